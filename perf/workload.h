// A model's gradient workload: the tensors listed in a perf/workloads file, one per line,
// "name dtype shape" with shape as AxBxC, in the order a backward pass makes them ready.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "base/dtype.h"
#include "base/status.h"

namespace concord {

struct WorkloadTensor {
  std::string name;
  DType dtype = DType::kFloat32;
  std::vector<int64_t> shape;
  int64_t elements = 0;
  size_t bytes = 0;
};

struct Workload {
  std::string name;  // the file's base name without extension
  std::vector<WorkloadTensor> tensors;
  size_t total_bytes = 0;
};

// Parses a workload file. '#' starts a comment; blank lines are skipped. Errors name the line.
StatusOr<Workload> LoadWorkload(const std::string& path);

// Parses a dtype name as written in workload files and on command lines ("float32", "fp16", ...).
StatusOr<DType> ParseDTypeName(const std::string& text);

}  // namespace concord
