// The engine's CPU operations, each run on one lane (its backend and buffers) by the stepping
// thread or that lane's worker: a fused batch of allreduces (or of reduces) through the lane's
// fusion buffer, a share of a span group of direct allreduces in place, a direct reduce, an
// allgather, a gather, a broadcast and a barrier.
//
// Each completes the entries it finishes with Finish() and returns OK; on a backend error it
// returns the error and completes nothing (Execute() completes every entry still held). A
// response that carries an error for this rank completes its entry with that error.
#include <cstring>

#include "base/json.h"
#include "core/engine.h"

namespace concord {
namespace {

// Integer average: the sum divided by the ranks that contributed, truncating toward zero.
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

// The factor applied after the reduction: postscale, and 1/contributors for a floating average.
double PostFactor(const TensorRequest& r, int contributors) {
  double f = r.postscale;
  if (r.reduce_op == ReduceOp::kAverage && IsFloatingPoint(r.dtype)) f /= contributors;
  return f;
}

}  // namespace

Status Engine::OutputTooSmall(const std::string& name, size_t needed, size_t capacity,
                              const char* op) {
  return InvalidArgument("tensor '" + name + "': " + op + " result needs " +
                         std::to_string(needed) + " bytes, the output buffer has " +
                         std::to_string(capacity));
}

void* Engine::ResultOutput(QueueEntry& e, size_t total, const char* op, Status* local) const {
  if (e.output == nullptr) {
    auto& owned = e.state->output().owned;
    owned = result_buffers_->Take(total);
    return owned.data();
  }
  if (total <= e.output_capacity) return e.output;
  *local = OutputTooSmall(e.request.name, total, e.output_capacity, op);
  return nullptr;
}

void* Engine::ResultBuffer(Lane& lane, QueueEntry& e, size_t total, const char* op,
                           Status* local) const {
  void* out = ResultOutput(e, total, op, local);
  // Still take part (the other ranks are already in the collective), into scratch memory.
  return local->ok() ? out : lane.fusion.Get(total, fusion_.threshold);
}

std::string Engine::MembersJson(const FusionBatch& batch, const Responses& responses) {
  std::string members = "\"members\":[";
  for (size_t i : batch.members) {
    if (members.back() != '[') members += ',';
    members += JsonQuote(responses[i]->request.name);
  }
  members += ']';
  return members;
}

void Engine::TraceBatch(const Lane& lane, const FusionBatch& batch, const Responses& responses,
                        Clock::time_point start) const {
  const TensorRequest& q = responses[batch.members.front()]->request;
  std::string members = MembersJson(batch, responses);
  if (!q.compression.empty()) members += ",\"compression\":" + JsonQuote(q.compression);
  const char* name = q.op == OpType::kReducescatter ? "fused reducescatter"
                     : q.op == OpType::kReduce      ? "fused reduce"
                                                    : "fused allreduce";
  timeline_->Slice(Timeline::kLaneTrack + LaneIndex(lane), name, start, Clock::now(), batch.bytes,
                   nullptr, std::move(members));
}

Status Engine::RunBatch(Lane& lane, const FusionBatch& batch, const Responses& responses,
                        Entries& entries) {
  const size_t i = batch.members.front();
  const Response& r = *responses[i];
  if (r.error != Code::kOk) {
    // Never fused: the fusion planner fuses only operations that run.
    if (entries[i]) Finish(entries[i], Status(r.error, r.error_message));
    return Status::Ok();
  }
  stats_.batches.fetch_add(1, std::memory_order_relaxed);
  if (batch.fused) {
    stats_.fused_tensors.fetch_add(batch.members.size(), std::memory_order_relaxed);
    metrics_->RecordFusedBatch(batch.members.size(), batch.bytes, fusion_.threshold);
    const Clock::time_point start = timeline_->on() ? Clock::now() : Clock::time_point();
    Status run;
    if (r.request.op == OpType::kReducescatter) {
      run = RunReducescatterPacked(lane, batch, responses, entries);
    } else if (!r.request.compression.empty()) {
      run = RunCompressed(lane, batch, responses, entries);
    } else {
      run = RunAllreduceFused(lane, batch, responses, entries);
    }
    if (start != Clock::time_point()) TraceBatch(lane, batch, responses, start);
    return run;
  }
  switch (r.request.op) {
    case OpType::kAllgather:
      return RunAllgather(lane, r, entries[i]);
    case OpType::kBroadcast:
      return RunBroadcast(lane, r, entries[i]);
    case OpType::kBarrier:
      return RunBarrier(lane, r, entries[i]);
    case OpType::kReducescatter:
      return RunReducescatter(lane, r, entries[i]);
    case OpType::kAlltoall:
      return RunAlltoall(lane, r, entries[i]);
    case OpType::kReduce:
      return RunReduce(lane, r, entries[i]);
    case OpType::kGather:
      return RunGather(lane, r, entries[i]);
    case OpType::kAllreduce:
      break;
  }
  // PlanLanes puts every direct allreduce in a span group.
  return Internal("direct allreduce of tensor '" + r.request.name + "' outside a span group");
}

void Engine::FinishAllreduce(const TensorRequest& q, int contributors, void* data, size_t n) const {
  if (q.reduce_op == ReduceOp::kAverage && !IsFloatingPoint(q.dtype)) {
    DivideIntegers(data, n, q.dtype, contributors);
  }
  const double post = PostFactor(q, contributors);
  if (post != 1.0) ScaleElements(data, n, q.dtype, post);
}

Status Engine::RunAllreducePieces(Lane& lane, const std::vector<AllreducePiece>& pieces,
                                  const Responses& responses, Entries& entries) {
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
  CONCORD_RETURN_IF_ERROR(Reductions(lane).AllreduceSpans(spans, first.dtype, first.reduce_op));
  for (size_t k = 0; k < pieces.size(); ++k) {
    const Response& r = *responses[pieces[k].member];
    const TensorRequest& q = r.request;
    FinishAllreduce(q, r.Contributors(config_.size), spans[k].data, spans[k].count);
    entries[pieces[k].member]->state->AddWireBytes(compression::WireBytesPerRank(
        compression::Exchange::kAllreduce, spans[k].count * DTypeSize(q.dtype), config_.size));
  }
  return Status::Ok();
}

Status Engine::RunAllreduceFused(Lane& lane, const FusionBatch& batch, const Responses& responses,
                                 Entries& entries) const {
  const TensorRequest& q = responses[batch.members.front()]->request;
  // Fused members agree on it (fusion_planner.cc).
  const int contributors = responses[batch.members.front()]->Contributors(config_.size);
  const size_t elem = DTypeSize(q.dtype);
  const size_t message = FusedMessageBytes(batch.bytes, elem);
  const int track = Timeline::kLaneTrack + LaneIndex(lane);
  const Clock::time_point start = timeline_->on() ? Clock::now() : Clock::time_point();
  uint8_t* buffer = lane.fusion.Get(message, fusion_.threshold);
  size_t offset = 0;
  for (size_t i : batch.members) {
    const QueueEntry& e = *entries[i];
    const size_t n = static_cast<size_t>(e.request.NumElements());
    CopyScaled(buffer + offset, e.input, n, q.dtype, q.prescale);
    offset += n * elem;
  }
  std::memset(buffer + offset, 0, message - offset);  // reduced, never read back
  const size_t count = message / elem;
  const bool traced = timeline_->on();
  const Clock::time_point packed = traced ? Clock::now() : Clock::time_point();
  if (traced) timeline_->Slice(track, "pack", start, packed, batch.bytes);
  CONCORD_RETURN_IF_ERROR(Reductions(lane).Allreduce(buffer, count, q.dtype, q.reduce_op));
  const Clock::time_point reduced = traced ? Clock::now() : Clock::time_point();
  if (q.reduce_op == ReduceOp::kAverage && !IsFloatingPoint(q.dtype)) {
    DivideIntegers(buffer, count, q.dtype, contributors);
  }
  const double post = PostFactor(q, contributors);
  offset = 0;
  for (size_t i : batch.members) {
    QueueEntry& e = *entries[i];
    const size_t n = static_cast<size_t>(e.request.NumElements());
    // A reduce's result is its root's alone (fused reduces may have different roots).
    if (q.op != OpType::kReduce || e.request.root == config_.rank) {
      CopyScaled(e.output, buffer + offset, n, q.dtype, post);
    }
    offset += n * elem;
    e.state->AddWireBytes(
        compression::WireBytesPerRank(compression::Exchange::kAllreduce, n * elem, config_.size));
    Finish(entries[i], Status::Ok());
  }
  if (traced) timeline_->Slice(track, "unpack", reduced, Clock::now(), batch.bytes);
  return Status::Ok();
}

StatusOr<std::vector<size_t>> Engine::AllgatherBytes(const Response& r, size_t* total,
                                                     int64_t* first_dim) const {
  const TensorRequest& q = r.request;
  if (r.first_dims.size() != static_cast<size_t>(config_.size)) {
    return ProtocolError(std::string(OpTypeName(q.op)) + " response for tensor '" + q.name +
                         "' has " + std::to_string(r.first_dims.size()) + " first dimensions for " +
                         std::to_string(config_.size) + " ranks");
  }
  size_t row = DTypeSize(q.dtype);
  for (size_t d = 1; d < q.shape.size(); ++d) row *= static_cast<size_t>(q.shape[d]);
  std::vector<size_t> bytes(config_.size);
  *total = 0;
  *first_dim = 0;
  constexpr size_t kMaxBytes = static_cast<size_t>(kMaxTensorSize);
  for (int rk = 0; rk < config_.size; ++rk) {
    if (__builtin_mul_overflow(static_cast<size_t>(r.first_dims[rk]), row, &bytes[rk]) ||
        bytes[rk] > kMaxBytes || (*total += bytes[rk]) > kMaxBytes) {
      return ProtocolError(std::string(OpTypeName(q.op)) + " response for tensor '" + q.name +
                           "' is too large");
    }
    *first_dim += r.first_dims[rk];
  }
  return bytes;
}

Status Engine::RunAllgather(Lane& lane, const Response& r, std::optional<QueueEntry>& entry) {
  QueueEntry& e = *entry;
  size_t total = 0;
  int64_t first = 0;
  CONCORD_ASSIGN_OR_RETURN(std::vector<size_t> bytes, AllgatherBytes(r, &total, &first));
  RequestState::Output& out = e.state->output();
  Status local = Status::Ok();  // this rank's own error, reported after taking part
  void* dst = ResultBuffer(lane, e, total, "allgather", &local);
  CONCORD_RETURN_IF_ERROR(lane.backend->Allgatherv(e.input, dst, bytes));
  // A ring allgather: each rank forwards (n - 1) / n of the result.
  if (config_.size > 1) e.state->AddWireBytes(total * (config_.size - 1) / config_.size);
  if (local.ok()) {
    out.data = dst;
    out.bytes = total;
    out.first_dim = first;
  }
  Finish(entry, local);
  return Status::Ok();
}

Status Engine::RunReduce(Lane& lane, const Response& r, std::optional<QueueEntry>& entry) {
  QueueEntry& e = *entry;
  const TensorRequest& q = r.request;
  const size_t n = static_cast<size_t>(q.NumElements());
  const bool root = config_.rank == q.root;
  void* out = root ? e.output : lane.fusion.Get(q.NumBytes(), fusion_.threshold);
  const void* in = e.input;
  if (q.prescale != 1.0) {  // into the output (the input is the caller's), reduced in place there
    CopyScaled(out, e.input, n, q.dtype, q.prescale);
    in = out;
  }
  CONCORD_RETURN_IF_ERROR(Reductions(lane).Reduce(in, out, n, q.dtype, q.reduce_op, q.root));
  if (root) FinishAllreduce(q, r.Contributors(config_.size), out, n);
  // Estimated as an allreduce's (what the default Backend::Reduce runs).
  e.state->AddWireBytes(
      compression::WireBytesPerRank(compression::Exchange::kAllreduce, q.NumBytes(), config_.size));
  Finish(entry, Status::Ok());
  return Status::Ok();
}

Status Engine::RunGather(Lane& lane, const Response& r, std::optional<QueueEntry>& entry) {
  QueueEntry& e = *entry;
  const int root = r.request.root;
  size_t total = 0;
  int64_t first = 0;
  CONCORD_ASSIGN_OR_RETURN(std::vector<size_t> bytes, AllgatherBytes(r, &total, &first));
  Status local = Status::Ok();  // the root's own error, reported after taking part
  void* dst = config_.rank == root ? ResultBuffer(lane, e, total, "gather", &local)
                                   : lane.fusion.Get(total, fusion_.threshold);
  CONCORD_RETURN_IF_ERROR(lane.backend->Gatherv(e.input, dst, bytes, root));
  // Estimated as an allgather's (what the default Backend::Gatherv runs).
  if (config_.size > 1) e.state->AddWireBytes(total * (config_.size - 1) / config_.size);
  if (config_.rank == root && local.ok()) {
    RequestState::Output& out = e.state->output();
    out.data = dst;
    out.bytes = total;
    out.first_dim = first;
  }
  Finish(entry, local);
  return Status::Ok();
}

Status Engine::RunBroadcast(Lane& lane, const Response& r, std::optional<QueueEntry>& entry) const {
  QueueEntry& e = *entry;
  const size_t bytes = r.request.NumBytes();
  if (config_.rank == r.request.root && e.output != e.input && bytes > 0) {
    std::memcpy(e.output, e.input, bytes);
  }
  CONCORD_RETURN_IF_ERROR(lane.backend->Broadcast(e.output, bytes, r.request.root));
  // Estimated as one copy of the data from every rank (a chain or tree forwards it once).
  if (config_.size > 1) e.state->AddWireBytes(bytes);
  Finish(entry, Status::Ok());
  return Status::Ok();
}

Status Engine::RunBarrier(Lane& lane, const Response& r, std::optional<QueueEntry>& entry) {
  CONCORD_RETURN_IF_ERROR(lane.backend->Barrier());
  if (r.request.name == FinalizeName()) finalized_.store(true);
  // A join returns the last rank to join (Engine::Join).
  if (IsJoinName(r.request.name) && !r.joined.empty()) {
    entry->state->output().first_dim = r.joined.back();
  }
  Finish(entry, Status::Ok());
  return Status::Ok();
}

}  // namespace concord
