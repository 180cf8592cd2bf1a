#include "backends/cuda/cuda_check.h"
#include "perf/device_copy.h"

namespace concord {

Status CopyHostToDevice(int device, void* dst, const void* src, size_t bytes) {
  cuda::DeviceGuard guard;
  CONCORD_CUDA_CHECK(guard.Set(device));
  CONCORD_CUDA_CHECK(cudaMemcpy(dst, src, bytes, cudaMemcpyHostToDevice));
  // A copy from pageable memory may return before its bytes arrive, and a non-blocking stream
  // (raw NCCL's) does not wait for the legacy one the copy ran on.
  CONCORD_CUDA_CHECK(cudaDeviceSynchronize());
  return Status::Ok();
}

Status CopyDeviceToHost(int device, void* dst, const void* src, size_t bytes) {
  cuda::DeviceGuard guard;
  CONCORD_CUDA_CHECK(guard.Set(device));
  // The work that wrote `src` may be on a non-blocking stream the copy would not wait for.
  CONCORD_CUDA_CHECK(cudaDeviceSynchronize());
  CONCORD_CUDA_CHECK(cudaMemcpy(dst, src, bytes, cudaMemcpyDeviceToHost));
  return Status::Ok();
}

}  // namespace concord
