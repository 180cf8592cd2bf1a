#include "compression/cast_kernels.h"

#include <cmath>
#include <cstdint>
#include <cstring>

#include "base/half_convert.h"

#if defined(__x86_64__) || defined(__i386__)
#define CONCORD_CAST_X86 1
#include <cpuid.h>
#include <immintrin.h>
#endif

namespace concord {
namespace compression {
namespace {

using EncodeFn = void (*)(const float* in, size_t n, float scale, uint8_t* out);
using DecodeFn = void (*)(const uint8_t* in, size_t n, float* out);

struct Kernels {
  EncodeFn encode;
  DecodeFn decode;      // out[i] = value
  DecodeFn accumulate;  // out[i] += value
};

// ---- Portable: the scalar conversions of base/dtype.h, one element at a time. ----

template <uint16_t (*To16)(float)>
void EncodePortable(const float* in, size_t n, float scale, uint8_t* out) {
  const bool scaled = scale != 1.0f;
  for (size_t i = 0; i < n; ++i) {
    const uint16_t h = To16(scaled ? in[i] * scale : in[i]);
    std::memcpy(out + 2 * i, &h, 2);
  }
}

template <float (*From16)(uint16_t), bool kAccumulate>
void DecodePortable(const uint8_t* in, size_t n, float* out) {
  for (size_t i = 0; i < n; ++i) {
    uint16_t h;
    std::memcpy(&h, in + 2 * i, 2);
    if (kAccumulate) {
      out[i] += From16(h);
    } else {
      out[i] = From16(h);
    }
  }
}

constexpr Kernels kPortableHalf = {EncodePortable<half_convert::FloatToHalf>,
                                   DecodePortable<half_convert::HalfToFloat, false>,
                                   DecodePortable<half_convert::HalfToFloat, true>};
constexpr Kernels kPortableBf16 = {EncodePortable<half_convert::FloatToBFloat16>,
                                   DecodePortable<half_convert::BFloat16ToFloat, false>,
                                   DecodePortable<half_convert::BFloat16ToFloat, true>};

#ifdef CONCORD_CAST_X86
constexpr int kRne = _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC;

// ---- AVX2 + F16C: 8 floats a step; the tail goes through the portable loop. ----

__attribute__((target("avx2,f16c"))) void EncodeHalfAvx2(const float* in, size_t n, float scale,
                                                         uint8_t* out) {
  const bool scaled = scale != 1.0f;
  const __m256 s = _mm256_set1_ps(scale);
  size_t i = 0;
  for (; i + 8 <= n; i += 8) {
    __m256 x = _mm256_loadu_ps(in + i);
    if (scaled) x = _mm256_mul_ps(x, s);
    _mm_storeu_si128(reinterpret_cast<__m128i*>(out + 2 * i), _mm256_cvtps_ph(x, kRne));
  }
  EncodePortable<half_convert::FloatToHalf>(in + i, n - i, scale, out + 2 * i);
}

template <bool kAccumulate>
__attribute__((target("avx2,f16c"))) void DecodeHalfAvx2(const uint8_t* in, size_t n, float* out) {
  size_t i = 0;
  for (; i + 8 <= n; i += 8) {
    __m256 x = _mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i*>(in + 2 * i)));
    if (kAccumulate) x = _mm256_add_ps(_mm256_loadu_ps(out + i), x);
    _mm256_storeu_ps(out + i, x);
  }
  DecodePortable<half_convert::HalfToFloat, kAccumulate>(in + 2 * i, n - i, out + i);
}

// bfloat16 by integer arithmetic, as FloatToBFloat16 does: nan -> quiet nan (bits >> 16 | 0x40),
// else (bits + 0x7fff + lsb) >> 16. Returns the eight 16-bit results packed.
__attribute__((target("avx2"))) inline __m128i Bf16FromBitsAvx2(__m256i bits) {
  const __m256i hi = _mm256_srli_epi32(bits, 16);
  const __m256i lsb = _mm256_and_si256(hi, _mm256_set1_epi32(1));
  const __m256i rounded = _mm256_srli_epi32(
      _mm256_add_epi32(bits, _mm256_add_epi32(_mm256_set1_epi32(0x7fff), lsb)), 16);
  const __m256i abs = _mm256_and_si256(bits, _mm256_set1_epi32(0x7fffffff));
  const __m256i is_nan = _mm256_cmpgt_epi32(abs, _mm256_set1_epi32(0x7f800000));
  const __m256i quiet = _mm256_or_si256(hi, _mm256_set1_epi32(0x40));
  const __m256i r = _mm256_blendv_epi8(rounded, quiet, is_nan);
  return _mm_packus_epi32(_mm256_castsi256_si128(r), _mm256_extracti128_si256(r, 1));
}

__attribute__((target("avx2"))) void EncodeBf16Avx2(const float* in, size_t n, float scale,
                                                    uint8_t* out) {
  const bool scaled = scale != 1.0f;
  const __m256 s = _mm256_set1_ps(scale);
  size_t i = 0;
  for (; i + 8 <= n; i += 8) {
    __m256 x = _mm256_loadu_ps(in + i);
    if (scaled) x = _mm256_mul_ps(x, s);
    _mm_storeu_si128(reinterpret_cast<__m128i*>(out + 2 * i),
                     Bf16FromBitsAvx2(_mm256_castps_si256(x)));
  }
  EncodePortable<half_convert::FloatToBFloat16>(in + i, n - i, scale, out + 2 * i);
}

template <bool kAccumulate>
__attribute__((target("avx2"))) void DecodeBf16Avx2(const uint8_t* in, size_t n, float* out) {
  size_t i = 0;
  for (; i + 8 <= n; i += 8) {
    const __m256i h =
        _mm256_cvtepu16_epi32(_mm_loadu_si128(reinterpret_cast<const __m128i*>(in + 2 * i)));
    __m256 x = _mm256_castsi256_ps(_mm256_slli_epi32(h, 16));
    if (kAccumulate) x = _mm256_add_ps(_mm256_loadu_ps(out + i), x);
    _mm256_storeu_ps(out + i, x);
  }
  DecodePortable<half_convert::BFloat16ToFloat, kAccumulate>(in + 2 * i, n - i, out + i);
}

// ---- AVX-512: 16 floats a step. ----
// GCC 12's AVX-512 intrinsics start from a self-initialised "undefined" vector that
// -Wmaybe-uninitialized reports at every inlined call (GCC bug 105593); the warning is false.
#pragma GCC diagnostic push
#if defined(__GNUC__) && !defined(__clang__)
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"
#endif

__attribute__((target("avx512f"))) void EncodeHalfAvx512(const float* in, size_t n, float scale,
                                                         uint8_t* out) {
  const bool scaled = scale != 1.0f;
  const __m512 s = _mm512_set1_ps(scale);
  size_t i = 0;
  for (; i + 16 <= n; i += 16) {
    __m512 x = _mm512_loadu_ps(in + i);
    if (scaled) x = _mm512_mul_ps(x, s);
    _mm256_storeu_si256(reinterpret_cast<__m256i*>(out + 2 * i), _mm512_cvtps_ph(x, kRne));
  }
  EncodePortable<half_convert::FloatToHalf>(in + i, n - i, scale, out + 2 * i);
}

template <bool kAccumulate>
__attribute__((target("avx512f"))) void DecodeHalfAvx512(const uint8_t* in, size_t n, float* out) {
  size_t i = 0;
  for (; i + 16 <= n; i += 16) {
    __m512 x = _mm512_cvtph_ps(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(in + 2 * i)));
    if (kAccumulate) x = _mm512_add_ps(_mm512_loadu_ps(out + i), x);
    _mm512_storeu_ps(out + i, x);
  }
  DecodePortable<half_convert::HalfToFloat, kAccumulate>(in + 2 * i, n - i, out + i);
}

// VCVTNEPS2BF16 treats subnormal inputs as zero (it ignores MXCSR), so a vector holding a nonzero
// subnormal is converted by the integer formula instead, which keeps subnormals as the contract
// says.
__attribute__((target("avx512f,avx512bf16"))) void EncodeBf16Avx512(const float* in, size_t n,
                                                                    float scale, uint8_t* out) {
  const bool scaled = scale != 1.0f;
  const __m512 s = _mm512_set1_ps(scale);
  const __m512i exp_mask = _mm512_set1_epi32(0x7f800000);
  const __m512i mant_mask = _mm512_set1_epi32(0x007fffff);
  size_t i = 0;
  for (; i + 16 <= n; i += 16) {
    __m512 x = _mm512_loadu_ps(in + i);
    if (scaled) x = _mm512_mul_ps(x, s);
    const __m512i bits = _mm512_castps_si512(x);
    const __mmask16 zero_exp = _mm512_testn_epi32_mask(bits, exp_mask);
    const __mmask16 subnormal = _mm512_mask_test_epi32_mask(zero_exp, bits, mant_mask);
    __m256i r;
    if (subnormal == 0) {
      r = reinterpret_cast<__m256i>(_mm512_cvtneps_pbh(x));
    } else {
      const __m512i hi = _mm512_srli_epi32(bits, 16);
      const __m512i lsb = _mm512_and_si512(hi, _mm512_set1_epi32(1));
      const __m512i rounded = _mm512_srli_epi32(
          _mm512_add_epi32(bits, _mm512_add_epi32(_mm512_set1_epi32(0x7fff), lsb)), 16);
      const __mmask16 is_nan =
          _mm512_cmpgt_epi32_mask(_mm512_and_si512(bits, _mm512_set1_epi32(0x7fffffff)), exp_mask);
      const __m512i quiet = _mm512_or_si512(hi, _mm512_set1_epi32(0x40));
      r = _mm512_cvtepi32_epi16(_mm512_mask_blend_epi32(is_nan, rounded, quiet));
    }
    _mm256_storeu_si256(reinterpret_cast<__m256i*>(out + 2 * i), r);
  }
  EncodePortable<half_convert::FloatToBFloat16>(in + i, n - i, scale, out + 2 * i);
}

template <bool kAccumulate>
__attribute__((target("avx512f"))) void DecodeBf16Avx512(const uint8_t* in, size_t n, float* out) {
  size_t i = 0;
  for (; i + 16 <= n; i += 16) {
    const __m512i h =
        _mm512_cvtepu16_epi32(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(in + 2 * i)));
    __m512 x = _mm512_castsi512_ps(_mm512_slli_epi32(h, 16));
    if (kAccumulate) x = _mm512_add_ps(_mm512_loadu_ps(out + i), x);
    _mm512_storeu_ps(out + i, x);
  }
  DecodePortable<half_convert::BFloat16ToFloat, kAccumulate>(in + 2 * i, n - i, out + i);
}

#pragma GCC diagnostic pop

constexpr Kernels kAvx2Half = {EncodeHalfAvx2, DecodeHalfAvx2<false>, DecodeHalfAvx2<true>};
constexpr Kernels kAvx2Bf16 = {EncodeBf16Avx2, DecodeBf16Avx2<false>, DecodeBf16Avx2<true>};
constexpr Kernels kAvx512Half = {EncodeHalfAvx512, DecodeHalfAvx512<false>, DecodeHalfAvx512<true>};
constexpr Kernels kAvx512Bf16 = {EncodeBf16Avx512, DecodeBf16Avx512<false>, DecodeBf16Avx512<true>};
#endif  // CONCORD_CAST_X86

const Kernels& KernelsFor(HalfFormat format, CastPath path) {
  const bool half = format == HalfFormat::kFloat16;
#ifdef CONCORD_CAST_X86
  if (CastPathAvailable(format, path)) {
    if (path == CastPath::kAvx512) return half ? kAvx512Half : kAvx512Bf16;
    if (path == CastPath::kAvx2) return half ? kAvx2Half : kAvx2Bf16;
  }
#else
  (void)path;
#endif
  return half ? kPortableHalf : kPortableBf16;
}

// The float nearest d in the direction of zero, with its last bit set when d is not exactly
// representable ("round to odd"). Rounding that float to nearest-even 16-bit gives the same result
// as rounding d directly, because float keeps more than two extra bits beyond either 16-bit format.
float RoundToOddFloat(double d) {
  float f = static_cast<float>(d);
  if (std::isnan(d) || static_cast<double>(f) == d) return f;
  uint32_t bits;
  std::memcpy(&bits, &f, 4);
  if (std::fabs(static_cast<double>(f)) > std::fabs(d))
    --bits;  // rounded away from zero: step back
  bits |= 1u;
  std::memcpy(&f, &bits, 4);
  return f;
}

#ifdef CONCORD_CAST_X86
// CPUID leaf 1, ECX bit 29 (clang's __builtin_cpu_supports has no "f16c"). Only asked together
// with AVX2, whose check already covers the operating system saving the YMM registers.
bool HasF16c() {
  unsigned a = 0, b = 0, c = 0, d = 0;
  return __get_cpuid(1, &a, &b, &c, &d) && (c & bit_F16C) != 0;
}
#endif

constexpr size_t kChunk = 512;  // doubles go through float in chunks of this many elements

}  // namespace

const char* HalfFormatName(HalfFormat format) {
  return format == HalfFormat::kFloat16 ? "fp16" : "bf16";
}

const char* CastPathName(CastPath path) {
  switch (path) {
    case CastPath::kPortable:
      return "portable";
    case CastPath::kAvx2:
      return "avx2";
    case CastPath::kAvx512:
      return "avx512";
  }
  return "unknown";
}

bool CastPathAvailable(HalfFormat format, CastPath path) {
  switch (path) {
    case CastPath::kPortable:
      return true;
#ifdef CONCORD_CAST_X86
    case CastPath::kAvx2:
      return __builtin_cpu_supports("avx2") && HasF16c();
    case CastPath::kAvx512:
      return __builtin_cpu_supports("avx512f") &&
             (format == HalfFormat::kFloat16 || __builtin_cpu_supports("avx512bf16"));
#else
    case CastPath::kAvx2:
    case CastPath::kAvx512:
      (void)format;
      return false;
#endif
  }
  return false;
}

CastPath BestCastPath(HalfFormat format) {
  if (CastPathAvailable(format, CastPath::kAvx512)) return CastPath::kAvx512;
  if (CastPathAvailable(format, CastPath::kAvx2)) return CastPath::kAvx2;
  return CastPath::kPortable;
}

void EncodeFloats(HalfFormat format, const float* in, size_t n, float scale, void* out,
                  CastPath path) {
  KernelsFor(format, path).encode(in, n, scale, static_cast<uint8_t*>(out));
}

void EncodeDoubles(HalfFormat format, const double* in, size_t n, double scale, void* out,
                   CastPath path) {
  const Kernels& k = KernelsFor(format, path);
  const bool scaled = scale != 1.0;
  float chunk[kChunk];
  for (size_t base = 0; base < n; base += kChunk) {
    const size_t m = n - base < kChunk ? n - base : kChunk;
    for (size_t i = 0; i < m; ++i) {
      chunk[i] = RoundToOddFloat(scaled ? in[base + i] * scale : in[base + i]);
    }
    k.encode(chunk, m, 1.0f, static_cast<uint8_t*>(out) + 2 * base);
  }
}

void DecodeToFloats(HalfFormat format, const void* in, size_t n, float* out, CastPath path) {
  KernelsFor(format, path).decode(static_cast<const uint8_t*>(in), n, out);
}

void DecodeToDoubles(HalfFormat format, const void* in, size_t n, double* out, CastPath path) {
  const Kernels& k = KernelsFor(format, path);
  float chunk[kChunk];
  for (size_t base = 0; base < n; base += kChunk) {
    const size_t m = n - base < kChunk ? n - base : kChunk;
    k.decode(static_cast<const uint8_t*>(in) + 2 * base, m, chunk);
    for (size_t i = 0; i < m; ++i) out[base + i] = chunk[i];
  }
}

void AccumulateFloats(HalfFormat format, const void* in, size_t n, float* dense, CastPath path) {
  KernelsFor(format, path).accumulate(static_cast<const uint8_t*>(in), n, dense);
}

void AccumulateDoubles(HalfFormat format, const void* in, size_t n, double* dense, CastPath path) {
  const Kernels& k = KernelsFor(format, path);
  float chunk[kChunk];
  for (size_t base = 0; base < n; base += kChunk) {
    const size_t m = n - base < kChunk ? n - base : kChunk;
    k.decode(static_cast<const uint8_t*>(in) + 2 * base, m, chunk);
    for (size_t i = 0; i < m; ++i) dense[base + i] += chunk[i];
  }
}

}  // namespace compression
}  // namespace concord
