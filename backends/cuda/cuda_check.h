// CUDA error handling for the .cu files of this component (it includes the CUDA runtime, so no
// header outside backends/cuda includes it). CONCORD_CUDA_CHECK(call) returns a Status naming the
// call, cudaGetErrorString and the file:line when the call fails. DeviceGuard sets a device for one
// scope and restores the caller's where that creates no CUDA context. Both are thread-safe (the
// current device is per thread).
#pragma once

#include <cudaTypedefs.h>
#include <cuda_runtime.h>

#include <string>
#include <utility>

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

// Whether `device`'s primary context is active (some thread of this process uses the device).
// Since CUDA 12 cudaSetDevice creates the primary context at once: setting a thread back to a
// device whose context is not active would make one there (hundreds of MiB of that GPU's memory,
// on GPU 0 for every rank: a thread that never chose a device is on device 0). Asks the driver
// through the runtime's entry points (nothing links libcuda); true when it cannot tell.
inline bool PrimaryContextActive(int device) {
#if CUDART_VERSION >= 12000
  using GetDevice = PFN_cuDeviceGet_v2000;
  using GetState = PFN_cuDevicePrimaryCtxGetState_v7000;
  static const std::pair<GetDevice, GetState> driver = [] {
    void* get_device = nullptr;
    void* get_state = nullptr;
    cudaDriverEntryPointQueryResult found = cudaDriverEntryPointSuccess;
#if CUDART_VERSION >= 12050
    cudaGetDriverEntryPointByVersion("cuDeviceGet", &get_device, 12000, cudaEnableDefault, &found);
    cudaGetDriverEntryPointByVersion("cuDevicePrimaryCtxGetState", &get_state, 12000,
                                     cudaEnableDefault, &found);
#else
    cudaGetDriverEntryPoint("cuDeviceGet", &get_device, cudaEnableDefault, &found);
    cudaGetDriverEntryPoint("cuDevicePrimaryCtxGetState", &get_state, cudaEnableDefault, &found);
#endif
    return std::make_pair(reinterpret_cast<GetDevice>(get_device),
                          reinterpret_cast<GetState>(get_state));
  }();
  CUdevice handle = 0;
  unsigned int flags = 0;
  int active = 1;
  if (driver.first == nullptr || driver.second == nullptr ||
      driver.first(&handle, device) != CUDA_SUCCESS ||
      driver.second(handle, &flags, &active) != CUDA_SUCCESS) {
    return true;
  }
  return active != 0;
#else
  (void)device;  // before CUDA 12 cudaSetDevice creates no context
  return true;
#endif
}

// Makes `device` the calling thread's for one scope. Nothing is set when it is already the
// thread's. At the end of the scope the thread's previous device is set again when its primary
// context is active; otherwise the thread stays on `device` (as PyTorch's MaybeSetDevice does):
// the previous one is then a device nothing in this process uses, as a thread's default device 0
// is on a Concord thread or on a thread that never chose one, and restoring it would create a
// context there.
class DeviceGuard {
 public:
  DeviceGuard() = default;
  DeviceGuard(const DeviceGuard&) = delete;
  DeviceGuard& operator=(const DeviceGuard&) = delete;
  ~DeviceGuard() {
    if (set_ && PrimaryContextActive(previous_)) cudaSetDevice(previous_);
  }
  cudaError_t Set(int device) {
    cudaError_t error = cudaGetDevice(&previous_);
    if (error != cudaSuccess || previous_ == device) return error;
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
