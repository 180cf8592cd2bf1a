#include "core/engine.h"

#include <sched.h>

#include <algorithm>
#include <cmath>
#include <cstring>

#include "core/message.h"

namespace concord {
namespace {

constexpr const char* kReservedPrefix = "__concord";

std::string FinalizeName() {
  return std::string(kReservedPrefix) + ".finalize";
}

// The CPUs this process may run on (its affinity mask), at least 1.
int UsableCpus() {
  cpu_set_t set;
  CPU_ZERO(&set);
  if (sched_getaffinity(0, sizeof(set), &set) == 0) return std::max(1, CPU_COUNT(&set));
  return static_cast<int>(std::max(1u, std::thread::hardware_concurrency()));
}

std::chrono::milliseconds Millis(double seconds) {
  return std::chrono::milliseconds(static_cast<int64_t>(std::llround(seconds * 1000.0)));
}

// Integer average: the sum divided by the world size, truncating toward zero.
template <typename T>
void DivideTyped(T* data, size_t n, int divisor) {
  for (size_t i = 0; i < n; ++i) data[i] = static_cast<T>(data[i] / divisor);
}

void DivideIntegers(void* data, size_t n, DType dtype, int divisor) {
  switch (dtype) {
    case DType::kUint8:
      return DivideTyped(static_cast<uint8_t*>(data), n, divisor);
    case DType::kInt8:
      return DivideTyped(static_cast<int8_t*>(data), n, divisor);
    case DType::kInt32:
      return DivideTyped(static_cast<int32_t*>(data), n, divisor);
    case DType::kInt64:
      return DivideTyped(static_cast<int64_t*>(data), n, divisor);
    default:
      return;
  }
}

// The factor applied after the reduction: postscale, and 1/size for a floating average.
double PostFactor(const TensorRequest& r, int size) {
  double f = r.postscale;
  if (r.reduce_op == ReduceOp::kAverage && IsFloatingPoint(r.dtype)) f /= size;
  return f;
}

}  // namespace

Status ValidateEntry(const QueueEntry& e, int world_size) {
  const TensorRequest& r = e.request;
  if (r.name.empty()) return InvalidArgument("the tensor name is empty");
  if (r.name.compare(0, std::strlen(kReservedPrefix), kReservedPrefix) == 0 &&
      r.op != OpType::kBarrier) {
    return InvalidArgument("tensor names starting with '" + std::string(kReservedPrefix) +
                           "' are reserved");
  }
  // The message is built only on failure: this runs on every enqueue.
  auto fail = [&r](Code code, const std::string& what) {
    return Status(code, "tensor '" + r.name + "': " + what);
  };
  if (!IsValidDType(static_cast<int>(r.dtype)))
    return fail(Code::kInvalidArgument, "unknown dtype");
  if (!IsValidReduceOp(static_cast<int>(r.reduce_op))) {
    return fail(Code::kInvalidArgument, "unknown reduce op");
  }
  if (r.shape.size() > 8) return fail(Code::kInvalidArgument, "more than 8 dimensions");
  int64_t elements = 1;
  for (int64_t d : r.shape) {
    if (d < 0) return fail(Code::kInvalidArgument, "negative dimension " + std::to_string(d));
    if (d > 0 && elements > (int64_t{1} << 50) / d)
      return fail(Code::kInvalidArgument, "too large");
    elements *= d;
  }
  if (r.device < -1) {
    return fail(Code::kInvalidArgument, "device " + std::to_string(r.device) +
                                            " is neither the CPU (-1) nor a CUDA device id");
  }
  if (elements > 0 && e.input == nullptr && r.op != OpType::kBarrier) {
    return fail(Code::kInvalidArgument, "input data is NULL");
  }
  switch (r.op) {
    case OpType::kAllreduce:
      if (elements > 0 && e.output == nullptr)
        return fail(Code::kInvalidArgument, "output data is NULL");
      if (!std::isfinite(r.prescale) || !std::isfinite(r.postscale)) {
        return fail(Code::kInvalidArgument, "scale factors must be finite");
      }
      if (!IsFloatingPoint(r.dtype) && (r.prescale != 1.0 || r.postscale != 1.0)) {
        return fail(Code::kInvalidArgument,
                    "prescale and postscale apply to floating-point dtypes only");
      }
      break;
    case OpType::kAllgather:
      if (r.shape.empty())
        return fail(Code::kInvalidArgument, "allgather needs at least one dimension");
      break;
    case OpType::kBroadcast:
      if (r.root < 0 || r.root >= world_size) {
        return fail(Code::kInvalidArgument, "root " + std::to_string(r.root) + " is outside [0, " +
                                                std::to_string(world_size) + ")");
      }
      if (elements > 0 && e.output == nullptr)
        return fail(Code::kInvalidArgument, "output data is NULL");
      break;
    case OpType::kBarrier:
      break;
    default:
      return fail(Code::kInvalidArgument, "unknown operation");
  }
  if (!e.state) return fail(Code::kInternal, "request without completion state");
  return Status::Ok();
}

Engine::Engine(const Config& config, std::unique_ptr<ControlPlane> control,
               std::vector<std::unique_ptr<Backend>> lanes, std::shared_ptr<void> keep_alive,
               DevicePlane device)
    : config_(config),
      keep_alive_(std::move(keep_alive)),
      control_(std::move(control)),
      // Called by Push() outside the queue's lock; control_ lives until the thread is joined.
      queue_([this] { WakeEngine(); }),
      cache_(static_cast<size_t>(config.cache_capacity)) {
  control_wake_ = control_.get();
  for (size_t i = 0; i < lanes.size(); ++i) {
    Lane lane;
    lane.backend = std::move(lanes[i]);
    if (i > 0) lane.worker = std::make_unique<LaneWorker>();
    lanes_.push_back(std::move(lane));
  }
  const bool oversubscribed = config_.local_size > UsableCpus();
  if (!oversubscribed) drive_busy_poll_ = kDriveBusyPoll;
  fusion_.threshold = static_cast<size_t>(config.fusion_threshold_bytes);
  fusion_.direct_bytes = static_cast<size_t>(config.direct_threshold_bytes);
  if (config_.rank == 0) {
    StallOptions stall;
    stall.warning = Millis(config_.stall_warning_s);
    stall.shutdown = Millis(config_.stall_shutdown_s);
    coordinator_ = std::make_unique<Coordinator>(config_.size, &cache_, stall);
  }
  device_ = std::move(device);
  gate_ = std::make_shared<WaitGate>(
      [this](RequestState& state, Deadline deadline) { Drive(state, deadline); });
  Log(LogLevel::kInfo, "started rank " + std::to_string(config_.rank) + " of " +
                           std::to_string(config_.size) + " on backend " +
                           lanes_.front().backend->name() + " (" + std::to_string(lanes_.size()) +
                           (lanes_.size() == 1 ? " lane" : " lanes") +
                           (oversubscribed ? ", oversubscribed: waiters do not busy-poll)" : ")"));
  thread_ = std::thread([this] { Loop(); });
}

Engine::~Engine() {
  // Never on the engine's own thread: the C API refuses to finalize from a callback.
  (void)Shutdown();
}

void Engine::Log(LogLevel level, const std::string& message) const {
  LogLine(static_cast<LogLevel>(config_.log_level), level, config_.rank, message);
}

Status Engine::failure() const {
  std::lock_guard<std::mutex> lock(failure_mu_);
  return failure_;
}

Status Engine::Enqueue(QueueEntry entry, bool then_wait) {
  CONCORD_RETURN_IF_ERROR(ValidateEntry(entry, config_.size));
  CONCORD_RETURN_IF_ERROR(CheckDevice(entry));
  TensorRequest& r = entry.request;
  // "none" (the default) is no compression at all; other specs go through their compressor.
  if (r.op == OpType::kAllreduce && !r.compression.empty() && r.compression != "none") {
    auto compressor = CompressorFor(r.compression);
    if (!compressor.ok()) return compressor.status().WithContext("tensor '" + r.name + "'");
    if (Status s = (*compressor)->CheckDType(r.dtype); !s.ok()) {
      return s.WithContext("tensor '" + r.name + "'");
    }
    // Ranks compare the canonical spec (an alias of "none" is no compression too).
    r.compression = (*compressor)->spec();
    if (r.compression == "none") {
      r.compression.clear();
    } else if (r.device != -1) {
      return Status(Code::kUnavailable, "tensor '" + r.name + "': compression '" + r.compression +
                                            "' runs on CPU tensors only in this version");
    } else {
      entry.compressor = std::move(*compressor);
    }
  } else {
    r.compression.clear();
  }
  {
    std::lock_guard<std::mutex> lock(group_mu_);
    if (group_open_ && group_owner_ == std::this_thread::get_id()) {
      for (const auto& e : group_entries_) {
        if (e.request.name == entry.request.name) {
          return InvalidArgument("tensor '" + entry.request.name + "' appears twice in one group");
        }
      }
      group_entries_.push_back(std::move(entry));
      return Status::Ok();
    }
  }
  std::vector<QueueEntry> one;
  one.push_back(std::move(entry));
  // Drive() wakes the engine thread if it is in a step; a parked one need not run.
  const bool wake = !then_wait || !config_.waiter_progress || OnEngineThread();
  return queue_.Push(std::move(one), wake);
}

Status Engine::GroupStart() {
  std::lock_guard<std::mutex> lock(group_mu_);
  if (group_open_) {
    return InvalidArgument(group_owner_ == std::this_thread::get_id()
                               ? "a group is already open on this thread (groups do not nest)"
                               : "another thread has a group open on this communicator");
  }
  group_open_ = true;
  group_owner_ = std::this_thread::get_id();
  return Status::Ok();
}

Status Engine::GroupEnd() {
  std::vector<QueueEntry> entries;
  {
    std::lock_guard<std::mutex> lock(group_mu_);
    if (!group_open_ || group_owner_ != std::this_thread::get_id()) {
      return InvalidArgument("group_end without group_start on this thread");
    }
    group_open_ = false;
    entries = std::move(group_entries_);
    group_entries_.clear();
  }
  if (entries.empty()) return Status::Ok();
  // Ranks agree on a group by its first member's name and its size; the coordinator checks both.
  const std::string group = entries.front().request.name + "#" + std::to_string(entries.size());
  for (auto& e : entries) {
    e.request.group = group;
    e.request.group_size = static_cast<int32_t>(entries.size());
  }
  // The members' handles exist since their Enqueue(): a refused group must still complete them.
  std::vector<std::shared_ptr<RequestState>> states;
  for (const auto& e : entries) states.push_back(e.state);
  Status s = queue_.Push(std::move(entries));
  if (!s.ok()) {
    for (auto& state : states) state->Complete(s);
  }
  return s;
}

std::string Engine::NextBarrierName() {
  return std::string(kReservedPrefix) + ".barrier." + std::to_string(barrier_seq_++);
}

Status Engine::Shutdown() {
  if (OnEngineThread()) {
    return InvalidArgument("a communicator cannot be finalized from its own completion callback");
  }
  std::lock_guard<std::mutex> shutdown_lock(shutdown_mu_);
  if (stopping_.load()) return Status::Ok();
  if (config_.size > 1 && failure().ok()) {
    // A last barrier, negotiated like any operation, so no rank closes its connections while a
    // peer still needs bytes from it. A peer that never finalizes costs one timeout, not a hang.
    auto finalized = std::make_shared<RequestState>();
    QueueEntry bye;
    bye.request.name = FinalizeName();
    bye.request.op = OpType::kBarrier;
    bye.request.dtype = DType::kUint8;
    bye.state = finalized;
    std::vector<QueueEntry> entries;
    entries.push_back(std::move(bye));
    if (queue_.Push(std::move(entries)).ok()) {
      Wait(*finalized, Deadline::After(Millis(config_.timeout_s)));
    }
  }
  stopping_.store(true);
  { std::lock_guard<std::mutex> lock(park_mu_); }
  park_cv_.notify_all();
  {
    std::lock_guard<std::mutex> lock(failure_mu_);
    if (control_wake_) control_wake_->Wake();
  }
  if (thread_.joinable()) thread_.join();
  // Waiters driving notice stopping_ within a slice; later ones wait plainly.
  gate_->Close();
  if (device_.backend) {
    // Normally drained by the finalize barrier; a lone rank waits here, at most the timeout.
    Status drained = device_.backend->Drain(Deadline::After(Millis(config_.timeout_s)));
    if (!drained.ok()) device_.backend->Abort(drained);
  }
  Log(LogLevel::kInfo,
      "finalized: " + std::to_string(stats_.responses_cached.load()) +
          " responses from the cache, " + std::to_string(stats_.responses_full.load()) + " full, " +
          std::to_string(stats_.response_lists.load()) + " response lists, " +
          std::to_string(stats_.batches.load()) + " collectives, " +
          std::to_string(stats_.fused_tensors.load()) + " tensors through the fusion buffer, " +
          std::to_string(stats_.inline_reductions.load()) + " reduced inline, " +
          std::to_string(stats_.device_launches.load()) + " device launches");
  const Status closed(Code::kNotInitialized, "the communicator was finalized");
  for (auto& e : queue_.Close(closed)) e.state->Complete(closed);
  std::vector<QueueEntry> held;
  {
    std::lock_guard<std::mutex> lock(group_mu_);
    held = std::move(group_entries_);
    group_entries_.clear();
  }
  // Callbacks run outside the lock: one may call back into this engine.
  for (auto& e : held) e.state->Complete(closed);
  return Status::Ok();
}

void Engine::Fail(const Status& status) {
  Log(LogLevel::kError, status.ToString());
  {
    std::lock_guard<std::mutex> lock(failure_mu_);
    if (failure_.ok()) failure_ = status;
    control_wake_ = nullptr;
  }
  // Close the connections now, so the other ranks see this rank go and fail too.
  if (config_.rank == 0 && control_) {
    ResponseMessage abort;
    abort.abort = true;
    abort.abort_code = status.code();
    abort.abort_reason = "rank 0 aborted the job: " + status.message();
    const std::string bytes = SerializeResponseMessage(abort);
    for (int r = 1; r < config_.size; ++r) control_->Send(r, bytes);
    // Best effort: peers that still read get the reason; dead ones cost at most a second.
    (void)control_->Drain(Deadline::After(std::min(Millis(config_.timeout_s), Millis(1.0))));
  }
  control_.reset();
  for (auto& lane : lanes_) lane.backend.reset();
  // Device work in flight fails now (its communicator is aborted), not at its deadline.
  if (device_.backend) device_.backend->Abort(status);
  for (auto& e : queue_.Close(status)) e.state->Complete(status);
}

bool Engine::OnEngineThread() const {
  const std::thread::id self = std::this_thread::get_id();
  if (self == engine_thread_id_.load() || self == device_thread_id_.load() ||
      self == stepping_thread_.load()) {
    return true;
  }
  for (const auto& lane : lanes_) {
    if (lane.worker && self == lane.worker->id()) return true;
  }
  return false;
}

void Engine::Loop() {
  engine_thread_id_.store(std::this_thread::get_id());
  auto rest_poll = kRestPoll;
  for (;;) {
    Deadline limit = Deadline::Infinite();
    {
      // Parked while waiters drive; while resting, one polling step after each rest_poll, which
      // doubles up to kMaxRestPoll while nothing happens.
      std::unique_lock<std::mutex> lock(park_mu_);
      parked_ = true;
      while (!stopping_.load() && (drivers_ > 0 || resting_)) {
        if (park_cv_.wait_for(lock, rest_poll) == std::cv_status::timeout && drivers_ == 0 &&
            resting_) {
          limit = Deadline::After(std::chrono::milliseconds(0));
          break;
        }
      }
      rest_poll = resting_ ? std::min(rest_poll * 2, kMaxRestPoll) : kRestPoll;
      parked_ = false;
      if (stopping_.load()) return;
    }
    std::lock_guard<std::mutex> step(step_mu_);
    if (halted_ || !StepHolding(limit, std::chrono::microseconds(0)).ok()) return;
  }
}

void Engine::Drive(RequestState& state, Deadline deadline) {
  if (!config_.waiter_progress || OnEngineThread()) return;
  bool engine_stepping;
  {
    std::lock_guard<std::mutex> lock(park_mu_);
    if (stopping_.load()) return;
    ++drivers_;
    resting_ = false;
    engine_stepping = !parked_;
  }
  if (engine_stepping) {
    // Its Receive() returns, it finishes the step and parks.
    std::lock_guard<std::mutex> lock(failure_mu_);
    if (control_wake_) control_wake_->Wake();
  }
  // The first step does not wait for messages: the request may not have been submitted yet (a
  // blocking call's enqueue wakes nobody).
  auto limit = Deadline::After(std::chrono::milliseconds(0));
  while (!state.done() && !deadline.passed()) {
    std::lock_guard<std::mutex> step(step_mu_);
    if (halted_ || stopping_.load()) break;
    if (!StepHolding(deadline.Earlier(limit), drive_busy_poll_).ok()) break;
    limit = Deadline::After(kDriveSlice);
  }
  bool resume;
  {
    std::lock_guard<std::mutex> lock(park_mu_);
    if (--drivers_ == 0) resting_ = queue_.in_flight() == 0;
    resume = drivers_ == 0 && !resting_;
  }
  if (resume) park_cv_.notify_all();
}

Status Engine::StepHolding(Deadline limit, std::chrono::microseconds busy) {
  stepping_thread_.store(std::this_thread::get_id());
  Status s = Step(limit, busy);
  if (!s.ok()) {
    halted_ = true;
    // Once the finalize barrier has run, peers close their connections as they please: that is
    // the end of the job, not a failure.
    if (!finalized_.load()) Fail(s);
  }
  stepping_thread_.store(std::thread::id());
  return s;
}

void Engine::WakeEngine() {
  {
    std::lock_guard<std::mutex> lock(failure_mu_);
    if (control_wake_) control_wake_->Wake();
  }
  bool was_resting;
  {
    std::lock_guard<std::mutex> lock(park_mu_);
    was_resting = resting_;
    resting_ = false;
  }
  if (was_resting) park_cv_.notify_all();
}

Deadline Engine::NextWake() const {
  Deadline d = Deadline::Infinite();
  if (config_.cycle_time_ms > 0) {
    if (auto oldest = queue_.OldestNew()) {
      const auto at =
          *oldest + std::chrono::microseconds(static_cast<int64_t>(config_.cycle_time_ms * 1000.0));
      d = Deadline::After(std::chrono::duration_cast<std::chrono::milliseconds>(
          at - Clock::now() + std::chrono::microseconds(999)));
    }
  }
  if (coordinator_) {
    if (auto next = coordinator_->NextStallCheck()) {
      d = d.Earlier(Deadline::After(std::chrono::duration_cast<std::chrono::milliseconds>(
          *next - Clock::now() + std::chrono::microseconds(999))));
    }
  }
  return d;
}

Status Engine::Step(Deadline limit, std::chrono::microseconds busy) {
  // Wait for a message or a wake-up; then take every message already there; then the queue.
  // The queue is read after the last Receive, so a wake-up consumed there is never lost.
  ControlMessage message;
  CONCORD_ASSIGN_OR_RETURN(bool got,
                           control_->ReceiveBusy(&message, NextWake().Earlier(limit), busy));
  while (got && !stopping_.load()) {
    CONCORD_RETURN_IF_ERROR(HandleMessage(message));
    CONCORD_ASSIGN_OR_RETURN(
        got, control_->Receive(&message, Deadline::After(std::chrono::milliseconds(0))));
  }
  if (stopping_.load()) return Status::Ok();
  {
    std::lock_guard<std::mutex> lock(failure_mu_);
    if (!device_failure_.ok()) return device_failure_;
  }
  CONCORD_RETURN_IF_ERROR(SubmitNew());
  if (coordinator_) CONCORD_RETURN_IF_ERROR(Coordinate());
  return Status::Ok();
}

Status Engine::SubmitNew() {
  if (config_.cycle_time_ms > 0) {
    auto oldest = queue_.OldestNew();
    if (oldest && Clock::now() - *oldest < std::chrono::microseconds(static_cast<int64_t>(
                                               config_.cycle_time_ms * 1000.0))) {
      return Status::Ok();  // keep gathering; NextWake() comes back when the cycle ends
    }
  }
  std::vector<TensorQueue::Fresh> fresh = queue_.PopNew();
  if (fresh.empty()) return Status::Ok();
  RequestMessage m;
  for (auto& [request, input] : fresh) {
    std::optional<std::string> data = InlineData(request, input);
    if (auto bit = cache_.Lookup(request, config_.rank)) {
      if (*bit / 64 >= m.cached_mask.size()) m.cached_mask.resize(*bit / 64 + 1, 0);
      m.cached_mask[*bit / 64] |= uint64_t{1} << (*bit % 64);
      if (data) m.cached_data.emplace(*bit, std::move(*data));
    } else {
      if (data) m.request_data.emplace(static_cast<uint32_t>(m.requests.size()), std::move(*data));
      m.requests.push_back(std::move(request));
    }
  }
  if (coordinator_) return coordinator_->Add(0, std::move(m), Clock::now());
  return control_->Send(0, SerializeRequestMessage(m));
}

std::optional<std::string> Engine::InlineData(const TensorRequest& r, const void* input) const {
  // Rank 0 receives every other rank's copy: past kInlineBudgetBytes in all, the backend's
  // collectives (bandwidth-optimal) are cheaper than the star through the coordinator.
  const size_t limit = std::min(static_cast<size_t>(config_.inline_threshold_bytes),
                                kInlineBudgetBytes / std::max(1, config_.size - 1));
  if (r.op != OpType::kAllreduce || r.device != -1 || config_.size == 1 || !r.compression.empty() ||
      config_.inline_threshold_bytes == 0 || r.NumBytes() > limit) {
    return std::nullopt;
  }
  if (r.prescale == 1.0) return std::string(static_cast<const char*>(input), r.NumBytes());
  std::string data(r.NumBytes(), '\0');
  CopyScaled(data.data(), input, static_cast<size_t>(r.NumElements()), r.dtype, r.prescale);
  return data;
}

Status Engine::HandleMessage(const ControlMessage& message) {
  if (coordinator_) {
    auto parsed = ParseRequestMessage(message.bytes);
    if (!parsed.ok())
      return parsed.status().WithContext("from rank " + std::to_string(message.from));
    return coordinator_->Add(message.from, std::move(*parsed), Clock::now());
  }
  if (message.from != 0) {
    return ProtocolError("negotiation message from rank " + std::to_string(message.from));
  }
  CONCORD_ASSIGN_OR_RETURN(ResponseMessage response, ParseResponseMessage(message.bytes));
  if (response.abort) return Status(response.abort_code, response.abort_reason);
  return Execute(response);
}

Status Engine::Coordinate() {
  const auto now = Clock::now();
  for (const auto& warning : coordinator_->StallWarnings(now)) Log(LogLevel::kWarning, warning);
  ResponseMessage ready = coordinator_->TakeReady(now);
  if (ready.items.empty()) return Status::Ok();
  if (config_.size > 1) {
    std::string bytes = SerializeResponseMessage(ready);
    for (int r = 1; r + 1 < config_.size; ++r) CONCORD_RETURN_IF_ERROR(control_->Send(r, bytes));
    CONCORD_RETURN_IF_ERROR(control_->Send(config_.size - 1, std::move(bytes)));
    // Every rank must have the whole list before this one enters its collectives: a rank still
    // waiting for the rest of a large response (inline results on a slow link) could never join.
    CONCORD_RETURN_IF_ERROR(control_->Drain(Deadline::After(Millis(config_.timeout_s))));
  }
  return Execute(ready);
}

Status Engine::Execute(const ResponseMessage& message) {
  stats_.response_lists.fetch_add(1, std::memory_order_relaxed);
  std::vector<const Response*> responses;
  responses.reserve(message.items.size());
  for (const auto& item : message.items) {
    if (!item.cached) {
      responses.push_back(&item.response);
      stats_.responses_full.fetch_add(1, std::memory_order_relaxed);
      continue;
    }
    stats_.responses_cached.fetch_add(1, std::memory_order_relaxed);
    const Response* cached = cache_.Get(item.bit);
    if (cached == nullptr) {
      return ProtocolError("response names cache entry " + std::to_string(item.bit) +
                           ", which does not exist");
    }
    responses.push_back(cached);
  }
  std::vector<std::optional<QueueEntry>> entries(responses.size());
  // The entries taken so far are out of the queue, so Fail() would not reach them.
  auto fail_taken = [&entries](const Status& s) {
    for (auto& e : entries) {
      if (e) e->state->Complete(s);
    }
    return s;
  };
  for (size_t i = 0; i < responses.size(); ++i) {
    // An error for other ranks (a stall timeout this rank was late for) leaves its entry alone.
    if (!responses[i]->AppliesTo(config_.rank)) continue;
    entries[i] = queue_.Take(responses[i]->request.name);
    const bool expected = responses[i]->error == Code::kOk;
    if (!entries[i] && expected) {
      return fail_taken(ProtocolError("response for tensor '" + responses[i]->request.name +
                                      "', which this rank did not submit"));
    }
  }
  // Operations the coordinator reduced inline complete now; the rest run on the backend.
  std::vector<const Response*> to_run;
  std::vector<std::optional<QueueEntry>> run_entries;
  for (size_t i = 0; i < responses.size(); ++i) {
    const std::optional<std::string>& data = message.items[i].data;
    if (!data) {
      to_run.push_back(responses[i]);
      run_entries.push_back(std::move(entries[i]));
      continue;
    }
    Status s = CompleteInline(*responses[i], *data, entries[i]);
    if (!s.ok()) return fail_taken(s);
    entries[i].reset();
  }
  // Batches run in segments; a barrier is a segment of its own, so it completes only after
  // everything before it in the list. Device batches are launched first (in plan order, which
  // is the same on every rank) and run while the lanes run the host batches.
  const std::vector<FusionBatch> plan = PlanFusion(to_run, fusion_);
  std::vector<size_t> segment;
  for (size_t b = 0; b <= plan.size(); ++b) {
    const Response* first = b < plan.size() ? to_run[plan[b].members.front()] : nullptr;
    const bool barrier = first != nullptr && first->request.op == OpType::kBarrier;
    if (first != nullptr && first->request.device != -1 && first->error == Code::kOk) {
      Status s = LaunchDevice(plan[b], to_run, run_entries);
      if (!s.ok()) {
        for (auto& e : run_entries) {
          if (e) e->state->Complete(s);
        }
        return s;
      }
    } else if (b == plan.size() || barrier) {
      Status s = RunOnLanes(plan, segment, to_run, run_entries);
      if (s.ok() && barrier && device_.backend) {
        s = device_.backend->Drain(Deadline::After(Millis(config_.timeout_s)));
      }
      if (s.ok() && barrier) s = RunOnLanes(plan, {b}, to_run, run_entries);
      if (!s.ok()) {
        // Entries taken from the queue for this list complete here; Fail() handles the queue.
        for (auto& e : run_entries) {
          if (e) e->state->Complete(s);
        }
        return s;
      }
      segment.clear();
    } else {
      segment.push_back(b);
    }
  }
  // Every rank inserts in this same order, so cache bits agree everywhere.
  for (const auto& item : message.items) {
    if (!item.cached) cache_.Insert(item.response);
  }
  return Status::Ok();
}

Status Engine::RunOnLanes(const std::vector<FusionBatch>& plan, const std::vector<size_t>& batches,
                          const std::vector<const Response*>& responses,
                          std::vector<std::optional<QueueEntry>>& entries) {
  // A batch, or one lane's share of a group of direct allreduces (see SpanGroup below).
  struct Work {
    size_t batch = 0;
    std::vector<AllreducePiece> pieces;  // non-empty for a share
  };
  // Each piece of work goes to the lane with the fewest bytes so far: the same choice on every
  // rank, since every rank runs the same plan.
  std::vector<std::vector<Work>> by_lane(lanes_.size());
  std::vector<size_t> load(lanes_.size(), 0);
  auto assign = [&](Work w, size_t bytes) {
    const size_t lane =
        static_cast<size_t>(std::min_element(load.begin(), load.end()) - load.begin());
    by_lane[lane].push_back(std::move(w));
    load[lane] += std::max<size_t>(bytes, 1);
  };
  // The direct allreduces of one dtype and backend reduction run as one collective over all
  // their buffers (Backend::AllreduceSpans), cut into shares of at least kMinSliceBytes that run
  // on different lanes; they complete once every lane is done.
  struct SpanGroup {
    DType dtype;
    ReduceOp op;
    std::vector<size_t> members;  // indices into responses, in plan order
    size_t elements = 0;
  };
  std::vector<SpanGroup> groups;
  std::vector<size_t> others;
  for (size_t b : batches) {
    const size_t i = plan[b].members.front();
    const Response& r = *responses[i];
    if (plan[b].fused || r.error != Code::kOk || r.request.op != OpType::kAllreduce) {
      others.push_back(b);
      continue;
    }
    if (!r.IsRequestOf(entries[i]->request, config_.rank)) {
      return Internal("response for tensor '" + r.request.name +
                      "' does not match this rank's request");
    }
    const ReduceOp op =
        r.request.reduce_op == ReduceOp::kAverage ? ReduceOp::kSum : r.request.reduce_op;
    auto group = std::find_if(groups.begin(), groups.end(), [&](const SpanGroup& g) {
      return g.dtype == r.request.dtype && g.op == op;
    });
    if (group == groups.end())
      group = groups.insert(groups.end(), SpanGroup{r.request.dtype, op, {}, 0});
    group->members.push_back(i);
    group->elements += static_cast<size_t>(r.request.NumElements());
  }
  for (const SpanGroup& g : groups) {
    stats_.batches.fetch_add(1, std::memory_order_relaxed);
    const size_t elem = DTypeSize(g.dtype);
    const size_t shares = std::clamp<size_t>(g.elements * elem / kMinSliceBytes, 1, lanes_.size());
    size_t member = 0, used = 0;  // the next element to hand out: `used` of members[member]
    for (size_t k = 0; k < shares; ++k) {
      const size_t end = g.elements * (k + 1) / shares;
      size_t at = g.elements * k / shares;
      Work w;
      while (at < end) {
        const size_t i = g.members[member];
        const size_t n = static_cast<size_t>(responses[i]->request.NumElements());
        const size_t take = std::min(n - used, end - at);
        if (take > 0) w.pieces.push_back(AllreducePiece{i, used, take});
        at += take;
        used += take;
        if (used == n) {
          ++member;
          used = 0;
        }
      }
      if (!w.pieces.empty()) assign(std::move(w), (end - g.elements * k / shares) * elem);
    }
  }
  for (size_t b : others) assign(Work{b, {}}, plan[b].bytes);
  // Lanes touch disjoint entries or disjoint pieces of one, and their own backend and buffer;
  // the rest is read-only here.
  auto run_lane = [&](size_t l) -> Status {
    for (const Work& w : by_lane[l]) {
      CONCORD_RETURN_IF_ERROR(w.pieces.empty()
                                  ? RunBatch(lanes_[l], plan[w.batch], responses, entries)
                                  : RunAllreducePieces(lanes_[l], w.pieces, responses, entries));
    }
    return Status::Ok();
  };
  for (size_t l = 1; l < lanes_.size(); ++l) {
    if (!by_lane[l].empty()) lanes_[l].worker->Start([&run_lane, l] { return run_lane(l); });
  }
  Status status = run_lane(0);
  for (size_t l = 1; l < lanes_.size(); ++l) {
    if (by_lane[l].empty()) continue;
    Status s = lanes_[l].worker->Wait();
    if (status.ok()) status = s;
  }
  // On failure the caller completes every entry taken for this list.
  if (status.ok()) {
    for (const SpanGroup& g : groups) {
      for (size_t i : g.members) entries[i]->state->Complete(Status::Ok());
    }
  }
  return status;
}

Status Engine::RunBatch(Lane& lane, const FusionBatch& batch,
                        const std::vector<const Response*>& responses,
                        std::vector<std::optional<QueueEntry>>& entries) {
  if (responses[batch.members.front()]->error == Code::kOk) {
    stats_.batches.fetch_add(1, std::memory_order_relaxed);
  }
  if (batch.fused) {
    stats_.fused_tensors.fetch_add(batch.members.size(), std::memory_order_relaxed);
    if (!responses[batch.members.front()]->request.compression.empty()) {
      return RunCompressed(lane, batch, responses, entries);
    }
    return RunAllreduceFused(lane, batch, responses, entries);
  }
  const size_t i = batch.members.front();
  const Response& r = *responses[i];
  if (r.error != Code::kOk) {
    if (entries[i]) entries[i]->state->Complete(Status(r.error, r.error_message));
    return Status::Ok();
  }
  QueueEntry& e = *entries[i];
  // The entry must be able to run what the coordinator decided: its own request is part of it.
  if (!r.IsRequestOf(e.request, config_.rank)) {
    return Internal("response for tensor '" + r.request.name +
                    "' does not match this rank's request");
  }
  Status local = Status::Ok();
  Status s;
  switch (r.request.op) {
    case OpType::kAllreduce:
      // RunOnLanes runs every direct allreduce in a span group.
      s = Internal("direct allreduce of tensor '" + r.request.name + "' outside a span group");
      break;
    case OpType::kAllgather:
      s = RunAllgather(lane, r, e, &local);
      break;
    case OpType::kBroadcast:
      s = RunBroadcast(lane, r, e);
      break;
    case OpType::kBarrier:
      s = lane.backend->Barrier();
      if (s.ok() && r.request.name == FinalizeName()) finalized_.store(true);
      break;
  }
  if (!s.ok()) {
    e.state->Complete(s);
    return s;
  }
  e.state->Complete(local);
  return Status::Ok();
}

Status Engine::CompleteInline(const Response& r, const std::string& data,
                              std::optional<QueueEntry>& entry) {
  const TensorRequest& q = r.request;
  if (r.error != Code::kOk || q.op != OpType::kAllreduce || data.size() != q.NumBytes()) {
    return ProtocolError("inline result for tensor '" + q.name +
                         "' is not an allreduce result of its size");
  }
  stats_.inline_reductions.fetch_add(1, std::memory_order_relaxed);
  if (!r.IsRequestOf(entry->request, config_.rank)) {
    return Internal("response for tensor '" + q.name + "' does not match this rank's request");
  }
  const size_t n = static_cast<size_t>(q.NumElements());
  if (n > 0) std::memcpy(entry->output, data.data(), data.size());  // output may be null at 0
  FinishAllreduce(q, entry->output, n);
  // Each rank sent its input to rank 0, which sent the result to every other rank.
  entry->state->AddWireBytes(config_.rank == 0 ? data.size() * (config_.size - 1) : data.size());
  entry->state->Complete(Status::Ok());
  return Status::Ok();
}

void Engine::FinishAllreduce(const TensorRequest& q, void* data, size_t n) const {
  if (q.reduce_op == ReduceOp::kAverage && !IsFloatingPoint(q.dtype)) {
    DivideIntegers(data, n, q.dtype, config_.size);
  }
  const double post = PostFactor(q, config_.size);
  if (post != 1.0) ScaleElements(data, n, q.dtype, post);
}

Status Engine::RunAllreducePieces(Lane& lane, const std::vector<AllreducePiece>& pieces,
                                  const std::vector<const Response*>& responses,
                                  std::vector<std::optional<QueueEntry>>& entries) {
  const TensorRequest& first = responses[pieces.front().member]->request;
  std::vector<AllreduceSpan> spans;
  spans.reserve(pieces.size());
  for (const AllreducePiece& p : pieces) {
    const TensorRequest& q = responses[p.member]->request;
    const QueueEntry& e = *entries[p.member];
    const size_t offset = p.begin * DTypeSize(q.dtype);
    void* out = static_cast<uint8_t*>(e.output) + offset;
    CopyScaled(out, static_cast<const uint8_t*>(e.input) + offset, p.count, q.dtype, q.prescale);
    spans.push_back(AllreduceSpan{out, p.count});
  }
  CONCORD_RETURN_IF_ERROR(lane.backend->AllreduceSpans(spans, first.dtype, first.reduce_op));
  for (size_t k = 0; k < pieces.size(); ++k) {
    const TensorRequest& q = responses[pieces[k].member]->request;
    FinishAllreduce(q, spans[k].data, spans[k].count);
    entries[pieces[k].member]->state->AddWireBytes(compression::WireBytesPerRank(
        compression::Exchange::kAllreduce, spans[k].count * DTypeSize(q.dtype), config_.size));
  }
  return Status::Ok();
}

uint8_t* Engine::FusionBuffer(Lane& lane, size_t bytes, size_t threshold) {
  return Grow(lane.fusion_buffer, lane.fusion_capacity, bytes, threshold);
}

uint8_t* Engine::Grow(std::unique_ptr<uint8_t[]>& buffer, size_t& capacity, size_t bytes,
                      size_t threshold) {
  if (bytes > capacity) {
    // Grow geometrically up to the threshold so a warming-up job reallocates only a few times.
    capacity = std::max<size_t>(bytes, std::min(threshold, 2 * capacity));
    buffer.reset(new uint8_t[capacity]);
  }
  return buffer.get();
}

Status Engine::RunAllreduceFused(Lane& lane, const FusionBatch& batch,
                                 const std::vector<const Response*>& responses,
                                 std::vector<std::optional<QueueEntry>>& entries) {
  const TensorRequest& q = responses[batch.members.front()]->request;
  const size_t elem = DTypeSize(q.dtype);
  const size_t message = FusedMessageBytes(batch.bytes, elem);
  uint8_t* buffer = FusionBuffer(lane, message, fusion_.threshold);
  size_t offset = 0;
  for (size_t i : batch.members) {
    const QueueEntry& e = *entries[i];
    const size_t n = static_cast<size_t>(e.request.NumElements());
    CopyScaled(buffer + offset, e.input, n, q.dtype, q.prescale);
    offset += n * elem;
  }
  std::memset(buffer + offset, 0, message - offset);  // reduced, never read back
  const size_t count = message / elem;
  Status s = lane.backend->Allreduce(buffer, count, q.dtype, q.reduce_op);
  if (!s.ok()) {
    for (size_t i : batch.members) entries[i]->state->Complete(s);
    return s;
  }
  if (q.reduce_op == ReduceOp::kAverage && !IsFloatingPoint(q.dtype)) {
    DivideIntegers(buffer, count, q.dtype, config_.size);
  }
  const double post = PostFactor(q, config_.size);
  offset = 0;
  for (size_t i : batch.members) {
    QueueEntry& e = *entries[i];
    const size_t n = static_cast<size_t>(e.request.NumElements());
    CopyScaled(e.output, buffer + offset, n, q.dtype, post);
    offset += n * elem;
    e.state->AddWireBytes(
        compression::WireBytesPerRank(compression::Exchange::kAllreduce, n * elem, config_.size));
    e.state->Complete(Status::Ok());
  }
  return Status::Ok();
}

StatusOr<std::vector<size_t>> Engine::AllgatherBytes(const Response& r, size_t* total,
                                                     int64_t* first_dim) const {
  const TensorRequest& q = r.request;
  if (r.first_dims.size() != static_cast<size_t>(config_.size)) {
    return ProtocolError("allgather response for tensor '" + q.name + "' has " +
                         std::to_string(r.first_dims.size()) + " first dimensions for " +
                         std::to_string(config_.size) + " ranks");
  }
  size_t row = DTypeSize(q.dtype);
  for (size_t d = 1; d < q.shape.size(); ++d) row *= static_cast<size_t>(q.shape[d]);
  std::vector<size_t> bytes(config_.size);
  *total = 0;
  *first_dim = 0;
  constexpr size_t kMaxBytes = size_t{1} << 50;
  for (int rk = 0; rk < config_.size; ++rk) {
    if (__builtin_mul_overflow(static_cast<size_t>(r.first_dims[rk]), row, &bytes[rk]) ||
        bytes[rk] > kMaxBytes || (*total += bytes[rk]) > kMaxBytes) {
      return ProtocolError("allgather response for tensor '" + q.name + "' is too large");
    }
    *first_dim += r.first_dims[rk];
  }
  return bytes;
}

Status Engine::RunAllgather(Lane& lane, const Response& r, QueueEntry& e, Status* local_error) {
  const TensorRequest& q = r.request;
  size_t total = 0;
  int64_t first = 0;
  CONCORD_ASSIGN_OR_RETURN(std::vector<size_t> bytes, AllgatherBytes(r, &total, &first));
  RequestState::Output& out = e.state->output();
  void* dst = e.output;
  if (dst == nullptr) {
    out.owned.resize(total);
    dst = out.owned.data();
  } else if (total > e.output_capacity) {
    // Still take part (the other ranks are already in the collective), into scratch memory.
    *local_error =
        InvalidArgument("tensor '" + q.name + "': allgather result needs " + std::to_string(total) +
                        " bytes, the output buffer has " + std::to_string(e.output_capacity));
    dst = FusionBuffer(lane, total, fusion_.threshold);
  }
  CONCORD_RETURN_IF_ERROR(lane.backend->Allgatherv(e.input, dst, bytes));
  // A ring allgather: each rank forwards (n - 1) / n of the result.
  if (config_.size > 1) e.state->AddWireBytes(total * (config_.size - 1) / config_.size);
  if (local_error->ok()) {
    out.data = dst;
    out.bytes = total;
    out.first_dim = first;
  }
  return Status::Ok();
}

Status Engine::RunBroadcast(Lane& lane, const Response& r, QueueEntry& e) {
  const size_t bytes = r.request.NumBytes();
  if (config_.rank == r.request.root && e.output != e.input && bytes > 0) {
    std::memcpy(e.output, e.input, bytes);
  }
  // Estimated as one copy of the data from every rank (a chain or tree forwards it once).
  if (config_.size > 1) e.state->AddWireBytes(bytes);
  return lane.backend->Broadcast(e.output, bytes, r.request.root);
}

}  // namespace concord

namespace concord {

Status Engine::CheckDevice(QueueEntry& e) const {
  TensorRequest& r = e.request;
  if (r.device == -1) {
    if (e.ready_stream != nullptr || e.ready_event != nullptr) {
      return InvalidArgument("tensor '" + r.name +
                             "': a ready stream or event was given for a CPU tensor");
    }
    return Status::Ok();
  }
  const std::string who = "tensor '" + r.name + "' on CUDA device " + std::to_string(r.device);
  if (!device_.backend) {
    return Status(device_.unavailable.code(), who + ": " + device_.unavailable.message());
  }
  Status usable = device_.backend->CheckDevice(r.device);
  if (!usable.ok()) return Status(usable.code(), who + ": " + usable.message());
  if (r.op == OpType::kAllgather && e.output == nullptr) {
    return InvalidArgument(who +
                           ": an allgather of a device tensor needs an output buffer on "
                           "the device (the result cannot be owned by the request)");
  }
  // Every rank's tensors are on its own GPU: ranks negotiate the kind, not the id.
  r.device = kDeviceTensor;
  return Status::Ok();
}

Status Engine::LaunchDevice(const FusionBatch& batch, const std::vector<const Response*>& responses,
                            std::vector<std::optional<QueueEntry>>& entries) {
  const TensorRequest& q = responses[batch.members.front()]->request;
  DeviceCollective c;
  c.device = device_.backend->device();
  c.dtype = q.dtype;
  c.deadline = Deadline::After(Millis(config_.timeout_s));
  std::vector<std::shared_ptr<RequestState>> states;
  for (size_t i : batch.members) {
    const QueueEntry& e = *entries[i];
    if (!responses[i]->IsRequestOf(e.request, config_.rank)) {
      return Internal("response for tensor '" + responses[i]->request.name +
                      "' does not match this rank's request");
    }
    c.tensors.push_back(DeviceTensor{e.input, e.output,
                                     static_cast<size_t>(e.request.NumElements()), e.ready_stream,
                                     e.ready_event});
    states.push_back(e.state);
  }
  Status local = Status::Ok();  // this rank's own error, after taking part
  switch (q.op) {
    case OpType::kAllreduce:
      c.kind = DeviceOpKind::kAllreduce;
      c.op = q.reduce_op;
      c.prescale = q.prescale;
      c.postscale = q.postscale;
      break;
    case OpType::kBroadcast:
      c.kind = DeviceOpKind::kBroadcast;
      c.root = q.root;
      break;
    case OpType::kAllgather: {
      c.kind = DeviceOpKind::kAllgatherv;
      const Response& r = *responses[batch.members.front()];
      QueueEntry& e = *entries[batch.members.front()];
      size_t total = 0;
      int64_t first = 0;
      CONCORD_ASSIGN_OR_RETURN(c.bytes_per_rank, AllgatherBytes(r, &total, &first));
      if (total > e.output_capacity) {
        local = InvalidArgument("tensor '" + q.name + "': allgather result needs " +
                                std::to_string(total) + " bytes, the output buffer has " +
                                std::to_string(e.output_capacity));
        c.tensors[0].output = nullptr;  // the backend gathers into scratch memory
      } else {
        RequestState::Output& out = e.state->output();
        out.data = e.output;
        out.bytes = total;
        out.first_dim = first;
      }
      break;
    }
    case OpType::kBarrier:
      return Internal("a barrier was planned as a device collective");
  }
  auto done = [this, states, local](const Status& s) {
    device_thread_id_.store(std::this_thread::get_id());
    for (const auto& state : states) state->Complete(s.ok() ? local : s);
    if (!s.ok()) return DeviceFailed(s);
    // A waiter driving the engine may sit in Receive() for its slice: it returns and sees this.
    bool driven;
    {
      std::lock_guard<std::mutex> lock(park_mu_);
      driven = drivers_ > 0;
    }
    if (driven) {
      std::lock_guard<std::mutex> lock(failure_mu_);
      if (control_wake_) control_wake_->Wake();
    }
  };
  // Counted first: the collective may complete before Launch() returns.
  stats_.device_launches.fetch_add(1, std::memory_order_relaxed);
  stats_.batches.fetch_add(1, std::memory_order_relaxed);
  if (batch.fused) stats_.fused_tensors.fetch_add(batch.members.size(), std::memory_order_relaxed);
  CONCORD_ASSIGN_OR_RETURN(std::shared_ptr<DeviceEvent> event,
                           device_.backend->Launch(c, std::move(done)));
  for (size_t i : batch.members) {
    entries[i]->state->SetLaunched(event);
    entries[i].reset();  // the completion thread completes it now
  }
  return Status::Ok();
}

void Engine::DeviceFailed(const Status& status) {
  {
    std::lock_guard<std::mutex> lock(failure_mu_);
    if (device_failure_.ok()) device_failure_ = status;
  }
  WakeEngine();
}

}  // namespace concord
