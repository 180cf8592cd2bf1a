// A ring allreduce over a list of buffers ("spans") as if they were one buffer, on Gloo's unbound
// buffers: no copy into a fusion buffer, and one pipelined collective instead of one per tensor.
//
// The spans are laid end to end into one logical array of N elements, cut into size blocks of
// N/size elements. Reduce-scatter: in size-1 steps, each rank sends one block to its right
// neighbour and adds the block that arrives from its left into its own copy, in segments through a
// double-buffered scratch area, so that adding one segment overlaps receiving the next. Afterwards
// rank r holds block (r + 1) % size complete. Allgather: in size-1 steps, each rank passes the
// completed blocks on, received straight into the spans. Every element is reduced on one rank and
// copied to the others, so replicas are bit-identical. A message never crosses two spans: a piece
// is the part of one span inside one segment, and sender and receiver cut the same pieces because
// they lay out the same spans.
#pragma once

#include <gloo/context.h>

#include <cstddef>
#include <cstdint>
#include <memory>
#include <vector>

#include "backends/backend.h"
#include "backends/gloo/in_flight.h"
#include "base/dtype.h"

namespace concord {
namespace gloo_internal {

// Collective over context's ranks, which pass spans of the same counts in the same order. kAverage
// reduces as a sum. `scratch` is the caller's, grown to 2 * segment_bytes as needed and reusable
// across calls. All messages go to `slot`: calls on one context must not overlap. Its buffers are
// in `in_flight` (may be null) while it runs. Blocks; throws Gloo's exceptions on failure, timeout
// (the context's timeout, per wait) or interruption.
void SpanRingAllreduce(const std::shared_ptr<gloo::Context>& context,
                       const std::vector<AllreduceSpan>& spans, DType dtype, ReduceOp op,
                       uint64_t slot, size_t segment_bytes, std::vector<uint8_t>* scratch,
                       InFlight* in_flight);

}  // namespace gloo_internal
}  // namespace concord
