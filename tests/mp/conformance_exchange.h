// The reducescatter and alltoall part of the conformance suite (conformance.cc runs it in the same
// launch, per size and step): every reduce op, dtype and split variant, checked against values
// computed here, and the mismatch and bad-argument cases, which must end in errors on every rank.
#pragma once

#include <cstdint>

#include "concord/concord.h"

namespace mp_exchange {

// What ran, and the failures found (this file's checks count their own: tests/common/check.h
// keeps its state per source file).
struct Counts {
  long cases = 0;
  long checks = 0;
  int failures = 0;
};

// Every dtype's reducescatters (every op; even, weighted and 2-D splits; scaled on floating
// types) and alltoalls (even and uneven splits, caller and library output) of first dimension
// about n. `large`: only the 1-D variants, and sum and max for reducescatter (the size is about
// bytes: the ring's segments, MPI's pieces). `device`: CONCORD_DEVICE_CPU, or the CUDA device the
// tensors are copied to (no library output there, and no compression). Failures go to FAILF.
void RunCases(concord_comm_t comm, int rank, int size, int device, int64_t n, int step, bool large,
              Counts* counts);

// Arguments refused at enqueue (every rank, locally) and, with two ranks or more, mismatching
// submissions that fail on every rank with MISMATCH naming the tensor, the field and the ranks,
// and an alltoall output too small on rank 0 only; then a good submission of the same name.
// On a CUDA `device` the same CPU cases, and the refusals of device tensors that need a device
// output buffer instead of those of a communicator without a GPU backend.
void RunErrorCases(concord_comm_t comm, int rank, int size, int device, Counts* counts);

}  // namespace mp_exchange
