// A reduce-scatter and an allreduce whose every element is the left fold over ranks 0, 1, ...,
// size-1 (the engine's deterministic mode, core/ordered_reduction.h), on Gloo's unbound buffers.
//
// Rank r owns block r. Every rank posts its block p, cut into segments, to each rank p at once;
// each owner receives the segments of its block from every peer through a double-buffered scratch
// area per peer, and folds segment k in rank order (its own input in its place) as soon as every
// peer's segment k is in, while the next segments are on the wire. The allreduce sends each folded
// segment to every peer at once, straight into their buffers, while it folds the next. The bytes on
// the wire are a ring's ((size - 1) / size of the data per rank and phase), but the fold overlaps
// the transfers and reads what it folds from cache: the engine's own build (an all-to-all of whole
// slices into a buffer, a fold over it, then an allgather) ran its three steps one after another.
//
// Why the allreduce may receive a peer's folded segment straight into the part of its buffer it
// also sends to that peer: the peer folds segment k only after it received this rank's segment k
// whole, so the send has read those bytes before anything can arrive for them.
#pragma once

#include <gloo/context.h>

#include <cstddef>
#include <cstdint>
#include <memory>
#include <vector>

#include "backends/gloo/in_flight.h"
#include "base/dtype.h"

namespace concord {
namespace gloo_internal {

// Where the messages of one call go (calls on one context must not overlap) and the caller's
// scratch area (grown as needed: two segments per peer and a 16 KiB chunk; reusable across calls).
struct OrderedRun {
  uint64_t fold_slot = 0;    // the blocks sent to their owners
  uint64_t gather_slot = 0;  // the folded segments (allreduce only)
  size_t segment_bytes = 0;  // how the blocks are cut (rounded down to whole elements, at least 1)
  std::vector<uint8_t>* scratch = nullptr;
  InFlight* in_flight = nullptr;  // may be null; holds the call's buffers while it runs
};

// Collective over context's ranks, which pass the same counts (elements per rank's block). in
// holds their sum, out counts[rank] elements; they do not overlap. kAverage reduces as a sum. Every
// element of out is ReduceElements' left fold of the ranks' values in rank order, bit for bit
// whatever the counts and segment size. Blocks; throws Gloo's exceptions on failure, timeout (the
// context's timeout, per wait) or interruption.
void OrderedReduceScatter(const std::shared_ptr<gloo::Context>& context, const void* in, void* out,
                          const std::vector<size_t>& counts, DType dtype, ReduceOp op,
                          const OrderedRun& run);

// In-place allreduce of count elements as that fold (blocks of whole cache lines, the last taking
// what is left), every rank ending with the same bits. Otherwise as OrderedReduceScatter.
void OrderedAllreduce(const std::shared_ptr<gloo::Context>& context, void* data, size_t count,
                      DType dtype, ReduceOp op, const OrderedRun& run);

}  // namespace gloo_internal
}  // namespace concord
