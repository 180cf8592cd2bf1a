// The engine's CPU reduce-scatter and all-to-all, each run on one lane (its backend and buffers)
// by the stepping thread or that lane's worker, like the operations of engine_host_ops.cc: each
// completes its entry with Finish() and returns OK, or returns a backend error and completes
// nothing (Execute() completes every entry still held).
//
// Both split the first dimension by the request's splits (rows; NormalizeSplits filled the even
// split at enqueue). A reducescatter's splits are the same on every rank (negotiated): rank r
// receives rows [sum(splits[0..r)), +splits[r]) of the reduction. An alltoall's are each rank's
// own: the response carries them all (Response::splits), so each rank knows what it receives from
// every rank, and reports it (RequestState::Output::splits).
#include <cstring>

#include "core/engine.h"

namespace concord {

Status Engine::RunReducescatter(Lane& lane, const Response& r, std::optional<QueueEntry>& entry) {
  QueueEntry& e = *entry;
  const TensorRequest& q = r.request;
  const size_t row = RowBytes(q) / DTypeSize(q.dtype);  // elements per row
  std::vector<size_t> counts(config_.size);
  for (int rk = 0; rk < config_.size; ++rk) counts[rk] = static_cast<size_t>(q.splits[rk]) * row;
  const size_t total = static_cast<size_t>(q.NumElements());
  const void* in = e.input;
  if (q.prescale != 1.0 && total > 0) {
    uint8_t* scaled = lane.fusion.Get(q.NumBytes(), fusion_.threshold);
    CopyScaled(scaled, e.input, total, q.dtype, q.prescale);
    in = scaled;
  }
  CONCORD_RETURN_IF_ERROR(lane.backend->ReduceScatter(in, e.output, counts, q.dtype, q.reduce_op));
  FinishAllreduce(q, r.Contributors(config_.size), e.output, counts[config_.rank]);
  // A ring reduce-scatter: each rank sends (n - 1) / n of the input.
  if (config_.size > 1) e.state->AddWireBytes(q.NumBytes() * (config_.size - 1) / config_.size);
  Finish(entry, Status::Ok());
  return Status::Ok();
}

StatusOr<std::vector<size_t>> Engine::AlltoallReceives(const Response& r,
                                                       std::vector<int64_t>* received,
                                                       size_t* total) const {
  const TensorRequest& q = r.request;
  const auto n = static_cast<size_t>(config_.size);
  const auto me = static_cast<size_t>(config_.rank);
  if (r.first_dims.size() != n || r.splits.size() != n * n) {
    return ProtocolError("alltoall response for tensor '" + q.name + "' has " +
                         std::to_string(r.splits.size()) + " splits for " + std::to_string(n) +
                         " ranks");
  }
  const size_t row = RowBytes(q);
  constexpr size_t kMaxBytes = static_cast<size_t>(kMaxTensorSize);
  std::vector<size_t> recv(n);
  received->assign(n, 0);
  *total = 0;
  for (size_t rk = 0; rk < n; ++rk) {
    (*received)[rk] = r.splits[rk * n + me];
    if (__builtin_mul_overflow(static_cast<size_t>((*received)[rk]), row, &recv[rk]) ||
        recv[rk] > kMaxBytes || (*total += recv[rk]) > kMaxBytes) {
      return ProtocolError("alltoall response for tensor '" + q.name + "' is too large");
    }
  }
  return recv;
}

Status Engine::RunAlltoall(Lane& lane, const Response& r, std::optional<QueueEntry>& entry) {
  QueueEntry& e = *entry;
  const auto n = static_cast<size_t>(config_.size);
  std::vector<int64_t> received;
  size_t total = 0;
  CONCORD_ASSIGN_OR_RETURN(std::vector<size_t> recv, AlltoallReceives(r, &received, &total));
  const size_t row = RowBytes(r.request);
  std::vector<size_t> send(n);
  size_t sent = 0;
  for (size_t rk = 0; rk < n; ++rk) {
    send[rk] = static_cast<size_t>(e.request.splits[rk]) * row;  // checked at enqueue
    if (rk != static_cast<size_t>(config_.rank)) sent += send[rk];
  }
  Status local = Status::Ok();  // this rank's own error, reported after taking part
  void* dst = ResultBuffer(lane, e, total, "alltoall", &local);
  CONCORD_RETURN_IF_ERROR(lane.backend->Alltoallv(e.input, send, dst, recv));
  e.state->AddWireBytes(sent);
  if (local.ok()) SetAlltoallOutput(e, dst, total, std::move(received));
  Finish(entry, local);
  return Status::Ok();
}

void Engine::SetAlltoallOutput(QueueEntry& e, void* data, size_t bytes,
                               std::vector<int64_t> received) {
  RequestState::Output& out = e.state->output();
  out.data = data;
  out.bytes = bytes;
  out.first_dim = 0;
  for (int64_t rows : received) out.first_dim += rows;
  out.splits = std::move(received);
}

}  // namespace concord
