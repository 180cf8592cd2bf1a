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
//
// A fused batch of reducescatters (RunReducescatterPacked) runs as ONE backend reduce-scatter.
// Tensor k gives rank r a block of c[k][r] elements; the fusion buffer holds them rank-major
// (every tensor's block for rank 0, then every tensor's block for rank 1, ...), so that the
// backend's counts[r] = sum over k of c[k][r] and rank r receives all its blocks contiguous, in
// tensor order. Any splits fuse: the layout follows from (splits, shape, dtype) alone, which every
// rank knows. A compressed batch (fp16, bf16) encodes each block into the buffer, each starting
// at a multiple of compression::kEncodedAlignment (zero padding between, reduced and ignored), is
// reduced as the compressor's reduce dtype with a sum (an average divides before encoding, as for
// allreduce) and decoded into the caller's outputs; the postscale is applied after decoding.
// On the timeline the batch's slice holds "pack" and "unpack", or "encode" and "decode" (args:
// bytes, the tensors' own; encoded, what travels), around the backend's reduce-scatter; a
// reducescatter alone that copies its input first shows that copy as "pack".
// Packing copies the input first, so an output overlapping its input is fine on this path; a
// reducescatter or alltoall alone copies its input first when its output overlaps it.
#include <cstdint>
#include <cstring>

#include "core/engine.h"

namespace concord {
namespace {

size_t AlignUp(size_t n, size_t to) {
  return (n + to - 1) / to * to;
}

}  // namespace

Status Engine::RunReducescatter(Lane& lane, const Response& r, std::optional<QueueEntry>& entry) {
  QueueEntry& e = *entry;
  const TensorRequest& q = r.request;
  const size_t row = RowBytes(q) / DTypeSize(q.dtype);  // elements per row
  std::vector<size_t> counts(config_.size);
  for (int rk = 0; rk < config_.size; ++rk) counts[rk] = static_cast<size_t>(q.splits[rk]) * row;
  const size_t total = static_cast<size_t>(q.NumElements());
  const void* in = e.input;
  // The backend's buffers must not overlap: an output inside (or across) the input, as in place
  // (this rank's rows at the start of the input buffer), reads the input from a copy.
  const auto in_at = reinterpret_cast<uintptr_t>(e.input);
  const auto out_at = reinterpret_cast<uintptr_t>(e.output);
  const size_t mine = counts[config_.rank] * DTypeSize(q.dtype);
  const bool overlaps =
      mine > 0 && total > 0 && in_at < out_at + mine && out_at < in_at + q.NumBytes();
  if ((q.prescale != 1.0 || overlaps) && total > 0) {
    const Clock::time_point start = timeline_->on() ? Clock::now() : Clock::time_point();
    uint8_t* scaled = lane.fusion.Get(q.NumBytes(), fusion_.threshold);
    CopyScaled(scaled, e.input, total, q.dtype, q.prescale);
    in = scaled;
    if (start != Clock::time_point()) {
      timeline_->Slice(Timeline::kLaneTrack + LaneIndex(lane), "pack", start, Clock::now(),
                       q.NumBytes());
    }
  }
  CONCORD_RETURN_IF_ERROR(
      Reductions(lane).ReduceScatter(in, e.output, counts, q.dtype, q.reduce_op));
  FinishAllreduce(q, r.Contributors(config_.size), e.output, counts[config_.rank]);
  // A ring reduce-scatter: each rank sends (n - 1) / n of the input.
  if (config_.size > 1) e.state->AddWireBytes(q.NumBytes() * (config_.size - 1) / config_.size);
  Finish(entry, Status::Ok());
  return Status::Ok();
}

Status Engine::RunReducescatterPacked(Lane& lane, const FusionBatch& batch,
                                      const Responses& responses, Entries& entries) {
  const Response& head = *responses[batch.members.front()];
  const TensorRequest& q = head.request;  // fused members agree but for name, shape and splits
  const size_t n = static_cast<size_t>(config_.size);
  const size_t me = static_cast<size_t>(config_.rank);
  const size_t members = batch.members.size();
  const compression::Compressor* compressor = nullptr;
  if (!q.compression.empty()) {
    for (size_t i : batch.members) {
      const QueueEntry& e = *entries[i];
      if (!e.compressor || e.compressor->spec() != q.compression ||
          e.compressor->exchange() != compression::Exchange::kAllreduce) {
        return Internal("tensor '" + e.request.name + "' has no summable compressor for '" +
                        q.compression + "'");
      }
    }
    compressor = entries[batch.members.front()]->compressor.get();
  }
  const DType wire = compressor ? compressor->reduce_dtype(q.dtype) : q.dtype;
  const size_t wsize = DTypeSize(wire);
  // Where each block starts inside its rank's section: a multiple of `unit` bytes.
  const size_t unit = compressor ? compression::kEncodedAlignment : wsize;
  std::vector<size_t> elems(members * n), at(members * n), section(n, 0);
  for (size_t k = 0; k < members; ++k) {
    const TensorRequest& t = entries[batch.members[k]]->request;
    const size_t row = RowBytes(t) / DTypeSize(t.dtype);
    for (size_t rk = 0; rk < n; ++rk) {
      elems[k * n + rk] = static_cast<size_t>(t.splits[rk]) * row;
      at[k * n + rk] = section[rk];
      section[rk] += AlignUp(elems[k * n + rk] * wsize, unit);
    }
  }
  std::vector<size_t> base(n), counts(n);
  size_t sent = 0;
  for (size_t rk = 0; rk < n; ++rk) {
    base[rk] = sent;
    counts[rk] = section[rk] / wsize;
    sent += section[rk];
  }
  const size_t recv_at = AlignUp(sent, compression::kEncodedAlignment);
  uint8_t* buffer = lane.fusion.Get(std::max<size_t>(recv_at + section[me], 1), fusion_.threshold);
  uint8_t* recv = buffer + recv_at;

  const int track = Timeline::kLaneTrack + LaneIndex(lane);
  const bool traced = timeline_->on();
  const Clock::time_point start = traced ? Clock::now() : Clock::time_point();
  double scale = q.prescale;
  if (compressor && q.reduce_op == ReduceOp::kAverage) scale /= head.Contributors(config_.size);
  const size_t esize = DTypeSize(q.dtype);
  for (size_t k = 0; k < members; ++k) {
    const QueueEntry& e = *entries[batch.members[k]];
    const auto* in = static_cast<const uint8_t*>(e.input);
    size_t first = 0;  // elements before rank rk's block in this tensor
    for (size_t rk = 0; rk < n; ++rk) {
      const size_t c = elems[k * n + rk];
      uint8_t* dst = buffer + base[rk] + at[k * n + rk];
      const size_t padded = AlignUp(c * wsize, unit);
      if (padded > c * wsize) std::memset(dst + c * wsize, 0, padded - c * wsize);
      if (c > 0 && compressor) {
        compression::EncodeInput block;
        block.name = e.request.name;
        block.dtype = q.dtype;
        block.count = c;
        block.data = in + first * esize;
        block.scale = scale;
        // Under the compression lock, as RunCompressed encodes (the casts keep no state).
        MutexLock lock(compression_mu_);
        Status s = compressor->Encode(block, dst, &compression_state_);
        if (!s.ok()) return s.WithContext("encoding tensor '" + e.request.name + "'");
      } else if (c > 0) {
        CopyScaled(dst, in + first * esize, c, q.dtype, q.prescale);
      }
      first += c;
    }
  }
  // "encode" (args: the tensors' bytes, and the encoded bytes) or "pack".
  if (traced) {
    timeline_->Slice(track, compressor ? "encode" : "pack", start, Clock::now(), batch.bytes,
                     nullptr, compressor ? "\"encoded\":" + std::to_string(sent) : std::string());
  }
  CONCORD_RETURN_IF_ERROR(Reductions(lane).ReduceScatter(
      buffer, recv, counts, wire, compressor ? WireReduceOp(q.reduce_op) : q.reduce_op));
  const Clock::time_point reduced = traced ? Clock::now() : Clock::time_point();
  uint64_t mine = 0;  // this rank's blocks, as the tensors' dtype
  for (size_t k = 0; k < members; ++k) {
    const Response& r = *responses[batch.members[k]];
    QueueEntry& e = *entries[batch.members[k]];
    const size_t c = elems[k * n + me];
    const uint8_t* block = recv + at[k * n + me];
    mine += c * esize;
    if (compressor) {
      Status d = compressor->Decode(block, q.dtype, c, e.output);
      if (!d.ok()) return d.WithContext("decoding tensor '" + e.request.name + "'");
      if (q.postscale != 1.0) ScaleElements(e.output, c, q.dtype, q.postscale);
    } else {
      if (c > 0) std::memcpy(e.output, block, c * wsize);
      FinishAllreduce(r.request, r.Contributors(config_.size), e.output, c);
    }
    // A ring reduce-scatter: each rank sends (n - 1) / n of what travels.
    size_t bytes = 0;
    for (size_t rk = 0; rk < n; ++rk) bytes += elems[k * n + rk] * wsize;
    if (n > 1) e.state->AddWireBytes(bytes * (n - 1) / n);
    Finish(entries[batch.members[k]], Status::Ok());
  }
  if (traced) {  // "decode" (args: this rank's bytes, and the encoded bytes it received) or
                 // "unpack"
    timeline_->Slice(track, compressor ? "decode" : "unpack", reduced, Clock::now(), mine, nullptr,
                     compressor ? "\"encoded\":" + std::to_string(section[me]) : std::string());
  }
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
  // The backend's buffers must not overlap: a block arriving into an output that is (or crosses)
  // the input, as in place, would overwrite rows not yet sent. The input is read from a copy
  // then (dst is the caller's output: scratch memory never overlaps the input).
  const void* in = e.input;
  const size_t in_bytes = e.request.NumBytes();
  const auto in_at = reinterpret_cast<uintptr_t>(e.input);
  const auto out_at = reinterpret_cast<uintptr_t>(dst);
  if (in_bytes > 0 && total > 0 && in_at < out_at + total && out_at < in_at + in_bytes) {
    uint8_t* copy = lane.fusion.Get(in_bytes, fusion_.threshold);
    std::memcpy(copy, e.input, in_bytes);
    in = copy;
  }
  CONCORD_RETURN_IF_ERROR(lane.backend->Alltoallv(in, send, dst, recv));
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
