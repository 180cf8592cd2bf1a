// fp16/bf16 casts on the GPU: one thread per element (grid-stride), the scalar conversions of
// base/half_convert.h, so the bits equal the CPU paths'.
#include "base/half_convert.h"
#include "compression/cuda/cuda_check.cuh"
#include "compression/cuda/cuda_kernels.h"

namespace concord {
namespace compression {
namespace {

constexpr int kThreads = 256;
constexpr size_t kMaxBlocks = 4096;

unsigned Blocks(size_t n) {
  const size_t blocks = (n + kThreads - 1) / kThreads;
  return static_cast<unsigned>(blocks < kMaxBlocks ? blocks : kMaxBlocks);
}

template <bool kBFloat16>
__global__ void EncodeKernel(const float* in, size_t n, float scale, uint16_t* out) {
  for (size_t i = blockIdx.x * size_t{blockDim.x} + threadIdx.x; i < n;
       i += size_t{gridDim.x} * blockDim.x) {
    const float x = scale != 1.0f ? __fmul_rn(in[i], scale) : in[i];
    out[i] = kBFloat16 ? half_convert::FloatToBFloat16(x) : half_convert::FloatToHalf(x);
  }
}

template <bool kBFloat16, bool kAccumulate>
__global__ void DecodeKernel(const uint16_t* in, size_t n, float* out) {
  for (size_t i = blockIdx.x * size_t{blockDim.x} + threadIdx.x; i < n;
       i += size_t{gridDim.x} * blockDim.x) {
    const float x =
        kBFloat16 ? half_convert::BFloat16ToFloat(in[i]) : half_convert::HalfToFloat(in[i]);
    out[i] = kAccumulate ? __fadd_rn(out[i], x) : x;
  }
}

template <bool kAccumulate>
Status LaunchDecode(HalfFormat format, const void* in, size_t n, float* out, void* stream) {
  if (n == 0) return Status::Ok();
  const auto* src = static_cast<const uint16_t*>(in);
  auto s = static_cast<cudaStream_t>(stream);
  if (format == HalfFormat::kBFloat16) {
    DecodeKernel<true, kAccumulate><<<Blocks(n), kThreads, 0, s>>>(src, n, out);
  } else {
    DecodeKernel<false, kAccumulate><<<Blocks(n), kThreads, 0, s>>>(src, n, out);
  }
  CONCORD_CUDA_RETURN_IF_LAUNCH_FAILED(kAccumulate ? "accumulate kernel" : "decode kernel");
  return Status::Ok();
}

}  // namespace

Status CudaEncodeFloats(HalfFormat format, const float* in, size_t n, float scale, void* out,
                        void* stream) {
  if (n == 0) return Status::Ok();
  auto* dst = static_cast<uint16_t*>(out);
  auto s = static_cast<cudaStream_t>(stream);
  if (format == HalfFormat::kBFloat16) {
    EncodeKernel<true><<<Blocks(n), kThreads, 0, s>>>(in, n, scale, dst);
  } else {
    EncodeKernel<false><<<Blocks(n), kThreads, 0, s>>>(in, n, scale, dst);
  }
  CONCORD_CUDA_RETURN_IF_LAUNCH_FAILED("encode kernel");
  return Status::Ok();
}

Status CudaDecodeToFloats(HalfFormat format, const void* in, size_t n, float* out, void* stream) {
  return LaunchDecode<false>(format, in, n, out, stream);
}

Status CudaAccumulateFloats(HalfFormat format, const void* in, size_t n, float* dense,
                            void* stream) {
  return LaunchDecode<true>(format, in, n, dense, stream);
}

}  // namespace compression
}  // namespace concord
