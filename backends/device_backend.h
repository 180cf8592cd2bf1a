// The asynchronous data plane for device (GPU) tensors: collectives that the caller launches and
// that complete later, while the caller goes on (NCCL now; a fake in the unit tests). A device
// backend sees only base types: no core headers, no CUDA headers (streams and events are `void*`,
// a cudaStream_t and a cudaEvent_t).
//
// Contract:
// - Launch() is called by one thread (the engine's), collectively: every rank launches the same
//   collectives in the same order (the coordinator guarantees it). It checks the collective, makes
//   its work wait for each tensor's ready stream or ready event, enqueues it on the backend's own
//   stream(s) and returns without waiting for the device. It blocks the host only while the library
//   accepts the launch, and never past the collective's deadline. A backend may start its
//   communicator in its first Launch() (NCCL does), which then also waits for every peer's first
//   launch; a failure to start fails that Launch() and aborts the backend.
// - When Launch() succeeds, `done` is called exactly once, later, on the backend's completion
//   thread (never inside Launch()), when the collective has finished on the device (its outputs
//   may be read) or has failed; a backend may run those that Abort() fails on the thread calling
//   Abort() instead (the in-process fake does; NCCL fails them on its completion thread, once the
//   work queued on the device has stopped, and Abort() waits for that unless called there).
//   Completions come in launch order: a failure is never reported before an earlier collective's
//   `done` has returned. The device runs collectives one after another, so a collective's time
//   counts from when the one before it completed: it fails with kTimeout once both its deadline
//   and the backend's timeout after it came first have passed, and so does every one launched
//   after it: the backend aborts its communicator, so a peer that never arrives cannot hang the
//   job. Any other failure (a peer's death, a library error) aborts it too. After an abort every
//   later Launch() fails.
// - When Launch() fails, `done` is never called and nothing was enqueued that could still run.
// - The returned DeviceEvent lets a consumer order its own device work after the collective
//   without blocking the host; it stays usable after the backend is gone.
// - CopyLocal() moves bytes between this rank's device and host memory for the point-to-point
//   operations on device tensors (core/p2p.h), which travel through host memory: on a stream of
//   its own, never behind a collective (a send must not wait for a collective its peer joins only
//   after receiving it), synchronously. It is local (no peer takes part) and thread-safe.
// - CaptureReady() is called on the thread that enqueues an operation on a device tensor, when it
//   enqueues it: what the operation must wait for is the work queued on the caller's ready stream
//   so far and its ready event as recorded so far, not what the stream holds when the operation is
//   launched later (the caller's later kernels, the backward pass of the next layers, would delay
//   it, and a per-thread default stream would be another thread's there). The engine and the
//   point-to-point operations then pass only the captured event on (ready_stream null). Local and
//   thread-safe.
// - Drain() blocks until every launched collective has completed (its `done` has returned, for
//   those the device finished), and returns the abort status once the backend was aborted. Abort()
//   may be called from any thread; the destructor aborts what is still in flight and joins the
//   completion thread.
#pragma once

#include <cstddef>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "backends/backend.h"
#include "base/clock.h"
#include "base/dtype.h"
#include "base/status.h"

namespace concord {

// One tensor of a device collective. input and output are device addresses on the collective's
// device (equal when in place).
struct DeviceTensor {
  const void* input = nullptr;
  void* output = nullptr;
  size_t count = 0;  // elements (allgatherv: this rank's bytes are bytes_per_rank)
  // The collective waits for the work queued so far on ready_stream and for ready_event; with
  // neither, for the legacy default stream (CUDA's NULL stream: stream 0's kernels, a pageable
  // cudaMemcpy still in flight, and so every blocking stream's work so far). CopyLocal alike. The
  // engine passes an event of CaptureReady()'s, made when the tensor was enqueued.
  void* ready_stream = nullptr;
  void* ready_event = nullptr;
};

enum class DeviceOpKind {
  kAllreduce,
  kAllgatherv,
  kBroadcast,
  kReducescatter,
  kAlltoallv,
  kReduce,
  kGatherv,
};

struct DeviceCollective {
  DeviceOpKind kind = DeviceOpKind::kAllreduce;
  int device = 0;
  DType dtype = DType::kFloat32;
  // Allreduce, reducescatter, reduce: out = postscale * reduce(prescale * in); kAverage divides
  // the sum by the number of ranks (integers truncate toward zero). Several allreduced tensors
  // (same dtype, op and scales) are fused: they travel as one message through the backend's
  // fusion buffer.
  ReduceOp op = ReduceOp::kSum;
  double prescale = 1.0;
  double postscale = 1.0;
  int root = 0;  // broadcast, reduce, gatherv
  // Allgatherv, gatherv: rank r contributes bytes_per_rank[r] bytes; tensors[0].output receives
  // them all in rank order (gatherv: on the root only). A null output: the backend receives into
  // scratch memory and drops the result. Alltoallv: this rank sends bytes_per_rank[r] bytes of
  // its input (rank order) to rank r, and receives recv_bytes_per_rank[r] from rank r into its
  // output (rank order; a null output: into scratch, dropped).
  std::vector<size_t> bytes_per_rank;
  std::vector<size_t> recv_bytes_per_rank;
  // Reducescatter: the input holds sum(counts_per_rank) elements, rank r's block after those of
  // ranks 0 .. r-1; this rank's output receives its block of the reduction (counts_per_rank[rank]
  // elements). Every rank gives the same counts. An output that overlaps the input is allowed.
  std::vector<size_t> counts_per_rank;
  // Reduce: tensors[0].count elements; the root's output receives the reduction, the others'
  // output is not written (it may be null).
  std::vector<DeviceTensor> tensors;  // allreduce: 1 or more; the other kinds: exactly 1
  Deadline deadline = Deadline::Infinite();
};

// Completion of one launched collective on the device.
class DeviceEvent {
 public:
  virtual ~DeviceEvent() = default;
  // Makes `stream` wait, on the device, until the collective has finished; returns at once.
  virtual Status StreamWait(void* stream) = 0;
};

class DeviceBackend {
 public:
  using Done = std::function<void(const Status&)>;

  virtual ~DeviceBackend() = default;
  virtual const char* name() const = 0;
  virtual int rank() const = 0;
  virtual int size() const = 0;
  // The device this rank's communicator runs on; a tensor elsewhere is refused by CheckDevice().
  virtual int device() const = 0;
  // OK when a tensor on `device` can be used with this backend, else a clear error.
  virtual Status CheckDevice(int device) const = 0;

  virtual StatusOr<std::shared_ptr<DeviceEvent>> Launch(const DeviceCollective& collective,
                                                        Done done) = 0;
  // An event of the backend's own that captures, now and on the calling thread, the work queued so
  // far on `ready_stream` and `ready_event` as last recorded (either may be null; with neither,
  // the legacy default stream's work so far, as DeviceTensor says). The handle owns it: the event
  // goes back to the backend with the handle's last copy, which may be before the work it waits
  // for has run (a wait already issued on it stays), and may outlive the backend.
  virtual StatusOr<std::shared_ptr<void>> CaptureReady(void* ready_stream, void* ready_event) = 0;
  // Copies `bytes` from src to dst (one of them device memory of device(), the other host
  // memory) once the work queued so far on ready_stream and ready_event (each may be null) has
  // run, and returns when the bytes have arrived or the copy failed.
  virtual Status CopyLocal(void* dst, const void* src, size_t bytes, void* ready_stream,
                           void* ready_event) = 0;
  // Waits until every launched collective has completed; kTimeout when the deadline passes first.
  virtual Status Drain(Deadline deadline) = 0;
  // Fails every collective in flight with `status`, aborts the communicator. Thread-safe.
  virtual void Abort(const Status& status) = 0;
  // Whether the calling thread is the backend's completion thread (where `done` runs, except for
  // the collectives Abort() fails on the thread calling it, where the backend does). Thread-safe.
  virtual bool OnCompletionThread() const = 0;
  // A callable, for any thread and valid after the backend is gone, that aborts the communicator
  // without waiting and without running any `done` on the caller's thread: the collectives in
  // flight then fail promptly, on the completion thread, instead of waiting for a peer that is
  // gone. The engine calls it from its control plane's failure listener. Empty (the default):
  // the backend's own failure detection and deadlines apply.
  virtual std::function<void()> Interrupter() { return nullptr; }
};

// The device backends this build has ("nccl" when built with CUDA and NCCL; else none).
std::vector<std::string> BuiltDeviceBackends();
// The device backend `name` would use on this rank (local_rank modulo the usable devices), or
// kUnavailable saying why it cannot run here (not built; no usable GPU, with CUDA's error string).
// Local: talks to no peer.
StatusOr<int> ProbeDeviceBackend(const std::string& name, int local_rank);
// Creates device backend `name` on `device`. Every rank calls it with the same name and
// options.prefix; it may talk to its peers then or only at the first Launch() (NCCL), through
// `store`, which must outlive the backend. Blocks at most options.timeout.
StatusOr<std::unique_ptr<DeviceBackend>> CreateDeviceBackend(const std::string& name, int device,
                                                             const BackendOptions& options,
                                                             Store* store);

}  // namespace concord
