#include "core/engine.h"

#include <cmath>
#include <cstring>

#include "core/message.h"

namespace concord {
namespace {

constexpr const char* kReservedPrefix = "__concord";

std::string FinalizeName() {
  return std::string(kReservedPrefix) + ".finalize";
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
  if (r.device != -1) {
    return fail(Code::kUnavailable, "device " + std::to_string(r.device) +
                                        " requested, but this build supports CPU tensors only");
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
               std::unique_ptr<Backend> backend, std::shared_ptr<void> keep_alive)
    : config_(config),
      keep_alive_(std::move(keep_alive)),
      control_(std::move(control)),
      backend_(std::move(backend)),
      queue_([this] {
        // Called by Push() outside the queue's lock; control_ lives until the thread is joined.
        std::lock_guard<std::mutex> lock(failure_mu_);
        if (control_wake_) control_wake_->Wake();
      }),
      cache_(static_cast<size_t>(config.cache_capacity)) {
  control_wake_ = control_.get();
  fusion_.threshold = static_cast<size_t>(config.fusion_threshold_bytes);
  if (config_.rank == 0) {
    StallOptions stall;
    stall.warning = Millis(config_.stall_warning_s);
    stall.shutdown = Millis(config_.stall_shutdown_s);
    coordinator_ = std::make_unique<Coordinator>(config_.size, &cache_, stall);
  }
  Log(LogLevel::kInfo, "started rank " + std::to_string(config_.rank) + " of " +
                           std::to_string(config_.size) + " on backend " + backend_->name());
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

Status Engine::Enqueue(QueueEntry entry) {
  CONCORD_RETURN_IF_ERROR(ValidateEntry(entry, config_.size));
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
  return queue_.Push(std::move(one));
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
  if (std::this_thread::get_id() == engine_thread_id_.load()) {
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
      finalized->Wait(Deadline::After(Millis(config_.timeout_s)));
    }
  }
  stopping_.store(true);
  {
    std::lock_guard<std::mutex> lock(failure_mu_);
    if (control_wake_) control_wake_->Wake();
  }
  if (thread_.joinable()) thread_.join();
  Log(LogLevel::kInfo,
      "finalized: " + std::to_string(stats_.responses_cached.load()) +
          " responses from the cache, " + std::to_string(stats_.responses_full.load()) + " full, " +
          std::to_string(stats_.response_lists.load()) + " response lists, " +
          std::to_string(stats_.batches.load()) + " collectives, " +
          std::to_string(stats_.fused_tensors.load()) + " tensors through the fusion buffer");
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
    ControlMessage ignored;
    control_->Receive(&ignored, Deadline::After(std::chrono::milliseconds(0)));  // flush
  }
  control_.reset();
  backend_.reset();
  for (auto& e : queue_.Close(status)) e.state->Complete(status);
}

void Engine::Loop() {
  engine_thread_id_.store(std::this_thread::get_id());
  while (!stopping_.load()) {
    Status s = Step();
    if (!s.ok()) {
      // Once the finalize barrier has run, peers close their connections as they please: that
      // is the end of the job, not a failure.
      if (!finalized_.load()) Fail(s);
      return;
    }
  }
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

Status Engine::Step() {
  // Wait for a message or a wake-up; then take every message already there; then the queue.
  // The queue is read after the last Receive, so a wake-up consumed there is never lost.
  ControlMessage message;
  CONCORD_ASSIGN_OR_RETURN(bool got, control_->Receive(&message, NextWake()));
  while (got && !stopping_.load()) {
    CONCORD_RETURN_IF_ERROR(HandleMessage(message));
    CONCORD_ASSIGN_OR_RETURN(
        got, control_->Receive(&message, Deadline::After(std::chrono::milliseconds(0))));
  }
  if (stopping_.load()) return Status::Ok();
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
  std::vector<TensorRequest> fresh = queue_.PopNew();
  if (fresh.empty()) return Status::Ok();
  RequestMessage m;
  for (auto& request : fresh) {
    if (auto bit = cache_.Lookup(request, config_.rank)) {
      if (*bit / 64 >= m.cached_mask.size()) m.cached_mask.resize(*bit / 64 + 1, 0);
      m.cached_mask[*bit / 64] |= uint64_t{1} << (*bit % 64);
    } else {
      m.requests.push_back(std::move(request));
    }
  }
  if (coordinator_) return coordinator_->Add(0, m, Clock::now());
  return control_->Send(0, SerializeRequestMessage(m));
}

Status Engine::HandleMessage(const ControlMessage& message) {
  if (coordinator_) {
    auto parsed = ParseRequestMessage(message.bytes);
    if (!parsed.ok())
      return parsed.status().WithContext("from rank " + std::to_string(message.from));
    return coordinator_->Add(message.from, *parsed, Clock::now());
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
    const std::string bytes = SerializeResponseMessage(ready);
    for (int r = 1; r < config_.size; ++r) CONCORD_RETURN_IF_ERROR(control_->Send(r, bytes));
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
  for (size_t i = 0; i < responses.size(); ++i) {
    // An error for other ranks (a stall timeout this rank was late for) leaves its entry alone.
    if (!responses[i]->AppliesTo(config_.rank)) continue;
    entries[i] = queue_.Take(responses[i]->request.name);
    const bool expected = responses[i]->error == Code::kOk;
    if (!entries[i] && expected) {
      const Status s = ProtocolError("response for tensor '" + responses[i]->request.name +
                                     "', which this rank did not submit");
      // The entries taken so far are out of the queue, so Fail() would not reach them.
      for (auto& e : entries) {
        if (e) e->state->Complete(s);
      }
      return s;
    }
  }
  for (const FusionBatch& batch : PlanFusion(responses, fusion_)) {
    Status s = RunBatch(batch, responses, entries);
    if (!s.ok()) {
      // Entries taken from the queue for this list complete here; Fail() handles the queue.
      for (auto& e : entries) {
        if (e) e->state->Complete(s);
      }
      return s;
    }
  }
  // Every rank inserts in this same order, so cache bits agree everywhere.
  for (const auto& item : message.items) {
    if (!item.cached) cache_.Insert(item.response);
  }
  return Status::Ok();
}

Status Engine::RunBatch(const FusionBatch& batch, const std::vector<const Response*>& responses,
                        std::vector<std::optional<QueueEntry>>& entries) {
  if (responses[batch.members.front()]->error == Code::kOk) {
    stats_.batches.fetch_add(1, std::memory_order_relaxed);
  }
  if (batch.fused) {
    stats_.fused_tensors.fetch_add(batch.members.size(), std::memory_order_relaxed);
    return RunAllreduceFused(batch, responses, entries);
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
      s = RunAllreduceDirect(r, e);
      break;
    case OpType::kAllgather:
      s = RunAllgather(r, e, &local);
      break;
    case OpType::kBroadcast:
      s = RunBroadcast(r, e);
      break;
    case OpType::kBarrier:
      s = backend_->Barrier();
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

Status Engine::RunAllreduceDirect(const Response& r, QueueEntry& e) {
  const TensorRequest& q = r.request;
  const size_t n = static_cast<size_t>(q.NumElements());
  CopyScaled(e.output, e.input, n, q.dtype, q.prescale);
  CONCORD_RETURN_IF_ERROR(backend_->Allreduce(e.output, n, q.dtype, q.reduce_op));
  if (q.reduce_op == ReduceOp::kAverage && !IsFloatingPoint(q.dtype)) {
    DivideIntegers(e.output, n, q.dtype, config_.size);
  }
  const double post = PostFactor(q, config_.size);
  if (post != 1.0) ScaleElements(e.output, n, q.dtype, post);
  return Status::Ok();
}

uint8_t* Engine::FusionBuffer(size_t bytes) {
  if (bytes > fusion_capacity_) {
    // Grow geometrically up to the threshold so a warming-up job reallocates only a few times.
    size_t capacity = std::max<size_t>(bytes, std::min(fusion_.threshold, 2 * fusion_capacity_));
    fusion_buffer_.reset(new uint8_t[capacity]);
    fusion_capacity_ = capacity;
  }
  return fusion_buffer_.get();
}

Status Engine::RunAllreduceFused(const FusionBatch& batch,
                                 const std::vector<const Response*>& responses,
                                 std::vector<std::optional<QueueEntry>>& entries) {
  const TensorRequest& q = responses[batch.members.front()]->request;
  const size_t elem = DTypeSize(q.dtype);
  const size_t message = FusedMessageBytes(batch.bytes, elem);
  uint8_t* buffer = FusionBuffer(message);
  size_t offset = 0;
  for (size_t i : batch.members) {
    const QueueEntry& e = *entries[i];
    const size_t n = static_cast<size_t>(e.request.NumElements());
    CopyScaled(buffer + offset, e.input, n, q.dtype, q.prescale);
    offset += n * elem;
  }
  std::memset(buffer + offset, 0, message - offset);  // reduced, never read back
  const size_t count = message / elem;
  Status s = backend_->Allreduce(buffer, count, q.dtype, q.reduce_op);
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
    e.state->Complete(Status::Ok());
  }
  return Status::Ok();
}

Status Engine::RunAllgather(const Response& r, QueueEntry& e, Status* local_error) {
  const TensorRequest& q = r.request;
  if (r.first_dims.size() != static_cast<size_t>(config_.size)) {
    return ProtocolError("allgather response for tensor '" + q.name + "' has " +
                         std::to_string(r.first_dims.size()) + " first dimensions for " +
                         std::to_string(config_.size) + " ranks");
  }
  size_t row = DTypeSize(q.dtype);
  for (size_t d = 1; d < q.shape.size(); ++d) row *= static_cast<size_t>(q.shape[d]);
  std::vector<size_t> bytes(config_.size);
  size_t total = 0;
  int64_t first = 0;
  constexpr size_t kMaxBytes = size_t{1} << 50;
  for (int rk = 0; rk < config_.size; ++rk) {
    if (__builtin_mul_overflow(static_cast<size_t>(r.first_dims[rk]), row, &bytes[rk]) ||
        bytes[rk] > kMaxBytes || (total += bytes[rk]) > kMaxBytes) {
      return ProtocolError("allgather response for tensor '" + q.name + "' is too large");
    }
    first += r.first_dims[rk];
  }
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
    dst = FusionBuffer(total);
  }
  CONCORD_RETURN_IF_ERROR(backend_->Allgatherv(e.input, dst, bytes));
  if (local_error->ok()) {
    out.data = dst;
    out.bytes = total;
    out.first_dim = first;
  }
  return Status::Ok();
}

Status Engine::RunBroadcast(const Response& r, QueueEntry& e) {
  const size_t bytes = r.request.NumBytes();
  if (config_.rank == r.request.root && e.output != e.input && bytes > 0) {
    std::memcpy(e.output, e.input, bytes);
  }
  return backend_->Broadcast(e.output, bytes, r.request.root);
}

}  // namespace concord
