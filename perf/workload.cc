#include "perf/workload.h"

#include <fstream>
#include <sstream>

namespace concord {

StatusOr<DType> ParseDTypeName(const std::string& text) {
  static const std::pair<const char*, DType> kNames[] = {
      {"uint8", DType::kUint8},     {"int8", DType::kInt8},         {"int32", DType::kInt32},
      {"int64", DType::kInt64},     {"float16", DType::kFloat16},   {"fp16", DType::kFloat16},
      {"half", DType::kFloat16},    {"bfloat16", DType::kBFloat16}, {"bf16", DType::kBFloat16},
      {"float32", DType::kFloat32}, {"fp32", DType::kFloat32},      {"float", DType::kFloat32},
      {"float64", DType::kFloat64}, {"fp64", DType::kFloat64},      {"double", DType::kFloat64},
  };
  for (const auto& [name, dtype] : kNames) {
    if (text == name) return dtype;
  }
  return InvalidArgument("unknown dtype '" + text + "'");
}

StatusOr<Workload> LoadWorkload(const std::string& path) {
  std::ifstream in(path);
  if (!in) return ErrnoError("cannot open workload file " + path, errno);
  Workload w;
  const size_t slash = path.find_last_of('/');
  w.name = path.substr(slash == std::string::npos ? 0 : slash + 1);
  w.name = w.name.substr(0, w.name.find('.'));
  std::string line;
  for (int lineno = 1; std::getline(in, line); ++lineno) {
    const std::string where = path + ":" + std::to_string(lineno) + ": ";
    line = line.substr(0, line.find('#'));
    std::istringstream fields(line);
    WorkloadTensor t;
    std::string dtype, shape, extra;
    if (!(fields >> t.name)) continue;
    if (!(fields >> dtype >> shape) || (fields >> extra)) {
      return InvalidArgument(where + "expected 'name dtype shape'");
    }
    auto parsed = ParseDTypeName(dtype);
    if (!parsed.ok()) return parsed.status().WithContext(where);
    t.dtype = *parsed;
    t.elements = 1;
    std::istringstream dims(shape);
    std::string dim;
    while (std::getline(dims, dim, 'x')) {
      char* end = nullptr;
      const long long d = std::strtoll(dim.c_str(), &end, 10);
      if (dim.empty() || *end != '\0' || d < 0 || d > (int64_t{1} << 40)) {
        return InvalidArgument(where + "bad dimension '" + dim + "' in shape '" + shape + "'");
      }
      t.shape.push_back(d);
      t.elements *= d;
    }
    t.bytes = static_cast<size_t>(t.elements) * DTypeSize(t.dtype);
    w.total_bytes += t.bytes;
    w.tensors.push_back(std::move(t));
  }
  if (w.tensors.empty()) return InvalidArgument(path + ": no tensors");
  return w;
}

}  // namespace concord
