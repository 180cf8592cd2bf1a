// Array conversions between float32/float64 and the two 16-bit float formats (IEEE binary16,
// "fp16", and bfloat16): the hot loops of the fp16 and bf16 compressors.
//
// Contract, identical on every path: round to nearest even; inf stays inf; nan stays nan, quiet,
// with its sign and the top bits of its payload; fp16 overflow gives inf as IEEE says; subnormal
// inputs and outputs are kept (never flushed to zero). Doubles are rounded once to the 16-bit
// format (through float with round-to-odd, which is exact for that purpose), not twice. A scale
// other than 1 multiplies each element first, in the input's precision (this is the prescale that
// keeps an average's sum in range); a scale of exactly 1 skips the multiply.
//
// The SIMD paths (AVX2 with F16C; AVX-512F for fp16, AVX-512F with AVX512_BF16 for bf16) are chosen
// at run time and compiled with target attributes, so the library runs on any x86-64 and builds on
// other architectures. Every path gives bit-identical results to the portable one (tested).
// The path argument exists for tests and benchmarks; production code passes BestCastPath(format).
// A path this CPU cannot run falls back to the portable one.
//
// Buffers: the 16-bit side may sit at any byte address; float/double buffers must be aligned to
// their element size. Stateless free functions; thread-safe.
#pragma once

#include <cstddef>

namespace concord {
namespace compression {

enum class HalfFormat : int { kFloat16 = 0, kBFloat16 = 1 };

enum class CastPath : int {
  kPortable = 0,
  kAvx2 = 1,    // AVX2 + F16C
  kAvx512 = 2,  // AVX-512F (fp16); AVX-512F + AVX512_BF16 (bf16)
};
constexpr int kNumCastPaths = 3;

const char* HalfFormatName(HalfFormat format);
const char* CastPathName(CastPath path);
// Whether this CPU runs `path` for `format`.
bool CastPathAvailable(HalfFormat format, CastPath path);
// The fastest available path for `format` on this CPU.
CastPath BestCastPath(HalfFormat format);

// out[i] = Round16(in[i] * scale); out holds 2 * n bytes.
void EncodeFloats(HalfFormat format, const float* in, size_t n, float scale, void* out,
                  CastPath path);
void EncodeDoubles(HalfFormat format, const double* in, size_t n, double scale, void* out,
                   CastPath path);
// out[i] = the value of 16-bit element i (exact: every fp16/bf16 value is a float).
void DecodeToFloats(HalfFormat format, const void* in, size_t n, float* out, CastPath path);
void DecodeToDoubles(HalfFormat format, const void* in, size_t n, double* out, CastPath path);
// dense[i] += the value of 16-bit element i, added in the dense buffer's precision.
void AccumulateFloats(HalfFormat format, const void* in, size_t n, float* dense, CastPath path);
void AccumulateDoubles(HalfFormat format, const void* in, size_t n, double* dense, CastPath path);

}  // namespace compression
}  // namespace concord
