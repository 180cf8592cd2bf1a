#include "core/ordered_reduction.h"

#include <algorithm>
#include <cstdint>
#include <cstring>

namespace concord {

LaneReductions::LaneReductions(Lane& lane, bool deterministic, size_t piece_bytes)
    : lane_(lane),
      fold_here_(deterministic && lane.backend->size() > 1 && !lane.backend->ReducesInRankOrder()),
      piece_bytes_(piece_bytes) {}

bool LaneReductions::FoldsHere(ReduceOp op) const {
  // Two ranks' values summed or multiplied give the same bits in either order (IEEE addition and
  // multiplication commute; half types add in float and round once, as ReduceElements): any
  // backend's reduction is then the fold. Min and max do not commute on the sign of zero.
  const bool commutes =
      op == ReduceOp::kSum || op == ReduceOp::kAverage || op == ReduceOp::kProduct;
  return fold_here_ && !(lane_.backend->size() == 2 && commutes);
}

Status LaneReductions::Reduce(const void* in, void* out, size_t count, DType dtype, ReduceOp op,
                              int root) {
  if (!FoldsHere(op)) return lane_.backend->Reduce(in, out, count, dtype, op, root);
  if (in != out && count > 0) std::memcpy(out, in, count * DTypeSize(dtype));
  return Allreduce(out, count, dtype, op);
}

Status LaneReductions::Allreduce(void* data, size_t count, DType dtype, ReduceOp op) {
  if (!FoldsHere(op)) return lane_.backend->Allreduce(data, count, dtype, op);
  // In pieces of at most piece_bytes_, which bounds the scratch buffer (any cut gives the same
  // bits: every element folds alone).
  const size_t esize = DTypeSize(dtype);
  const size_t piece = std::max<size_t>(piece_bytes_ / esize, 1);
  for (size_t at = 0; at < count; at += piece) {
    CONCORD_RETURN_IF_ERROR(AllreducePiece(static_cast<uint8_t*>(data) + at * esize,
                                           std::min(piece, count - at), dtype, op));
  }
  return Status::Ok();  // nothing at all for 0 elements, on every rank alike
}

Status LaneReductions::AllreducePiece(void* data, size_t count, DType dtype, ReduceOp op) {
  // The backend's own, which overlaps the fold and the allgather with the transfers.
  if (lane_.backend->HasOrderedReductions()) {
    return lane_.backend->OrderedAllreduce(data, count, dtype, op);
  }
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
  // The backend's own, which overlaps the fold with the transfers.
  if (lane_.backend->HasOrderedReductions()) {
    return lane_.backend->OrderedReduceScatter(in, out, counts, dtype, op);
  }
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
  uint8_t* slices = lane_.gather.Get(std::max<size_t>(mine * n, 1), piece_bytes_);
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
