// The engine: one per communicator. It owns the tensor queue, the response cache, the coordinator
// (on rank 0), the control plane, the lanes (backends, their buffers and worker threads), the
// device plane, the compressors and their per-tensor state, and the progress driver with its
// engine thread. Nothing in it is process-global. docs/ARCHITECTURE.md draws the whole picture:
// threads, locks and their order, who completes a request.
//
// The engine's work is split by concern, one file each:
//   engine.cc              wiring, lifecycle (Shutdown, Fail), enqueue and groups
//   progress_driver.h      which thread runs the engine's steps (engine thread or waiters)
//   engine_negotiation.cc  a step: messages in, requests out, coordination on rank 0
//   engine_execute.cc      a response list: plan, segments, lanes; who completes what
//   engine_host_ops.cc     CPU collectives on a lane: fused, span, allgather, broadcast
//   engine_exchange_ops.cc CPU reducescatter and alltoall on a lane
//   engine_inline.cc       small operations the coordinator completes during negotiation
//   engine_join.cc         concord_join: what a joined rank runs without a tensor of its own
//   engine_compression.cc  compressed fused allreduces
//   engine_exchange_ops.cc reducescatter (alone, or packed and fused) and alltoall
//   engine_device.cc       CUDA tensors on the device backend
//   entry_validation.h     checks of an operation at enqueue
//
// Threading: Enqueue(), GroupStart()/GroupEnd(), Wait() and the accessors may be called from any
// thread. Steps (negotiation and execution) run on one thread at a time, the engine thread or a
// waiting thread (ProgressDriver), which holds the driver's step lock: the control plane, the
// cache, the coordinator, the lanes and the queue's negotiation side are touched only under it
// (and by the lane workers the stepping thread starts and waits for). Completion callbacks run on
// the thread that completes the request: the stepping thread, a lane worker, or the device
// backend's completion thread.
//
// Failure: the first error (a peer failed, a backend or protocol error, an abort from rank 0)
// fails the engine: every request in flight completes with that error, later enqueues return it,
// and the connections close at once so the other ranks notice. Shutdown() (also the destructor)
// first runs a negotiated barrier with every rank (waiting at most the timeout), so no rank closes
// while a peer still needs its bytes, then completes what is in flight with kNotInitialized and
// joins the engine thread.
#pragma once

#include <atomic>
#include <chrono>
#include <map>
#include <memory>
#include <optional>
#include <set>
#include <string>
#include <thread>
#include <unordered_map>
#include <vector>

#include "backends/backend.h"
#include "backends/control_plane.h"
#include "backends/device_backend.h"
#include "base/log.h"
#include "base/mutex.h"
#include "compression/compressor.h"
#include "core/config.h"
#include "core/coordinator.h"
#include "core/entry_validation.h"
#include "core/fusion_planner.h"
#include "core/lane.h"
#include "core/lane_plan.h"
#include "core/metrics.h"
#include "core/metrics_render.h"
#include "core/metrics_server.h"
#include "core/ordered_reduction.h"
#include "core/p2p.h"
#include "core/plane_teardown.h"
#include "core/progress_driver.h"
#include "core/response_cache.h"
#include "core/tensor_queue.h"
#include "core/timeline.h"
#include "core/wait_gate.h"

namespace concord {

// Counters for tests and benchmarks; read with relaxed atomics from any thread.
struct EngineStats {
  std::atomic<uint64_t> responses_cached{0};         // executed through the cache bit fast path
  std::atomic<uint64_t> responses_full{0};           // executed from full responses (incl. errors)
  std::atomic<uint64_t> response_lists{0};           // response messages executed
  std::atomic<uint64_t> batches{0};                  // collectives run
  std::atomic<uint64_t> fused_tensors{0};            // tensors that went through the fusion buffer
  std::atomic<uint64_t> inline_reductions{0};        // operations the coordinator completed inline
  std::atomic<uint64_t> device_launches{0};          // collectives handed to the device backend
  std::atomic<uint64_t> cache_evictions{0};          // response-cache entries evicted
  std::atomic<uint64_t> topk_residual_evictions{0};  // top-k residuals dropped (topk_residuals)
  // The lanes' fusion and gather buffers after the last response list: their bytes (and those of
  // top-k's selection scratch), and how often the lanes' were allocated or freed so far
  // (core/lane.h, GrowingBuffer).
  std::atomic<uint64_t> scratch_bytes{0};
  std::atomic<uint64_t> scratch_reallocations{0};
  // The result pool's kept bytes after the last response list (core/result_buffers.h).
  std::atomic<uint64_t> kept_result_bytes{0};
};

class Engine;

// The metrics endpoint (config.metrics_port) from binding to serving: bound before the engine
// exists (OpenMetricsEndpoint), so a port in use fails init before any peer is involved; the
// server renders the engine `engine` points to (none yet: an empty page) until Shutdown().
struct MetricsEndpoint {
  std::unique_ptr<MetricsServer> server;
  std::shared_ptr<std::atomic<const Engine*>> engine;
};
// Binds config.metrics_address on metrics_port + local_rank (when metrics_port is not -1):
// kUnavailable naming CONCORD_METRICS_PORT, the address and the port when it cannot.
StatusOr<MetricsEndpoint> OpenMetricsEndpoint(const Config& config);

// The engine's device side: the device backend, or none and why (the error a CUDA tensor gets).
struct DevicePlane {
  std::unique_ptr<DeviceBackend> backend;
  Status unavailable = Status(Code::kUnavailable, "no GPU backend was started");
};

class Engine {
 public:
  // Takes ownership of the transports and starts the engine thread. `lanes` holds one backend per
  // lane (at least one). `keep_alive` holds whatever the transports need to outlive them (the
  // rendezvous store, a store server). `device` serves CUDA tensors, when it has a backend.
  // `p2p` carries sends and recvs (null: they are refused with kUnavailable).
  Engine(const Config& config, std::unique_ptr<ControlPlane> control,
         std::vector<std::unique_ptr<Backend>> lanes, std::shared_ptr<void> keep_alive,
         DevicePlane device = DevicePlane(), std::unique_ptr<P2pTransport> p2p = nullptr);
  ~Engine();
  Engine(const Engine&) = delete;
  Engine& operator=(const Engine&) = delete;

  const Config& config() const { return config_; }
  int rank() const { return config_.rank; }
  int size() const { return config_.size; }

  // Checks the entry (kInvalidArgument naming what is wrong; kUnavailable for a CUDA tensor without
  // a usable device backend; nothing is queued) and queues it, or holds it when this thread has a
  // group open (not from a completion callback, which runs on the engine's threads). A CUDA
  // tensor's request is negotiated with device kDeviceTensor. `then_wait` promises that this thread
  // calls Wait() on it next (a blocking call): with waiter progress the engine thread is then left
  // alone, since the waiter runs the step itself. A barrier without a name is numbered by the queue
  // when it accepts it (TensorQueue::Push), so a refusal here or of its group takes no number.
  Status Enqueue(QueueEntry entry, bool then_wait = false) EXCLUDES(group_mu_);
  // Opens a group for the calling thread (other threads may have theirs open at the same time);
  // GroupEnd() queues its entries atomically. When the queue refuses them (a name already in
  // flight, the engine failed), every member completes with the error GroupEnd() returns.
  Status GroupStart() EXCLUDES(group_mu_);
  Status GroupEnd() EXCLUDES(group_mu_);

  // Waits until `state` (a request of this engine) completes or the deadline passes, driving
  // progress meanwhile (progress by the waiter, unless config.waiter_progress is off or this is
  // one of the engine's own threads); returns whether it completed. A request that the calling
  // thread's open group still holds is never waited for without a limit: the wait is refused
  // (INVALID_ARGUMENT, through wait_gate(); here: false), since only that thread submits the group.
  bool Wait(RequestState& state, Deadline deadline) {
    StatusOr<bool> completed = gate_->Wait(state, deadline);
    return completed.ok() && *completed;
  }
  // What request handles keep to wait through this engine; usable after the engine is gone.
  std::shared_ptr<WaitGate> wait_gate() const { return gate_; }

  // Point to point (core/p2p.h): checks the send or recv and hands it to the transport, or
  // refuses it (nothing is queued). Thread-safe; never negotiated. Its requests wait through
  // p2p_wait_gate(). Shutdown() and a failure of the engine complete those in flight.
  Status SubmitP2p(P2pEntry entry);
  std::shared_ptr<WaitGate> p2p_wait_gate() const { return p2p_->wait_gate(); }

  // Next barrier's name: barriers are matched across ranks by their sequence number.
  std::string NextBarrierName();

  // concord_join (coordinator.h, point 8): this rank has no more tensors; until every rank has
  // joined it takes part in the others' operations with the identity. Blocks until every rank
  // has joined (or the engine fails) and returns the last rank to join. Not from the engine's
  // threads, nor inside a group.
  StatusOr<int> Join();

  // Concord's own allgather, for a communicator split (core/comm_split.h): every rank gives
  // `bytes` of the same length under the same `tag`, and gets every rank's in rank order.
  // Negotiated like any operation under a reserved name; waits at most the timeout (kTimeout
  // saying that not every rank took part; the operation then stays in flight until the engine
  // fails or stops). Not from the engine's own threads.
  StatusOr<std::string> ExchangeInternal(const std::string& tag, const std::string& bytes);
  // ExchangeInternal's refusal on this thread (a completion callback's), before any argument is
  // made: a caller numbering its exchanges takes no number for a refused one.
  Status CheckExchangeInternal() const;

  // Ends this rank's current step: operations enqueued afterwards belong to the next one. When
  // every rank marks its steps, a name submitted in different steps on different ranks fails with
  // kMismatch instead of mixing the steps' data (coordinator.h, point 5). Thread-safe.
  void EndStep() { step_.fetch_add(1, std::memory_order_relaxed); }

  // Finalizes (see the class comment). Refused with kInvalidArgument on the engine's own threads
  // (from a completion callback), where it could only deadlock: then stopped() stays false.
  // Otherwise the engine is stopped afterwards, and the status says whether the finalize barrier
  // completed with every rank (kTimeout: some rank did not finalize in time; the error of a
  // failed barrier). A second call returns OK.
  Status Shutdown() EXCLUDES(shutdown_mu_, group_mu_, failure_mu_);
  bool stopped() const { return driver_.stopping(); }
  // The error that failed the engine (OK while healthy).
  Status failure() const EXCLUDES(failure_mu_);
  const EngineStats& stats() const { return stats_; }
  // For tests: kInlineMessageBudgetBytes's value for this engine. Thread-safe; applies to the
  // messages of later steps.
  void SetInlineMessageBudget(size_t bytes) {
    inline_message_budget_.store(bytes, std::memory_order_relaxed);
  }
  // The communicator's metrics (core/metrics.h) as JSON, and as Prometheus text
  // (core/metrics_render.h); thread-safe.
  std::string MetricsJson() const;
  std::string MetricsPrometheus() const;
  // Serves `endpoint` with this engine's Prometheus text until Shutdown().
  void ServeMetrics(MetricsEndpoint endpoint);
  // The timeline (core/timeline.h): starts writing into `file` (kInvalidArgument when one is
  // already on), or into TimelineFileName(`path`, rank, Config::membership): `path`.rank<R>, on a
  // sub-communicator `path`.comm<H>.rank<R> (also kInvalidArgument naming the path and the
  // system's reason when it cannot be written); Stop writes the rest and closes it (a failed write
  // only warns). Shutdown() stops it. Thread-safe. `clock`: this rank's clock offset from rank 0's,
  // recorded in the file (none: the merge aligns the ranks on their system clocks).
  Status StartTimeline(TimelineFile file, std::optional<ClockOffset> clock = std::nullopt) {
    return timeline_->Start(std::move(file), clock);
  }
  Status StartTimeline(const std::string& path);
  void StopTimeline() { timeline_->Stop(); }
  // Collective, at init only (before the application can submit anything): this rank's system
  // clock offset from rank 0's, measured over the point-to-point transport (core/clock_sync.h)
  // within the communicator's timeout. None on one rank, without a transport, or when the
  // measurement failed (which logs a warning: the timeline then falls back to the system clock).
  std::optional<ClockOffset> MeasureClockOffset();

  // Compressors kept for reuse, by spec (least recently used forgotten first).
  static constexpr size_t kMaxCachedCompressors = 16;
  // For tests: how many compressors the cache holds now (at most kMaxCachedCompressors).
  size_t CachedCompressors() const EXCLUDES(compression_mu_);

  // A group of direct allreduces is split over the lanes when each share gets this many bytes.
  static constexpr size_t kMinShareBytes = size_t{1} << 20;
  // A driving waiter, or the engine thread while requests are in flight, polls for messages
  // without sleeping this long in each step: its thread would only sleep otherwise, and a
  // sleeping thread's wake-up costs tens of microseconds (4 KiB allreduces nobody drove took
  // 73-97 us with an engine thread that slept in every step, 16 us polling).
  // Not when this host runs more ranks than this process may use CPUs: there the spinning
  // waiter takes the core from the rank it waits for (measured with 4 ranks on 2 cores: 4 KiB
  // Gloo allreduces took 253 us polling, 139 us without), as Open MPI yields when oversubscribed.
  static constexpr std::chrono::microseconds kDriveBusyPoll{50};
  // Inline data rank 0 may receive for one tensor from all ranks together: at scale the
  // inline threshold shrinks to this divided by (size - 1).
  static constexpr size_t kInlineBudgetBytes = size_t{1} << 20;
  // Inline data one negotiation message carries at most, a rank's requests or rank 0's response
  // list (coordinator.h, point 2): the operations past it go without and run on the backend. A
  // rank's request message holds at most this of inline data and full requests together (a full
  // request that would pass it, a long name, begins the next message). Far below the control
  // plane's frame limit (1 GiB), however many small operations one step sends.
  static constexpr size_t kInlineMessageBudgetBytes = size_t{64} << 20;
  // How long Fail() waits for its control-plane teardown before it completes the requests (so
  // that, as a rule, the other ranks have this rank's last words before the application learns
  // of the failure and perhaps exits), and how long Shutdown() waits for it again: rank 0's abort
  // and drain take at most a second, an MPI plane's sends to live peers another. Past both, the
  // teardown has stalled inside MPI and is left to itself.
  static constexpr std::chrono::milliseconds kTeardownWait{1000};

 private:
  // The entries of one response list, index for index with its responses, taken out of the queue
  // (engine_execute.cc). Whoever completes an entry releases it (Finish); when the list fails,
  // Execute completes every entry still held. So each request is completed once, by its owner.
  using Entries = std::vector<std::optional<QueueEntry>>;
  using Responses = std::vector<const Response*>;
  static void Finish(std::optional<QueueEntry>& entry, const Status& status);

  // --- engine.cc ---
  // The progress driver's hooks.
  Status StepHook(Deadline limit, std::chrono::microseconds busy);
  void HaltHook(const Status& status);
  // Makes a step waiting in the control plane's receive return, while there is a control plane.
  void InterruptReceive() EXCLUDES(failure_mu_);
  // Runs the waiter's steps (WaitGate's drive function), where it may (see Wait()).
  void Drive(RequestState& state, Deadline deadline);
  // WaitGate's check function: refuses a wait for a request the calling thread's open group holds.
  Status CheckWait(const RequestState& state) EXCLUDES(group_mu_);
  // A sub-communicator's failure names its members' parent ranks (Config::membership).
  Status WithMembership(const Status& status) const;
  // Fails the engine (see the class comment); on the stepping thread, which halts.
  void Fail(const Status& status) REQUIRES(driver_.step_mutex()) EXCLUDES(failure_mu_);
  // Whether the calling thread is one of the engine's: engine thread, stepping thread, a lane
  // worker or the device completion thread.
  bool OnEngineThread() const;
  void Log(LogLevel level, const std::string& message) const;
  // config.timeout_s from now: how long a collective, a drain or the finalize barrier may take.
  Deadline TimeoutFromNow() const;

  // --- engine_metrics.cc ---
  MetricsContext MetricsContextNow() const;
  // The end-of-job summary, when config.summary_dir asks for it (a warning when it cannot be).
  void WriteSummary() const;

  // --- engine_negotiation.cc ---
  Status Step(Deadline limit, std::chrono::microseconds busy) REQUIRES(driver_.step_mutex());
  Status HandleMessage(const ControlMessage& message) REQUIRES(driver_.step_mutex());
  // On rank 0: the failure another rank reported (message.h, IsFailureReport), as rank 0 aborts
  // the job with it: PEER_FAILURE, "rank N failed: <its error>".
  static Status ReportedFailure(const ControlMessage& message);
  Status SubmitNew() REQUIRES(driver_.step_mutex());
  // Gives `m` to the coordinator (rank 0) or sends it to rank 0.
  Status SendRequests(RequestMessage m) REQUIRES(driver_.step_mutex());
  Status Coordinate() REQUIRES(driver_.step_mutex());
  // On rank 0: drops the inline results of `list` past the inline message budget (in list
  // order); every rank then runs those operations on the backend (coordinator.h, point 2).
  void DropInlinePastBudget(ResponseMessage& list) const;
  // Executes a response list, then applies it to the response cache and sends again in full
  // what this rank sent as bits that the list evicted.
  Status ExecuteList(const ResponseMessage& list) REQUIRES(driver_.step_mutex());
  // When the next step must run at the latest: the end of a gathering cycle, a stall check.
  Deadline NextWake() const REQUIRES(driver_.step_mutex());

  // --- engine_execute.cc ---
  Status Execute(const ResponseMessage& message) REQUIRES(driver_.step_mutex());
  Status ResolveCached(const ResponseMessage& message, Responses* responses)
      REQUIRES(driver_.step_mutex());
  Status TakeEntries(const ResponseMessage& message, const Responses& responses, Entries& entries);
  // One piece of a lane's work (a whole batch, or a share of a span group), on `lane`; memory
  // this host cannot give (std::bad_alloc) is a kSystemError naming the tensor.
  Status RunWork(Lane& lane, const std::vector<FusionBatch>& plan, const LaneWork& work,
                 const Responses& responses, Entries& entries);
  // The members' batch starts running (RequestState::MarkStarted); any thread.
  static void MarkStarted(const std::vector<size_t>& members, const Entries& entries);
  // A list's failure, with the culprit when a collective failed: waits (at most the timeout and
  // a second) for the control plane to name the rank that failed (see the definition).
  Status ExplainFailure(const Status& failure) REQUIRES(driver_.step_mutex());
  // Another rank's operation failed while this rank finalizes: this rank left it behind.
  void NoteLeftBehind(const Response& r) EXCLUDES(left_behind_mu_);
  // What Shutdown() reports after a finalize barrier that completed with tensors left behind.
  Status LeftBehindError() const EXCLUDES(left_behind_mu_);
  Status RunResponses(const ResponseMessage& message, const Responses& responses, Entries& entries)
      REQUIRES(driver_.step_mutex());
  // Runs the plan in segments: device batches launched at once, host batches on the lanes, each
  // barrier after every batch before it (device ones included) and alone.
  Status RunSegments(const std::vector<FusionBatch>& plan, const Responses& responses,
                     Entries& entries) REQUIRES(driver_.step_mutex());
  // After each response list, once no lane runs: counts it on the lanes' buffers, top-k's
  // selection scratch and the result pool (which give memory back after a burst) and updates the
  // scratch stats.
  void EndListOnBuffers() REQUIRES(driver_.step_mutex()) EXCLUDES(compression_mu_);
  // The bytes of compression_state_'s top-k selection scratch.
  size_t TopkScratchBytes() REQUIRES(compression_mu_);
  // Runs `batches` (indices into `plan`) spread over the lanes, and waits for all of them.
  Status RunOnLanes(const std::vector<FusionBatch>& plan, const std::vector<size_t>& batches,
                    const Responses& responses, Entries& entries) REQUIRES(driver_.step_mutex());

  // The reductions every batch runs on `lane`: the backend's, or rank-order folds in
  // deterministic mode (core/ordered_reduction.h). The one place that chooses.
  LaneReductions Reductions(Lane& lane) const {
    return LaneReductions(lane, config_.deterministic);
  }

  // --- engine_host_ops.cc: one batch on one lane; Finish() what they complete ---
  Status RunBatch(Lane& lane, const FusionBatch& batch, const Responses& responses,
                  Entries& entries);
  int LaneIndex(const Lane& lane) const { return static_cast<int>(&lane - lanes_.data()); }
  // Records fused batch `batch`, run on `lane` since `start`, on the timeline with its members.
  void TraceBatch(const Lane& lane, const FusionBatch& batch, const Responses& responses,
                  Clock::time_point start) const;
  // The timeline args naming a batch's members ("members":[...]).
  static std::string MembersJson(const FusionBatch& batch, const Responses& responses);
  // After the reduction: integer average division (by `contributors`: the ranks whose tensors
  // were reduced) and the post factor.
  void FinishAllreduce(const TensorRequest& q, int contributors, void* data, size_t n) const;
  // Allreduces the pieces (one dtype and backend reduction) as one collective in place, after the
  // prescaled copy when out of place, then divides and postscales them. Completes nothing: the
  // span group completes once every lane is done.
  Status RunAllreducePieces(Lane& lane, const std::vector<AllreducePiece>& pieces,
                            const Responses& responses, Entries& entries);
  Status RunAllreduceFused(Lane& lane, const FusionBatch& batch, const Responses& responses,
                           Entries& entries) const;
  Status RunAllgather(Lane& lane, const Response& r, std::optional<QueueEntry>& entry);
  // A reduce that runs alone (Backend::Reduce; through the rank-order fold when deterministic):
  // the root's output gets the reduction, the others reduce into the lane's scratch.
  Status RunReduce(Lane& lane, const Response& r, std::optional<QueueEntry>& entry);
  // A gather (Backend::Gatherv): the root's result goes where an allgather's would, the others'
  // into the lane's scratch; their requests report no output.
  Status RunGather(Lane& lane, const Response& r, std::optional<QueueEntry>& entry);
  Status RunBroadcast(Lane& lane, const Response& r, std::optional<QueueEntry>& entry) const;
  Status RunBarrier(Lane& lane, const Response& r, std::optional<QueueEntry>& entry);
  // This rank's error when its allgather output cannot hold the result (it still takes part).
  static Status OutputTooSmall(const std::string& name, size_t needed, size_t capacity,
                               const char* op = "allgather");
  // Where a variable-size result of `total` bytes goes: the caller's output, else the entry's
  // owned buffer; nullptr and *local this rank's error when the caller's output is too small.
  void* ResultOutput(QueueEntry& e, size_t total, const char* op, Status* local) const;
  // ResultOutput, or the lane's scratch when the output is too small (the rank still takes part).
  void* ResultBuffer(Lane& lane, QueueEntry& e, size_t total, const char* op, Status* local) const;
  // Bytes each rank contributes to an allgather response, their sum and the first dimension.
  StatusOr<std::vector<size_t>> AllgatherBytes(const Response& r, size_t* total,
                                               int64_t* first_dim) const;

  // --- engine_exchange_ops.cc: reducescatter and alltoall on one lane ---
  // A large uncompressed reducescatter, alone on the caller's buffers.
  Status RunReducescatter(Lane& lane, const Response& r, std::optional<QueueEntry>& entry);
  // A fused batch of reducescatters (small ones, or compressed ones of any size): packed
  // rank-major into the lane's fusion buffer (encoded when compressed), one backend
  // reduce-scatter, unpacked into the outputs.
  Status RunReducescatterPacked(Lane& lane, const FusionBatch& batch, const Responses& responses,
                                Entries& entries) EXCLUDES(compression_mu_);
  Status RunAlltoall(Lane& lane, const Response& r, std::optional<QueueEntry>& entry);
  // Bytes this rank receives from each rank in an alltoall response, their rows (*received)
  // and their sum (*total).
  StatusOr<std::vector<size_t>> AlltoallReceives(const Response& r, std::vector<int64_t>* received,
                                                 size_t* total) const;
  // An alltoall's result: `bytes` at `data`, `received` rows from each rank.
  static void SetAlltoallOutput(QueueEntry& e, void* data, size_t bytes,
                                std::vector<int64_t> received);

  // --- engine_inline.cc: operations the coordinator completes during negotiation ---
  // A small operation's input for the coordinator (an allreduce's or reducescatter's prescaled),
  // when it qualifies (see the file's comment).
  std::optional<std::string> InlineData(const TensorRequest& r, const void* input) const;
  // Completes an operation from the coordinator's inline result.
  Status CompleteInline(const Response& r, const std::string& data,
                        std::optional<QueueEntry>& entry);

  // --- engine_join.cc ---
  // The entry through which this joined rank runs an operation it never submitted.
  StatusOr<QueueEntry> JoinedEntry(const Response& r);

  // --- engine_compression.cc ---
  // A fused batch of compressed allreduces: encode into the fusion buffer, allreduce or allgather
  // the encoded bytes, decode into the outputs.
  Status RunCompressed(Lane& lane, const FusionBatch& batch, const Responses& responses,
                       Entries& entries) EXCLUDES(compression_mu_);
  // Counts the top-k residuals evicted since compression_state_'s count was `*counted` (and
  // updates it), and warns once per communicator that their names lost error feedback; warns
  // once too when a name's residual started again because the name came with another shape.
  void NoteResidualEvictions(uint64_t* counted) REQUIRES(compression_mu_);
  // The compressor for `spec` (shared; created again only for a spec the bounded cache forgot),
  // or the registry's error.
  StatusOr<std::shared_ptr<const compression::Compressor>> CompressorFor(const std::string& spec)
      EXCLUDES(compression_mu_);
  // Resolves the entry's compression spec to its compressor, canonical spec, or none.
  Status AttachCompressor(QueueEntry& entry);

  // --- engine_device.cc ---
  // The checks Enqueue() adds for device tensors (and stream or event on a CPU tensor); a device
  // tensor's ready stream and event are captured here, on the enqueuing thread (QueueEntry::ready).
  Status CheckDevice(QueueEntry& entry) const;
  // Launches one batch; the device backend's completion thread then completes its entries.
  Status LaunchDevice(const FusionBatch& batch, const Responses& responses, Entries& entries);
  // Called from the device backend's completion thread: fails the engine on its next step.
  void DeviceFailed(const Status& status) EXCLUDES(failure_mu_);

  const Config config_;
  std::shared_ptr<void> keep_alive_;
  FusionOptions fusion_;
  EngineStats stats_;
  // Memory of the results requests own (shared with them: a request may outlive the engine).
  const std::shared_ptr<ResultBuffers> result_buffers_ = std::make_shared<ResultBuffers>();
  // Before the lanes: their backends record into it.
  const std::shared_ptr<Metrics> metrics_ = std::make_shared<Metrics>();
  const std::shared_ptr<Timeline> timeline_ = std::make_shared<Timeline>(
      config_.rank, config_.size, [this](const std::string& m) { Log(LogLevel::kWarning, m); });

  // Touched only by the stepping thread (and the lane workers it waits for).
  std::unique_ptr<ControlPlane> control_ GUARDED_BY(driver_.step_mutex());
  std::vector<Lane> lanes_;  // the vector is fixed at construction; see core/lane.h
  ResponseCache cache_ GUARDED_BY(driver_.step_mutex());
  std::unique_ptr<Coordinator> coordinator_ GUARDED_BY(driver_.step_mutex());  // rank 0 only
  // Thread-safe itself: Push() from any thread, the rest from the stepping thread.
  TensorQueue queue_;

  // Lanes encode concurrently: one compressor per spec, one CompressionState (residuals by name).
  // The compressors of the kMaxCachedCompressors specs used last (a spec that changes every step,
  // an annealed top-k density, must not grow the cache): compressors are immutable, so one
  // forgotten is simply made again.
  struct CachedCompressor {
    std::shared_ptr<const compression::Compressor> compressor;
    uint64_t last_use = 0;  // compressor_clock_ at its last lookup
  };
  mutable Mutex compression_mu_;
  std::map<std::string, CachedCompressor> compressors_ GUARDED_BY(compression_mu_);
  uint64_t compressor_clock_ GUARDED_BY(compression_mu_) = 0;
  compression::CompressionState compression_state_ GUARDED_BY(compression_mu_){
      static_cast<size_t>(config_.topk_residuals)};
  // When compression_state_'s top-k selection scratch, which grows to the largest tensor top-k
  // selected from, is given back (EndListOnBuffers).
  TrimWindow topk_scratch_trim_ GUARDED_BY(compression_mu_);
  bool residual_eviction_logged_ GUARDED_BY(compression_mu_) = false;
  bool residual_reset_logged_ GUARDED_BY(compression_mu_) = false;

  Mutex group_mu_;
  // Each thread's open group (concord_group_start to concord_group_end): its members so far.
  // Groups are per thread, as NCCL's: threads open and end theirs independently.
  std::unordered_map<std::thread::id, std::vector<QueueEntry>> open_groups_ GUARDED_BY(group_mu_);
  std::atomic<uint64_t> join_seq_{0};
  std::atomic<size_t> inline_message_budget_{kInlineMessageBudgetBytes};
  // This rank read rank 0's abort (stepping thread): Fail() sends rank 0 no report then.
  std::atomic<bool> read_rank0_abort_{false};
  // Fail()'s control-plane teardown, which Fail() and Shutdown() wait for at most kTeardownWait.
  std::shared_ptr<PlaneTeardown> teardown_ GUARDED_BY(driver_.step_mutex());

  mutable Mutex failure_mu_;
  Status failure_ GUARDED_BY(failure_mu_);
  Status device_failure_ GUARDED_BY(failure_mu_);  // from the device completion thread
  // control_ while it may be woken (until Fail()), for threads that do not hold the step lock.
  ControlPlane* control_wake_ GUARDED_BY(failure_mu_) = nullptr;

  // Serialises Shutdown(), which runs the finalize barrier: taken before every other lock.
  Mutex shutdown_mu_ ACQUIRED_BEFORE(group_mu_, failure_mu_);
  std::atomic<bool> finalized_{false};   // the finalize barrier ran on this rank
  std::atomic<bool> finalizing_{false};  // Shutdown() submitted its finalize barrier
  // Other ranks' operations that failed because this rank had finalized (uneven epochs).
  struct LeftBehind {
    std::vector<std::string> names;  // each once, in the order they failed
    std::set<int32_t> ranks;         // the ranks that submitted them
  };
  mutable Mutex left_behind_mu_;
  LeftBehind left_behind_ GUARDED_BY(left_behind_mu_);
  std::atomic<uint64_t> step_{0};  // EndStep() calls so far
  // When the last device collective the timeline saw completed (Clock ticks; engine_device.cc).
  std::atomic<Clock::rep> device_done_{0};
  // The thread completing what Shutdown() aborts or left, while it runs their callbacks.
  std::atomic<std::thread::id> finalizing_thread_{};

  std::shared_ptr<WaitGate> gate_;
  // Sends and recvs: their own connections and progress thread (fixed after construction).
  std::unique_ptr<PointToPoint> p2p_;
  ProgressDriver driver_;
  // Stopped by Shutdown(), so no scrape renders an engine being destroyed.
  MetricsEndpoint metrics_endpoint_;
  std::string metrics_address_;  // its "address:port", set before it serves; empty: none
  // Last: destroyed first, joining its completion thread while what its callbacks touch lives.
  DevicePlane device_;
};

}  // namespace concord
