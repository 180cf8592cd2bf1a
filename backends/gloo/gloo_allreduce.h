// Gloo's allreduce algorithms behind one small interface, bound to one buffer, dtype and op, with
// Concord's reduction kernels (base/dtype.h; half types combine in float) as the reduction.
#pragma once

#include <gloo/context.h>

#include <cstddef>
#include <memory>
#include <string>

#include "base/dtype.h"
#include "base/status.h"

namespace concord {
namespace gloo_internal {

enum class AllreduceAlgorithm {
  kRing,             // gloo::AllreduceRing: whole buffer passed around the ring
  kRingChunked,      // gloo::AllreduceRingChunked: reduce-scatter + allgather in chunks
  kHalvingDoubling,  // gloo::AllreduceHalvingDoubling: recursive halving/doubling
  kBcube,            // gloo::AllreduceBcube
  kFunction,         // function-style gloo::allreduce (unbound buffers, ring)
};

const char* AllreduceAlgorithmName(AllreduceAlgorithm algorithm);

// Parses "ring", "ring_chunked", "halving_doubling", "bcube" or "allreduce"; kInvalidArgument
// listing the accepted names otherwise ("auto" is the backend's business, not a name here).
StatusOr<AllreduceAlgorithm> ParseAllreduceAlgorithm(const std::string& name);

// Whether Gloo's algorithm objects can run `count` elements of `element_bytes` each: they count
// elements in an int and keep the buffer's bytes in an int too (`const int bytes_ = count_ *
// sizeof(T)` in gloo/allreduce_ring.h, _ring_chunked.h, _halving_doubling.h, _bcube.h), so the
// bytes must fit INT_MAX; larger buffers must use kFunction.
bool AlgorithmObjectFits(size_t count, size_t element_bytes);

// Whether `algorithm` runs correctly for this many ranks and elements of `element_bytes` each:
// object algorithms need AlgorithmObjectFits, and bcube needs a power-of-two size (Gloo 0.5.0
// corrupts data or drops connections with 3 ranks). Halving-doubling handles any size and
// count < size.
bool AlgorithmSupports(AllreduceAlgorithm algorithm, int size, size_t count, size_t element_bytes);

// An allreduce of one fixed buffer, built once and run many times. Run() blocks until done and
// throws Gloo's exceptions on failure or timeout (callers convert them). Owns Gloo's algorithm
// object or options; keeps the context alive. Not thread-safe; one collective in flight per
// context.
class BoundAllreduce {
 public:
  virtual ~BoundAllreduce() = default;
  virtual void Run() = 0;
};

// Builds the algorithm over data[0, count). Object algorithms take their slots from the context's
// slot counter (see GlooContext). Throws Gloo's exceptions. count must be > 0, and must satisfy
// AlgorithmObjectFits(count, DTypeSize(dtype)) unless algorithm is kFunction.
std::unique_ptr<BoundAllreduce> MakeBoundAllreduce(const std::shared_ptr<gloo::Context>& context,
                                                   AllreduceAlgorithm algorithm, void* data,
                                                   size_t count, DType dtype, ReduceOp op);

}  // namespace gloo_internal
}  // namespace concord
