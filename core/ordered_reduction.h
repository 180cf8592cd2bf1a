// The reductions a batch runs on its lane, and deterministic mode's switch between them.
//
// Deterministic mode (Config::deterministic, CONCORD_DETERMINISTIC) fixes how every element of an
// allreduce and a reducescatter is combined: the LEFT FOLD over ranks 0, 1, ..., size-1,
//   acc = x_0; acc = ReduceElements(acc, x_1); ...; acc = ReduceElements(acc, x_{size-1})
// (base/dtype.h: half types are rounded once per step), then the caller's usual postscale. The
// result of an element then depends only on the ranks' inputs, never on how elements are fused,
// cut into pieces or spread over lanes, nor on their arrival order: the same bits for a given
// world size whatever the fusion, direct and inline thresholds (Coordinator::CombineInline folds
// the same way) and lanes.
//
// A backend whose reductions already fold so (Backend::ReducesInRankOrder) is called directly.
// One with ordered reductions of its own (Backend::HasOrderedReductions: Gloo, whose fold overlaps
// the transfers) runs those. For the others, the reductions are built here from the backend's
// Alltoallv and Allgatherv:
//  - reduce-scatter: slice owner r receives every rank's slice r (one Alltoallv), in rank order,
//    and folds them in rank order;
//  - allreduce: the same reduce-scatter with nearly equal slices, then an Allgatherv of the
//    folded slices back into the data; multiple spans run one by one, in place.
// The wire volume is a ring's: each rank sends (n - 1) / n of the data in each half. The received
// slices live in the lane's `gather` buffer (core/lane.h), which no reduction uses otherwise: for
// an allreduce's pieces (kPieceBytes), a reduce-scatter's input size.
// With two ranks, a sum, average or product is the backend's own: two values combine to the same
// bits in either order (IEEE addition and multiplication commute; which of two NaNs' payloads
// survives is the only difference), so only min and max fold here.
//
// Contract: like the Backend calls it replaces (collective, same arguments on every rank, on the
// lane's thread); kAverage reduces as a sum (the caller divides).
#pragma once

#include <cstddef>
#include <vector>

#include "backends/backend.h"
#include "base/dtype.h"
#include "base/status.h"
#include "core/lane.h"

namespace concord {

class LaneReductions {
 public:
  // An allreduce folded here runs in pieces of at most this many bytes (the engine's choice), so
  // that the scratch buffer stays about this size.
  static constexpr size_t kPieceBytes = size_t{64} << 20;

  // `deterministic`: fold in rank order (above); `piece_bytes`: see kPieceBytes (tests pass less;
  // at least the largest element).
  LaneReductions(Lane& lane, bool deterministic, size_t piece_bytes = kPieceBytes);

  // As Backend::Allreduce, AllreduceSpans and ReduceScatter.
  Status Allreduce(void* data, size_t count, DType dtype, ReduceOp op);
  Status AllreduceSpans(const std::vector<AllreduceSpan>& spans, DType dtype, ReduceOp op);
  Status ReduceScatter(const void* in, void* out, const std::vector<size_t>& counts, DType dtype,
                       ReduceOp op);
  // As Backend::Reduce: when folded here, the copy of in into out and Allreduce above on every
  // rank (a reduce is an allreduce whose result only the root keeps).
  Status Reduce(const void* in, void* out, size_t count, DType dtype, ReduceOp op, int root);

 private:
  // One piece of Allreduce: the reduce-scatter into scratch, then the allgather into `data`.
  Status AllreducePiece(void* data, size_t count, DType dtype, ReduceOp op);
  // Whether a reduction with `op` is built here (else the backend's own is the fold already).
  bool FoldsHere(ReduceOp op) const;
  // Folds slice me of `in` (laid out as ReduceScatter's counts) from every rank, in rank order,
  // into `out`; returns where the folded slice is when `out` is null (the scratch buffer).
  StatusOr<const void*> FoldSlice(const void* in, void* out, const std::vector<size_t>& counts,
                                  DType dtype, ReduceOp op);

  Lane& lane_;
  bool fold_here_;  // deterministic, on a backend that does not reduce in rank order
  size_t piece_bytes_;
};

}  // namespace concord
