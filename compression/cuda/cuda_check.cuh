// CUDA error checking for the .cu files of compression/cuda: a failed call becomes a Status that
// names the call, file and line. Included by .cu files only.
#pragma once

#include <cuda_runtime.h>

#include <string>

#include "base/status.h"

namespace concord {
namespace compression {

inline Status CudaStatus(cudaError_t error, const char* call, const char* file, int line) {
  const Code code = error == cudaErrorNoDevice || error == cudaErrorInsufficientDriver
                        ? Code::kUnavailable
                        : Code::kBackendError;
  return Status(code, std::string(file) + ":" + std::to_string(line) + ": " + call + ": " +
                          cudaGetErrorName(error) + " (" + cudaGetErrorString(error) + ")");
}

}  // namespace compression
}  // namespace concord

#define CONCORD_CUDA_RETURN_IF_ERROR(call)                                                       \
  do {                                                                                           \
    const cudaError_t concord_cuda_error_ = (call);                                              \
    if (concord_cuda_error_ != cudaSuccess) {                                                    \
      return ::concord::compression::CudaStatus(concord_cuda_error_, #call, __FILE__, __LINE__); \
    }                                                                                            \
  } while (0)

// After a kernel launch: the launch's own error (bad configuration, no device).
#define CONCORD_CUDA_RETURN_IF_LAUNCH_FAILED(what)                                              \
  do {                                                                                          \
    const cudaError_t concord_cuda_error_ = cudaGetLastError();                                 \
    if (concord_cuda_error_ != cudaSuccess) {                                                   \
      return ::concord::compression::CudaStatus(concord_cuda_error_, what, __FILE__, __LINE__); \
    }                                                                                           \
  } while (0)
