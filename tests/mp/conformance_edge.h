// The edge values of the conformance suite (conformance.cc runs it once per launch, on CPU
// tensors): results whose bits the op semantics fix (base/dtype.h, ReduceElements) and that every
// backend must give alike, checked bit for bit against values computed here on every rank:
//   - 8-bit integer sums, averages and products that overflow wrap around (two's complement);
//   - floating min and max with a NaN held by each rank in turn give the canonical quiet NaN on
//     every rank (float16 0x7e00, bfloat16 0x7fc0, float32 0x7fc00000, float64 0x7ff8...), and
//     -0 and +0 give min -0 and max +0, whichever rank holds which (one rank: its input).
#pragma once

#include <cstdint>

#include "concord/concord.h"
#include "conformance_exchange.h"

namespace mp_edge {

// Allreduces (in place) and reduces (to the last rank, out of place) of n elements. Failures go
// to FAILF; counts as mp_exchange's.
void RunCases(concord_comm_t comm, int rank, int size, int64_t n, mp_exchange::Counts* counts);

}  // namespace mp_edge
