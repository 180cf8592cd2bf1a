// The engine's wiring and lifecycle: construction, enqueue and groups, Shutdown() and Fail().
#include "core/engine.h"

#include <sched.h>

#include <algorithm>

#include "core/message.h"
#include "core/metered_backend.h"

namespace concord {
namespace {

// The engine whose refused group this thread is completing in GroupEnd: the members' callbacks
// run here, on the caller's thread, and must not finalize the communicator under the call.
thread_local const Engine* t_completing_group = nullptr;

// The CPUs this process may run on (its affinity mask), at least 1.
int UsableCpus() {
  cpu_set_t set;
  CPU_ZERO(&set);
  if (sched_getaffinity(0, sizeof(set), &set) == 0) return std::max(1, CPU_COUNT(&set));
  return static_cast<int>(std::max(1u, std::thread::hardware_concurrency()));
}

// How long a driving waiter polls without sleeping (see Engine::kDriveBusyPoll). A process bound
// to one CPU of several (mpirun binds each of 2 ranks to a core of its own) polls on its own
// core; any other shares its CPUs with the other local ranks.
std::chrono::microseconds DriveBusyPoll(const Config& config) {
  const int usable = UsableCpus();
  const bool bound = usable == 1 && std::thread::hardware_concurrency() > 1;
  const bool oversubscribed = !bound && config.local_size > usable;
  return oversubscribed ? std::chrono::microseconds(0) : Engine::kDriveBusyPoll;
}

std::vector<Lane> MakeLanes(std::vector<std::unique_ptr<Backend>> backends,
                            const std::shared_ptr<Metrics>& metrics,
                            const std::shared_ptr<Timeline>& timeline) {
  std::vector<Lane> lanes(backends.size());
  for (size_t i = 0; i < backends.size(); ++i) {
    lanes[i].backend = std::make_unique<MeteredBackend>(std::move(backends[i]), static_cast<int>(i),
                                                        metrics, timeline);
    if (i > 0) lanes[i].worker = std::make_unique<LaneWorker>();
  }
  return lanes;
}

std::unique_ptr<Coordinator> MakeCoordinator(const Config& config, const ResponseCache* cache) {
  if (config.rank != 0) return nullptr;
  StallOptions stall;
  stall.warning = MillisFromSeconds(config.stall_warning_s);
  stall.shutdown = MillisFromSeconds(config.stall_shutdown_s);
  return std::make_unique<Coordinator>(config.size, cache, stall,
                                       MillisFromSeconds(config.straggler_report_s));
}

}  // namespace

Engine::Engine(const Config& config, std::unique_ptr<ControlPlane> control,
               std::vector<std::unique_ptr<Backend>> lanes, std::shared_ptr<void> keep_alive,
               DevicePlane device, std::unique_ptr<P2pTransport> p2p)
    : config_(config),
      keep_alive_(std::move(keep_alive)),
      control_(std::move(control)),
      lanes_(MakeLanes(std::move(lanes), metrics_, timeline_)),
      cache_(static_cast<size_t>(config.cache_capacity)),
      coordinator_(MakeCoordinator(config_, &cache_)),
      // Push() calls it outside the queue's lock; the driver outlives the queue's use.
      queue_([this] { driver_.Wake(); }),
      gate_(std::make_shared<WaitGate>(
          [this](RequestState& state, Deadline deadline) { Drive(state, deadline); },
          [this](const RequestState& state) { return CheckWait(state); })),
      p2p_(std::make_unique<PointToPoint>(
          config.rank, config.size, MillisFromSeconds(config.timeout_s), DriveBusyPoll(config),
          std::move(p2p), result_buffers_,
          Status(Code::kUnavailable, "this communicator has no point-to-point transport"),
          // p2p_ is made before device_ takes the plane over; the backend object stays the same.
          device.backend.get(), device.unavailable)),
      driver_(ProgressDriver::Hooks{[this](Deadline limit, std::chrono::microseconds busy) {
                                      return StepHook(limit, busy);
                                    },
                                    [this](const Status& s) { HaltHook(s); },
                                    [this] { InterruptReceive(); },
                                    [this] { return queue_.in_flight() > 0; }},
              DriveBusyPoll(config)),
      device_(std::move(device)) {
  fusion_.threshold = static_cast<size_t>(config.fusion_threshold_bytes);
  fusion_.direct_bytes = static_cast<size_t>(config.direct_threshold_bytes);
  {
    MutexLock lock(failure_mu_);
    control_wake_ = control_.get();
  }
  const bool oversubscribed = DriveBusyPoll(config_).count() == 0;
  Log(LogLevel::kInfo, "started rank " + std::to_string(config_.rank) + " of " +
                           std::to_string(config_.size) + " on backend " +
                           lanes_.front().backend->name() + " (" + std::to_string(lanes_.size()) +
                           (lanes_.size() == 1 ? " lane" : " lanes") +
                           (oversubscribed ? ", oversubscribed: waiters do not busy-poll)" : ")"));
  // A peer the control plane finds failed while a collective may wait for it (the stepping
  // thread is away in it, not reading the plane): the lanes' backends interrupt what they can,
  // so that it fails now, not at its deadline, and the engine's failure path runs. The device
  // backend aborts its communicator (NCCL's kernels waiting for the peer stop); its collectives
  // fail on its completion thread, which then reports the device failure.
  std::vector<std::function<void()>> interrupters;
  for (auto& lane : lanes_) {
    if (std::function<void()> f = lane.backend->Interrupter()) interrupters.push_back(std::move(f));
  }
  if (device_.backend) {
    if (std::function<void()> f = device_.backend->Interrupter()) {
      interrupters.push_back(std::move(f));
    }
  }
  if (control_ && !interrupters.empty()) {
    control_->SetFailureListener([interrupters] {
      for (const auto& interrupt : interrupters) interrupt();
    });
  }
  driver_.Start();
}

Engine::~Engine() {
  // Never on the engine's own thread: the C API refuses to finalize from a callback.
  (void)Shutdown();
}

void Engine::Log(LogLevel level, const std::string& message) const {
  LogLine(static_cast<LogLevel>(config_.log_level), level, config_.rank, message);
}

Deadline Engine::TimeoutFromNow() const {
  return Deadline::After(MillisFromSeconds(config_.timeout_s));
}

Status Engine::failure() const {
  MutexLock lock(failure_mu_);
  return failure_;
}

void Engine::Finish(std::optional<QueueEntry>& entry, const Status& status) {
  std::shared_ptr<RequestState> state = std::move(entry->state);
  entry.reset();
  state->Complete(status);
}

Status Engine::Enqueue(QueueEntry entry, bool then_wait) {
  // Once failure() says so, every enqueue does (Fail() closes the queue a moment later).
  CONCORD_RETURN_IF_ERROR(failure());
  const bool barrier = entry.request.op == OpType::kBarrier;
  if (then_wait) {
    // Its members run at group_end, which this thread would never reach (found by
    // tests/fuzz/fuzz_c_api: concord_barrier between group_start and group_end hung). Refused
    // before anything else is looked at.
    MutexLock lock(group_mu_);
    if (open_groups_.count(std::this_thread::get_id()) != 0) {
      return InvalidArgument(
          (barrier && entry.request.name.empty() ? std::string("a barrier")
                                                 : "'" + entry.request.name + "'") +
          ": a blocking call inside a group would wait for itself; use the _async call and wait "
          "after concord_group_end");
    }
  }
  CONCORD_RETURN_IF_ERROR(NormalizeSplits(&entry.request, config_.size));
  CONCORD_RETURN_IF_ERROR(ValidateEntry(entry, config_.size, config_.rank));
  CONCORD_RETURN_IF_ERROR(CheckDevice(entry));
  CONCORD_RETURN_IF_ERROR(AttachCompressor(entry));
  entry.step = step_.load(std::memory_order_relaxed);
  entry.state->Meter(metrics_, OpTypeName(entry.request.op), entry.request.dtype,
                     barrier ? 0 : static_cast<uint64_t>(entry.request.NumBytes()), Clock::now());
  if (timeline_->on()) {
    // An unnamed barrier's number comes later (TensorQueue::Push): its track is all barriers'.
    entry.state->Trace(timeline_, entry.request.name.empty()
                                      ? std::string(kReservedPrefix) + ".barrier"
                                      : entry.request.name);
  }
  // A completion callback's enqueue is not the thread's own: a thread that waits runs the steps,
  // and with them the callbacks of whatever completes, which must not join a group it has open
  // (the other ranks run the callback elsewhere, or later).
  const bool from_callback = OnEngineThread();
  {
    MutexLock lock(group_mu_);
    // then_wait was refused above if this thread has a group open (only it can close it).
    const auto group =
        from_callback ? open_groups_.end() : open_groups_.find(std::this_thread::get_id());
    if (group != open_groups_.end()) {
      for (const auto& e : group->second) {
        if (!entry.request.name.empty() && e.request.name == entry.request.name) {
          return InvalidArgument("tensor '" + entry.request.name + "' appears twice in one group");
        }
      }
      group->second.push_back(std::move(entry));
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
  MutexLock lock(group_mu_);
  if (!open_groups_.emplace(std::this_thread::get_id(), std::vector<QueueEntry>()).second) {
    return InvalidArgument("a group is already open on this thread (groups do not nest)");
  }
  return Status::Ok();
}

Status Engine::GroupEnd() {
  std::vector<QueueEntry> entries;
  {
    MutexLock lock(group_mu_);
    const auto group = open_groups_.find(std::this_thread::get_id());
    if (group == open_groups_.end()) {
      return InvalidArgument("group_end without group_start on this thread");
    }
    entries = std::move(group->second);
    open_groups_.erase(group);
  }
  if (entries.empty()) return Status::Ok();
  // Ranks agree on a group by its first member's name and its size (the queue names it, once an
  // unnamed barrier among them has its number); the coordinator checks both.
  for (auto& e : entries) e.request.group_size = static_cast<int32_t>(entries.size());
  // The members' handles exist since their Enqueue(): a refused group must still complete them.
  std::vector<std::shared_ptr<RequestState>> states;
  states.reserve(entries.size());
  for (const auto& e : entries) states.push_back(e.state);
  Status s = queue_.Push(std::move(entries));
  if (!s.ok()) {
    const Engine* outer = t_completing_group;
    t_completing_group = this;
    for (auto& state : states) state->Complete(s);
    t_completing_group = outer;
  }
  return s;
}

std::string Engine::NextBarrierName() {
  return queue_.NextBarrierName();
}

Status Engine::CheckExchangeInternal() const {
  if (OnEngineThread()) {
    return InvalidArgument(
        "cannot run from the communicator's own threads (a completion callback)");
  }
  return Status::Ok();
}

StatusOr<std::string> Engine::ExchangeInternal(const std::string& tag, const std::string& bytes) {
  if (Status s = CheckExchangeInternal(); !s.ok()) return s.WithContext("'" + tag + "'");
  // The input must live as long as the operation, which may outlive this call (a timeout).
  auto input = std::make_shared<const std::string>(bytes);
  auto state = std::make_shared<RequestState>([input](const Status&) {});
  QueueEntry e;
  e.request.name = std::string(kReservedPrefix) + "." + tag;
  e.request.op = OpType::kAllgather;
  e.request.dtype = DType::kUint8;
  e.request.shape = {static_cast<int64_t>(bytes.size())};
  e.input = input->data();
  e.state = state;
  e.step = step_.load(std::memory_order_relaxed);
  std::vector<QueueEntry> one;
  one.push_back(std::move(e));
  CONCORD_RETURN_IF_ERROR(queue_.Push(std::move(one)));
  if (!Wait(*state, TimeoutFromNow())) {
    return Status(Code::kTimeout, "'" + tag + "' did not complete within " +
                                      FormatSeconds(config_.timeout_s) +
                                      ": not every rank of the communicator called it");
  }
  CONCORD_RETURN_IF_ERROR(state->status());
  const auto& owned = state->output().owned;
  if (owned.size() != bytes.size() * static_cast<size_t>(config_.size)) {
    return Internal("'" + tag + "': gathered " + std::to_string(owned.size()) +
                    " bytes, expected " +
                    std::to_string(bytes.size() * static_cast<size_t>(config_.size)));
  }
  return std::string(reinterpret_cast<const char*>(owned.data()), owned.size());
}

Status Engine::Shutdown() {
  if (OnEngineThread()) {
    return InvalidArgument("a communicator cannot be finalized from its own completion callback");
  }
  MutexLock shutdown_lock(shutdown_mu_);
  if (driver_.stopping()) return Status::Ok();
  const Status closed(Code::kNotInitialized, "the communicator was finalized");
  // Point to point ends first, where its transport can tell the peers: their sends and recvs
  // with this rank fail at once instead of at their timeout while the barrier below waits for
  // them to finalize too. Not after a failure (Fail() may still wait for the control plane's
  // teardown, its p2p_->Fail() to come): then this rank leaves as a failed one does, without a
  // goodbye, and its peers' operations with it wait for their own engine's cause (rank 0's
  // abort) instead of failing as if this rank had finalized alone.
  if (const Status failed = failure(); !failed.ok()) {
    p2p_->Fail(failed);
  } else {
    p2p_->Finish(closed);
  }
  Status barrier = Status::Ok();
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
    finalizing_.store(true);
    if (queue_.Push(std::move(entries)).ok()) {
      if (!Wait(*finalized, TimeoutFromNow())) {
        barrier = Status(Code::kTimeout,
                         "concord_finalize: the finalize barrier did not complete within " +
                             FormatSeconds(config_.timeout_s) +
                             " (other ranks have not finalized; they may still be running); "
                             "this rank finalized without them");
      } else if (!finalized->status().ok()) {
        barrier = finalized->status().WithContext("concord_finalize: the finalize barrier failed");
      } else {
        barrier = LeftBehindError();
      }
    }
  }
  driver_.Stop();
  std::shared_ptr<PlaneTeardown> teardown;
  {
    // The driver has stopped: the coordinator's last figures, for the summary.
    MutexLock step(driver_.step_mutex());
    if (coordinator_ && config_.size > 1) {
      metrics_->SetStragglers(coordinator_->straggler_totals());
    }
    teardown = teardown_;
  }
  // After a failure: the other ranks should get this rank's last words before the process ends.
  if (teardown && !teardown->WaitFor(kTeardownWait)) {
    Log(LogLevel::kWarning,
        "the control plane's teardown after the failure did not end within " +
            FormatSeconds(std::chrono::duration<double>(kTeardownWait).count()) +
            " (stalled inside the transport); left to itself");
  }
  // Waiters driving notice the stop within a slice; later ones wait plainly.
  gate_->Close();
  // From here callbacks run on this thread (what the device backend's Abort() fails, what is left
  // below), which counts as the engine's meanwhile: one that finalizes this communicator again is
  // refused instead of waiting for shutdown_mu_ forever.
  finalizing_thread_.store(std::this_thread::get_id());
  if (device_.backend) {
    // Normally drained by the finalize barrier; a lone rank waits here, at most the timeout.
    Status drained = device_.backend->Drain(TimeoutFromNow());
    if (!drained.ok()) device_.backend->Abort(drained);
  }
  Log(LogLevel::kInfo,
      "finalized: " + std::to_string(stats_.responses_cached.load()) +
          " responses from the cache, " + std::to_string(stats_.responses_full.load()) + " full, " +
          std::to_string(stats_.response_lists.load()) + " response lists, " +
          std::to_string(stats_.batches.load()) + " collectives, " +
          std::to_string(stats_.fused_tensors.load()) + " tensors through the fusion buffer, " +
          std::to_string(stats_.inline_reductions.load()) + " reduced inline, " +
          std::to_string(stats_.device_launches.load()) + " device launches, " +
          std::to_string(stats_.cache_evictions.load()) + " cache evictions, " +
          std::to_string(stats_.topk_residual_evictions.load()) + " top-k residuals evicted");
  std::vector<QueueEntry> left = queue_.Close(closed);
  {
    MutexLock lock(group_mu_);
    // The groups stay open (their threads' group_end still closes them), without members.
    for (auto& [thread, members] : open_groups_) {
      for (auto& e : members) left.push_back(std::move(e));
      members.clear();
    }
  }
  p2p_->Close(closed);
  for (auto& e : left) e.state->Complete(closed);
  finalizing_thread_.store(std::thread::id());
  WriteSummary();
  timeline_->Stop();
  if (metrics_endpoint_.server) {
    // The server's destructor waits for a scrape that is rendering this engine.
    metrics_endpoint_.engine->store(nullptr);
    metrics_endpoint_.server.reset();
  }
  if (!barrier.ok()) Log(LogLevel::kWarning, barrier.message());
  return barrier;
}

Status Engine::StepHook(Deadline limit, std::chrono::microseconds busy) {
  // The driver calls its hooks with the step lock held.
  driver_.step_mutex().AssertHeld();
  return Step(limit, busy);
}

void Engine::HaltHook(const Status& status) {
  driver_.step_mutex().AssertHeld();
  // Once the finalize barrier has run, peers close their connections as they please: that is the
  // end of the job, not a failure.
  if (!finalized_.load()) Fail(status);
}

void Engine::InterruptReceive() {
  MutexLock lock(failure_mu_);
  if (control_wake_) control_wake_->Wake();
}

Status Engine::CheckWait(const RequestState& state) {
  MutexLock lock(group_mu_);
  const auto group = open_groups_.find(std::this_thread::get_id());
  if (group == open_groups_.end()) return Status::Ok();
  for (const auto& e : group->second) {
    if (e.state.get() != &state) continue;
    return InvalidArgument("'" + e.request.name +
                           "' is in the group this thread has open: the group is submitted by "
                           "this thread's group_end, so waiting for it first would never end; "
                           "end the group, then wait");
  }
  return Status::Ok();
}

void Engine::Drive(RequestState& state, Deadline deadline) {
  if (!config_.waiter_progress || OnEngineThread()) return;
  driver_.Drive(state, deadline);
}

Status Engine::WithMembership(const Status& status) const {
  if (config_.membership.empty() || status.ok()) return status;
  const std::string note = " [" + config_.membership + "]";
  if (status.message().find(note) != std::string::npos) return status;
  return Status(status.code(), status.message() + note);
}

void Engine::Fail(const Status& failure) {
  const Status status = WithMembership(failure);
  Log(LogLevel::kError, status.ToString());
  {
    MutexLock lock(failure_mu_);
    if (failure_.ok()) failure_ = status;
    control_wake_ = nullptr;
  }
  // Before anything that waits: peers in a collective that waits for this rank fail now, and do
  // not take this process's exit, soon, for the cause (the shared memory names ranks it finds
  // gone; the cause is the control plane's to name). The lanes are idle: the stepping thread,
  // this one, waits for their workers.
  for (auto& lane : lanes_) {
    if (lane.backend) lane.backend->Abandon();
  }
  // The control plane's last words and its teardown (closing its connections, so the other ranks
  // see this rank go and fail too) run on a thread of their own (core/plane_teardown.h), waited
  // for at most kTeardownWait: over MPI they can stall for good, and this thread is often the
  // application's. Abandon() first, which calls no MPI: the MPI backends then free nothing either.
  if (control_) {
    control_->Abandon();
    std::vector<std::pair<int, std::string>> last_words;
    std::chrono::milliseconds drain(0);
    if (config_.rank == 0) {
      ResponseMessage abort;
      abort.abort = true;
      abort.abort_code = status.code();
      abort.abort_reason = "rank 0 aborted the job: " + status.message();
      const std::string bytes = SerializeResponseMessage(abort);
      for (int r = 1; r < config_.size; ++r) last_words.emplace_back(r, bytes);
      // Best effort: peers that still read get the reason; dead ones cost at most a second.
      drain = std::min(MillisFromSeconds(config_.timeout_s), std::chrono::milliseconds(1000));
    } else if (!read_rank0_abort_.load()) {
      // Tell rank 0 why before closing (its first sign would be this rank's closed connection):
      // this rank may have seen the culprit die first, as shared memory does (message.h). Best
      // effort: the frame leaves before the connection closes, or rank 0 is gone already. Not
      // when rank 0 aborted the job: it knows, and it may have exited (over MPI, a message to a
      // process that exited is what stalls).
      ResponseMessage report;
      report.abort = true;
      report.abort_code = status.code();
      report.abort_reason = status.message();
      last_words.emplace_back(0, SerializeResponseMessage(report));
    }
    teardown_ = PlaneTeardown::Start(std::move(control_), std::move(last_words), drain);
    (void)teardown_->WaitFor(kTeardownWait);
  }
  for (auto& lane : lanes_) lane.backend.reset();
  // Device work in flight fails now (its communicator is aborted), not at its deadline.
  if (device_.backend) device_.backend->Abort(status);
  for (auto& e : queue_.Close(status)) e.state->Complete(status);
  p2p_->Fail(status);
}

bool Engine::OnEngineThread() const {
  const std::thread::id self = std::this_thread::get_id();
  if (t_completing_group == this || driver_.RunsSteps(self) ||
      (device_.backend && device_.backend->OnCompletionThread()) ||
      self == finalizing_thread_.load() || p2p_->OnOwnThread()) {
    return true;
  }
  for (const auto& lane : lanes_) {
    if (lane.worker && self == lane.worker->id()) return true;
  }
  return false;
}

}  // namespace concord
