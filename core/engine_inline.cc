// Small operations that the coordinator completes during negotiation, with no backend call.
//
// A rank sends a small operation's input with its request (InlineData); when every rank that
// must has sent one, rank 0 combines them (Coordinator::CombineInline) and sends the result with
// the response; each rank then completes its entry from it (CompleteInline). One round trip
// through rank 0 instead of a negotiation round trip followed by a collective: what makes a
// 4 KiB operation cost about what the backend's own collective costs.
//
//   op             sends               rank 0 sends back        each rank takes
//   allreduce      input (prescaled)   the reduction            all of it
//   reduce         input (prescaled)   the reduction            the root: all of it
//   reducescatter  input (prescaled)   the reduction            its rows
//   allgather      input               every input, rank order  all of it
//   gather         input               every input, rank order  the root: all of it
//   alltoall       input               every input, rank order  what each rank sent to it
//   broadcast      the root only       the root's input         all of it
//
// Each rank decides from its own request alone whether it sends: a reduction's input up to the
// inline threshold, an allgather's or alltoall's up to the threshold divided by the ranks (every
// rank receives all of them), and at scale less (kInlineBudgetBytes over the ranks). When one rank
// did not send, the operation runs on the backend as usual. Never for CUDA tensors, compressed
// allreduces, one rank, or responses with joined ranks (they send nothing).
#include <cstring>

#include "core/engine.h"

namespace concord {

std::optional<std::string> Engine::InlineData(const TensorRequest& r, const void* input) const {
  if (r.device != -1 || config_.size == 1 || !r.compression.empty() ||
      config_.inline_threshold_bytes == 0) {
    return std::nullopt;
  }
  // Rank 0 receives every other rank's copy: past kInlineBudgetBytes in all, the backend's
  // collectives (bandwidth-optimal) are cheaper than the star through the coordinator.
  size_t limit = std::min(static_cast<size_t>(config_.inline_threshold_bytes),
                          kInlineBudgetBytes / static_cast<size_t>(config_.size - 1));
  bool scaled = false;
  switch (r.op) {
    case OpType::kAllreduce:
    case OpType::kReduce:
    case OpType::kReducescatter:
      scaled = r.prescale != 1.0;
      break;
    case OpType::kAllgather:
    case OpType::kGather:
    case OpType::kAlltoall:
      limit /= static_cast<size_t>(config_.size);
      break;
    case OpType::kBroadcast:
      if (config_.rank != r.root) return std::nullopt;
      break;
    case OpType::kBarrier:
      return std::nullopt;
  }
  if (r.NumBytes() > limit) return std::nullopt;
  if (!scaled) return std::string(static_cast<const char*>(input), r.NumBytes());
  std::string data(r.NumBytes(), '\0');
  CopyScaled(data.data(), input, static_cast<size_t>(r.NumElements()), r.dtype, r.prescale);
  return data;
}

Status Engine::CompleteInline(const Response& r, const std::string& data,
                              std::optional<QueueEntry>& entry) {
  const TensorRequest& q = r.request;
  auto malformed = [&q](const char* why) {
    return ProtocolError("inline result for tensor '" + q.name + "' (" + OpTypeName(q.op) +
                         "): " + why);
  };
  if (r.error != Code::kOk) return malformed("the response is an error");
  // TakeEntries took none for a response that does not apply to this rank.
  if (!entry) return malformed("this rank did not submit the tensor");
  QueueEntry& e = *entry;
  const auto n = static_cast<size_t>(config_.size);
  const auto me = static_cast<size_t>(config_.rank);
  Status local = Status::Ok();
  switch (q.op) {
    case OpType::kAllreduce:
    case OpType::kBroadcast: {
      if (data.size() != q.NumBytes()) return malformed("not the tensor's size");
      if (!data.empty()) std::memcpy(e.output, data.data(), data.size());  // null output at 0
      if (q.op == OpType::kAllreduce) {
        FinishAllreduce(q, r.Contributors(config_.size), e.output,
                        static_cast<size_t>(q.NumElements()));
      }
      break;
    }
    case OpType::kReduce: {
      if (data.size() != q.NumBytes()) return malformed("not the tensor's size");
      if (config_.rank != q.root) break;  // the others discard it
      if (!data.empty()) std::memcpy(e.output, data.data(), data.size());
      FinishAllreduce(q, r.Contributors(config_.size), e.output,
                      static_cast<size_t>(q.NumElements()));
      break;
    }
    case OpType::kReducescatter: {
      if (data.size() != q.NumBytes() || q.splits.size() != n) {
        return malformed("not the tensor's size");
      }
      // This rank's rows [before, end) must lie inside the tensor's shape[0] rows.
      uint64_t before = 0, end = 0;
      bool bad = q.shape.empty();
      for (size_t rk = 0; rk < me && !bad; ++rk) {
        bad = __builtin_add_overflow(before, static_cast<uint64_t>(q.splits[rk]), &before);
      }
      if (bad || __builtin_add_overflow(before, static_cast<uint64_t>(q.splits[me]), &end) ||
          end > static_cast<uint64_t>(q.shape[0])) {
        return malformed("splits past the tensor");
      }
      const size_t row = RowBytes(q);
      const size_t bytes = static_cast<size_t>(end - before) * row;
      if (bytes > 0) std::memcpy(e.output, data.data() + before * row, bytes);
      FinishAllreduce(q, r.Contributors(config_.size), e.output, bytes / DTypeSize(q.dtype));
      break;
    }
    case OpType::kAllgather:
    case OpType::kGather: {
      size_t total = 0;
      int64_t first = 0;
      CONCORD_RETURN_IF_ERROR(AllgatherBytes(r, &total, &first).status());
      if (data.size() != total) return malformed("not the sum of the ranks' sizes");
      if (q.op == OpType::kGather && config_.rank != q.root) break;  // the others discard it
      void* dst = ResultOutput(e, total, OpTypeName(q.op), &local);
      if (!local.ok()) break;
      if (total > 0) std::memcpy(dst, data.data(), total);
      RequestState::Output& out = e.state->output();
      out.data = dst;
      out.bytes = total;
      out.first_dim = first;
      break;
    }
    case OpType::kAlltoall: {
      std::vector<int64_t> received;
      size_t total = 0;
      CONCORD_ASSIGN_OR_RETURN(std::vector<size_t> recv, AlltoallReceives(r, &received, &total));
      // Sender s's input starts after every earlier sender's; its rows for this rank after the
      // rows it sends to lower ranks. The counts come from the wire: sums and products are
      // checked, so that data.size() == start bounds every copy below.
      const size_t row = RowBytes(q);
      std::vector<size_t> from(n);
      size_t start = 0;
      for (size_t s = 0; s < n; ++s) {
        uint64_t before = 0, rows = 0;
        bool bad = false;
        for (size_t d = 0; d < n && !bad; ++d) {
          if (d == me) before = rows;
          bad = __builtin_add_overflow(rows, static_cast<uint64_t>(r.splits[s * n + d]), &rows);
        }
        if (bad || rows != static_cast<uint64_t>(r.first_dims[s])) {
          return malformed("a rank's splits do not sum to its first dimension");
        }
        uint64_t bytes = 0, end = 0;
        if (__builtin_mul_overflow(rows, row, &bytes) ||
            __builtin_add_overflow(start, bytes, &end)) {
          return malformed("a rank's rows overflow the sum of the ranks' sizes");
        }
        from[s] = start + before * row;  // before <= rows: no overflow
        start = end;
      }
      if (data.size() != start) return malformed("not the sum of the ranks' sizes");
      void* dst = ResultOutput(e, total, "alltoall", &local);
      if (!local.ok()) break;
      auto* at = static_cast<uint8_t*>(dst);
      for (size_t s = 0; s < n; ++s) {
        if (recv[s] > 0) std::memcpy(at, data.data() + from[s], recv[s]);
        at += recv[s];
      }
      SetAlltoallOutput(e, dst, total, std::move(received));
      break;
    }
    case OpType::kBarrier:
      return malformed("a barrier has no data");
  }
  stats_.inline_reductions.fetch_add(1, std::memory_order_relaxed);
  // Each rank sent its input to rank 0 (of a broadcast, only the root: InlineData), which sent
  // the result to every other rank.
  uint64_t sent = 0;
  if (config_.rank == 0) {
    sent = data.size() * (n - 1);
  } else if (q.op != OpType::kBroadcast || config_.rank == q.root) {
    sent = e.request.NumBytes();
  }
  e.state->AddWireBytes(sent);
  Finish(entry, local);
  return Status::Ok();
}

}  // namespace concord
