// CUDA error handling for the .cu files of this component (it includes the CUDA runtime, so no
// header outside backends/cuda includes it). CONCORD_CUDA_CHECK(call) returns a Status naming the
// call, cudaGetErrorString and the file:line when the call fails. DeviceGuard sets a device for one
// scope and restores the caller's. Both are thread-safe (the current device is per thread).
#pragma once

#include <cuda_runtime.h>

#include <string>

#include "base/status.h"

namespace concord {
namespace cuda {

// Unavailable for the errors that mean "no usable GPU here", BackendError otherwise.
inline Status CudaError(cudaError_t error, const char* call, const char* file, int line) {
  const bool no_device = error == cudaErrorInsufficientDriver || error == cudaErrorNoDevice ||
                         error == cudaErrorDevicesUnavailable;
  return Status(no_device ? Code::kUnavailable : Code::kBackendError,
                std::string(file) + ":" + std::to_string(line) + ": " + call + ": " +
                    cudaGetErrorString(error) + " (" + cudaGetErrorName(error) + ", error " +
                    std::to_string(static_cast<int>(error)) + ")");
}

class DeviceGuard {
 public:
  DeviceGuard() = default;
  DeviceGuard(const DeviceGuard&) = delete;
  DeviceGuard& operator=(const DeviceGuard&) = delete;
  ~DeviceGuard() {
    if (set_) cudaSetDevice(previous_);
  }
  cudaError_t Set(int device) {
    cudaError_t error = cudaGetDevice(&previous_);
    if (error != cudaSuccess) return error;
    error = cudaSetDevice(device);
    set_ = error == cudaSuccess;
    return error;
  }

 private:
  int previous_ = 0;
  bool set_ = false;
};

}  // namespace cuda
}  // namespace concord

#define CONCORD_CUDA_CHECK(call)                                                         \
  do {                                                                                   \
    const cudaError_t concord_cuda_error_ = (call);                                      \
    if (concord_cuda_error_ != cudaSuccess) {                                            \
      return ::concord::cuda::CudaError(concord_cuda_error_, #call, __FILE__, __LINE__); \
    }                                                                                    \
  } while (0)
