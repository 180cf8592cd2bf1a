// What the multi-process tests (tests/mp/*.cc) share beyond the harness (tests/common: checks,
// element access, CpuTensor): short dtype names, tolerances and a clock. Only the C API
// (concord.h) is used.
#ifndef CONCORD_TESTS_MP_MP_COMMON_H_
#define CONCORD_TESTS_MP_MP_COMMON_H_

#include <chrono>
#include <cmath>

#include "concord/concord.h"

namespace mp {

inline const char* DTypeName(concord_dtype_t t) {
  switch (t) {
    case CONCORD_UINT8:
      return "u8";
    case CONCORD_INT8:
      return "i8";
    case CONCORD_INT32:
      return "i32";
    case CONCORD_INT64:
      return "i64";
    case CONCORD_FLOAT16:
      return "f16";
    case CONCORD_BFLOAT16:
      return "bf16";
    case CONCORD_FLOAT32:
      return "f32";
    case CONCORD_FLOAT64:
      return "f64";
  }
  return "?";
}

inline bool IsSigned(concord_dtype_t t) {
  return t != CONCORD_UINT8;
}

// Relative tolerance for a dtype: 0 (exact) for integers.
inline double Tolerance(concord_dtype_t t) {
  switch (t) {
    case CONCORD_FLOAT16:
      return 2e-3;
    case CONCORD_BFLOAT16:
      return 1.6e-2;
    case CONCORD_FLOAT32:
      return 1e-6;
    case CONCORD_FLOAT64:
      return 1e-12;
    default:
      return 0;
  }
}

inline bool Close(double got, double want, concord_dtype_t t) {
  const double tol = Tolerance(t);
  if (tol == 0) return got == want;
  return std::fabs(got - want) <= tol * std::fabs(want) + tol * 1e-3;
}

inline double Now() {
  return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count();
}

}  // namespace mp

#endif  // CONCORD_TESTS_MP_MP_COMMON_H_
