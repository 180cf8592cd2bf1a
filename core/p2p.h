// Point-to-point sends and receives by (peer, tag), for pipeline stages: the engine's component
// that checks them and hands them to a P2pTransport (backends/p2p_transport.h), which moves each
// message (a small header: dtype, shape, bytes; then the payload) straight between the two ranks
// on connections of its own. Nothing is negotiated: no coordinator, no step, no control plane.
//
// Contract. One PointToPoint per communicator, owned by its engine (no process globals). Submit()
// is thread-safe and never blocks on the network: it refuses a bad operation at once with
// kInvalidArgument (peer out of range or this rank, negative tag or above the transport's largest,
// NULL data with elements, a bad shape or dtype, a CUDA tensor on another device, a ready stream
// or event for a CPU tensor) or kUnavailable (a CUDA tensor without a device backend; a
// communicator without a transport), completing nothing; otherwise the transport's progress thread
// (or the submitting thread, when it completes at once) completes the request exactly once.
// - CUDA tensors travel through host memory (DeviceBackend::CopyLocal, on a stream of its own):
//   a send copies its tensor out before Submit() returns, after the work queued on its ready
//   stream and event; a recv copies the message in, after its ready stream and event, before it
//   completes (on the progress thread). The network never sees device memory, so any transport
//   carries them; a recv of a CUDA tensor names its tensor (it cannot own device memory).
// - A send reads its data until it completes. Messages between two ranks with one tag arrive in
//   order (FIFO per (peer, tag)); tags and peers are independent; any number may be in flight.
// - A recv that names a tensor (expected dtype and shape, and its buffer) completes with kMismatch
//   naming both when the sender sent another dtype or shape: the message is consumed and dropped,
//   so the next one on that (peer, tag) is received intact. A recv without a tensor takes the
//   sender's dtype and shape: the request owns the bytes (RequestState::Output: data, bytes,
//   shape, dtype), as an allgather without an output buffer does. A message whose host memory
//   (the request's own, a CUDA recv's staging) cannot be allocated is dropped the same way: the
//   recv completes with kSystemError saying so.
// - A recv not matched within the communicator's timeout completes with kTimeout; a peer that
//   fails fails what is in flight with it (kPeerFailure naming it).
// - A peer's failure is not always the job's: a rank that exits after a failure elsewhere closes
//   its connections too. So with more than two ranks an operation the transport fails with
//   kPeerFailure is held (no thread waits for it) until Fail() gives the cause (the engine's
//   failure: rank 0's abort names the rank that caused it), which completes it with the cause,
//   its own failure as context (as it does one that the transport reports while Fail() closes
//   it: the peer left because the job failed, before the cause reached this rank); or until the
//   communicator's timeout and a second more pass (the time the engine gives a failed collective to
//   learn its cause), or Close(): then with its own failure. The first hold starts a thread that
//   keeps that time, until Close(). With two ranks the peer is the only other rank, and its failure
//   completes the operation at once; so does a failure because the peer finalized
//   (P2pTransport::PeerFinalized: its Finish() told this rank), and one held already is completed
//   within kFinalizedCheck once its peer says so.
// - Close() (the engine's Shutdown) and Fail() complete everything in flight with their status,
//   on the calling thread, and refuse later operations. Callbacks run on the transport's progress
//   thread, a waiter driving it, the submitting thread itself (an operation that completes at
//   once) or the hold's thread, none of which may wait for a request of this communicator or
//   finalize it (OnOwnThread()).
// Requests wait through wait_gate(): the waiting thread runs the transport's progress itself
// where the transport can (P2pTransport::Drive: MPI) and the host has a core for each local rank
// (drive_busy_poll > 0), so callbacks may run on the waiter, as an engine's do; plainly on their
// state otherwise (the progress thread drives).
#pragma once

#include <chrono>
#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <thread>
#include <vector>

#include "backends/device_backend.h"
#include "backends/p2p_transport.h"
#include "base/mutex.h"
#include "core/request_state.h"
#include "core/wait_gate.h"

namespace concord {

// One send or recv, as the C API hands it over.
struct P2pEntry {
  bool send = true;
  int peer = -1;
  int64_t tag = 0;
  // send: the tensor sent; recv with expect: the tensor expected (data: where it lands).
  bool expect = true;  // recv only: false takes the sender's dtype and shape (request-owned)
  DType dtype = DType::kUint8;
  std::vector<int64_t> shape;
  int device = -1;  // -1: CPU
  void* data = nullptr;
  // CUDA tensors only: the copy waits for the work queued so far on this cudaStream_t and for
  // this recorded cudaEvent_t (either may be null), as they are when the operation is submitted:
  // Submit captures them (DeviceBackend::CaptureReady) and the copy waits for that (a recv's copy
  // runs later, on another thread).
  void* ready_stream = nullptr;
  void* ready_event = nullptr;
  std::shared_ptr<RequestState> state;
};

class PointToPoint {
 public:
  // `transport` may be null (this communicator's backend has none): then every operation on a
  // communicator of more than one rank is refused with `unavailable`. `drive_busy_poll`: how long
  // a waiter driving the transport polls without yielding (P2pTransport::Drive).
  // `result_buffers`: where a recv that takes the sender's shape gets its result's memory.
  // `device`: the communicator's device backend, which must outlive Close(), or null; then CUDA
  // tensors are refused with `device_unavailable`.
  PointToPoint(int rank, int size, std::chrono::milliseconds timeout,
               std::chrono::microseconds drive_busy_poll, std::unique_ptr<P2pTransport> transport,
               std::shared_ptr<ResultBuffers> result_buffers, Status unavailable,
               DeviceBackend* device = nullptr,
               Status device_unavailable = Status(Code::kUnavailable, "no GPU backend"));
  ~PointToPoint();
  PointToPoint(const PointToPoint&) = delete;
  PointToPoint& operator=(const PointToPoint&) = delete;

  Status Submit(P2pEntry entry) EXCLUDES(mu_);
  void Close(const Status& status) EXCLUDES(mu_);
  // The communicator finalizes: tells the peers (P2pTransport::Finish), then Close(status) where
  // that closed the transport; elsewhere Close() comes later (MPI: the transport refuses later
  // operations meanwhile, which complete with `status`).
  void Finish(const Status& status) EXCLUDES(mu_);
  // Close(cause), completing the held peer failures with the cause (the communicator failed).
  void Fail(const Status& cause) EXCLUDES(mu_);
  // Whether the calling thread is the transport's progress thread or is running one of this
  // object's completions (a user callback).
  bool OnOwnThread() const;
  std::shared_ptr<WaitGate> wait_gate() const { return gate_; }
  // The transport (null when none), for the clock sync at init (core/clock_sync.h), which runs on
  // it before any operation can be submitted.
  P2pTransport* transport() const { return transport_.get(); }

 private:
  // How much longer than the timeout a peer failure is held for its cause (as Engine does for
  // a failed collective).
  static constexpr std::chrono::seconds kHoldExtra{1};
  // How often the hold's thread looks whether a held failure's peer has finalized since.
  static constexpr std::chrono::milliseconds kFinalizedCheck{100};
  // A peer failure held for the cause (see the contract above): `what` says which operation.
  struct HeldFailure {
    std::shared_ptr<RequestState> state;
    Status failure;
    std::string what;
    int peer;
    Deadline until;
  };

  Status Check(const P2pEntry& e) const;
  // Completes an operation with `s`, from the transport's completion: holds it instead when `s`
  // is a peer failure that may not be the job's cause.
  void Complete(const std::shared_ptr<RequestState>& state, const Status& s, bool send, int peer,
                int64_t tag) EXCLUDES(mu_);
  // The hold's thread: completes each held failure with its own status once its time has passed,
  // until Close().
  void ReleaseHeldInTime() EXCLUDES(mu_);
  // Close() and Fail(): `cause` null completes the held failures with their own status.
  void CloseWith(const Status& status, const Status* cause) EXCLUDES(mu_);
  // A peer failure of `what` ("send to rank 2 with tag 7") reported as the communicator's
  // failure `cause`, which explains it.
  Status BecauseOf(const Status& cause, const std::string& what, const Status& failure) const;

  const int rank_;
  const int size_;
  const std::chrono::milliseconds timeout_;
  const Status unavailable_;
  std::unique_ptr<P2pTransport> transport_;  // fixed after construction; closed by Close()
  const std::shared_ptr<ResultBuffers> result_buffers_;  // what a recv of the sender's shape owns
  DeviceBackend* const device_;                          // null: CUDA tensors are refused
  const Status device_unavailable_;
  Mutex mu_;
  Status closed_ GUARDED_BY(mu_);
  // Fail()'s cause: a peer failure the transport reports after it (while it closes) is that.
  std::optional<Status> cause_ GUARDED_BY(mu_);
  std::vector<HeldFailure> held_ GUARDED_BY(mu_);
  CondVar held_changed_;                    // a failure held, or closed
  std::thread hold_timer_ GUARDED_BY(mu_);  // ReleaseHeldInTime, from the first hold
  std::shared_ptr<WaitGate> gate_;
};

}  // namespace concord
