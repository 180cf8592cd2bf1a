// A ring reduce-scatter with uneven blocks on Gloo's unbound buffers, for every dtype Concord has
// (Gloo's own ReduceScatterHalvingDoubling takes int counts and no bfloat16, and builds an
// algorithm object, with slots and a buffer of the whole input, per shape).
//
// Rank r ends with block r. In size-1 steps each rank sends one block to its right neighbour and
// receives one from its left: at step s it sends block (rank - 1 - s) (its own input at step 0,
// else the partial sum it made at step s - 1) and receives block (rank - 2 - s), which it reduces
// with its own input into a partial sum (at the last step, into `out`). Received blocks arrive in
// segments through a double-buffered scratch area, so reducing one segment overlaps receiving the
// next. Each rank sends (size - 1) / size of the input: bandwidth-optimal. Every element of the
// result is reduced on its owner in one order, so the result does not depend on timing.
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

// Collective over context's ranks, which pass the same counts (elements per rank's block). in
// holds their sum, out counts[rank] elements; they do not overlap. kAverage reduces as a sum.
// `scratch` is the caller's, grown as needed (two of the largest blocks and two segments) and
// reusable across calls. All messages go to `slot`: calls on one context must not overlap. Its
// buffers are in `in_flight` (may be null) while it runs. Blocks; throws Gloo's exceptions on
// failure, timeout (the context's timeout, per wait) or interruption.
void RingReduceScatter(const std::shared_ptr<gloo::Context>& context, const void* in, void* out,
                       const std::vector<size_t>& counts, DType dtype, ReduceOp op, uint64_t slot,
                       size_t segment_bytes, std::vector<uint8_t>* scratch, InFlight* in_flight);

}  // namespace gloo_internal
}  // namespace concord
