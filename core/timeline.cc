#include "core/timeline.h"

#include <fcntl.h>
#include <sys/file.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <charconv>
#include <chrono>
#include <cinttypes>
#include <cmath>
#include <cstring>

#include "base/c_locale.h"
#include "base/digest.h"
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

std::string TimelineFileName(const std::string& path, int rank, const std::string& membership) {
  std::string name = path;
  if (!membership.empty()) {
    const uint64_t h = Fnv1a(membership);
    char digest[9];
    std::snprintf(digest, sizeof(digest), "%08" PRIx32, static_cast<uint32_t>(h ^ (h >> 32)));
    name += ".comm" + std::string(digest);
  }
  return name + ".rank" + std::to_string(rank);
}

StatusOr<TimelineFile> OpenTimelineFile(const std::string& path, int rank,
                                        const std::string& source, const std::string& membership) {
  TimelineFile f;
  f.path = TimelineFileName(path, rank, membership);
  f.membership = membership;
  const auto refused = [&](const std::string& why) {
    return InvalidArgument(source + " = " + path + ": cannot write the timeline file " + f.path +
                           ": " + why);
  };
  const auto system_error = [](int error) {
    return std::string(std::strerror(error)) + " (errno " + std::to_string(error) + ")";
  };
  // Non-blocking, so that a FIFO without a reader is refused (ENXIO) rather than blocking init
  // until one comes; writes block again.
  const int fd = ::open(f.path.c_str(), O_WRONLY | O_CREAT | O_CLOEXEC | O_NONBLOCK, 0666);
  if (fd < 0) {
    const int error = errno;
    struct stat st;
    const bool fifo = ::stat(f.path.c_str(), &st) == 0 && S_ISFIFO(st.st_mode);
    return refused(error == ENXIO && fifo ? "a FIFO that no process reads" : system_error(error));
  }
  const auto fail = [&](const std::string& why) {
    ::close(fd);
    return refused(why);
  };
  const int flags = ::fcntl(fd, F_GETFL);
  if (flags < 0 || ::fcntl(fd, F_SETFL, flags & ~O_NONBLOCK) != 0) return fail(system_error(errno));
  struct stat st;
  if (::fstat(fd, &st) != 0) return fail(system_error(errno));
  // A regular file is locked before it is truncated: one that another timeline writes is refused,
  // not cut short (a file system without locks, ENOLCK, is not checked). A device (/dev/null) is
  // neither locked nor truncated.
  if (S_ISREG(st.st_mode)) {
    if (::flock(fd, LOCK_EX | LOCK_NB) != 0 && errno == EWOULDBLOCK) {
      return fail(
          "another timeline is writing it (a communicator of this or another process was "
          "given the same path)");
    }
    if (::ftruncate(fd, 0) != 0) return fail(system_error(errno));
  }
  f.file.reset(::fdopen(fd, "w"));
  if (f.file == nullptr) return fail(system_error(errno));
  std::setvbuf(f.file.get(), nullptr, _IOFBF, kFileBuffer);
  return f;
}

Timeline::Timeline(int rank, int size, Warn warn, size_t max_pending, size_t max_tensors)
    : rank_(rank),
      size_(size),
      warn_(std::move(warn)),
      max_pending_(max_pending),
      max_tensors_(std::max<size_t>(max_tensors, 1)) {}

Timeline::~Timeline() {
  Stop();
}

Status Timeline::Start(TimelineFile file, std::optional<ClockOffset> clock) {
  MutexLock control(control_mu_);
  if (on()) {
    return InvalidArgument("a timeline is already being written to " + path() +
                           "; stop it before starting another");
  }
  // A writer still joinable has returned (or is returning) after a failed write, which closed the
  // file and warned.
  if (writer_.joinable()) writer_.join();
  const auto wall = std::chrono::system_clock::now();
  const auto steady = Clock::now();
  const int64_t start_us =
      std::chrono::duration_cast<std::chrono::microseconds>(wall.time_since_epoch()).count();
  std::fprintf(file.file.get(),
               "{\"traceEvents\":[\n{\"ph\":\"M\",\"pid\":%d,\"tid\":0,\"name\":\"process_name\","
               "\"args\":{\"name\":\"rank %d\",\"concord_rank\":%d,\"concord_size\":%d,"
               "\"concord_start_us\":%" PRId64,
               rank_, rank_, rank_, size_, start_us);
  // Only a finite offset: "nan" or "inf" would make the file invalid JSON.
  if (clock && std::isfinite(clock->offset_us) && std::isfinite(clock->error_us)) {
    const ScopedCLocale c_locale;  // "12.500", not "12,500", whatever the application's LC_NUMERIC
    std::fprintf(file.file.get(),
                 ",\"concord_clock_offset_us\":%.3f,\"concord_clock_error_us\":%.3f",
                 clock->offset_us, clock->error_us);
  }
  if (!file.membership.empty()) {
    std::fprintf(file.file.get(), ",\"concord_communicator\":%s",
                 JsonQuote(file.membership).c_str());
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
    tensor_recency_.clear();
    next_tensor_track_ = kTensorTrack;
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

size_t Timeline::tensor_count() const {
  MutexLock lock(mu_);
  return tensors_.size();
}

bool Timeline::Append(Event e) {
  if (pending_.size() >= max_pending_) {
    ++dropped_;
    return false;
  }
  pending_.push_back(std::move(e));
  return true;
}

void Timeline::NameTrack(int track) {
  if (track < 0 || track >= kTensorTrack || named_tracks_[track]) return;
  Event e;
  e.track = track;
  e.args = JsonQuote(TrackName(track));
  named_tracks_[track] = Append(std::move(e));
}

Timeline::TensorInfo& Timeline::TensorTrack(const std::string& name) {
  auto it = tensors_.find(name);
  if (it != tensors_.end()) {
    tensor_recency_.splice(tensor_recency_.end(), tensor_recency_, it->second.recency);
  } else {
    if (tensors_.size() >= max_tensors_) {
      // Erased by iterator: the name in tensor_recency_ is the node's own key.
      tensors_.erase(tensors_.find(*tensor_recency_.front()));
      tensor_recency_.pop_front();
    }
    it = tensors_.try_emplace(name).first;
    it->second.track = next_tensor_track_++;
    it->second.recency = tensor_recency_.insert(tensor_recency_.end(), &it->first);
  }
  TensorInfo& tensor = it->second;
  if (!tensor.named) {
    Event e;
    e.track = tensor.track;
    e.args = JsonQuote(name);
    tensor.named = Append(std::move(e));
  }
  return tensor;
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
  const bool changed = tensor.op != op || tensor.bytes != bytes;  // op names are literals
  if (changed) {
    e.detail = op;
    e.detail_key = "op";
    e.bytes = bytes;
  }
  if (Append(e) && changed) {
    tensor.op = op;
    tensor.bytes = bytes;
  }
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
  int error = 0;  // the first failure's errno
  const auto check = [&error](bool done) {
    if (!done && error == 0) error = errno;
  };
  check(Write(f, events));
  if (last) check(std::fputs("\n]}\n", f) >= 0);
  check(std::fflush(f) == 0);
  if (error == 0 && !last) return Status::Ok();
  if (!last) {  // the failure ends the timeline: what it dropped so far is told now, not never
    MutexLock lock(mu_);
    std::swap(dropped, dropped_);
  }
  const std::string path = file_.path;
  if (last) check(std::fclose(file_.file.release()) == 0);  // a close can fail too (NFS)
  file_.file.reset();
  if (dropped > 0) {
    warn_("timeline: " + std::to_string(dropped) + " events were dropped: " + path +
          " could not be written as fast as they came");
  }
  if (error == 0) return Status::Ok();
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
