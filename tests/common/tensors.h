/*
 * Tensors and their elements for the tests, for every element type, fp16 and bf16 included.
 *
 * C and C++: ElementSize() and CpuTensor(), a CPU tensor descriptor of the C API.
 *
 * C++ only (namespace concord::harness): the lists of every element type and reduction; element
 * i of a buffer loaded as a double or stored from one; reference half-precision conversions; and
 * the expected results of reductions over ranks. Every function that takes an element type or a
 * reduction takes the C API's enum or concord::DType / concord::ReduceOp (base/dtype.h), which
 * number them the same way; this header needs only the C API's header, so the tests that use the
 * C API alone can use it too.
 *
 * The conversions are written here, independently of the library's (base/half_convert.h), so that
 * a bug there cannot hide in the expected values: IEEE binary16 and bfloat16, round to nearest
 * even, subnormals, infinities and NaN kept. Values given to StoreElement must be exact in the
 * element type (integers are truncated toward zero, half types rounded).
 */
#ifndef CONCORD_TESTS_COMMON_TENSORS_H_
#define CONCORD_TESTS_COMMON_TENSORS_H_

#include <stddef.h>
#include <stdint.h>

#include "concord/concord.h"

/* Bytes of one element of `dtype`; 0 for a value outside the enum. */
static inline size_t ElementSize(concord_dtype_t dtype) {
  switch (dtype) {
    case CONCORD_UINT8:
    case CONCORD_INT8:
      return 1;
    case CONCORD_FLOAT16:
    case CONCORD_BFLOAT16:
      return 2;
    case CONCORD_INT32:
    case CONCORD_FLOAT32:
      return 4;
    case CONCORD_INT64:
    case CONCORD_FLOAT64:
      return 8;
  }
  return 0;
}

/* A CPU tensor over `data` (the caller's memory) of `ndim` dimensions `shape`. */
static inline concord_tensor_t CpuTensor(void* data, concord_dtype_t dtype, int ndim,
                                         const int64_t* shape) {
  concord_tensor_t t;
  t.data = data;
  t.dtype = dtype;
  t.ndim = ndim;
  t.shape = shape;
  t.device = CONCORD_DEVICE_CPU;
  return t;
}

#ifdef __cplusplus

#include <algorithm>
#include <cmath>
#include <cstring>
#include <functional>

namespace concord {

// base/dtype.h's enums, declared (not defined) here: they number element types and reductions as
// concord_dtype_t and concord_reduce_op_t do.
enum class DType : int;
enum class ReduceOp : int;

namespace harness {

inline constexpr DType kAllDTypes[] = {
    static_cast<DType>(CONCORD_UINT8),   static_cast<DType>(CONCORD_INT8),
    static_cast<DType>(CONCORD_INT32),   static_cast<DType>(CONCORD_INT64),
    static_cast<DType>(CONCORD_FLOAT16), static_cast<DType>(CONCORD_BFLOAT16),
    static_cast<DType>(CONCORD_FLOAT32), static_cast<DType>(CONCORD_FLOAT64)};
inline constexpr ReduceOp kAllReduceOps[] = {
    static_cast<ReduceOp>(CONCORD_SUM), static_cast<ReduceOp>(CONCORD_AVERAGE),
    static_cast<ReduceOp>(CONCORD_MIN), static_cast<ReduceOp>(CONCORD_MAX),
    static_cast<ReduceOp>(CONCORD_PRODUCT)};

inline concord_dtype_t ToC(DType dtype) {
  return static_cast<concord_dtype_t>(dtype);
}
inline concord_reduce_op_t ToC(ReduceOp op) {
  return static_cast<concord_reduce_op_t>(op);
}

inline bool IsFloat(concord_dtype_t dtype) {
  return dtype == CONCORD_FLOAT16 || dtype == CONCORD_BFLOAT16 || dtype == CONCORD_FLOAT32 ||
         dtype == CONCORD_FLOAT64;
}
inline bool IsFloat(DType dtype) {
  return IsFloat(ToC(dtype));
}

inline uint32_t FloatBits(float f) {
  uint32_t u;
  std::memcpy(&u, &f, sizeof(u));
  return u;
}
inline float BitsToFloat(uint32_t u) {
  float f;
  std::memcpy(&f, &u, sizeof(f));
  return f;
}

inline uint16_t FloatToHalf(float f) {
  const uint32_t x = FloatBits(f);
  const uint32_t sign = (x >> 16) & 0x8000u;
  const uint32_t exp = (x >> 23) & 0xffu;
  uint32_t mant = x & 0x7fffffu;
  if (exp == 0xff) return static_cast<uint16_t>(sign | 0x7c00u | (mant ? 0x200u : 0u));
  const int e = static_cast<int>(exp) - 127 + 15;
  if (e >= 31) return static_cast<uint16_t>(sign | 0x7c00u);
  if (e <= 0) {
    if (e < -10) return static_cast<uint16_t>(sign);
    mant |= 0x800000u;
    const int shift = 14 - e;
    uint32_t h = mant >> shift;
    const uint32_t rem = mant & ((1u << shift) - 1);
    const uint32_t half = 1u << (shift - 1);
    if (rem > half || (rem == half && (h & 1u))) ++h;
    return static_cast<uint16_t>(sign | h);
  }
  uint32_t h = (static_cast<uint32_t>(e) << 10) | (mant >> 13);
  const uint32_t rem = mant & 0x1fffu;
  if (rem > 0x1000u || (rem == 0x1000u && (h & 1u))) ++h;  // may carry into the exponent: ok
  return static_cast<uint16_t>(sign | h);
}

inline float HalfToFloat(uint16_t h) {
  const uint32_t sign = (static_cast<uint32_t>(h) & 0x8000u) << 16;
  const uint32_t exp = (h >> 10) & 0x1fu;
  const uint32_t mant = h & 0x3ffu;
  if (exp == 0) {
    const float v = std::ldexp(static_cast<float>(mant), -24);
    return sign ? -v : v;
  }
  if (exp == 31) return BitsToFloat(sign | 0x7f800000u | (mant << 13));
  return BitsToFloat(sign | ((exp - 15 + 127) << 23) | (mant << 13));
}

inline uint16_t FloatToBFloat16(float f) {
  uint32_t x = FloatBits(f);
  if ((x & 0x7fffffffu) > 0x7f800000u) return static_cast<uint16_t>((x >> 16) | 0x40u);  // NaN
  x += 0x7fffu + ((x >> 16) & 1u);
  return static_cast<uint16_t>(x >> 16);
}

inline float BFloat16ToFloat(uint16_t b) {
  return BitsToFloat(static_cast<uint32_t>(b) << 16);
}

// Element i of `data` as a double.
inline double LoadElement(concord_dtype_t dtype, const void* data, size_t i) {
  switch (dtype) {
    case CONCORD_UINT8:
      return static_cast<const uint8_t*>(data)[i];
    case CONCORD_INT8:
      return static_cast<const int8_t*>(data)[i];
    case CONCORD_INT32:
      return static_cast<const int32_t*>(data)[i];
    case CONCORD_INT64:
      return static_cast<double>(static_cast<const int64_t*>(data)[i]);
    case CONCORD_FLOAT16:
      return HalfToFloat(static_cast<const uint16_t*>(data)[i]);
    case CONCORD_BFLOAT16:
      return BFloat16ToFloat(static_cast<const uint16_t*>(data)[i]);
    case CONCORD_FLOAT32:
      return static_cast<const float*>(data)[i];
    case CONCORD_FLOAT64:
      return static_cast<const double*>(data)[i];
  }
  return 0;
}
inline double LoadElement(DType dtype, const void* data, size_t i) {
  return LoadElement(ToC(dtype), data, i);
}

// Stores `v` as element i of `data`.
inline void StoreElement(concord_dtype_t dtype, void* data, size_t i, double v) {
  switch (dtype) {
    case CONCORD_UINT8:
      static_cast<uint8_t*>(data)[i] = static_cast<uint8_t>(v);
      return;
    case CONCORD_INT8:
      static_cast<int8_t*>(data)[i] = static_cast<int8_t>(v);
      return;
    case CONCORD_INT32:
      static_cast<int32_t*>(data)[i] = static_cast<int32_t>(v);
      return;
    case CONCORD_INT64:
      static_cast<int64_t*>(data)[i] = static_cast<int64_t>(v);
      return;
    case CONCORD_FLOAT16:
      static_cast<uint16_t*>(data)[i] = FloatToHalf(static_cast<float>(v));
      return;
    case CONCORD_BFLOAT16:
      static_cast<uint16_t*>(data)[i] = FloatToBFloat16(static_cast<float>(v));
      return;
    case CONCORD_FLOAT32:
      static_cast<float*>(data)[i] = static_cast<float>(v);
      return;
    case CONCORD_FLOAT64:
      static_cast<double*>(data)[i] = v;
      return;
  }
}
inline void StoreElement(DType dtype, void* data, size_t i, double v) {
  StoreElement(ToC(dtype), data, i, v);
}

// a (op) b; an average combines as a sum (its division comes once, at the end).
inline double CombineValues(concord_reduce_op_t op, double a, double b) {
  switch (op) {
    case CONCORD_SUM:
    case CONCORD_AVERAGE:
      return a + b;
    case CONCORD_MIN:
      return std::min(a, b);
    case CONCORD_MAX:
      return std::max(a, b);
    case CONCORD_PRODUCT:
      return a * b;
  }
  return a;
}
inline double CombineValues(ReduceOp op, double a, double b) {
  return CombineValues(ToC(op), a, b);
}

// input(0) (op) input(1) (op) ... input(size - 1), in rank order: what a backend's allreduce
// leaves (its average is a sum; the engine divides).
inline double ReduceOverRanks(concord_reduce_op_t op, int size,
                              const std::function<double(int rank)>& input) {
  double acc = input(0);
  for (int r = 1; r < size; ++r) acc = CombineValues(op, acc, input(r));
  return acc;
}
inline double ReduceOverRanks(ReduceOp op, int size, const std::function<double(int rank)>& input) {
  return ReduceOverRanks(ToC(op), size, input);
}

// What an allreduce through the engine (or the C API) leaves: every input prescaled, reduced in
// rank order, an average divided by the size (integer types truncate toward zero), postscaled.
inline double ExpectedAllreduce(concord_reduce_op_t op, concord_dtype_t dtype, int size,
                                const std::function<double(int rank)>& input, double prescale = 1.0,
                                double postscale = 1.0) {
  double acc = ReduceOverRanks(op, size, [&](int r) { return prescale * input(r); });
  if (op == CONCORD_AVERAGE) acc = IsFloat(dtype) ? acc / size : std::trunc(acc / size);
  return acc * postscale;
}
inline double ExpectedAllreduce(ReduceOp op, DType dtype, int size,
                                const std::function<double(int rank)>& input, double prescale = 1.0,
                                double postscale = 1.0) {
  return ExpectedAllreduce(ToC(op), ToC(dtype), size, input, prescale, postscale);
}

}  // namespace harness
}  // namespace concord

#endif  // __cplusplus

#endif /* CONCORD_TESTS_COMMON_TENSORS_H_ */
