// Element access by runtime dtype for the C++ tests: load element i of a buffer as a double (half
// types converted), or store a double (exactly representable in the dtype) as element i.
#pragma once

#include <algorithm>
#include <cstddef>
#include <cstdint>

#include "base/dtype.h"

namespace concord {
namespace testing_elements {

inline double LoadElement(DType dtype, const void* data, size_t i) {
  switch (dtype) {
    case DType::kUint8:
      return static_cast<const uint8_t*>(data)[i];
    case DType::kInt8:
      return static_cast<const int8_t*>(data)[i];
    case DType::kInt32:
      return static_cast<const int32_t*>(data)[i];
    case DType::kInt64:
      return static_cast<double>(static_cast<const int64_t*>(data)[i]);
    case DType::kFloat16:
      return HalfToFloat(static_cast<const uint16_t*>(data)[i]);
    case DType::kBFloat16:
      return BFloat16ToFloat(static_cast<const uint16_t*>(data)[i]);
    case DType::kFloat32:
      return static_cast<const float*>(data)[i];
    case DType::kFloat64:
      return static_cast<const double*>(data)[i];
  }
  return 0;
}

inline void StoreElement(DType dtype, void* data, size_t i, double v) {
  switch (dtype) {
    case DType::kUint8:
      static_cast<uint8_t*>(data)[i] = static_cast<uint8_t>(v);
      return;
    case DType::kInt8:
      static_cast<int8_t*>(data)[i] = static_cast<int8_t>(v);
      return;
    case DType::kInt32:
      static_cast<int32_t*>(data)[i] = static_cast<int32_t>(v);
      return;
    case DType::kInt64:
      static_cast<int64_t*>(data)[i] = static_cast<int64_t>(v);
      return;
    case DType::kFloat16:
      static_cast<uint16_t*>(data)[i] = FloatToHalf(static_cast<float>(v));
      return;
    case DType::kBFloat16:
      static_cast<uint16_t*>(data)[i] = FloatToBFloat16(static_cast<float>(v));
      return;
    case DType::kFloat32:
      static_cast<float*>(data)[i] = static_cast<float>(v);
      return;
    case DType::kFloat64:
      static_cast<double*>(data)[i] = v;
      return;
  }
}

// a (op) b for the expected results of a reduction (average combines as a sum).
inline double CombineValues(ReduceOp op, double a, double b) {
  switch (op) {
    case ReduceOp::kSum:
    case ReduceOp::kAverage:
      return a + b;
    case ReduceOp::kMin:
      return std::min(a, b);
    case ReduceOp::kMax:
      return std::max(a, b);
    case ReduceOp::kProduct:
      return a * b;
  }
  return a;
}

}  // namespace testing_elements
}  // namespace concord
