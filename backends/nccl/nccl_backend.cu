// The NCCL device backend (nccl_backend.h). One communicator on one device, one stream of its own,
// a device fusion buffer (grown rarely, reused), a CudaPacker for fused and scaled allreduces, and
// a completion thread that polls each launch's CUDA event, the communicator's asynchronous error
// and the launch's deadline, aborts the communicator (ncclCommAbort) on an error or a deadline, and
// runs every `done`, the failed ones' too, in launch order.
#include <nccl.h>

#include <algorithm>
#include <condition_variable>
#include <cstring>
#include <deque>
#include <mutex>
#include <optional>
#include <thread>
#include <utility>
#include <vector>

#include "backends/cuda/cuda_check.h"
#include "backends/cuda/cuda_device.h"
#include "backends/cuda/cuda_packer.h"
#include "backends/nccl/nccl_backend.h"
#include "backends/nccl/nccl_check.h"
#include "rendezvous/store.h"

namespace concord {
namespace {

StatusOr<ncclDataType_t> NcclType(DType dtype) {
  switch (dtype) {
    case DType::kUint8:
      return ncclUint8;
    case DType::kInt8:
      return ncclInt8;
    case DType::kInt32:
      return ncclInt32;
    case DType::kInt64:
      return ncclInt64;
    case DType::kFloat16:
      return ncclFloat16;
    case DType::kBFloat16:
#if NCCL_VERSION_CODE >= NCCL_VERSION(2, 10, 0)
      return ncclBfloat16;
#else
      break;
#endif
    case DType::kFloat32:
      return ncclFloat32;
    case DType::kFloat64:
      return ncclFloat64;
  }
  return Status(Code::kUnavailable, std::string("dtype ") + DTypeName(dtype) +
                                        " is not supported by NCCL " + cuda::NcclVersion());
}

// How often a wait that Abort() must be able to end (the NCCL unique id in the store) looks.
constexpr auto kAbortCheck = std::chrono::milliseconds(100);
// How long the failure of an aborted launch waits for the work queued on the stream to stop.
constexpr auto kAbortDrain = std::chrono::seconds(2);

// Sets the calling thread's stream-capture mode to relaxed for one scope, so that another thread
// capturing a CUDA graph in global mode neither makes this thread's calls that are unsafe during
// a capture (cudaMalloc, cudaEventQuery, ...) fail nor invalidates that capture: none of them
// touches a capturing stream.
class RelaxedCapture {
 public:
  RelaxedCapture() { cudaThreadExchangeStreamCaptureMode(&mode_); }
  ~RelaxedCapture() { cudaThreadExchangeStreamCaptureMode(&mode_); }
  RelaxedCapture(const RelaxedCapture&) = delete;
  RelaxedCapture& operator=(const RelaxedCapture&) = delete;

 private:
  cudaStreamCaptureMode mode_ = cudaStreamCaptureModeRelaxed;
};

constexpr size_t kStagingAlignment = 256;

size_t AlignUp(size_t n) {
  return (n + kStagingAlignment - 1) / kStagingAlignment * kStagingAlignment;
}

bool Overlap(const void* a, size_t a_bytes, const void* b, size_t b_bytes) {
  const auto x = reinterpret_cast<uintptr_t>(a);
  const auto y = reinterpret_cast<uintptr_t>(b);
  return a_bytes > 0 && b_bytes > 0 && x < y + b_bytes && y < x + a_bytes;
}

// Collects the first failure of the calls issued between ncclGroupStart and ncclGroupEnd (which
// must run whatever happened, so the group is closed).
class GroupCalls {
 public:
  explicit GroupCalls(ncclComm_t comm) : comm_(comm) {}
  void Check(ncclResult_t result, const char* call) {
    if (issued_.ok() && result != ncclSuccess && result != ncclInProgress) {
      issued_ = nccl::NcclError(result, call, __FILE__, __LINE__, comm_);
    }
  }
  bool ok() const { return issued_.ok(); }
  Status End() {
    const ncclResult_t ended = ncclGroupEnd();
    CONCORD_RETURN_IF_ERROR(issued_);
    if (ended != ncclSuccess && ended != ncclInProgress) {
      return nccl::NcclError(ended, "ncclGroupEnd", __FILE__, __LINE__, comm_);
    }
    return Status::Ok();
  }

 private:
  ncclComm_t comm_;
  Status issued_;
};

// The events CaptureReady() hands out, kept for reuse: made on demand, given back by the handle's
// deleter (from any thread, after the backend is gone too), destroyed with the last reference. An
// event given back may be recorded again at once: a wait already issued on it waits for the record
// before (cudaStreamWaitEvent). Thread-safe.
class ReadyEvents {
 public:
  explicit ReadyEvents(int device) : device_(device) {}
  ~ReadyEvents() {
    cuda::DeviceGuard guard;
    if (guard.Set(device_) != cudaSuccess) return;
    for (cudaEvent_t e : free_) cudaEventDestroy(e);
  }
  ReadyEvents(const ReadyEvents&) = delete;
  ReadyEvents& operator=(const ReadyEvents&) = delete;

  // On the device set by the caller (device_).
  StatusOr<cudaEvent_t> Take() {
    {
      std::lock_guard<std::mutex> lock(mu_);
      if (!free_.empty()) {
        const cudaEvent_t e = free_.back();
        free_.pop_back();
        return e;
      }
    }
    cudaEvent_t e = nullptr;
    CONCORD_CUDA_CHECK(cudaEventCreateWithFlags(&e, cudaEventDisableTiming));
    return e;
  }
  void Give(cudaEvent_t e) {
    std::lock_guard<std::mutex> lock(mu_);
    free_.push_back(e);
  }

 private:
  const int device_;
  std::mutex mu_;
  std::vector<cudaEvent_t> free_;
};

// The stream a tensor's work waits for: its ready stream; with neither a stream nor an event, the
// legacy default stream, which is what a NULL cudaStream_t means to CUDA (a kernel launched on
// stream 0, a pageable cudaMemcpy that returned before its bytes arrived, and through the legacy
// stream's implicit synchronization every blocking stream's work so far).
void* ReadyStream(void* ready_stream, void* ready_event) {
  return ready_stream == nullptr && ready_event == nullptr ? static_cast<void*>(cudaStreamLegacy)
                                                           : ready_stream;
}

// Makes `stream` wait, on the device, for the work queued so far on ready_stream and for
// ready_event (either may be null).
Status WaitReady(cudaStream_t stream, void* ready_stream, void* ready_event) {
  if (ready_event != nullptr) {
    CONCORD_CUDA_CHECK(cudaStreamWaitEvent(stream, static_cast<cudaEvent_t>(ready_event), 0));
  }
  if (ready_stream == nullptr) return Status::Ok();
  cudaEvent_t produced;
  CONCORD_CUDA_CHECK(cudaEventCreateWithFlags(&produced, cudaEventDisableTiming));
  const cudaError_t recorded = cudaEventRecord(produced, static_cast<cudaStream_t>(ready_stream));
  const cudaError_t waited =
      recorded == cudaSuccess ? cudaStreamWaitEvent(stream, produced, 0) : recorded;
  cudaEventDestroy(produced);  // released once the wait is satisfied
  CONCORD_CUDA_CHECK(waited);
  return Status::Ok();
}

// The completion of one launch: a CUDA event recorded on the backend's stream after it.
class NcclEvent : public DeviceEvent {
 public:
  NcclEvent(int device, cudaEvent_t event) : device_(device), event_(event) {}
  ~NcclEvent() override {
    cuda::DeviceGuard guard;
    if (guard.Set(device_) == cudaSuccess) cudaEventDestroy(event_);
  }
  Status StreamWait(void* stream) override {
    CONCORD_CUDA_CHECK(cudaStreamWaitEvent(static_cast<cudaStream_t>(stream), event_, 0));
    return Status::Ok();
  }
  cudaEvent_t event() const { return event_; }

 private:
  const int device_;
  const cudaEvent_t event_;
};

class NcclBackend : public DeviceBackend {
 public:
  // `store` outlives the backend; rank 0 puts the NCCL unique id under `id_key` there.
  NcclBackend(int rank, int size, int device, std::chrono::milliseconds timeout, Store* store,
              std::string id_key)
      : rank_(rank),
        size_(size),
        device_(device),
        timeout_(timeout),
        store_(store),
        id_key_(std::move(id_key)) {}
  ~NcclBackend() override;

  // Creates the streams and the packer, and starts the completion thread. Talks to no peer: the
  // communicator starts at the first Launch() (Connect()).
  Status Start();

  const char* name() const override { return "nccl"; }
  int rank() const override { return rank_; }
  int size() const override { return size_; }
  int device() const override { return device_; }
  Status CheckDevice(int device) const override;
  StatusOr<std::shared_ptr<DeviceEvent>> Launch(const DeviceCollective& c, Done done) override;
  StatusOr<std::shared_ptr<void>> CaptureReady(void* ready_stream, void* ready_event) override;
  Status CopyLocal(void* dst, const void* src, size_t bytes, void* ready_stream,
                   void* ready_event) override;
  Status Drain(Deadline deadline) override;
  void Abort(const Status& status) override;
  bool OnCompletionThread() const override { return std::this_thread::get_id() == completion_id_; }
  std::function<void()> Interrupter() override;

 private:
  struct Pending {
    std::shared_ptr<NcclEvent> event;
    Deadline deadline;
    Done done;
    std::vector<cuda::DeviceBuffer> retired;  // fusion buffers outgrown before this launch
    bool at_front = false;  // the completion thread has seen it first in line (and its deadline)
  };
  // What Interrupter() reaches: the backend while it lives.
  struct Interrupt {
    std::mutex mu;
    NcclBackend* backend = nullptr;
  };

  // Refuses a malformed collective before anything of it is enqueued (the communicator stays).
  Status Validate(const DeviceCollective& c) const;
  // Starts the communicator, from the first Launch(): rank 0 makes the NCCL unique id and puts it
  // in the store, every rank reads it and starts the non-blocking communicator, waiting for the
  // peers until `deadline`. Collective, as Launch() is (every rank's first launch is the same
  // collective). Abort() interrupts it. Until it runs, the backend holds no NCCL resources, so a
  // communicator that never carries a CUDA collective (most sub-communicators) costs no NCCL
  // start-up, no bootstrap thread and no GPU memory for NCCL.
  Status Connect(Deadline deadline);
  // Whether the communicator was aborted (or must never start).
  bool CommAborted();
  // Waits until the non-blocking communicator has accepted what was issued. An NCCL call may
  // return ncclInProgress before its work is on the stream: our own kernels that read what it
  // writes (unpacking, scaled copies out of the fusion buffer) are queued only after this, or they
  // would run first (seen on an H200 at 2 ranks: every fused or scaled result was this rank's own
  // input). Called holding comm_mu_ through `comm_lock`, which it releases between its polls so
  // that the completion thread can check the communicator and an Abort() can abort it; returns
  // holding it, and an error once the communicator was aborted.
  Status WaitComm(std::unique_lock<std::mutex>& comm_lock, Deadline deadline);
  // Whether the communicator has accepted what was issued (holding comm_mu_): true; false while
  // NCCL is still at it; or NCCL's asynchronous error, reported as `call`'s.
  StatusOr<bool> CommReady(const char* call);
  // Enqueue() takes comm_mu_; the kinds' functions run under it (`comm_lock`: for WaitComm).
  Status Enqueue(const DeviceCollective& c);
  Status EnqueueAllreduce(const DeviceCollective& c, std::unique_lock<std::mutex>& comm_lock);
  Status EnqueueAllgatherv(const DeviceCollective& c);
  Status EnqueueReducescatter(const DeviceCollective& c, std::unique_lock<std::mutex>& comm_lock);
  Status EnqueueAlltoallv(const DeviceCollective& c);
  Status EnqueueReduce(const DeviceCollective& c, std::unique_lock<std::mutex>& comm_lock);
  Status EnqueueGatherv(const DeviceCollective& c);
  // NCCL's reduction for c.op; *post is c.postscale, with the division folded in for an average
  // on an NCCL without ncclAvg.
  StatusOr<ncclRedOp_t> RedOp(const DeviceCollective& c, double* post) const;
  // The packer's wait for a table slot (cuda_packer.h), holding comm_mu_ through `comm_lock`:
  // releases it between polls, as WaitComm does, so that the completion thread can time out and
  // abort the collective whose kernels still hold the slot (its peer never came), and an Abort()
  // from another thread can run; fails once the communicator was aborted while the lock was
  // released. It sets no deadline of its own: the collectives ahead are timed from when each
  // reaches the front of the line (the completion thread), and this one's kernels come after
  // theirs.
  cuda::SlotWait PackerWait(std::unique_lock<std::mutex>& comm_lock);
  // dst = src * scale, `count` elements, on stream_ (the packer; dst is fusion-buffer memory).
  Status ScaledCopy(const void* src, void* dst, size_t count, DType dtype, double scale,
                    std::unique_lock<std::mutex>& comm_lock);
  // dst = src * scale, `count` elements, on stream_ (src is fusion-buffer memory).
  Status ScaledCopyOut(const void* src, void* dst, size_t count, DType dtype, double scale,
                       std::unique_lock<std::mutex>& comm_lock);
  // The fusion buffer, at least `bytes` long (an outgrown one is retired, freed after the launch).
  StatusOr<void*> Buffer(size_t bytes);
  // Records the first failure and aborts the communicator (its kernels stop), on any thread;
  // runs no `done`: the completion thread fails what is pending (FailPending).
  void AbortComm(const Status& status);
  // Whether the stream has run everything queued on it, polled until `within` has passed.
  bool StreamIdle(std::chrono::milliseconds within);
  // On the completion thread, holding `lock` (mu_), once aborted_ is set: fails every pending
  // launch with it, in launch order, after the stream stopped (at most kAbortDrain: ncclCommAbort
  // stops NCCL's kernels, but our own ones queued after them, unpacking and scaled copies out,
  // would still write the outputs). Releases the lock while it waits and while `done` runs.
  void FailPending(std::unique_lock<std::mutex>& lock);
  void CompletionLoop();

  const int rank_, size_, device_;
  const std::chrono::milliseconds timeout_;
  Store* const store_;
  const std::string id_key_;
  bool connected_ = false;  // the launching thread's: Connect() succeeded
  // comm_ is used by the launching thread and the completion thread: comm_mu_ serialises every
  // call on it, so ncclCommAbort never frees it under another call. comm_aborted_ is also set by
  // an Abort() before the communicator exists, so that it is never started after.
  std::mutex comm_mu_;
  ncclComm_t comm_ = nullptr;
  bool comm_aborted_ = false;
  cudaStream_t stream_ = nullptr;
  // CopyLocal's stream: point-to-point staging never waits behind a collective on stream_.
  std::mutex copy_mu_;
  cudaStream_t copy_stream_ = nullptr;
  // CaptureReady's: where a caller's ready event is captured as recorded now (capture_mu_ keeps
  // each capture's waits and record together).
  std::mutex capture_mu_;
  cudaStream_t capture_stream_ = nullptr;
  const std::shared_ptr<ReadyEvents> ready_events_ = std::make_shared<ReadyEvents>(device_);
  std::unique_ptr<cuda::CudaPacker> packer_;
  cuda::DeviceBuffer fusion_;
  std::vector<cuda::DeviceBuffer> retired_;  // launching thread only

  std::mutex mu_;
  std::condition_variable cv_;
  std::deque<Pending> pending_;
  bool busy_ = false;  // the completion thread runs a `done` (taken out of pending_ or not)
  Status aborted_;
  bool stop_ = false;
  std::thread completion_;
  std::thread::id completion_id_;  // set by Start(), before anything can ask
  const std::shared_ptr<Interrupt> interrupt_ = std::make_shared<Interrupt>();
};

Status NcclBackend::Start() {
  cuda::DeviceGuard guard;
  CONCORD_CUDA_CHECK(guard.Set(device_));
  CONCORD_CUDA_CHECK(cudaStreamCreateWithFlags(&stream_, cudaStreamNonBlocking));
  CONCORD_CUDA_CHECK(cudaStreamCreateWithFlags(&copy_stream_, cudaStreamNonBlocking));
  CONCORD_CUDA_CHECK(cudaStreamCreateWithFlags(&capture_stream_, cudaStreamNonBlocking));
  CONCORD_ASSIGN_OR_RETURN(packer_, cuda::CudaPacker::Create(device_));
  completion_ = std::thread([this] { CompletionLoop(); });
  completion_id_ = completion_.get_id();
  {
    std::lock_guard<std::mutex> lock(interrupt_->mu);
    interrupt_->backend = this;
  }
  return Status::Ok();
}

std::function<void()> NcclBackend::Interrupter() {
  return [interrupt = interrupt_] {
    std::lock_guard<std::mutex> lock(interrupt->mu);
    if (interrupt->backend == nullptr) return;
    interrupt->backend->AbortComm(
        Status(Code::kPeerFailure,
               "the communicator's control plane found a peer failed: its NCCL communicator was "
               "aborted [NCCL " +
                   cuda::NcclVersion() + "]"));
  };
}

bool NcclBackend::CommAborted() {
  std::lock_guard<std::mutex> lock(comm_mu_);
  return comm_aborted_;
}

Status NcclBackend::Connect(Deadline deadline) {
  ncclUniqueId id;
  if (rank_ == 0) {
    CONCORD_NCCL_CHECK(ncclGetUniqueId(&id));
    CONCORD_RETURN_IF_ERROR(
        store_->Set(id_key_, std::string(reinterpret_cast<const char*>(&id), sizeof(id))));
  } else {
    // Read in slices, so that an Abort() ends the wait.
    auto bytes = store_->Get(id_key_, deadline.Earlier(Deadline::After(kAbortCheck)));
    while (!bytes.ok() && bytes.status().code() == Code::kTimeout && !deadline.passed()) {
      if (CommAborted()) return Status(Code::kBackendError, "the NCCL backend was aborted");
      bytes = store_->Get(id_key_, deadline.Earlier(Deadline::After(kAbortCheck)));
    }
    if (!bytes.ok()) {
      return bytes.status().WithContext(
          "waiting for rank 0's NCCL unique id (rank 0 had not "
          "launched this CUDA collective)");
    }
    if (bytes->size() != sizeof(id)) {
      return ProtocolError("the NCCL unique id in the store has " + std::to_string(bytes->size()) +
                           " bytes, not " + std::to_string(sizeof(id)));
    }
    std::memcpy(&id, bytes->data(), sizeof(id));
  }
  ncclConfig_t config = NCCL_CONFIG_INITIALIZER;
  config.blocking = 0;
  {
    std::lock_guard<std::mutex> lock(comm_mu_);
    if (comm_aborted_) return Status(Code::kBackendError, "the NCCL backend was aborted");
    CONCORD_NCCL_CHECK(ncclCommInitRankConfig(&comm_, size_, id, rank_, &config));
  }
  // Polled without holding comm_mu_ in between, so an Abort() from another thread ends the wait.
  for (;;) {
    {
      std::lock_guard<std::mutex> lock(comm_mu_);
      if (comm_aborted_) return Status(Code::kBackendError, "the NCCL backend was aborted");
      CONCORD_ASSIGN_OR_RETURN(const bool ready, CommReady("ncclCommInitRankConfig"));
      if (ready) return Status::Ok();
    }
    if (deadline.passed()) {
      return TimeoutError("the NCCL communicator of " + std::to_string(size_) +
                          " ranks did not start by the deadline: a peer did not launch this "
                          "CUDA collective [NCCL " +
                          cuda::NcclVersion() + "]");
    }
    std::this_thread::sleep_for(std::chrono::microseconds(200));
  }
}

NcclBackend::~NcclBackend() {
  {
    // An interrupter called from now on finds no backend; one running now finishes first.
    std::lock_guard<std::mutex> lock(interrupt_->mu);
    interrupt_->backend = nullptr;
  }
  // The engine drains before it lets go: what is left fails; ncclCommAbort frees the communicator
  // without waiting for peers that may be gone.
  Abort(Status(Code::kNotInitialized, "the NCCL backend was shut down"));
  {
    std::lock_guard<std::mutex> lock(mu_);
    stop_ = true;
  }
  cv_.notify_all();
  if (completion_.joinable()) completion_.join();
  cuda::DeviceGuard guard;
  if (guard.Set(device_) != cudaSuccess) return;
  packer_.reset();
  if (stream_ != nullptr) cudaStreamDestroy(stream_);
  if (copy_stream_ != nullptr) cudaStreamDestroy(copy_stream_);
  if (capture_stream_ != nullptr) cudaStreamDestroy(capture_stream_);
}

Status NcclBackend::CheckDevice(int device) const {
  if (device != device_) {
    return InvalidArgument("this communicator's NCCL backend runs on CUDA device " +
                           std::to_string(device_) + " (local rank modulo the devices)");
  }
  return Status::Ok();
}

Status NcclBackend::Validate(const DeviceCollective& c) const {
  if (c.device != device_) return CheckDevice(c.device);
  if (c.tensors.empty() || (c.kind != DeviceOpKind::kAllreduce && c.tensors.size() != 1)) {
    return InvalidArgument("nccl: a collective needs one tensor (an allreduce at least one)");
  }
  const auto ranks = static_cast<size_t>(size_);
  const bool rooted = c.kind == DeviceOpKind::kBroadcast || c.kind == DeviceOpKind::kReduce ||
                      c.kind == DeviceOpKind::kGatherv;
  if (rooted && (c.root < 0 || c.root >= size_)) {
    return InvalidArgument("nccl: root " + std::to_string(c.root) + " is not a rank of " +
                           std::to_string(size_));
  }
  const DeviceTensor& t = c.tensors[0];
  switch (c.kind) {
    case DeviceOpKind::kAllreduce:
    case DeviceOpKind::kBroadcast:
      break;
    case DeviceOpKind::kAllgatherv:
    case DeviceOpKind::kGatherv:
      if (c.bytes_per_rank.size() != ranks) {
        return InvalidArgument("nccl: a gather needs one byte count per rank");
      }
      break;
    case DeviceOpKind::kAlltoallv:
      if (c.bytes_per_rank.size() != ranks || c.recv_bytes_per_rank.size() != ranks) {
        return InvalidArgument("nccl: an alltoallv needs send and receive byte counts per rank");
      }
      break;
    case DeviceOpKind::kReducescatter: {
      size_t total = 0;
      for (size_t n : c.counts_per_rank) total += n;
      if (c.counts_per_rank.size() != ranks || total != t.count) {
        return InvalidArgument(
            "nccl: a reducescatter needs one count per rank, adding up to the "
            "input's elements");
      }
      break;
    }
    case DeviceOpKind::kReduce:
      if (rank_ == c.root && t.count > 0 && t.output == nullptr) {
        return InvalidArgument("nccl: the reduce root has no output");
      }
      break;
  }
  return Status::Ok();
}

StatusOr<bool> NcclBackend::CommReady(const char* call) {
  ncclResult_t state = ncclSuccess;
  CONCORD_NCCL_CHECK(ncclCommGetAsyncError(comm_, &state));
  if (state == ncclSuccess) return true;
  if (state == ncclInProgress) return false;
  return nccl::NcclError(state, call, __FILE__, __LINE__, comm_);
}

Status NcclBackend::WaitComm(std::unique_lock<std::mutex>& comm_lock, Deadline deadline) {
  for (;;) {
    if (comm_aborted_) return Status(Code::kBackendError, "the NCCL communicator was aborted");
    CONCORD_ASSIGN_OR_RETURN(const bool ready, CommReady("ncclCommGetAsyncError"));
    if (ready) return Status::Ok();
    if (deadline.passed()) {
      return TimeoutError("NCCL did not accept the operation within " +
                          std::to_string(timeout_.count()) + " ms [NCCL " + cuda::NcclVersion() +
                          "]");
    }
    comm_lock.unlock();
    std::this_thread::yield();
    comm_lock.lock();
  }
}

StatusOr<void*> NcclBackend::Buffer(size_t bytes) {
  if (bytes > fusion_.size()) {
    CONCORD_ASSIGN_OR_RETURN(
        cuda::DeviceBuffer grown,
        cuda::DeviceBuffer::Allocate(device_, std::max(bytes, 2 * fusion_.size())));
    retired_.push_back(std::move(fusion_));
    fusion_ = std::move(grown);
  }
  return fusion_.data();
}

StatusOr<std::shared_ptr<DeviceEvent>> NcclBackend::Launch(const DeviceCollective& c, Done done) {
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (!aborted_.ok()) return aborted_;
  }
  CONCORD_RETURN_IF_ERROR(Validate(c));
  cuda::DeviceGuard guard;
  CONCORD_CUDA_CHECK(guard.Set(device_));
  RelaxedCapture relaxed;
  if (!connected_) {
    Status connected = Connect(c.deadline);
    if (!connected.ok()) {
      connected =
          connected.WithContext("starting NCCL at this communicator's first CUDA collective");
      Abort(connected);  // nothing was enqueued; later launches fail with this
      return connected;
    }
    connected_ = true;
  }
  // The producers' work first: the backend's stream waits for each ready event and stream.
  std::vector<void*> seen;
  auto first = [&seen](void* handle) {
    if (handle == nullptr || std::find(seen.begin(), seen.end(), handle) != seen.end()) {
      return static_cast<void*>(nullptr);
    }
    seen.push_back(handle);
    return handle;
  };
  for (const DeviceTensor& t : c.tensors) {
    CONCORD_RETURN_IF_ERROR(WaitReady(stream_, first(ReadyStream(t.ready_stream, t.ready_event)),
                                      first(t.ready_event)));
  }
  Status enqueued = Enqueue(c);
  cudaEvent_t finished = nullptr;
  if (enqueued.ok()) {
    const cudaError_t e = cudaEventCreateWithFlags(&finished, cudaEventDisableTiming);
    const cudaError_t r = e == cudaSuccess ? cudaEventRecord(finished, stream_) : e;
    if (r != cudaSuccess) {
      if (finished != nullptr) cudaEventDestroy(finished);
      enqueued = cuda::CudaError(r, "cudaEventRecord(finished, stream_)", __FILE__, __LINE__);
    }
  }
  if (!enqueued.ok()) {
    // Part of it may be on the stream: abort, so nothing of it runs against the peers.
    Abort(enqueued);
    return enqueued;
  }
  auto event = std::make_shared<NcclEvent>(device_, finished);
  {
    std::lock_guard<std::mutex> lock(mu_);
    pending_.push_back(Pending{event, c.deadline, std::move(done), std::move(retired_)});
    retired_.clear();
  }
  cv_.notify_all();
  return std::shared_ptr<DeviceEvent>(event);
}

Status NcclBackend::Enqueue(const DeviceCollective& c) {
  std::unique_lock<std::mutex> lock(comm_mu_);
  if (comm_aborted_) return Status(Code::kBackendError, "the NCCL communicator was aborted");
  switch (c.kind) {
    case DeviceOpKind::kAllreduce:
      CONCORD_RETURN_IF_ERROR(EnqueueAllreduce(c, lock));
      break;
    case DeviceOpKind::kAllgatherv:
      CONCORD_RETURN_IF_ERROR(EnqueueAllgatherv(c));
      break;
    case DeviceOpKind::kReducescatter:
      CONCORD_RETURN_IF_ERROR(EnqueueReducescatter(c, lock));
      break;
    case DeviceOpKind::kAlltoallv:
      CONCORD_RETURN_IF_ERROR(EnqueueAlltoallv(c));
      break;
    case DeviceOpKind::kReduce:
      CONCORD_RETURN_IF_ERROR(EnqueueReduce(c, lock));
      break;
    case DeviceOpKind::kGatherv:
      CONCORD_RETURN_IF_ERROR(EnqueueGatherv(c));
      break;
    case DeviceOpKind::kBroadcast: {
      const DeviceTensor& t = c.tensors[0];
      const size_t bytes = t.count * DTypeSize(c.dtype);
      if (bytes == 0) return Status::Ok();
      CONCORD_NCCL_CHECK(
          ncclBroadcast(t.input, t.output, bytes, ncclUint8, c.root, comm_, stream_));
      break;
    }
  }
  return WaitComm(lock, c.deadline);
}

StatusOr<ncclRedOp_t> NcclBackend::RedOp(const DeviceCollective& c, double* post) const {
  ncclRedOp_t op = ncclSum;
  *post = c.postscale;
  switch (c.op) {
    case ReduceOp::kSum:
      op = ncclSum;
      break;
    case ReduceOp::kMin:
      op = ncclMin;
      break;
    case ReduceOp::kMax:
      op = ncclMax;
      break;
    case ReduceOp::kProduct:
      op = ncclProd;
      break;
    case ReduceOp::kAverage:
      // One rank: the average is the sum. NCCL 2.28.9's one-rank ncclAvg out of place left the
      // last of 4099 float64 elements unwritten on an H200 (nccl_exchange_test, layout 4); its
      // ncclSum there is a plain copy.
      if (size_ == 1) break;
#if NCCL_VERSION_CODE >= NCCL_VERSION(2, 10, 0)
      op = ncclAvg;  // integers: the sum divided by the ranks, truncated
#else
      if (!IsFloatingPoint(c.dtype)) {
        return Status(Code::kUnavailable,
                      "an integer average needs ncclAvg (NCCL 2.10); this is "
                      "NCCL " +
                          cuda::NcclVersion());
      }
      *post /= size_;
#endif
      break;
  }
  return op;
}

Status NcclBackend::EnqueueAllreduce(const DeviceCollective& c,
                                     std::unique_lock<std::mutex>& comm_lock) {
  CONCORD_ASSIGN_OR_RETURN(ncclDataType_t type, NcclType(c.dtype));
  double post = 1.0;
  CONCORD_ASSIGN_OR_RETURN(ncclRedOp_t op, RedOp(c, &post));
  size_t elements = 0;
  for (const DeviceTensor& t : c.tensors) elements += t.count;
  if (elements == 0) return Status::Ok();
  if (c.tensors.size() == 1 && c.prescale == 1.0 && post == 1.0) {
    const DeviceTensor& t = c.tensors[0];
    CONCORD_NCCL_CHECK(ncclAllReduce(t.input, t.output, t.count, type, op, comm_, stream_));
    return Status::Ok();
  }
  // Fused or scaled: pack (with the prescale) into the fusion buffer, reduce it in place, unpack
  // (with the postscale). Both plans have the same slots: offsets depend on sizes only.
  std::vector<cuda::PackTensor> inputs, outputs;
  for (const DeviceTensor& t : c.tensors) {
    inputs.push_back(cuda::PackTensor{t.input, c.dtype, t.count});
    outputs.push_back(cuda::PackTensor{t.output, c.dtype, t.count});
  }
  CONCORD_ASSIGN_OR_RETURN(cuda::PackPlan in_plan, cuda::PlanPack(inputs));
  CONCORD_ASSIGN_OR_RETURN(cuda::PackPlan out_plan, cuda::PlanPack(outputs));
  CONCORD_ASSIGN_OR_RETURN(void* buffer, Buffer(in_plan.total_bytes));
  CONCORD_RETURN_IF_ERROR(
      packer_->Pack(in_plan, buffer, fusion_.size(), c.prescale, stream_, PackerWait(comm_lock)));
  // The padding between slots is reduced too, and never read back.
  CONCORD_NCCL_CHECK(ncclAllReduce(buffer, buffer, in_plan.total_bytes / DTypeSize(c.dtype), type,
                                   op, comm_, stream_));
  CONCORD_RETURN_IF_ERROR(WaitComm(comm_lock, c.deadline));
  return packer_->Unpack(out_plan, buffer, fusion_.size(), post, stream_, PackerWait(comm_lock));
}

Status NcclBackend::EnqueueAllgatherv(const DeviceCollective& c) {
  size_t total = 0;
  for (size_t b : c.bytes_per_rank) total += b;
  if (total == 0) return Status::Ok();
  const DeviceTensor& t = c.tensors[0];
  auto* out = static_cast<uint8_t*>(t.output);
  if (out == nullptr) {
    CONCORD_ASSIGN_OR_RETURN(void* scratch, Buffer(total));
    out = static_cast<uint8_t*>(scratch);
  }
  const bool equal = std::all_of(c.bytes_per_rank.begin(), c.bytes_per_rank.end(),
                                 [&](size_t b) { return b == c.bytes_per_rank[0]; });
  if (equal) {
    CONCORD_NCCL_CHECK(ncclAllGather(t.input, out, c.bytes_per_rank[0], ncclUint8, comm_, stream_));
    return Status::Ok();
  }
  // Different sizes: one broadcast per contributing rank, issued as one group.
  CONCORD_NCCL_CHECK(ncclGroupStart());
  GroupCalls calls(comm_);
  size_t offset = 0;
  for (int r = 0; r < size_ && calls.ok(); ++r) {
    const size_t bytes = c.bytes_per_rank[r];
    if (bytes > 0) {
      const void* send = r == rank_ ? t.input : out + offset;
      calls.Check(ncclBroadcast(send, out + offset, bytes, ncclUint8, r, comm_, stream_),
                  "ncclBroadcast");
    }
    offset += bytes;
  }
  return calls.End();
}

cuda::SlotWait NcclBackend::PackerWait(std::unique_lock<std::mutex>& comm_lock) {
  return [this, &comm_lock]() -> Status {
    comm_lock.unlock();
    // The launch ahead may take milliseconds: no spinning on a core NCCL's threads may need.
    std::this_thread::sleep_for(std::chrono::microseconds(50));
    comm_lock.lock();
    // Looked at after the lock is back: comm_ may have been freed while it was released, and the
    // caller goes on to call NCCL on it once the slot is free.
    if (comm_aborted_) return Status(Code::kBackendError, "the NCCL communicator was aborted");
    return Status::Ok();
  };
}

Status NcclBackend::ScaledCopy(const void* src, void* dst, size_t count, DType dtype, double scale,
                               std::unique_lock<std::mutex>& comm_lock) {
  CONCORD_ASSIGN_OR_RETURN(cuda::PackPlan plan,
                           cuda::PlanPack({cuda::PackTensor{src, dtype, count}}));
  return packer_->Pack(plan, dst, plan.total_bytes, scale, stream_, PackerWait(comm_lock));
}

Status NcclBackend::ScaledCopyOut(const void* src, void* dst, size_t count, DType dtype,
                                  double scale, std::unique_lock<std::mutex>& comm_lock) {
  CONCORD_ASSIGN_OR_RETURN(cuda::PackPlan plan,
                           cuda::PlanPack({cuda::PackTensor{dst, dtype, count}}));
  return packer_->Unpack(plan, src, plan.total_bytes, scale, stream_, PackerWait(comm_lock));
}

Status NcclBackend::EnqueueReducescatter(const DeviceCollective& c,
                                         std::unique_lock<std::mutex>& comm_lock) {
  CONCORD_ASSIGN_OR_RETURN(ncclDataType_t type, NcclType(c.dtype));
  double post = 1.0;
  CONCORD_ASSIGN_OR_RETURN(ncclRedOp_t op, RedOp(c, &post));
  const size_t esize = DTypeSize(c.dtype);
  std::vector<size_t> first(size_);  // elements before each rank's block
  size_t total = 0;
  for (int r = 0; r < size_; ++r) {
    first[r] = total;
    total += c.counts_per_rank[r];
  }
  if (total == 0) return Status::Ok();
  const DeviceTensor& t = c.tensors[0];
  const size_t mine = c.counts_per_rank[rank_];
  const bool equal = std::all_of(c.counts_per_rank.begin(), c.counts_per_rank.end(),
                                 [&](size_t n) { return n == c.counts_per_rank[0]; });
  // NCCL allows one overlap: its in-place layout (the output is this rank's block of the input).
  const bool nccl_in_place =
      equal && t.output == static_cast<const uint8_t*>(t.input) + first[rank_] * esize;
  const bool stage_in = c.prescale != 1.0 ||
                        (!nccl_in_place && Overlap(t.input, total * esize, t.output, mine * esize));
  const bool stage_out = post != 1.0 && mine > 0;
  const size_t in_part = stage_in ? AlignUp(total * esize) : 0;
  const void* send = t.input;
  void* recv = t.output;
  if (stage_in || stage_out) {
    CONCORD_ASSIGN_OR_RETURN(void* buffer, Buffer(in_part + (stage_out ? mine * esize : 0)));
    if (stage_in) {
      CONCORD_RETURN_IF_ERROR(ScaledCopy(t.input, buffer, total, c.dtype, c.prescale, comm_lock));
      send = buffer;
    }
    if (stage_out) recv = static_cast<uint8_t*>(buffer) + in_part;
  }
  if (equal) {
    CONCORD_NCCL_CHECK(ncclReduceScatter(send, recv, mine, type, op, comm_, stream_));
  } else {
    // Uneven blocks: one reduce to each rank, as one group.
    CONCORD_NCCL_CHECK(ncclGroupStart());
    GroupCalls calls(comm_);
    for (int r = 0; r < size_ && calls.ok(); ++r) {
      if (c.counts_per_rank[r] == 0) continue;
      const void* block = static_cast<const uint8_t*>(send) + first[r] * esize;
      // Only the root's receive buffer is written: the others pass their block (never written).
      void* into = r == rank_ ? recv : const_cast<void*>(block);
      calls.Check(ncclReduce(block, into, c.counts_per_rank[r], type, op, r, comm_, stream_),
                  "ncclReduce");
    }
    CONCORD_RETURN_IF_ERROR(calls.End());
  }
  if (!stage_out) return Status::Ok();
  CONCORD_RETURN_IF_ERROR(WaitComm(comm_lock, c.deadline));
  return ScaledCopyOut(recv, t.output, mine, c.dtype, post, comm_lock);
}

Status NcclBackend::EnqueueAlltoallv(const DeviceCollective& c) {
#if NCCL_VERSION_CODE < NCCL_VERSION(2, 7, 0)
  return Status(Code::kUnavailable,
                "alltoall needs ncclSend/ncclRecv (NCCL 2.7); this is NCCL " + cuda::NcclVersion());
#else
  size_t sent = 0, received = 0;
  for (int r = 0; r < size_; ++r) {
    sent += c.bytes_per_rank[r];
    received += c.recv_bytes_per_rank[r];
  }
  if (sent == 0 && received == 0) return Status::Ok();
  const DeviceTensor& t = c.tensors[0];
  const auto* in = static_cast<const uint8_t*>(t.input);
  auto* out = static_cast<uint8_t*>(t.output);
  // Receives could overwrite input not yet sent: an overlapping input is sent from a copy.
  const bool copy_in = out != nullptr && Overlap(in, sent, out, received);
  const size_t in_part = copy_in ? AlignUp(sent) : 0;
  if (copy_in || out == nullptr) {
    CONCORD_ASSIGN_OR_RETURN(void* buffer, Buffer(in_part + (out == nullptr ? received : 0)));
    auto* staging = static_cast<uint8_t*>(buffer);
    if (copy_in) {
      CONCORD_CUDA_CHECK(cudaMemcpyAsync(staging, in, sent, cudaMemcpyDeviceToDevice, stream_));
      in = staging;
    }
    if (out == nullptr) out = staging + in_part;
  }
  CONCORD_NCCL_CHECK(ncclGroupStart());
  GroupCalls calls(comm_);
  size_t send_at = 0, recv_at = 0;
  for (int r = 0; r < size_ && calls.ok(); ++r) {
    if (c.bytes_per_rank[r] > 0) {
      calls.Check(ncclSend(in + send_at, c.bytes_per_rank[r], ncclUint8, r, comm_, stream_),
                  "ncclSend");
    }
    if (c.recv_bytes_per_rank[r] > 0) {
      calls.Check(ncclRecv(out + recv_at, c.recv_bytes_per_rank[r], ncclUint8, r, comm_, stream_),
                  "ncclRecv");
    }
    send_at += c.bytes_per_rank[r];
    recv_at += c.recv_bytes_per_rank[r];
  }
  return calls.End();
#endif
}

Status NcclBackend::EnqueueReduce(const DeviceCollective& c,
                                  std::unique_lock<std::mutex>& comm_lock) {
  CONCORD_ASSIGN_OR_RETURN(ncclDataType_t type, NcclType(c.dtype));
  double post = 1.0;
  CONCORD_ASSIGN_OR_RETURN(ncclRedOp_t op, RedOp(c, &post));
  const DeviceTensor& t = c.tensors[0];
  const size_t n = t.count;
  if (n == 0) return Status::Ok();
  const size_t bytes = n * DTypeSize(c.dtype);
  const bool root = rank_ == c.root;
  const bool stage_in = c.prescale != 1.0 ||
                        (root && t.output != t.input && Overlap(t.input, bytes, t.output, bytes));
  const bool stage_out = root && post != 1.0;
  const size_t in_part = stage_in ? AlignUp(bytes) : 0;
  const void* send = t.input;
  void* recv = root ? t.output : const_cast<void*>(t.input);  // a non-root's is never written
  if (stage_in || stage_out) {
    CONCORD_ASSIGN_OR_RETURN(void* buffer, Buffer(in_part + (stage_out ? bytes : 0)));
    if (stage_in) {
      CONCORD_RETURN_IF_ERROR(ScaledCopy(t.input, buffer, n, c.dtype, c.prescale, comm_lock));
      send = buffer;
      if (!root) recv = buffer;
    }
    if (stage_out) recv = static_cast<uint8_t*>(buffer) + in_part;
  }
  CONCORD_NCCL_CHECK(ncclReduce(send, recv, n, type, op, c.root, comm_, stream_));
  if (!stage_out) return Status::Ok();
  CONCORD_RETURN_IF_ERROR(WaitComm(comm_lock, c.deadline));
  return ScaledCopyOut(recv, t.output, n, c.dtype, post, comm_lock);
}

Status NcclBackend::EnqueueGatherv(const DeviceCollective& c) {
#if NCCL_VERSION_CODE < NCCL_VERSION(2, 7, 0)
  return Status(Code::kUnavailable,
                "gather needs ncclSend/ncclRecv (NCCL 2.7); this is NCCL " + cuda::NcclVersion());
#else
  size_t total = 0;
  std::vector<size_t> at(size_);
  for (int r = 0; r < size_; ++r) {
    at[r] = total;
    total += c.bytes_per_rank[r];
  }
  if (total == 0) return Status::Ok();
  const DeviceTensor& t = c.tensors[0];
  if (rank_ != c.root) {
    if (c.bytes_per_rank[rank_] == 0) return Status::Ok();
    CONCORD_NCCL_CHECK(
        ncclSend(t.input, c.bytes_per_rank[rank_], ncclUint8, c.root, comm_, stream_));
    return Status::Ok();
  }
  auto* out = static_cast<uint8_t*>(t.output);
  if (out == nullptr) {
    CONCORD_ASSIGN_OR_RETURN(void* scratch, Buffer(total));
    out = static_cast<uint8_t*>(scratch);
  }
  // The root's own rows first, on the same stream: the receives come after them.
  if (c.bytes_per_rank[rank_] > 0 && out + at[rank_] != t.input) {
    CONCORD_CUDA_CHECK(cudaMemcpyAsync(out + at[rank_], t.input, c.bytes_per_rank[rank_],
                                       cudaMemcpyDeviceToDevice, stream_));
  }
  CONCORD_NCCL_CHECK(ncclGroupStart());
  GroupCalls calls(comm_);
  for (int r = 0; r < size_ && calls.ok(); ++r) {
    if (r == rank_ || c.bytes_per_rank[r] == 0) continue;
    calls.Check(ncclRecv(out + at[r], c.bytes_per_rank[r], ncclUint8, r, comm_, stream_),
                "ncclRecv");
  }
  return calls.End();
#endif
}

void NcclBackend::AbortComm(const Status& status) {
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (aborted_.ok()) aborted_ = status;
  }
  {
    // ncclCommAbort sets the communicator's device and then the caller's again: this thread is on
    // it already, so no context is made on the caller's (device 0 on a thread that never chose).
    cuda::DeviceGuard guard;
    guard.Set(device_);
    std::lock_guard<std::mutex> lock(comm_mu_);
    // Frees the communicator and stops its kernels, so a peer that never comes cannot hang us.
    if (comm_ != nullptr && !comm_aborted_) ncclCommAbort(comm_);
    comm_aborted_ = true;
  }
  cv_.notify_all();
}

void NcclBackend::Abort(const Status& status) {
  AbortComm(status);
  // The callback that called this returns first; the completion thread then fails the rest.
  if (OnCompletionThread()) return;
  std::unique_lock<std::mutex> lock(mu_);
  cv_.wait(lock, [&] { return pending_.empty() && !busy_; });
}

bool NcclBackend::StreamIdle(std::chrono::milliseconds within) {
  const Deadline deadline = Deadline::After(within);
  for (;;) {
    const cudaError_t query = cudaStreamQuery(stream_);
    if (query != cudaErrorNotReady) return query == cudaSuccess;
    if (deadline.passed()) return false;
    std::this_thread::sleep_for(std::chrono::microseconds(100));
  }
}

void NcclBackend::FailPending(std::unique_lock<std::mutex>& lock) {
  Status status = aborted_;
  busy_ = true;  // Drain() and Abort() wait for these callbacks too
  lock.unlock();
  if (!StreamIdle(kAbortDrain)) {
    status = Status(status.code(), status.message() +
                                       " (the device had not stopped the work queued before the "
                                       "abort within " +
                                       std::to_string(kAbortDrain.count()) +
                                       " s: it may still write these collectives' outputs)");
  }
  lock.lock();
  std::deque<Pending> failed;
  failed.swap(pending_);
  lock.unlock();
  for (Pending& p : failed) p.done(status);
  failed.clear();  // frees the retired buffers outside the lock
  lock.lock();
  busy_ = false;
  cv_.notify_all();
}

StatusOr<std::shared_ptr<void>> NcclBackend::CaptureReady(void* ready_stream, void* ready_event) {
  cuda::DeviceGuard guard;
  CONCORD_CUDA_CHECK(guard.Set(device_));
  RelaxedCapture relaxed;
  CONCORD_ASSIGN_OR_RETURN(const cudaEvent_t captured, ready_events_->Take());
  std::shared_ptr<void> handle(
      captured, [events = ready_events_](void* e) { events->Give(static_cast<cudaEvent_t>(e)); });
  const auto stream = static_cast<cudaStream_t>(ready_stream);
  if (ready_event == nullptr) {
    // The stream's work so far; with no stream, the legacy default stream's (ReadyStream).
    CONCORD_CUDA_CHECK(cudaEventRecord(captured, stream != nullptr ? stream : cudaStreamLegacy));
    return handle;
  }
  // The caller's event as recorded now, and the stream's work so far: capture_stream_ waits for
  // both, then records ours.
  std::lock_guard<std::mutex> lock(capture_mu_);
  if (stream != nullptr) {
    CONCORD_CUDA_CHECK(cudaEventRecord(captured, stream));
    CONCORD_CUDA_CHECK(cudaStreamWaitEvent(capture_stream_, captured, 0));
  }
  CONCORD_CUDA_CHECK(
      cudaStreamWaitEvent(capture_stream_, static_cast<cudaEvent_t>(ready_event), 0));
  CONCORD_CUDA_CHECK(cudaEventRecord(captured, capture_stream_));
  return handle;
}

Status NcclBackend::CopyLocal(void* dst, const void* src, size_t bytes, void* ready_stream,
                              void* ready_event) {
  if (bytes == 0) return Status::Ok();
  cuda::DeviceGuard guard;
  CONCORD_CUDA_CHECK(guard.Set(device_));
  RelaxedCapture relaxed;
  std::lock_guard<std::mutex> lock(copy_mu_);
  CONCORD_RETURN_IF_ERROR(
      WaitReady(copy_stream_, ReadyStream(ready_stream, ready_event), ready_event));
  CONCORD_CUDA_CHECK(cudaMemcpyAsync(dst, src, bytes, cudaMemcpyDefault, copy_stream_));
  CONCORD_CUDA_CHECK(cudaStreamSynchronize(copy_stream_));
  return Status::Ok();
}

Status NcclBackend::Drain(Deadline deadline) {
  std::unique_lock<std::mutex> lock(mu_);
  auto idle = [&] { return pending_.empty() && !busy_; };
  if (deadline.infinite()) {
    cv_.wait(lock, idle);
  } else if (!cv_.wait_until(lock, deadline.at(), idle)) {
    return TimeoutError("NCCL collectives still running at the deadline [NCCL " +
                        cuda::NcclVersion() + "]");
  }
  return aborted_;
}

void NcclBackend::CompletionLoop() {
  cuda::DeviceGuard guard;
  const cudaError_t set = guard.Set(device_);
  RelaxedCapture relaxed;
  std::unique_lock<std::mutex> lock(mu_);
  for (;;) {
    cv_.wait(lock, [&] { return stop_ || !pending_.empty(); });
    if (pending_.empty()) return;  // stopping
    if (!aborted_.ok()) {
      FailPending(lock);
      continue;
    }
    Pending& front = pending_.front();
    if (!front.at_front) {
      // The device runs the launches one after another: this one's time starts now, when the one
      // before it has completed, however long it waited in line.
      front.at_front = true;
      const Deadline fresh = Deadline::After(timeout_);
      if (!front.deadline.infinite() && front.deadline.at() < fresh.at()) front.deadline = fresh;
    }
    std::shared_ptr<NcclEvent> event = front.event;
    const Deadline deadline = front.deadline;
    lock.unlock();
    cudaError_t query = set == cudaSuccess ? cudaEventQuery(event->event()) : set;
    // Another thread capturing a CUDA graph in global mode: not an error of ours; look again.
    if (query == cudaErrorStreamCaptureUnsupported || query == cudaErrorStreamCaptureImplicit) {
      query = cudaErrorNotReady;
    }
    Status failure = Status::Ok();
    if (query == cudaSuccess) {
      lock.lock();
      if (!aborted_.ok()) continue;  // aborted meanwhile: it fails with the rest
      // Only this thread takes launches out of pending_: the front is still this one.
      busy_ = true;
      Done done = std::move(pending_.front().done);
      lock.unlock();
      done(Status::Ok());
      lock.lock();
      std::optional<Pending> finished(std::move(pending_.front()));
      pending_.pop_front();
      busy_ = false;
      cv_.notify_all();
      lock.unlock();
      finished.reset();  // frees the retired buffers (their work is done) outside the lock
      lock.lock();
      continue;
    }
    if (query != cudaErrorNotReady) {
      failure = cuda::CudaError(query, "cudaEventQuery", __FILE__, __LINE__);
    } else {
      std::lock_guard<std::mutex> comm_lock(comm_mu_);
      ncclResult_t async = ncclSuccess;
      if (comm_ != nullptr && !comm_aborted_) {
        // A call that fails says so itself: reported as the communicator's error.
        const ncclResult_t asked = ncclCommGetAsyncError(comm_, &async);
        if (asked != ncclSuccess) async = asked;
      }
      if (async != ncclSuccess && async != ncclInProgress) {
        failure = nccl::NcclError(async, "ncclCommGetAsyncError", __FILE__, __LINE__, comm_);
      } else if (deadline.passed()) {
        failure =
            TimeoutError("NCCL collective not finished within " + std::to_string(timeout_.count()) +
                         " ms (a peer did not arrive or hung): communicator aborted [NCCL " +
                         cuda::NcclVersion() + "]");
      }
    }
    if (!failure.ok()) AbortComm(failure);  // the next round fails what is pending
    lock.lock();
    cv_.wait_for(lock, std::chrono::microseconds(50), [&] { return stop_ || !aborted_.ok(); });
  }
}

}  // namespace

StatusOr<int> ProbeNcclDevice(int local_rank) {
  auto count = cuda::DeviceCount();
  if (!count.ok()) {
    return Status(Code::kUnavailable, "no usable GPU: " + count.status().message() + " [NCCL " +
                                          cuda::NcclVersion() + "]");
  }
  return std::max(local_rank, 0) % *count;
}

StatusOr<std::unique_ptr<DeviceBackend>> CreateNcclBackend(int device,
                                                           const BackendOptions& options,
                                                           Store* store) {
  if (store == nullptr) return InvalidArgument("the nccl backend needs a rendezvous store");
  auto backend = std::make_unique<NcclBackend>(options.rank, options.size, device, options.timeout,
                                               store, options.prefix + "/nccl_unique_id");
  CONCORD_RETURN_IF_ERROR(backend->Start());
  return std::unique_ptr<DeviceBackend>(std::move(backend));
}

}  // namespace concord
