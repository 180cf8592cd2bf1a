#include "core/timeline.h"

#include <cerrno>
#include <charconv>
#include <chrono>
#include <cinttypes>
#include <cstring>

#include "base/json.h"

namespace concord {
namespace {

constexpr size_t kFileBuffer = size_t{1} << 20;
constexpr auto kWriteEvery = std::chrono::milliseconds(100);

template <typename Int>
void AppendInt(std::string& out, Int v) {
  char digits[24];
  const std::to_chars_result r = std::to_chars(digits, digits + sizeof(digits), v);
  out.append(digits, r.ptr);
}

// Nanoseconds as microseconds with one decimal, rounded to the nearest 100 ns.
void AppendMicros(std::string& out, int64_t ns) {
  if (ns < 0) {
    out += '-';
    ns = -ns;
  }
  const int64_t tenths = (ns + 50) / 100;
  AppendInt(out, tenths / 10);
  out += '.';
  out += static_cast<char>('0' + tenths % 10);
}

std::string TrackName(int track) {
  if (track == Timeline::kEngineTrack) return "engine";
  if (track == Timeline::kDeviceLaunchTrack) return "device launches";
  if (track == Timeline::kDeviceTrack) return "device";
  return "lane " + std::to_string(track - Timeline::kLaneTrack);
}

}  // namespace

StatusOr<TimelineFile> OpenTimelineFile(const std::string& path, int rank,
                                        const std::string& source) {
  TimelineFile f;
  f.path = path + ".rank" + std::to_string(rank);
  f.file.reset(std::fopen(f.path.c_str(), "w"));
  if (f.file == nullptr) {
    const int error = errno;
    return InvalidArgument(source + " = " + path + ": cannot write the timeline file " + f.path +
                           ": " + std::strerror(error) + " (errno " + std::to_string(error) + ")");
  }
  std::setvbuf(f.file.get(), nullptr, _IOFBF, kFileBuffer);
  return f;
}

Timeline::Timeline(int rank, int size, Warn warn)
    : rank_(rank), size_(size), warn_(std::move(warn)) {}

Timeline::~Timeline() {
  Stop();
}

Status Timeline::Start(TimelineFile file, std::optional<ClockOffset> clock) {
  MutexLock control(control_mu_);
  if (on()) {
    return InvalidArgument("a timeline is already being written to " + path() +
                           "; stop it before starting another");
  }
  const auto wall = std::chrono::system_clock::now();
  const auto steady = Clock::now();
  const int64_t start_us =
      std::chrono::duration_cast<std::chrono::microseconds>(wall.time_since_epoch()).count();
  std::fprintf(file.file.get(),
               "{\"traceEvents\":[\n{\"ph\":\"M\",\"pid\":%d,\"tid\":0,\"name\":\"process_name\","
               "\"args\":{\"name\":\"rank %d\",\"concord_rank\":%d,\"concord_size\":%d,"
               "\"concord_start_us\":%" PRId64,
               rank_, rank_, rank_, size_, start_us);
  if (clock) {
    std::fprintf(file.file.get(),
                 ",\"concord_clock_offset_us\":%.3f,\"concord_clock_error_us\":%.3f",
                 clock->offset_us, clock->error_us);
  }
  std::fputs("}}", file.file.get());
  {
    MutexLock write(write_mu_);
    MutexLock lock(mu_);
    path_ = file.path;
    file_ = std::move(file);
    start_ = steady;
    pending_.clear();
    tensors_.clear();
    named_tracks_.assign(kTensorTrack, false);
    dropped_ = 0;
    stopping_ = false;
  }
  on_.store(true, std::memory_order_relaxed);
  writer_ = std::thread([this] { WriterLoop(); });
  return Status::Ok();
}

void Timeline::Stop() {
  MutexLock control(control_mu_);
  if (!writer_.joinable()) return;
  on_.store(false, std::memory_order_relaxed);
  {
    MutexLock lock(mu_);
    stopping_ = true;
  }
  wake_.NotifyAll();
  writer_.join();
  (void)Flush(true);  // a failure has warned
}

std::string Timeline::path() const {
  MutexLock lock(mu_);
  return path_;
}

void Timeline::Append(Event e) {
  if (pending_.size() >= kMaxPending) {
    ++dropped_;
    return;
  }
  pending_.push_back(std::move(e));
}

void Timeline::NameTrack(int track) {
  if (track < 0 || track >= kTensorTrack || named_tracks_[track]) return;
  named_tracks_[track] = true;
  Event e;
  e.track = track;
  e.args = JsonQuote(TrackName(track));
  Append(std::move(e));
}

Timeline::TensorInfo& Timeline::TensorTrack(const std::string& name) {
  auto [it, added] = tensors_.try_emplace(name);
  if (added) {
    it->second.track = kTensorTrack + static_cast<int>(tensors_.size()) - 1;
    Event e;
    e.track = it->second.track;
    e.args = JsonQuote(name);
    Append(std::move(e));
  }
  return it->second;
}

void Timeline::Tensor(const std::string& name, const char* op, uint64_t bytes,
                      const TensorPhases& phases) {
  if (!on()) return;
  MutexLock lock(mu_);
  if (!on() || phases.enqueued < start_) return;  // stopped meanwhile, or from before this timeline
  TensorInfo& tensor = TensorTrack(name);
  Event e;
  e.track = tensor.track;
  e.name = "negotiate";
  e.begin_ns = Since(phases.enqueued);
  e.end_ns = Since(phases.negotiated);
  if (phases.last_rank >= 0 && phases.last_rank != rank_) {
    e.last_rank = phases.last_rank;
    e.last_wait_us = phases.last_wait_us;
  }
  Append(e);
  e.last_rank = -1;
  e.name = "queued";
  e.begin_ns = e.end_ns;
  e.end_ns = Since(phases.started);
  Append(e);
  e.name = "execute";
  e.begin_ns = e.end_ns;
  e.end_ns = Since(phases.completed);
  if (tensor.op != op || tensor.bytes != bytes) {  // op names are literals
    e.detail = op;
    e.detail_key = "op";
    e.bytes = bytes;
    tensor.op = op;
    tensor.bytes = bytes;
  }
  Append(e);
  const int64_t called_back = Since(phases.called_back);
  if (called_back - e.end_ns < kShortestCallbackNs) return;
  e.name = "callback";
  e.begin_ns = e.end_ns;
  e.end_ns = called_back;
  e.detail = nullptr;
  e.bytes = kNoBytes;
  Append(std::move(e));
}

void Timeline::Slice(int track, const char* name, Clock::time_point begin, Clock::time_point end,
                     uint64_t bytes, const char* detail, std::string args) {
  if (!on()) return;
  MutexLock lock(mu_);
  if (!on() || begin < start_) return;
  NameTrack(track);
  Event e;
  e.name = name;
  e.track = track;
  e.begin_ns = Since(begin);
  e.end_ns = Since(end);
  e.bytes = bytes;
  e.detail = detail;
  e.args = std::move(args);
  Append(std::move(e));
}

bool Timeline::Write(FILE* file, const std::vector<Event>& events) {
  std::string out;
  out.reserve(events.size() * 96);
  for (const Event& e : events) {
    if (e.name == nullptr) {
      out += ",\n{\"ph\":\"M\",\"pid\":";
      AppendInt(out, rank_);
      out += ",\"tid\":";
      AppendInt(out, e.track);
      out += ",\"name\":\"thread_name\",\"args\":{\"name\":";
      out += e.args;
      out += "}},\n{\"ph\":\"M\",\"pid\":";
      AppendInt(out, rank_);
      out += ",\"tid\":";
      AppendInt(out, e.track);
      out += ",\"name\":\"thread_sort_index\",\"args\":{\"sort_index\":";
      AppendInt(out, e.track);
      out += "}}";
      continue;
    }
    out += ",\n{\"ph\":\"X\",\"pid\":";
    AppendInt(out, rank_);
    out += ",\"tid\":";
    AppendInt(out, e.track);
    out += ",\"ts\":";
    AppendMicros(out, e.begin_ns);
    out += ",\"dur\":";
    AppendMicros(out, e.end_ns - e.begin_ns);
    out += ",\"name\":\"";
    out += e.name;
    out += '"';
    if (e.bytes == kNoBytes && e.detail == nullptr && e.last_rank < 0 && e.args.empty()) {
      out += '}';
      continue;
    }
    out += ",\"args\":{";
    const char* sep = "";
    if (e.detail != nullptr) {
      out += '"';
      out += e.detail_key;
      out += "\":\"";
      out += e.detail;
      out += '"';
      sep = ",";
    }
    if (e.bytes != kNoBytes) {
      out += sep;
      out += "\"bytes\":";
      AppendInt(out, e.bytes);
      sep = ",";
    }
    if (e.last_rank >= 0) {
      out += sep;
      out += "\"last_rank\":";
      AppendInt(out, e.last_rank);
      out += ",\"last_wait_us\":";
      AppendInt(out, e.last_wait_us);
      sep = ",";
    }
    if (!e.args.empty()) {
      out += sep;
      out += e.args;
    }
    out += "}}";
  }
  return std::fwrite(out.data(), 1, out.size(), file) == out.size() && std::ferror(file) == 0;
}

Status Timeline::Flush(bool last) {
  MutexLock write(write_mu_);
  if (file_.file == nullptr) return Status::Ok();
  std::vector<Event> events;
  uint64_t dropped = 0;
  {
    MutexLock lock(mu_);
    events.swap(pending_);
    if (last) std::swap(dropped, dropped_);
  }
  FILE* f = file_.file.get();
  bool ok = Write(f, events);
  if (last) ok = std::fputs("\n]}\n", f) >= 0 && ok;
  ok = std::fflush(f) == 0 && ok;
  const int error = errno;
  if (ok && !last) return Status::Ok();
  const std::string path = file_.path;
  if (last) ok = file_.file.release() != nullptr && std::fclose(f) == 0 && ok;
  file_.file.reset();
  if (dropped > 0) {
    warn_("timeline: " + std::to_string(dropped) + " events were dropped: " + path +
          " could not be written as fast as they came");
  }
  if (ok) return Status::Ok();
  on_.store(false, std::memory_order_relaxed);
  const Status failed =
      Status(Code::kSystemError, "timeline: writing " + path + " failed: " + std::strerror(error) +
                                     "; the timeline is off, training goes on");
  warn_(failed.message());
  return failed;
}

void Timeline::WriterLoop() {
  for (;;) {
    {
      MutexLock lock(mu_);
      if (!stopping_) wake_.WaitFor(mu_, kWriteEvery);
      if (stopping_) return;
    }
    if (!Flush(false).ok()) return;
  }
}

}  // namespace concord
