// What the multi-process tests (tests/mp/*.cc) share beyond the harness (tests/common: checks,
// element access, CpuTensor): short dtype names, tolerances, a clock and an init that exits on
// failure. Only the C API (concord.h) is used.
#ifndef CONCORD_TESTS_MP_MP_COMMON_H_
#define CONCORD_TESTS_MP_MP_COMMON_H_

#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <string>

#include "concord/concord.h"
#include "tests/common/check.h"

namespace mp {

// Every dtype and every reduction of the C API.
inline constexpr concord_dtype_t kDTypes[] = {CONCORD_UINT8,   CONCORD_INT8,    CONCORD_INT32,
                                              CONCORD_INT64,   CONCORD_FLOAT16, CONCORD_BFLOAT16,
                                              CONCORD_FLOAT32, CONCORD_FLOAT64};
inline constexpr concord_reduce_op_t kOps[] = {CONCORD_SUM, CONCORD_AVERAGE, CONCORD_MIN,
                                               CONCORD_MAX, CONCORD_PRODUCT};

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

inline bool Contains(const std::string& s, const std::string& part) {
  return s.find(part) != std::string::npos;
}

// concord_init from the environment, or exit(1) saying why; sets *rank, *size and the checks'
// context ("rank R").
inline concord_comm_t InitOrExit(int* rank, int* size) {
  concord_comm_t comm = nullptr;
  const concord_status_t s = concord_init(&comm);
  if (s != CONCORD_SUCCESS) {
    std::fprintf(stderr, "rank ?: FAIL concord_init: %s: %s\n", concord_status_string(s),
                 concord_comm_last_error(nullptr));
    std::exit(1);
  }
  concord_comm_rank(comm, rank);
  concord_comm_size(comm, size);
  CheckSetContext("rank %d", *rank);
  return comm;
}

}  // namespace mp

#endif  // CONCORD_TESTS_MP_MP_COMMON_H_
