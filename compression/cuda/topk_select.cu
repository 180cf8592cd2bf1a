// Exact top-k selection on the GPU: a radix select over the magnitude keys (|x|'s bits, below 2^31)
// in three histogram passes of 11, 11 and 9 bits fixes the k-th largest key T and how many of the
// elements equal to T are wanted; one stable compaction (CUB) lists the elements equal to T to find
// the last wanted one, a second lists the selection in index order. No host synchronisation.
#include <thrust/iterator/counting_iterator.h>

#include <cstdint>
#include <cub/device/device_select.cuh>

#include "compression/cuda/cuda_check.cuh"
#include "compression/cuda/cuda_kernels.h"
#include "compression/topk.h"

namespace concord {
namespace compression {
namespace {

constexpr int kThreads = 256;
constexpr size_t kMaxBlocks = 2048;
constexpr uint32_t kBins = 2048;

// Control words in the workspace, after the histogram.
enum Control : int { kPrefix = 0, kPrefixMask = 1, kRemaining = 2, kTieCut = 3, kNumControl = 4 };

// Workspace layout: histogram, control words, the selection count CUB writes, the list of ties,
// then CUB's temporary storage.
constexpr size_t kHistBytes = kBins * sizeof(uint32_t);
constexpr size_t kControlOffset = kHistBytes;
constexpr size_t kCountOffset = kControlOffset + 64;
constexpr size_t kTiesOffset = kCountOffset + 64;

size_t Align256(size_t bytes) {
  return (bytes + 255) / 256 * 256;
}

unsigned Blocks(size_t n) {
  const size_t blocks = (n + kThreads - 1) / kThreads;
  return static_cast<unsigned>(blocks == 0 ? 1 : (blocks < kMaxBlocks ? blocks : kMaxBlocks));
}

// MagnitudeKey (topk.h): every nan has one key, above inf's. A GPU addition makes any nan the
// canonical one where the CPU keeps an operand's payload, so nans must not order by payload.
constexpr uint32_t kDeviceNanKey = 0x7f800001u;
static_assert(kDeviceNanKey == kNanKey, "the GPU's nan key is the CPU's");

__device__ __forceinline__ uint32_t Key(float x) {
  return min(__float_as_uint(x) & 0x7fffffffu, kDeviceNanKey);
}

__global__ void InitKernel(uint32_t* hist, uint32_t* control, uint32_t k) {
  for (uint32_t b = threadIdx.x; b < kBins; b += blockDim.x) hist[b] = 0;
  if (threadIdx.x == 0) {
    control[kPrefix] = 0;
    control[kPrefixMask] = 0;
    control[kRemaining] = k;
    control[kTieCut] = 0;
  }
}

// Adds the scaled gradient (first pass only), then counts the keys that match the prefix found so
// far by their digit at `shift`.
template <bool kAccumulate>
__global__ void HistogramKernel(const float* grad, float scale, float* acc, size_t n, int shift,
                                uint32_t digit_mask, const uint32_t* control, uint32_t* hist) {
  __shared__ uint32_t local[kBins];
  for (uint32_t b = threadIdx.x; b < kBins; b += blockDim.x) local[b] = 0;
  __syncthreads();
  const uint32_t prefix = control[kPrefix];
  const uint32_t mask = control[kPrefixMask];
  for (size_t i = blockIdx.x * size_t{blockDim.x} + threadIdx.x; i < n;
       i += size_t{gridDim.x} * blockDim.x) {
    float v = acc[i];
    if (kAccumulate) {
      v = __fadd_rn(v, __fmul_rn(scale, grad[i]));  // rounded as the CPU loop rounds
      acc[i] = v;
    }
    const uint32_t key = Key(v);
    if ((key & mask) == prefix) atomicAdd(&local[(key >> shift) & digit_mask], 1u);
  }
  __syncthreads();
  for (uint32_t b = threadIdx.x; b <= digit_mask; b += blockDim.x) {
    if (local[b] != 0) atomicAdd(&hist[b], local[b]);
  }
}

// One thread: the digit holding the remaining-th largest key; clears the histogram for the next
// pass.
__global__ void FindDigitKernel(uint32_t* hist, int shift, uint32_t digit_mask, uint32_t* control) {
  if (threadIdx.x == 0) {
    uint32_t remaining = control[kRemaining];
    uint32_t digit = digit_mask;
    while (hist[digit] < remaining) remaining -= hist[digit--];
    control[kPrefix] |= digit << shift;
    control[kPrefixMask] |= digit_mask << shift;
    control[kRemaining] = remaining;  // how many keys equal to the prefix are still wanted
  }
  __syncthreads();
  for (uint32_t b = threadIdx.x; b < kBins; b += blockDim.x) hist[b] = 0;
}

__global__ void TieCutKernel(const uint32_t* ties, uint32_t* control) {
  control[kTieCut] = ties[control[kRemaining] - 1];
}

__global__ void AccumulateKernel(const float* grad, float scale, float* acc, size_t n) {
  for (size_t i = blockIdx.x * size_t{blockDim.x} + threadIdx.x; i < n;
       i += size_t{gridDim.x} * blockDim.x) {
    acc[i] = __fadd_rn(acc[i], __fmul_rn(scale, grad[i]));
  }
}

__global__ void IotaKernel(uint32_t* out, size_t n) {
  for (size_t i = blockIdx.x * size_t{blockDim.x} + threadIdx.x; i < n;
       i += size_t{gridDim.x} * blockDim.x) {
    out[i] = static_cast<uint32_t>(i);
  }
}

struct IsTie {
  const float* acc;
  const uint32_t* control;
  __device__ bool operator()(uint32_t i) const { return Key(acc[i]) == control[kPrefix]; }
};

struct IsSelected {
  const float* acc;
  const uint32_t* control;
  __device__ bool operator()(uint32_t i) const {
    const uint32_t key = Key(acc[i]);
    const uint32_t kth = control[kPrefix];
    return key > kth || (key == kth && i <= control[kTieCut]);
  }
};

using Indices = thrust::counting_iterator<uint32_t>;

// CUB's temporary storage for either compaction over n elements.
StatusOr<size_t> CubTempBytes(size_t n) {
  size_t tie_bytes = 0, select_bytes = 0;
  const auto items = static_cast<int64_t>(n);
  CONCORD_CUDA_RETURN_IF_ERROR(
      cub::DeviceSelect::If(nullptr, tie_bytes, Indices(0), static_cast<uint32_t*>(nullptr),
                            static_cast<int64_t*>(nullptr), items, IsTie{nullptr, nullptr}));
  CONCORD_CUDA_RETURN_IF_ERROR(
      cub::DeviceSelect::If(nullptr, select_bytes, Indices(0), static_cast<uint32_t*>(nullptr),
                            static_cast<int64_t*>(nullptr), items, IsSelected{nullptr, nullptr}));
  return tie_bytes > select_bytes ? tie_bytes : select_bytes;
}

}  // namespace

StatusOr<size_t> CudaTopkWorkspaceBytes(size_t n) {
  CONCORD_ASSIGN_OR_RETURN(const size_t cub_bytes, CubTempBytes(n));
  return kTiesOffset + Align256(n * sizeof(uint32_t)) + cub_bytes;
}

Status CudaSelectTopk(const float* grad, float scale, float* acc, size_t n, size_t k,
                      uint32_t* selected, void* workspace, size_t workspace_bytes, void* stream) {
  if (n > UINT32_MAX || k > n) {
    return InvalidArgument("GPU top-k selection of " + std::to_string(k) + " out of " +
                           std::to_string(n) + " elements");
  }
  // Device pointers are not dereferenced here: a null or misaligned one would fault inside a
  // kernel and leave the CUDA context unusable, so both are refused before any launch.
  const struct {
    const void* pointer;
    bool needed;
    const char* what;
  } buffers[] = {{acc, n > 0, "acc"}, {grad, false, "grad"}, {selected, k > 0, "selected"}};
  for (const auto& b : buffers) {
    if (b.pointer == nullptr ? b.needed : reinterpret_cast<uintptr_t>(b.pointer) % 4 != 0) {
      return InvalidArgument(std::string("GPU top-k selection: ") + b.what +
                             (b.pointer == nullptr ? " is null" : " is not aligned to 4 bytes"));
    }
  }
  auto s = static_cast<cudaStream_t>(stream);
  if (k == 0 || k == n) {
    if (grad != nullptr && n > 0) {
      AccumulateKernel<<<Blocks(n), kThreads, 0, s>>>(grad, scale, acc, n);
      CONCORD_CUDA_RETURN_IF_LAUNCH_FAILED("top-k accumulate kernel");
    }
    if (k > 0) {
      IotaKernel<<<Blocks(n), kThreads, 0, s>>>(selected, n);
      CONCORD_CUDA_RETURN_IF_LAUNCH_FAILED("top-k iota kernel");
    }
    return Status::Ok();
  }
  if (reinterpret_cast<uintptr_t>(workspace) % 8 != 0) {
    return InvalidArgument("GPU top-k workspace is not aligned to 8 bytes (cudaMalloc's are)");
  }
  CONCORD_ASSIGN_OR_RETURN(const size_t cub_bytes, CubTempBytes(n));
  const size_t cub_offset = kTiesOffset + Align256(n * sizeof(uint32_t));
  if (workspace == nullptr || workspace_bytes < cub_offset + cub_bytes) {
    return InvalidArgument("GPU top-k workspace of " + std::to_string(workspace_bytes) +
                           " bytes is smaller than the " + std::to_string(cub_offset + cub_bytes) +
                           " CudaTopkWorkspaceBytes asks for");
  }
  auto* base = static_cast<uint8_t*>(workspace);
  auto* hist = reinterpret_cast<uint32_t*>(base);
  auto* control = reinterpret_cast<uint32_t*>(base + kControlOffset);
  auto* count = reinterpret_cast<int64_t*>(base + kCountOffset);
  auto* ties = reinterpret_cast<uint32_t*>(base + kTiesOffset);
  void* cub_temp = base + cub_offset;

  InitKernel<<<1, kThreads, 0, s>>>(hist, control, static_cast<uint32_t>(k));
  CONCORD_CUDA_RETURN_IF_LAUNCH_FAILED("top-k init kernel");
  struct Pass {
    int shift;
    uint32_t digit_mask;
  };
  constexpr Pass kPasses[] = {{20, 2047}, {9, 2047}, {0, 511}};
  bool first = true;
  for (const Pass& pass : kPasses) {
    if (first && grad != nullptr) {
      HistogramKernel<true><<<Blocks(n), kThreads, 0, s>>>(grad, scale, acc, n, pass.shift,
                                                           pass.digit_mask, control, hist);
    } else {
      HistogramKernel<false><<<Blocks(n), kThreads, 0, s>>>(nullptr, 1.0f, acc, n, pass.shift,
                                                            pass.digit_mask, control, hist);
    }
    CONCORD_CUDA_RETURN_IF_LAUNCH_FAILED("top-k histogram kernel");
    FindDigitKernel<<<1, kThreads, 0, s>>>(hist, pass.shift, pass.digit_mask, control);
    CONCORD_CUDA_RETURN_IF_LAUNCH_FAILED("top-k digit kernel");
    first = false;
  }
  const auto items = static_cast<int64_t>(n);
  size_t temp_bytes = cub_bytes;
  CONCORD_CUDA_RETURN_IF_ERROR(cub::DeviceSelect::If(cub_temp, temp_bytes, Indices(0), ties, count,
                                                     items, IsTie{acc, control}, s));
  TieCutKernel<<<1, 1, 0, s>>>(ties, control);
  CONCORD_CUDA_RETURN_IF_LAUNCH_FAILED("top-k tie kernel");
  temp_bytes = cub_bytes;
  CONCORD_CUDA_RETURN_IF_ERROR(cub::DeviceSelect::If(cub_temp, temp_bytes, Indices(0), selected,
                                                     count, items, IsSelected{acc, control}, s));
  return Status::Ok();
}

}  // namespace compression
}  // namespace concord
