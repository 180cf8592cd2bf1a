#include "base/dtype.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>
#include <type_traits>

#include "base/half_convert.h"

namespace concord {

bool IsValidDType(int value) {
  return value >= 0 && value < kNumDTypes;
}
bool IsValidReduceOp(int value) {
  return value >= 0 && value < kNumReduceOps;
}

size_t DTypeSize(DType dtype) {
  switch (dtype) {
    case DType::kUint8:
    case DType::kInt8:
      return 1;
    case DType::kFloat16:
    case DType::kBFloat16:
      return 2;
    case DType::kInt32:
    case DType::kFloat32:
      return 4;
    case DType::kInt64:
    case DType::kFloat64:
      return 8;
  }
  return 0;
}

const char* DTypeName(DType dtype) {
  switch (dtype) {
    case DType::kUint8:
      return "uint8";
    case DType::kInt8:
      return "int8";
    case DType::kInt32:
      return "int32";
    case DType::kInt64:
      return "int64";
    case DType::kFloat16:
      return "float16";
    case DType::kBFloat16:
      return "bfloat16";
    case DType::kFloat32:
      return "float32";
    case DType::kFloat64:
      return "float64";
  }
  return "unknown";
}

const char* ReduceOpName(ReduceOp op) {
  switch (op) {
    case ReduceOp::kSum:
      return "sum";
    case ReduceOp::kAverage:
      return "average";
    case ReduceOp::kMin:
      return "min";
    case ReduceOp::kMax:
      return "max";
    case ReduceOp::kProduct:
      return "product";
  }
  return "unknown";
}

bool IsFloatingPoint(DType dtype) {
  return dtype == DType::kFloat16 || dtype == DType::kBFloat16 || dtype == DType::kFloat32 ||
         dtype == DType::kFloat64;
}

bool IsHalfPrecision(DType dtype) {
  return dtype == DType::kFloat16 || dtype == DType::kBFloat16;
}

uint16_t FloatToHalf(float value) {
  return half_convert::FloatToHalf(value);
}
float HalfToFloat(uint16_t bits) {
  return half_convert::HalfToFloat(bits);
}
uint16_t FloatToBFloat16(float value) {
  return half_convert::FloatToBFloat16(value);
}
float BFloat16ToFloat(uint16_t bits) {
  return half_convert::BFloat16ToFloat(bits);
}

namespace {

// Integer sums and products wrap around (two's complement), as NCCL's and MPI's 32- and 64-bit
// ones do (Open MPI's vectorised 8-bit sums saturate: the MPI backend reduces 8-bit integers with
// these kernels instead): computed in the unsigned type, since a signed overflow would be undefined
// behaviour (found by tests/fuzz/fuzz_compressed: two int32 shares whose sum overflows).
template <typename T>
T Sum(T a, T b) {
  if constexpr (std::is_integral_v<T>) {
    using U = std::make_unsigned_t<T>;
    return static_cast<T>(static_cast<U>(static_cast<U>(a) + static_cast<U>(b)));
  } else {
    return a + b;
  }
}

template <typename T>
T Product(T a, T b) {
  if constexpr (std::is_integral_v<T>) {
    // uint32_t or wider: narrower types promote to int, whose product of two 8-bit values fits.
    using U = std::conditional_t<(sizeof(T) < sizeof(int)), unsigned, std::make_unsigned_t<T>>;
    return static_cast<T>(static_cast<U>(static_cast<U>(a) * static_cast<U>(b)));
  } else {
    return a * b;
  }
}

// Floating min and max are IEEE 754-2019 minimum and maximum, as torch.minimum and torch.maximum:
// NaN in either operand gives NaN, always the type's canonical quiet NaN (positive, payload 0:
// std::numeric_limits<T>::quiet_NaN()) whichever operand held which NaN; -0 is less than +0. Both
// are symmetric in their operands, so every rank gets the same bits whatever order a backend
// combines the ranks in. Integers: std::min and std::max.
//
// How, without branches, so that the loops vectorise (each `x < y ? x : y` is one minps): the two
// one-sided selects agree unless the operands are equal or unordered, where each returns a
// different operand. The OR of their bits is then -0 for -0 and +0 (AND: +0), the value itself
// for other equal operands, and a NaN when either operand is one (a NaN's exponent and some
// mantissa bit survive an OR), which is then replaced by the canonical one. Against std::min
// (measured, GCC 12, SSE2): about twice the time on float32 data in L1 (0.18 us against 0.09 us
// for 1024 elements), 10-20% more at 4 MiB, where memory bounds both.
template <typename T>
using FloatBits = std::conditional_t<sizeof(T) == sizeof(uint32_t), uint32_t, uint64_t>;

template <typename T>
FloatBits<T> BitsOf(T value) {
  FloatBits<T> bits;
  std::memcpy(&bits, &value, sizeof(bits));
  return bits;
}

template <typename T>
T FromBits(FloatBits<T> bits) {
  T value;
  std::memcpy(&value, &bits, sizeof(value));
  return value;
}

template <typename T>
T Min(T a, T b) {
  if constexpr (std::is_floating_point_v<T>) {
    const T ab = a < b ? a : b;  // b when equal or unordered
    const T ba = b < a ? b : a;  // a when equal or unordered
    const T either = FromBits<T>(BitsOf(ab) | BitsOf(ba));
    return either != either ? std::numeric_limits<T>::quiet_NaN() : either;
  } else {
    return std::min(a, b);
  }
}

template <typename T>
T Max(T a, T b) {
  if constexpr (std::is_floating_point_v<T>) {
    const T ab = a > b ? a : b;
    const T ba = b > a ? b : a;
    const T either = FromBits<T>(BitsOf(ab) | BitsOf(ba));  // NaN exactly when a or b is
    const T both = FromBits<T>(BitsOf(ab) & BitsOf(ba));
    return either != either ? std::numeric_limits<T>::quiet_NaN() : both;
  } else {
    return std::max(a, b);
  }
}

template <typename T>
struct Ops {
  static T Apply(ReduceOp op, T a, T b) {
    switch (op) {
      case ReduceOp::kSum:
      case ReduceOp::kAverage:
        return Sum(a, b);
      case ReduceOp::kMin:
        return Min(a, b);
      case ReduceOp::kMax:
        return Max(a, b);
      case ReduceOp::kProduct:
        return Product(a, b);
    }
    return a;
  }
};

template <typename T>
void ReduceTyped(T* dst, const T* a, const T* b, size_t n, ReduceOp op) {
  // One switch outside the loop so each loop vectorises.
  switch (op) {
    case ReduceOp::kSum:
    case ReduceOp::kAverage:
      for (size_t i = 0; i < n; ++i) dst[i] = Sum(a[i], b[i]);
      break;
    case ReduceOp::kMin:
      for (size_t i = 0; i < n; ++i) dst[i] = Min(a[i], b[i]);
      break;
    case ReduceOp::kMax:
      for (size_t i = 0; i < n; ++i) dst[i] = Max(a[i], b[i]);
      break;
    case ReduceOp::kProduct:
      for (size_t i = 0; i < n; ++i) dst[i] = Product(a[i], b[i]);
      break;
  }
}

template <float (*ToFloat)(uint16_t), uint16_t (*FromFloat)(float)>
void ReduceHalf(uint16_t* dst, const uint16_t* a, const uint16_t* b, size_t n, ReduceOp op) {
  for (size_t i = 0; i < n; ++i) {
    dst[i] = FromFloat(Ops<float>::Apply(op, ToFloat(a[i]), ToFloat(b[i])));
  }
}

template <typename T>
void CopyScaledTyped(T* dst, const T* src, size_t n, double factor) {
  if constexpr (std::is_floating_point_v<T>) {
    const T f = static_cast<T>(factor);
    for (size_t i = 0; i < n; ++i) dst[i] = src[i] * f;
  } else {
    for (size_t i = 0; i < n; ++i) dst[i] = static_cast<T>(std::trunc(src[i] * factor));
  }
}

template <float (*ToFloat)(uint16_t), uint16_t (*FromFloat)(float)>
void CopyScaledHalf(uint16_t* dst, const uint16_t* src, size_t n, double factor) {
  const float f = static_cast<float>(factor);
  for (size_t i = 0; i < n; ++i) dst[i] = FromFloat(ToFloat(src[i]) * f);
}

}  // namespace

void ReduceElements(void* dst, const void* a, const void* b, size_t n, DType dtype, ReduceOp op) {
  switch (dtype) {
    case DType::kUint8:
      return ReduceTyped(static_cast<uint8_t*>(dst), static_cast<const uint8_t*>(a),
                         static_cast<const uint8_t*>(b), n, op);
    case DType::kInt8:
      return ReduceTyped(static_cast<int8_t*>(dst), static_cast<const int8_t*>(a),
                         static_cast<const int8_t*>(b), n, op);
    case DType::kInt32:
      return ReduceTyped(static_cast<int32_t*>(dst), static_cast<const int32_t*>(a),
                         static_cast<const int32_t*>(b), n, op);
    case DType::kInt64:
      return ReduceTyped(static_cast<int64_t*>(dst), static_cast<const int64_t*>(a),
                         static_cast<const int64_t*>(b), n, op);
    case DType::kFloat32:
      return ReduceTyped(static_cast<float*>(dst), static_cast<const float*>(a),
                         static_cast<const float*>(b), n, op);
    case DType::kFloat64:
      return ReduceTyped(static_cast<double*>(dst), static_cast<const double*>(a),
                         static_cast<const double*>(b), n, op);
    case DType::kFloat16:
      return ReduceHalf<HalfToFloat, FloatToHalf>(static_cast<uint16_t*>(dst),
                                                  static_cast<const uint16_t*>(a),
                                                  static_cast<const uint16_t*>(b), n, op);
    case DType::kBFloat16:
      return ReduceHalf<BFloat16ToFloat, FloatToBFloat16>(static_cast<uint16_t*>(dst),
                                                          static_cast<const uint16_t*>(a),
                                                          static_cast<const uint16_t*>(b), n, op);
  }
}

void CopyScaled(void* dst, const void* src, size_t n, DType dtype, double factor) {
  if (factor == 1.0) {
    if (dst != src && n > 0) std::memmove(dst, src, n * DTypeSize(dtype));
    return;
  }
  switch (dtype) {
    case DType::kUint8:
      return CopyScaledTyped(static_cast<uint8_t*>(dst), static_cast<const uint8_t*>(src), n,
                             factor);
    case DType::kInt8:
      return CopyScaledTyped(static_cast<int8_t*>(dst), static_cast<const int8_t*>(src), n, factor);
    case DType::kInt32:
      return CopyScaledTyped(static_cast<int32_t*>(dst), static_cast<const int32_t*>(src), n,
                             factor);
    case DType::kInt64:
      return CopyScaledTyped(static_cast<int64_t*>(dst), static_cast<const int64_t*>(src), n,
                             factor);
    case DType::kFloat32:
      return CopyScaledTyped(static_cast<float*>(dst), static_cast<const float*>(src), n, factor);
    case DType::kFloat64:
      return CopyScaledTyped(static_cast<double*>(dst), static_cast<const double*>(src), n, factor);
    case DType::kFloat16:
      return CopyScaledHalf<HalfToFloat, FloatToHalf>(static_cast<uint16_t*>(dst),
                                                      static_cast<const uint16_t*>(src), n, factor);
    case DType::kBFloat16:
      return CopyScaledHalf<BFloat16ToFloat, FloatToBFloat16>(
          static_cast<uint16_t*>(dst), static_cast<const uint16_t*>(src), n, factor);
  }
}

void ScaleElements(void* data, size_t n, DType dtype, double factor) {
  CopyScaled(data, data, n, dtype, factor);
}

}  // namespace concord
