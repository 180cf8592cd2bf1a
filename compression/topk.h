// Top-k sparsification with error feedback (Deep Gradient Compression, Lin et al., ICLR 2018).
//
// Each step, for a float32 tensor g of n elements under name N:
//   acc = residual[N] + scale * g            (error feedback: what was not sent before comes back)
//   S   = the k = TopkCount(density, n) indices of acc with the largest magnitudes
//   send (index, acc[index]) for index in S  (values as float32, or rounded to fp16)
//   residual[N] = acc minus what was sent    (zero at S, or the fp16 rounding error there)
// so over any number of steps, sum of everything sent + the final residual = scale * sum of the
// gradients, up to float rounding of the additions.
//
// Selection is deterministic: magnitudes compare as |x| with nan above inf and every nan alike
// (whatever its sign and payload, which the SIMD, portable and GPU additions propagate
// differently), ties go to the lower index, and both methods select the same set (the sampled one
// only finds it faster):
// - exact: a radix pass (histogram of the top 11 bits of |x|) finds the bucket holding the k-th
//   magnitude, then nth_element over that bucket's elements.
// - sampled: estimates a threshold from a deterministic pseudo-random sample of about 64 n / k
//   elements (at least 1024) aiming at ~1.4 k candidates, collects the candidates in the same pass
//   that adds the residual (one read of g, one read and write of the residual), and corrects: if
//   fewer than k or more than 2 k + 64 elements pass the threshold, it re-picks the threshold from
//   the sample (at most 3 rescans of the accumulated tensor) and then falls back to exact. The
//   candidates (between k and 2 k + 64) are trimmed to exactly k.
//   Tensors with n < 2 * sample size use exact selection (sampling would not be cheaper).
//
// Encoded form (exchange: allgather; exact size 4 k + k * value size, value size 4 or 2):
//   k uint32 indices, strictly increasing, then k values (float32 or IEEE fp16) in the same order.
//   A value beyond fp16's range is sent as inf, as the fp16 cast would; a nan is sent as nan; the
//   residual at such an index is set to zero (an infinite residual would poison every later step).
// Accepts float32 tensors only (the residual is float32), of at most 2^32 - 1 elements.
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>

#include "compression/cast_kernels.h"
#include "compression/compressor.h"

namespace concord {
namespace compression {

enum class TopkMethod : int { kExact = 0, kSampled = 1 };
const char* TopkMethodName(TopkMethod method);

struct TopkOptions {
  double density = 0.01;  // in (0, 1]
  TopkMethod method = TopkMethod::kSampled;
  bool fp16_values = false;
};

// ceil(density * n), at least 1 for n > 0, at most n.
size_t TopkCount(double density, size_t n);

// What one selection did (for tests and benchmarks).
struct TopkStats {
  uint32_t estimated_key = 0;   // sampled: the first threshold from the sample (as |x| bits)
  uint32_t kth_key = 0;         // the k-th largest magnitude (as |x| bits), found by either method
  size_t candidates = 0;        // elements that passed the final threshold, before trimming to k
  int rescans = 0;              // sampled: corrective passes over the tensor
  bool exact_fallback = false;  // sampled: gave up correcting, or the tensor was too small
};

// The key of every nan: one above inf's.
constexpr uint32_t kNanKey = 0x7f800001u;

// The magnitude of x as an order-preserving integer: |x|'s bits, kNanKey for any nan (so nans
// order above inf, and tie with each other whatever their payloads).
inline uint32_t MagnitudeKey(float x) {
  uint32_t bits;
  __builtin_memcpy(&bits, &x, 4);
  bits &= 0x7fffffffu;
  return bits < kNanKey ? bits : kNanKey;
}

// When grad is non-null: acc[i] += scale * grad[i] for every i first. Then writes to selected[0..k)
// the indices of acc's k largest magnitudes in increasing order. k <= n < 2^32 (InvalidArgument
// otherwise). scratch provides reusable memory. stats may be null.
Status SelectTopk(const float* grad, float scale, float* acc, size_t n, size_t k, TopkMethod method,
                  CompressionState* scratch, uint32_t* selected, TopkStats* stats);

// The sampled selection's pass, exposed for tests and benchmarks: when grad is non-null,
// acc[i] += scale * grad[i] first; stores the indices (increasing) of the elements whose
// MagnitudeKey is at least `threshold` into cand[0..cap) and returns how many passed (possibly more
// than cap). path: CastPath::kAvx512 (when the CPU has AVX-512F) or else the portable loop; both
// give the same bits (the product and the sum are rounded separately on both).
size_t AccumulateAndCollect(const float* grad, float scale, float* acc, size_t n,
                            uint32_t threshold, uint32_t* cand, size_t cap, CastPath path);

// The "topk" compressor (see above). InvalidArgument for a density outside (0, 1].
StatusOr<std::unique_ptr<Compressor>> MakeTopkCompressor(const TopkOptions& options);

}  // namespace compression
}  // namespace concord
