// fp16/bf16 casts on the GPU: one thread per element (grid-stride), the scalar conversions of
// base/half_convert.h, so the bits equal the CPU paths'. A GPU multiply or add with a nan operand
// gives the canonical nan (0x7fffffff, positive), where x86 gives that operand back (quiet, with
// its sign and payload): the scale and the accumulation below do what x86 does, so nan inputs keep
// their sign and payload bits as on the CPU.
#include <cstdint>

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

// x86's nan propagation: the first nan operand, made quiet (sets the top mantissa bit).
__device__ __forceinline__ float Quiet(float nan) {
  return __uint_as_float(__float_as_uint(nan) | 0x00400000u);
}
__device__ __forceinline__ float MulAsCpu(float a, float b) {
  return isnan(a) ? Quiet(a) : (isnan(b) ? Quiet(b) : __fmul_rn(a, b));
}
// dense + value, dense first as the CPU's SIMD paths add (_mm256_add_ps(dense, value)).
__device__ __forceinline__ float AddAsCpu(float a, float b) {
  return isnan(a) ? Quiet(a) : (isnan(b) ? Quiet(b) : __fadd_rn(a, b));
}

template <bool kBFloat16>
__global__ void EncodeKernel(const float* in, size_t n, float scale, uint16_t* out) {
  for (size_t i = blockIdx.x * size_t{blockDim.x} + threadIdx.x; i < n;
       i += size_t{gridDim.x} * blockDim.x) {
    const float x = scale != 1.0f ? MulAsCpu(in[i], scale) : in[i];
    out[i] = kBFloat16 ? half_convert::FloatToBFloat16(x) : half_convert::FloatToHalf(x);
  }
}

template <bool kBFloat16, bool kAccumulate>
__global__ void DecodeKernel(const uint16_t* in, size_t n, float* out) {
  for (size_t i = blockIdx.x * size_t{blockDim.x} + threadIdx.x; i < n;
       i += size_t{gridDim.x} * blockDim.x) {
    const float x =
        kBFloat16 ? half_convert::BFloat16ToFloat(in[i]) : half_convert::HalfToFloat(in[i]);
    out[i] = kAccumulate ? AddAsCpu(out[i], x) : x;
  }
}

// Device pointers are not dereferenced here: a null or misaligned one would fault inside the
// kernel and leave the CUDA context unusable, so both are refused before any launch.
Status CheckBuffer(const void* p, size_t alignment, const char* what) {
  if (p == nullptr) return InvalidArgument(std::string("GPU cast: the ") + what + " is null");
  if (reinterpret_cast<uintptr_t>(p) % alignment != 0) {
    return InvalidArgument(std::string("GPU cast: the ") + what + " is not aligned to " +
                           std::to_string(alignment) + " bytes");
  }
  return Status::Ok();
}

template <bool kAccumulate>
Status LaunchDecode(HalfFormat format, const void* in, size_t n, float* out, void* stream) {
  if (n == 0) return Status::Ok();
  CONCORD_RETURN_IF_ERROR(CheckBuffer(in, sizeof(uint16_t), "16-bit input"));
  CONCORD_RETURN_IF_ERROR(CheckBuffer(out, sizeof(float), "float output"));
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
  CONCORD_RETURN_IF_ERROR(CheckBuffer(in, sizeof(float), "float input"));
  CONCORD_RETURN_IF_ERROR(CheckBuffer(out, sizeof(uint16_t), "16-bit output"));
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
