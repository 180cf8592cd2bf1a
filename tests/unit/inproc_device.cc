#include "tests/unit/inproc_device.h"

#include <algorithm>
#include <cmath>
#include <cstring>

#include "tests/common/tensors.h"

namespace concord {
namespace {

class FakeDeviceEvent : public DeviceEvent {
 public:
  explicit FakeDeviceEvent(std::shared_ptr<std::atomic<bool>> finished)
      : finished_(std::move(finished)) {}
  Status StreamWait(void* stream) override {
    if (stream == nullptr) return InvalidArgument("StreamWait: the stream is NULL");
    auto* s = static_cast<FakeStream*>(stream);
    std::lock_guard<std::mutex> lock(s->mu);
    s->waits.push_back(finished_);
    return Status::Ok();
  }

 private:
  std::shared_ptr<std::atomic<bool>> finished_;
};

// What the engine passes on: a FakeReady of CaptureReady()'s, or nothing.
bool Ready(void* ready_event) {
  return ready_event == nullptr || static_cast<FakeReady*>(ready_event)->Ready();
}

bool SameShape(const DeviceCollective& a, const DeviceCollective& b) {
  if (a.kind != b.kind || a.dtype != b.dtype || a.op != b.op || a.prescale != b.prescale ||
      a.postscale != b.postscale || a.root != b.root || a.counts_per_rank != b.counts_per_rank ||
      a.tensors.size() != b.tensors.size()) {
    return false;
  }
  // An alltoallv's byte counts are each rank's own (Compute() checks that they pair up).
  if (a.kind == DeviceOpKind::kAlltoallv) return true;
  if (a.bytes_per_rank != b.bytes_per_rank) return false;
  // Gathers: counts are per rank.
  if (a.kind == DeviceOpKind::kAllgatherv || a.kind == DeviceOpKind::kGatherv) return true;
  for (size_t t = 0; t < a.tensors.size(); ++t) {
    if (a.tensors[t].count != b.tensors[t].count) return false;
  }
  return true;
}

}  // namespace

class InProcDeviceBackend : public DeviceBackend {
 public:
  InProcDeviceBackend(InProcDeviceWorld* world, int rank, int device)
      : world_(world), rank_(rank), device_(device) {}
  ~InProcDeviceBackend() override {
    Abort(Status(Code::kNotInitialized, "the device backend was destroyed"));
    std::unique_lock<std::mutex> lock(world_->mu_);
    // Nor may the worker still be calling a callback it took: they reach this rank's engine.
    world_->cv_.wait(lock,
                     [&] { return !world_->ranks_[rank_].running && world_->delivering_ == 0; });
  }

  const char* name() const override { return "inproc-device"; }
  int rank() const override { return rank_; }
  int size() const override { return world_->size_; }
  int device() const override { return device_; }

  Status CheckDevice(int device) const override {
    if (device < 0 || device >= InProcDeviceWorld::kDevices) {
      return Status(Code::kUnavailable,
                    "CUDA device " + std::to_string(device) + " does not exist (" +
                        std::to_string(InProcDeviceWorld::kDevices) + " devices)");
    }
    if (device != device_) {
      return InvalidArgument("this communicator runs on CUDA device " + std::to_string(device_));
    }
    return Status::Ok();
  }

  StatusOr<std::shared_ptr<void>> CaptureReady(void* ready_stream, void* ready_event) override {
    auto ready = std::make_shared<FakeReady>();
    ready->event = static_cast<FakeEvent*>(ready_event);
    if (ready_stream != nullptr) {
      auto* stream = static_cast<FakeStream*>(ready_stream);
      std::lock_guard<std::mutex> lock(stream->mu);
      ready->stream_waits = stream->waits;
    }
    ready->captured_on = std::this_thread::get_id();
    std::lock_guard<std::mutex> lock(world_->mu_);
    world_->captures_.push_back(ready);
    return std::shared_ptr<void>(std::move(ready));
  }

  StatusOr<std::shared_ptr<DeviceEvent>> Launch(const DeviceCollective& c, Done done) override {
    if (c.tensors.empty() || (c.kind != DeviceOpKind::kAllreduce && c.tensors.size() != 1)) {
      return InvalidArgument("inproc-device: wrong number of tensors");
    }
    for (const DeviceTensor& t : c.tensors) {
      if (t.ready_stream != nullptr) {
        return InvalidArgument(
            "inproc-device: a ready stream at launch (not captured when enqueued)");
      }
    }
    const auto ranks = static_cast<size_t>(world_->size_);
    const bool gathers = c.kind == DeviceOpKind::kAllgatherv || c.kind == DeviceOpKind::kGatherv;
    if ((gathers || c.kind == DeviceOpKind::kAlltoallv) && c.bytes_per_rank.size() != ranks) {
      return InvalidArgument("inproc-device: one byte count per rank is needed");
    }
    if (c.kind == DeviceOpKind::kAlltoallv && c.recv_bytes_per_rank.size() != ranks) {
      return InvalidArgument("inproc-device: alltoallv needs one receive count per rank");
    }
    if (c.kind == DeviceOpKind::kReducescatter) {
      size_t total = 0;
      for (size_t n : c.counts_per_rank) total += n;
      if (c.counts_per_rank.size() != ranks || total != c.tensors[0].count) {
        return InvalidArgument("inproc-device: reducescatter counts do not cover the input");
      }
    }
    auto finished = std::make_shared<std::atomic<bool>>(false);
    std::lock_guard<std::mutex> lock(world_->mu_);
    const Status& aborted = world_->ranks_[rank_].aborted;
    if (!aborted.ok()) return aborted;
    world_->ranks_[rank_].queue.push_back({c, std::move(done), finished});
    world_->cv_.notify_all();
    return std::shared_ptr<DeviceEvent>(std::make_shared<FakeDeviceEvent>(finished));
  }

  // "Device memory" is host memory: a memcpy once the producers are done (the captured FakeEvent
  // set, the FakeStream's collectives then finished).
  Status CopyLocal(void* dst, const void* src, size_t bytes, void* ready_stream,
                   void* ready_event) override {
    if (ready_stream != nullptr) {
      return InvalidArgument(
          "inproc-device: a ready stream at a copy (not captured when submitted)");
    }
    const Deadline deadline = Deadline::After(std::chrono::milliseconds(20000));
    while (!Ready(ready_event)) {
      if (deadline.passed()) return TimeoutError("inproc-device: a copy's producer never finished");
      std::this_thread::sleep_for(std::chrono::microseconds(100));
    }
    ++world_->copies_;
    if (bytes > 0) std::memcpy(dst, src, bytes);
    return Status::Ok();
  }

  Status Drain(Deadline deadline) override {
    std::unique_lock<std::mutex> lock(world_->mu_);
    auto& me = world_->ranks_[rank_];
    auto idle = [&] { return me.queue.empty(); };
    if (deadline.infinite()) {
      world_->cv_.wait(lock, idle);
    } else if (!world_->cv_.wait_until(lock, deadline.at(), idle)) {
      return TimeoutError("inproc-device: collectives still in flight at the deadline");
    }
    return me.aborted;
  }

  bool OnCompletionThread() const override {
    return std::this_thread::get_id() == world_->worker_.get_id();
  }

  void Abort(const Status& status) override {
    std::vector<std::function<void()>> callbacks;
    {
      std::lock_guard<std::mutex> lock(world_->mu_);
      callbacks = world_->Break(rank_, status);
    }
    for (auto& cb : callbacks) cb();
  }

 private:
  InProcDeviceWorld* const world_;
  const int rank_;
  const int device_;
};

InProcDeviceWorld::InProcDeviceWorld(int size, std::chrono::milliseconds delay)
    : size_(size), delay_(delay), ranks_(size), worker_([this] { Loop(); }) {}

InProcDeviceWorld::~InProcDeviceWorld() {
  {
    std::lock_guard<std::mutex> lock(mu_);
    stop_ = true;
  }
  cv_.notify_all();
  worker_.join();
}

std::unique_ptr<DeviceBackend> InProcDeviceWorld::MakeBackend(int rank, int device) {
  return std::make_unique<InProcDeviceBackend>(this, rank, device);
}

void InProcDeviceWorld::Stall(int rank) {
  std::lock_guard<std::mutex> lock(mu_);
  ranks_[rank].stalled = true;
}

std::vector<std::thread::id> InProcDeviceWorld::capture_threads() {
  std::lock_guard<std::mutex> lock(mu_);
  std::vector<std::thread::id> threads;
  for (const auto& c : captures_) threads.push_back(c->captured_on);
  return threads;
}

uint64_t InProcDeviceWorld::completed() {
  std::lock_guard<std::mutex> lock(mu_);
  return completed_;
}

std::vector<std::function<void()>> InProcDeviceWorld::Break(int rank, const Status& status) {
  std::vector<std::function<void()>> callbacks;
  for (int r = 0; r < size_; ++r) {
    RankState& s = ranks_[r];
    const Status mine = r == rank
                            ? status
                            : Status(Code::kPeerFailure,
                                     "rank " + std::to_string(rank) +
                                         " aborted its device communicator: " + status.message());
    if (s.aborted.ok()) s.aborted = mine;
    if (s.stalled && r != rank) continue;  // hung: only its own Abort() ends its work
    // A front the worker is completing finishes normally; everything behind it fails.
    const size_t keep = s.running ? 1 : 0;
    while (s.queue.size() > keep) {
      Pending p = std::move(s.queue.back());
      s.queue.pop_back();
      p.finished->store(true);
      callbacks.push_back([done = std::move(p.done), mine] { done(mine); });
    }
  }
  // Launch order: the callbacks were collected back to front per rank.
  std::reverse(callbacks.begin(), callbacks.end());
  cv_.notify_all();
  return callbacks;
}

bool InProcDeviceWorld::FrontsReady() const {
  for (const RankState& s : ranks_) {
    if (s.stalled || s.queue.empty()) return false;
    for (const DeviceTensor& t : s.queue.front().collective.tensors) {
      if (!Ready(t.ready_event)) return false;
    }
  }
  return true;
}

bool InProcDeviceWorld::Compute(const std::vector<Pending*>& fronts) {
  std::vector<const DeviceCollective*> all;
  for (const Pending* p : fronts) all.push_back(&p->collective);
  for (const auto* c : all) {
    if (!SameShape(*c, *all[0])) return false;
  }
  const DeviceCollective& c0 = *all[0];
  const size_t elem = DTypeSize(c0.dtype);
  if (c0.kind == DeviceOpKind::kAllgatherv || c0.kind == DeviceOpKind::kGatherv) {
    std::vector<uint8_t> gathered;
    for (int r = 0; r < size_; ++r) {
      const auto* in = static_cast<const uint8_t*>(all[r]->tensors[0].input);
      gathered.insert(gathered.end(), in, in + c0.bytes_per_rank[r]);
    }
    for (int r = 0; r < size_; ++r) {
      if (c0.kind == DeviceOpKind::kGatherv && r != c0.root) continue;
      void* out = all[r]->tensors[0].output;
      if (out != nullptr && !gathered.empty()) std::memcpy(out, gathered.data(), gathered.size());
    }
    return true;
  }
  if (c0.kind == DeviceOpKind::kAlltoallv) {
    // Rank s's block for rank r, copied first (an output may overlap its input).
    std::vector<std::vector<uint8_t>> received(size_);
    for (int r = 0; r < size_; ++r) {
      for (int s = 0; s < size_; ++s) {
        if (all[s]->bytes_per_rank[r] != all[r]->recv_bytes_per_rank[s]) return false;
        size_t at = 0;
        for (int d = 0; d < r; ++d) at += all[s]->bytes_per_rank[d];
        const auto* in = static_cast<const uint8_t*>(all[s]->tensors[0].input) + at;
        received[r].insert(received[r].end(), in, in + all[s]->bytes_per_rank[r]);
      }
    }
    for (int r = 0; r < size_; ++r) {
      void* out = all[r]->tensors[0].output;
      if (out != nullptr && !received[r].empty()) {
        std::memcpy(out, received[r].data(), received[r].size());
      }
    }
    return true;
  }
  for (size_t t = 0; t < c0.tensors.size(); ++t) {
    const size_t n = c0.tensors[t].count;
    std::vector<uint8_t> acc(n * elem);
    if (n == 0) continue;
    if (c0.kind == DeviceOpKind::kBroadcast) {
      std::memcpy(acc.data(), all[c0.root]->tensors[t].input, acc.size());
      for (const auto* c : all) std::memcpy(c->tensors[t].output, acc.data(), acc.size());
      continue;
    }
    std::vector<uint8_t> scaled(n * elem);
    for (int r = 0; r < size_; ++r) {
      CopyScaled(r == 0 ? acc.data() : scaled.data(), all[r]->tensors[t].input, n, c0.dtype,
                 c0.prescale);
      if (r > 0) ReduceElements(acc.data(), acc.data(), scaled.data(), n, c0.dtype, c0.op);
    }
    double post = c0.postscale;
    if (c0.op == ReduceOp::kAverage) {
      if (IsFloatingPoint(c0.dtype)) {
        post /= size_;
      } else {
        for (size_t i = 0; i < n; ++i) {
          const double v = harness::LoadElement(c0.dtype, acc.data(), i);
          harness::StoreElement(c0.dtype, acc.data(), i, std::trunc(v / size_));
        }
      }
    }
    for (int r = 0; r < size_; ++r) {
      auto* out = static_cast<uint8_t*>(all[r]->tensors[t].output);
      if (c0.kind == DeviceOpKind::kAllreduce) {
        CopyScaled(out, acc.data(), n, c0.dtype, post);
      } else if (c0.kind == DeviceOpKind::kReduce && r == c0.root) {
        CopyScaled(out, acc.data(), n, c0.dtype, post);
      } else if (c0.kind == DeviceOpKind::kReducescatter && c0.counts_per_rank[r] > 0) {
        size_t first = 0;
        for (int d = 0; d < r; ++d) first += c0.counts_per_rank[d];
        CopyScaled(out, acc.data() + first * elem, c0.counts_per_rank[r], c0.dtype, post);
      }
    }
  }
  return true;
}

void InProcDeviceWorld::Loop() {
  std::unique_lock<std::mutex> lock(mu_);
  while (!stop_) {
    // A collective past its deadline (on a rank that is not stalled) breaks the world.
    int late = -1;
    for (int r = 0; r < size_ && late < 0; ++r) {
      const RankState& s = ranks_[r];
      if (!s.stalled && !s.running && !s.queue.empty() &&
          s.queue.front().collective.deadline.passed()) {
        late = r;
      }
    }
    if (late >= 0) {
      auto callbacks = Break(late, TimeoutError("inproc-device: collective not finished by its "
                                                "deadline (a peer never arrived)"));
      ++delivering_;
      lock.unlock();
      for (auto& cb : callbacks) cb();
      lock.lock();
      --delivering_;
      cv_.notify_all();
      continue;
    }
    if (FrontsReady()) {
      // The fronts stay put while running (Launch appends, Break spares them).
      std::vector<Pending*> fronts;
      for (RankState& s : ranks_) {
        s.running = true;
        fronts.push_back(&s.queue.front());
      }
      lock.unlock();
      std::this_thread::sleep_for(delay_);  // the simulated device's latency, not an ordering
      const bool ok = Compute(fronts);
      const Status status =
          ok ? Status::Ok()
             : Status(Code::kInternal, "inproc-device: ranks launched different collectives");
      lock.lock();
      if (ok) ++completed_;  // counted before any rank learns of it
      lock.unlock();
      for (Pending* p : fronts) {
        p->finished->store(true);
        p->done(status);
      }
      lock.lock();
      for (RankState& s : ranks_) {
        s.queue.pop_front();
        s.running = false;
      }
      cv_.notify_all();
      continue;
    }
    bool pending = false;
    for (const RankState& s : ranks_) pending = pending || !s.queue.empty();
    if (pending) {
      cv_.wait_for(lock, std::chrono::milliseconds(1));  // poll events and deadlines
    } else {
      cv_.wait(lock);
    }
  }
}

}  // namespace concord
