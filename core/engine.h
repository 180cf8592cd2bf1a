// The engine: one per communicator. It owns the tensor queue, the response cache, the coordinator
// (on rank 0), the control plane, the lanes (backends and their buffers), the device backend, the
// compressors and their per-tensor state, and one background thread that negotiates and executes.
// Nothing in it is process-global. Small CPU allreduces travel with their negotiation and come
// back reduced by the coordinator (coordinator.h); compressed ones run in engine_compression.cc.
//
// Threading: Enqueue(), GroupStart()/GroupEnd() and the accessors may be called from any thread.
// The background thread is the only one that touches the control plane, the cache, the
// coordinator and the queue's negotiation side. It sleeps in the control plane's Receive() until
// a message arrives or Enqueue() wakes it: no fixed cycle unless cycle_time_ms asks to gather work.
//
// Lanes: the data plane has config.lanes lanes, each a backend with its own connections and its
// own fusion buffer. The batches of one response list are spread over the lanes (greedily by
// bytes, identically on every rank) and run concurrently: lane 0 on the engine thread, the others
// on their LaneWorker threads, so one collective's latency hides behind another's transfer. The
// engine thread waits for every lane before it goes on, and a barrier runs alone, after every
// batch before it. The direct (unfused) allreduces of a list with one dtype and reduction run as
// one collective over all their buffers (Backend::AllreduceSpans; on Gloo one pipelined ring),
// cut into shares of at least kMinSliceBytes that run on different lanes. Completion callbacks run
// on the thread of the lane that ran the operation, and on the engine thread for direct
// allreduces, which complete when the whole list has run.
//
// Devices: CPU tensors run on the lanes; CUDA tensors on the device backend (DevicePlane), which
// is asynchronous: the engine thread launches each device batch in plan order and goes on
// negotiating while the GPU works; the device backend's completion thread completes the requests
// (their callbacks run there). A device failure or deadline fails the engine like any other error.
// A barrier first waits for every device collective before it. Tensors of different devices are
// never fused (the fusion planner compares TensorRequest::device).
//
// Progress by the waiter: a thread that waits for a request (Wait(), the C API's concord_wait and
// every blocking call) runs the engine's steps itself while it waits, and the background thread
// stands aside (parks) meanwhile, so a blocking operation costs no hand-off between threads: the
// waiter negotiates, executes and completes its own request. Whoever runs a step holds step_mu_;
// the waiter wakes an engine thread blocked in Receive() so it finishes its step and parks. When
// the last waiter leaves with nothing else in flight the engine thread rests: it polls every
// kRestPoll (backing off to kMaxRestPoll) instead of blocking in Receive(), so the next waiter
// finds step_mu_ free; an enqueue ends the rest at once. Callbacks then run on the waiting thread.
// config.waiter_progress off, a wait on the engine's own threads (a callback) and a wait after the
// engine stopped all wait plainly.
//
// Failure: the first error (a peer failed, a backend or protocol error, an abort from rank 0)
// fails the engine: every request in flight completes with that error, later enqueues return it,
// and the connections close at once so the other ranks notice. Shutdown() (also the destructor)
// first runs a negotiated barrier with every rank (waiting at most the timeout), so no rank closes
// while a peer still needs its bytes, then completes what is in flight with kNotInitialized and
// joins the thread.
#pragma once

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <thread>
#include <vector>

#include "backends/backend.h"
#include "backends/control_plane.h"
#include "backends/device_backend.h"
#include "base/log.h"
#include "compression/compressor.h"
#include "core/config.h"
#include "core/coordinator.h"
#include "core/fusion_planner.h"
#include "core/lane_worker.h"
#include "core/response_cache.h"
#include "core/tensor_queue.h"
#include "core/wait_gate.h"

namespace concord {

// Counters for tests and benchmarks; read with relaxed atomics from any thread.
struct EngineStats {
  std::atomic<uint64_t> responses_cached{0};   // executed through the cache bit fast path
  std::atomic<uint64_t> responses_full{0};     // executed from full responses (incl. errors)
  std::atomic<uint64_t> response_lists{0};     // response messages executed
  std::atomic<uint64_t> batches{0};            // collectives run
  std::atomic<uint64_t> fused_tensors{0};      // tensors that went through the fusion buffer
  std::atomic<uint64_t> inline_reductions{0};  // allreduces the coordinator reduced inline
  std::atomic<uint64_t> device_launches{0};    // collectives handed to the device backend
};

// The engine's device side: the device backend, or none and why (the error a CUDA tensor gets).
struct DevicePlane {
  std::unique_ptr<DeviceBackend> backend;
  Status unavailable = Status(Code::kUnavailable, "no GPU backend was started");
};

class Engine {
 public:
  // Takes ownership of the transports and starts the background thread. `lanes` holds one
  // backend per lane (at least one). `keep_alive` holds whatever the transports need to outlive
  // them (the rendezvous store, a store server). `device` serves CUDA tensors, when it has a
  // backend.
  Engine(const Config& config, std::unique_ptr<ControlPlane> control,
         std::vector<std::unique_ptr<Backend>> lanes, std::shared_ptr<void> keep_alive,
         DevicePlane device = DevicePlane());
  ~Engine();
  Engine(const Engine&) = delete;
  Engine& operator=(const Engine&) = delete;

  const Config& config() const { return config_; }
  int rank() const { return config_.rank; }
  int size() const { return config_.size; }

  // Checks the entry (kInvalidArgument naming what is wrong; kUnavailable for a CUDA tensor without
  // a usable device backend; nothing is queued) and queues it, or holds it when this thread has a
  // group open. A CUDA tensor's request is negotiated with device kDeviceTensor. `then_wait`
  // promises that this thread calls Wait() on it next (a blocking call): with waiter progress the
  // engine thread is then left alone, since the waiter runs the step itself.
  Status Enqueue(QueueEntry entry, bool then_wait = false);
  // Opens a group for the calling thread; GroupEnd() queues its entries atomically. When the queue
  // refuses them (a name already in flight, the engine failed), every member completes with the
  // error GroupEnd() returns.
  Status GroupStart();
  Status GroupEnd();

  // Waits until `state` (a request of this engine) completes or the deadline passes, driving
  // progress meanwhile (see the class comment); returns whether it completed.
  bool Wait(RequestState& state, Deadline deadline) { return gate_->Wait(state, deadline); }
  // What request handles keep to wait through this engine; usable after the engine is gone.
  std::shared_ptr<WaitGate> wait_gate() const { return gate_; }

  // Next barrier's name: barriers are matched across ranks by their sequence number.
  std::string NextBarrierName();

  // Finalizes (see the class comment). Refused with kInvalidArgument on the engine's own threads
  // (from a completion callback), where it could only deadlock.
  Status Shutdown();
  // The error that failed the engine (OK while healthy).
  Status failure() const;
  const EngineStats& stats() const { return stats_; }

 private:
  void Loop();
  // Runs steps on the calling (waiting) thread until `state` completes, the deadline passes or
  // the engine stops; returns at once where it may not (see the class comment).
  void Drive(RequestState& state, Deadline deadline);
  // One step on the calling thread, which holds step_mu_; `limit` bounds its wait for messages,
  // of which it spends up to `busy` polling without sleeping (ControlPlane::ReceiveBusy). A
  // failure halts the engine (and fails it unless the finalize barrier has run).
  Status StepHolding(Deadline limit, std::chrono::microseconds busy);
  Status Step(Deadline limit, std::chrono::microseconds busy);
  // Makes the engine thread notice new work: its Receive() returns and a rest ends.
  void WakeEngine();
  Status HandleMessage(const ControlMessage& message);
  Status SubmitNew();
  Status Coordinate();
  // One data-plane lane: a backend and the fusion buffer its batches use.
  struct Lane {
    std::unique_ptr<Backend> backend;
    std::unique_ptr<uint8_t[]> fusion_buffer;  // grown rarely, never shrunk, reused every batch
    size_t fusion_capacity = 0;
    std::unique_ptr<uint8_t[]> gather_buffer;  // every rank's encoded bytes (top-k), likewise
    size_t gather_capacity = 0;
    std::unique_ptr<LaneWorker> worker;  // lanes 1.. only
  };

  Status Execute(const ResponseMessage& message);
  // Runs `batches` (indices into `plan`) spread over the lanes, and waits for all of them.
  Status RunOnLanes(const std::vector<FusionBatch>& plan, const std::vector<size_t>& batches,
                    const std::vector<const Response*>& responses,
                    std::vector<std::optional<QueueEntry>>& entries);
  Status RunBatch(Lane& lane, const FusionBatch& batch,
                  const std::vector<const Response*>& responses,
                  std::vector<std::optional<QueueEntry>>& entries);
  // A small allreduce's input for the coordinator (prescaled), when it qualifies.
  std::optional<std::string> InlineData(const TensorRequest& r, const void* input) const;
  // Completes an operation the coordinator reduced inline; `entry` is this rank's (present).
  Status CompleteInline(const Response& r, const std::string& data,
                        std::optional<QueueEntry>& entry);
  // After the reduction: integer average division and the post factor.
  void FinishAllreduce(const TensorRequest& q, void* data, size_t n) const;
  // Elements [begin, begin + count) of a direct allreduce (`member` indexes the response list).
  struct AllreducePiece {
    size_t member;
    size_t begin, count;
  };
  // Allreduces the pieces (one dtype and backend reduction) as one collective in place, after the
  // prescaled copy when out of place, then divides and postscales them. Completes nothing.
  Status RunAllreducePieces(Lane& lane, const std::vector<AllreducePiece>& pieces,
                            const std::vector<const Response*>& responses,
                            std::vector<std::optional<QueueEntry>>& entries);
  Status RunAllreduceFused(Lane& lane, const FusionBatch& batch,
                           const std::vector<const Response*>& responses,
                           std::vector<std::optional<QueueEntry>>& entries);
  // A fused batch of compressed allreduces (engine_compression.cc): encode into the fusion
  // buffer, allreduce or allgather the encoded bytes, decode into the outputs.
  Status RunCompressed(Lane& lane, const FusionBatch& batch,
                       const std::vector<const Response*>& responses,
                       std::vector<std::optional<QueueEntry>>& entries);
  // The compressor for `spec` (shared, created once per spec), or the registry's error.
  StatusOr<std::shared_ptr<const compression::Compressor>> CompressorFor(const std::string& spec);
  Status RunAllgather(Lane& lane, const Response& r, QueueEntry& e, Status* local_error);
  Status RunBroadcast(Lane& lane, const Response& r, QueueEntry& e);
  // Device tensors: the checks Enqueue() adds, and the launch of one batch (which then owns its
  // entries: their states complete on the device backend's completion thread).
  Status CheckDevice(QueueEntry& entry) const;
  Status LaunchDevice(const FusionBatch& batch, const std::vector<const Response*>& responses,
                      std::vector<std::optional<QueueEntry>>& entries);
  // Called from the device backend's completion thread: fails the engine on its next step.
  void DeviceFailed(const Status& status);
  // Bytes each rank contributes to an allgather response, their sum and the first dimension.
  StatusOr<std::vector<size_t>> AllgatherBytes(const Response& r, size_t* total,
                                               int64_t* first_dim) const;
  void Fail(const Status& status);
  Deadline NextWake() const;
  static uint8_t* FusionBuffer(Lane& lane, size_t bytes, size_t threshold);
  static uint8_t* Grow(std::unique_ptr<uint8_t[]>& buffer, size_t& capacity, size_t bytes,
                       size_t threshold);
  bool OnEngineThread() const;
  void Log(LogLevel level, const std::string& message) const;

  // A resting engine thread polls after kRestPoll, then ever less often, down to once every
  // kMaxRestPoll; a driving waiter's step waits at most kDriveSlice for messages before it looks
  // at its request (completed elsewhere) and deadline again.
  static constexpr std::chrono::milliseconds kRestPoll{2};
  static constexpr std::chrono::milliseconds kMaxRestPoll{64};
  static constexpr std::chrono::milliseconds kDriveSlice{1};
  // A driving waiter polls for messages without sleeping this long in each step: its thread
  // would only sleep otherwise, and a sleeping thread's wake-up costs tens of microseconds.
  // Not when this host runs more ranks than this process may use CPUs: there the spinning
  // waiter takes the core from the rank it waits for (measured with 4 ranks on 2 cores: 4 KiB
  // Gloo allreduces took 253 us polling, 139 us without), as Open MPI yields when oversubscribed.
  static constexpr std::chrono::microseconds kDriveBusyPoll{50};
  // A group of direct allreduces is split over the lanes when each share gets this many bytes.
  static constexpr size_t kMinSliceBytes = size_t{1} << 20;
  // Inline data rank 0 may receive for one tensor from all ranks together: at scale the
  // inline threshold shrinks to this divided by (size - 1).
  static constexpr size_t kInlineBudgetBytes = size_t{1} << 20;

  const Config config_;
  std::shared_ptr<void> keep_alive_;
  std::unique_ptr<ControlPlane> control_;
  std::vector<Lane> lanes_;
  TensorQueue queue_;
  ResponseCache cache_;
  std::unique_ptr<Coordinator> coordinator_;  // rank 0 only
  FusionOptions fusion_;

  std::mutex compression_mu_;  // guards the two below (lanes encode concurrently)
  std::map<std::string, std::shared_ptr<const compression::Compressor>> compressors_;
  compression::CompressionState compression_state_;  // residuals by tensor name

  std::mutex group_mu_;
  std::thread::id group_owner_;
  bool group_open_ = false;
  std::vector<QueueEntry> group_entries_;
  std::atomic<uint64_t> barrier_seq_{0};
  EngineStats stats_;

  mutable std::mutex failure_mu_;
  Status failure_;
  ControlPlane* control_wake_ = nullptr;  // control_ while it may be woken; guarded by failure_mu_
  std::mutex shutdown_mu_;                // serialises Shutdown()
  std::atomic<bool> stopping_{false};
  std::atomic<bool> finalized_{false};               // the finalize barrier ran on this rank
  std::atomic<std::thread::id> engine_thread_id_{};  // set by the thread itself; read by Shutdown
  std::atomic<std::thread::id> device_thread_id_{};  // the device completion thread, once seen
  std::atomic<std::thread::id> stepping_thread_{};   // the thread running Step(), if any

  // Progress by the waiter (see the class comment).
  std::chrono::microseconds drive_busy_poll_{0};  // kDriveBusyPoll, or 0 when oversubscribed
  std::mutex step_mu_;                            // held by whichever thread runs Step()
  bool halted_ = false;  // a step failed: no more steps; guarded by step_mu_
  std::mutex park_mu_;   // guards the three below
  std::condition_variable park_cv_;
  int drivers_ = 0;       // waiters driving or about to
  bool resting_ = false;  // the last waiter left with nothing in flight
  bool parked_ = false;   // the engine thread is parked (not in a step)
  std::shared_ptr<WaitGate> gate_;
  Status device_failure_;  // guarded by failure_mu_
  std::thread thread_;
  // Last: destroyed first, joining its completion thread while what its callbacks touch lives.
  DevicePlane device_;
};

// Checks one request as the C API receives it: name, dtype, shape, op-specific fields, pointers.
Status ValidateEntry(const QueueEntry& entry, int world_size);

}  // namespace concord
