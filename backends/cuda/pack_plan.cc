#include "backends/cuda/pack_plan.h"

#include <cmath>
#include <cstdio>
#include <limits>
#include <string>

#include "base/c_locale.h"

namespace concord {
namespace cuda {
namespace {

bool IsPowerOfTwo(size_t v) {
  return v != 0 && (v & (v - 1)) == 0;
}

std::string TensorLabel(size_t index) {
  return "pack tensor " + std::to_string(index) + ": ";
}

// A scale factor for messages: "0.500000" whatever the application's LC_NUMERIC (std::to_string
// follows it: "0,500000" under de_DE).
std::string ScaleText(double scale) {
  const ScopedCLocale c_locale;
  return std::to_string(scale);
}

std::string Hex(uint64_t v) {
  char text[32];
  std::snprintf(text, sizeof(text), "0x%llx", static_cast<unsigned long long>(v));
  return text;
}

}  // namespace

uint32_t VectorBytes(uint64_t user_address, size_t slot_alignment) {
  uint32_t width = 16;
  while (width > 1 && (user_address % width != 0 || slot_alignment % width != 0)) width /= 2;
  return width;
}

StatusOr<PackPlan> PlanPack(const std::vector<PackTensor>& tensors, const PackOptions& options) {
  if (!IsPowerOfTwo(options.alignment) || options.alignment < 8 || options.alignment > 4096) {
    return InvalidArgument("pack alignment must be a power of two from 8 to 4096, got " +
                           std::to_string(options.alignment));
  }
  if (options.chunk_bytes == 0 || options.chunk_bytes % 16 != 0) {
    return InvalidArgument("pack chunk_bytes must be a positive multiple of 16, got " +
                           std::to_string(options.chunk_bytes));
  }
  if (tensors.size() > std::numeric_limits<uint32_t>::max()) {
    return InvalidArgument("too many tensors for one pack: " + std::to_string(tensors.size()));
  }
  constexpr size_t kMax = std::numeric_limits<size_t>::max();
  PackPlan plan;
  plan.alignment = options.alignment;
  plan.entries.reserve(tensors.size());
  size_t offset = 0;
  for (size_t i = 0; i < tensors.size(); ++i) {
    const PackTensor& t = tensors[i];
    if (!IsValidDType(static_cast<int>(t.dtype))) {
      return InvalidArgument(TensorLabel(i) + "unknown dtype " +
                             std::to_string(static_cast<int>(t.dtype)));
    }
    const size_t element = DTypeSize(t.dtype);
    if (t.count > kMax / element) {
      return InvalidArgument(TensorLabel(i) + "element count overflows the byte size");
    }
    const size_t bytes = t.count * element;
    const uint64_t address = reinterpret_cast<uintptr_t>(t.data);
    if (bytes > 0 && t.data == nullptr) {
      return InvalidArgument(TensorLabel(i) + "null address with " + std::to_string(t.count) +
                             " elements");
    }
    if (address % element != 0) {
      return InvalidArgument(TensorLabel(i) + "address " + Hex(address) +
                             " is not aligned to its element size (" + DTypeName(t.dtype) + ")");
    }
    const size_t padding = (options.alignment - bytes % options.alignment) % options.alignment;
    if (bytes > kMax - padding || offset > kMax - (bytes + padding)) {
      return InvalidArgument(TensorLabel(i) + "the fusion buffer's size overflows");
    }
    plan.entries.push_back(PackEntry{address, offset, bytes, static_cast<uint32_t>(t.dtype),
                                     VectorBytes(address, options.alignment)});
    for (size_t begin = 0; begin < bytes; begin += options.chunk_bytes) {
      const size_t end = bytes - begin > options.chunk_bytes ? begin + options.chunk_bytes : bytes;
      plan.chunks.push_back(PackChunk{begin, end, static_cast<uint32_t>(i), 0});
    }
    offset += bytes + padding;
    plan.payload_bytes += bytes;
  }
  // One block per chunk: the grid's x dimension holds at most 2^31 - 1 blocks.
  if (plan.chunks.size() > static_cast<size_t>(std::numeric_limits<int32_t>::max())) {
    return InvalidArgument("pack needs " + std::to_string(plan.chunks.size()) +
                           " chunks, more than one launch holds: raise chunk_bytes");
  }
  plan.total_bytes = offset;
  return plan;
}

Status CheckLaunch(const PackPlan& plan, const void* buffer, size_t buffer_bytes, double scale) {
  if (plan.total_bytes > 0 && buffer == nullptr) {
    return InvalidArgument("pack: null fusion buffer for " + std::to_string(plan.total_bytes) +
                           " bytes");
  }
  if (plan.alignment == 0) return InvalidArgument("pack: the plan was not made by PlanPack");
  if (reinterpret_cast<uintptr_t>(buffer) % plan.alignment != 0) {
    return InvalidArgument("pack: fusion buffer " + Hex(reinterpret_cast<uintptr_t>(buffer)) +
                           " is not aligned to the plan's " + std::to_string(plan.alignment) +
                           " bytes");
  }
  if (buffer_bytes < plan.total_bytes) {
    return InvalidArgument("pack: fusion buffer holds " + std::to_string(buffer_bytes) +
                           " bytes, the plan needs " + std::to_string(plan.total_bytes));
  }
  if (!std::isfinite(scale)) {
    return InvalidArgument("pack: scale factor must be finite, got " + ScaleText(scale));
  }
  if (scale != 1.0) {
    for (size_t i = 0; i < plan.entries.size(); ++i) {
      const DType dtype = static_cast<DType>(plan.entries[i].dtype);
      if (!IsFloatingPoint(dtype)) {
        return InvalidArgument(TensorLabel(i) + "a " + DTypeName(dtype) +
                               " tensor cannot be scaled (factor " + ScaleText(scale) +
                               "); integer tensors are packed with a scale of exactly 1");
      }
    }
  }
  return Status::Ok();
}

}  // namespace cuda
}  // namespace concord
