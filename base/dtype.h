// Element types, reduction operators and the CPU kernels over them (reduce, scale, half-precision
// conversion). Stateless free functions; all thread-safe. Numeric values of DType and ReduceOp
// equal the C API's concord_dtype_t and concord_reduce_op_t and never change.
#pragma once

#include <cstddef>
#include <cstdint>

namespace concord {

enum class DType : int {
  kUint8 = 0,
  kInt8 = 1,
  kInt32 = 2,
  kInt64 = 3,
  kFloat16 = 4,
  kBFloat16 = 5,
  kFloat32 = 6,
  kFloat64 = 7,
};
constexpr int kNumDTypes = 8;

enum class ReduceOp : int {
  kSum = 0,
  kAverage = 1,
  kMin = 2,
  kMax = 3,
  kProduct = 4,
};
constexpr int kNumReduceOps = 5;

bool IsValidDType(int value);
bool IsValidReduceOp(int value);
size_t DTypeSize(DType dtype);
const char* DTypeName(DType dtype);
const char* ReduceOpName(ReduceOp op);
bool IsFloatingPoint(DType dtype);
bool IsHalfPrecision(DType dtype);  // float16 or bfloat16

// IEEE binary16 and bfloat16 conversions, round to nearest even, inf preserved, nan kept as a quiet
// nan with its sign and the top bits of its payload, subnormals kept. compression/cast_kernels.h
// has the array forms (SIMD), bit-identical to these.
uint16_t FloatToHalf(float value);
float HalfToFloat(uint16_t bits);
uint16_t FloatToBFloat16(float value);
float BFloat16ToFloat(uint16_t bits);

// dst[i] = a[i] (op) b[i] for count elements; dst may alias a or b. Average reduces as a sum (the
// division is a postscale). Half types are combined in float and rounded once per call.
void ReduceElements(void* dst, const void* a, const void* b, size_t count, DType dtype,
                    ReduceOp op);

// data[i] *= factor in place. Floating types scale in their own precision (half types through
// float); integer types multiply in double and truncate toward zero, so dividing a sum by the world
// size behaves like integer division.
void ScaleElements(void* data, size_t count, DType dtype, double factor);

// dst[i] = src[i] * factor (copy and scale in one pass; factor 1.0 is a plain memcpy).
void CopyScaled(void* dst, const void* src, size_t count, DType dtype, double factor);

}  // namespace concord
