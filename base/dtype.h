// Element types, reduction operators and the CPU kernels over them (reduce, scale, half-precision
// conversion). Stateless free functions; all thread-safe. DType and ReduceOp take their values
// from the C API's concord_dtype_t and concord_reduce_op_t (include/concord/concord.h, the one
// place they are written down), so the C boundary converts by cast.
#pragma once

#include <cstddef>
#include <cstdint>

#include "concord/concord.h"

namespace concord {

enum class DType : int {
  kUint8 = CONCORD_UINT8,
  kInt8 = CONCORD_INT8,
  kInt32 = CONCORD_INT32,
  kInt64 = CONCORD_INT64,
  kFloat16 = CONCORD_FLOAT16,
  kBFloat16 = CONCORD_BFLOAT16,
  kFloat32 = CONCORD_FLOAT32,
  kFloat64 = CONCORD_FLOAT64,
};
// Values are 0 .. kNumDTypes - 1 (IsValidDType relies on it).
constexpr int kNumDTypes = CONCORD_FLOAT64 + 1;
static_assert(CONCORD_UINT8 == 0 && CONCORD_INT8 == 1 && CONCORD_INT32 == 2 && CONCORD_INT64 == 3 &&
                  CONCORD_FLOAT16 == 4 && CONCORD_BFLOAT16 == 5 && CONCORD_FLOAT32 == 6 &&
                  kNumDTypes == 8,
              "concord_dtype_t must stay dense from 0: its values are part of the ABI");

enum class ReduceOp : int {
  kSum = CONCORD_SUM,
  kAverage = CONCORD_AVERAGE,
  kMin = CONCORD_MIN,
  kMax = CONCORD_MAX,
  kProduct = CONCORD_PRODUCT,
};
constexpr int kNumReduceOps = CONCORD_PRODUCT + 1;
static_assert(CONCORD_SUM == 0 && CONCORD_AVERAGE == 1 && CONCORD_MIN == 2 && CONCORD_MAX == 3 &&
                  kNumReduceOps == 5,
              "concord_reduce_op_t must stay dense from 0: its values are part of the ABI");

bool IsValidDType(int value);
bool IsValidReduceOp(int value);
size_t DTypeSize(DType dtype);
const char* DTypeName(DType dtype);
const char* ReduceOpName(ReduceOp op);
// The reduction that runs on the wire for `op`: an average is a sum, divided before or after.
inline ReduceOp WireReduceOp(ReduceOp op) {
  return op == ReduceOp::kAverage ? ReduceOp::kSum : op;
}
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
// Integer sums and products wrap around (two's complement). Floating min and max are IEEE
// 754-2019 minimum and maximum: a NaN operand gives the type's canonical quiet NaN (positive, no
// payload), min(-0, +0) is -0 and max(-0, +0) is +0. Min and max (every type) are commutative and
// associative on bits, so their results do not depend on the order a backend combines ranks in.
void ReduceElements(void* dst, const void* a, const void* b, size_t count, DType dtype,
                    ReduceOp op);

// data[i] *= factor in place. Floating types scale in their own precision (half types through
// float); integer types multiply in double and truncate toward zero, so dividing a sum by the world
// size behaves like integer division.
void ScaleElements(void* data, size_t count, DType dtype, double factor);

// dst[i] = src[i] * factor (copy and scale in one pass; factor 1.0 is a plain memcpy).
void CopyScaled(void* dst, const void* src, size_t count, DType dtype, double factor);

}  // namespace concord
