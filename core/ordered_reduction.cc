#include "core/ordered_reduction.h"

#include <algorithm>
#include <cstdint>
#include <cstring>

namespace concord {

LaneReductions::LaneReductions(Lane& lane, bool deterministic, size_t scratch_cap)
    : lane_(lane),
      fold_here_(deterministic && lane.backend->size() > 1 && !lane.backend->ReducesInRankOrder()),
      scratch_cap_(scratch_cap) {}

bool LaneReductions::FoldsHere(ReduceOp op) const {
  // Two ranks' values summed or multiplied give the same bits in either order (IEEE addition and
  // multiplication commute; half types add in float and round once, as ReduceElements): any
  // backend's reduction is then the fold. Min and max do not commute on the sign of zero.
  const bool commutes =
      op == ReduceOp::kSum || op == ReduceOp::kAverage || op == ReduceOp::kProduct;
  return fold_here_ && !(lane_.backend->size() == 2 && commutes);
}

Status LaneReductions::Allreduce(void* data, size_t count, DType dtype, ReduceOp op) {
  if (!FoldsHere(op)) return lane_.backend->Allreduce(data, count, dtype, op);
  if (count == 0) return Status::Ok();  // every rank passes the same count
  // Nearly equal slices, the first count % n one element longer; any cut gives the same bits.
  const size_t n = static_cast<size_t>(lane_.backend->size());
  const size_t esize = DTypeSize(dtype);
  std::vector<size_t> counts(n), bytes(n);
  for (size_t r = 0; r < n; ++r) {
    counts[r] = count / n + (r < count % n ? 1 : 0);
    bytes[r] = counts[r] * esize;
  }
  CONCORD_ASSIGN_OR_RETURN(const void* folded, FoldSlice(data, nullptr, counts, dtype, op));
  return lane_.backend->Allgatherv(folded, data, bytes);
}

Status LaneReductions::AllreduceSpans(const std::vector<AllreduceSpan>& spans, DType dtype,
                                      ReduceOp op) {
  if (!FoldsHere(op)) return lane_.backend->AllreduceSpans(spans, dtype, op);
  for (const AllreduceSpan& s : spans) {
    CONCORD_RETURN_IF_ERROR(Allreduce(s.data, s.count, dtype, op));
  }
  return Status::Ok();
}

Status LaneReductions::ReduceScatter(const void* in, void* out, const std::vector<size_t>& counts,
                                     DType dtype, ReduceOp op) {
  if (!FoldsHere(op)) return lane_.backend->ReduceScatter(in, out, counts, dtype, op);
  return FoldSlice(in, out, counts, dtype, op).status();
}

StatusOr<const void*> LaneReductions::FoldSlice(const void* in, void* out,
                                                const std::vector<size_t>& counts, DType dtype,
                                                ReduceOp op) {
  Backend& backend = *lane_.backend;
  const size_t n = static_cast<size_t>(backend.size());
  const size_t me = static_cast<size_t>(backend.rank());
  const size_t esize = DTypeSize(dtype);
  const size_t mine = counts[me] * esize;
  std::vector<size_t> send(n);
  for (size_t r = 0; r < n; ++r) send[r] = counts[r] * esize;
  // slices + r * mine: rank r's contribution to this rank's slice.
  uint8_t* slices = lane_.gather.Get(std::max<size_t>(mine * n, 1), scratch_cap_);
  CONCORD_RETURN_IF_ERROR(backend.Alltoallv(in, send, slices, std::vector<size_t>(n, mine)));
  uint8_t* acc = out != nullptr ? static_cast<uint8_t*>(out) : slices;
  if (mine == 0) return static_cast<const void*>(acc);
  if (acc != slices) std::memcpy(acc, slices, mine);
  for (size_t r = 1; r < n; ++r) {
    ReduceElements(acc, acc, slices + r * mine, counts[me], dtype, op);
  }
  return static_cast<const void*>(acc);
}

}  // namespace concord
