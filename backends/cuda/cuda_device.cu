#include <cstdio>
#include <utility>

#include "backends/cuda/cuda_check.h"
#include "backends/cuda/cuda_device.h"

#ifdef CONCORD_HAVE_NCCL
#include <nccl.h>
#endif

namespace concord {
namespace cuda {

StatusOr<int> DeviceCount() {
  int count = 0;
  CONCORD_CUDA_CHECK(cudaGetDeviceCount(&count));
  if (count == 0) return Status(Code::kUnavailable, "cudaGetDeviceCount: no CUDA device");
  return count;
}

StatusOr<std::string> DeviceDescription(int device) {
  cudaDeviceProp prop;
  CONCORD_CUDA_CHECK(cudaGetDeviceProperties(&prop, device));
  char text[384];
  std::snprintf(text, sizeof(text), "%s, sm_%d%d, %d SMs, %.1f GiB", prop.name, prop.major,
                prop.minor, prop.multiProcessorCount,
                static_cast<double>(prop.totalGlobalMem) / (1024.0 * 1024.0 * 1024.0));
  return std::string(text);
}

std::string NcclVersion() {
#ifdef CONCORD_HAVE_NCCL
  int version = 0;
  const ncclResult_t result = ncclGetVersion(&version);
  if (result != ncclSuccess) {
    return std::string("unknown (ncclGetVersion: ") + ncclGetErrorString(result) + ")";
  }
  // NCCL >= 2.9 encodes major * 10000 + minor * 100 + patch.
  return std::to_string(version / 10000) + "." + std::to_string(version / 100 % 100) + "." +
         std::to_string(version % 100);
#else
  return "not built (nccl.h or libnccl was not found at configure time)";
#endif
}

StatusOr<DeviceBuffer> DeviceBuffer::Allocate(int device, size_t bytes) {
  DeviceGuard guard;
  CONCORD_CUDA_CHECK(guard.Set(device));
  DeviceBuffer buffer;
  buffer.device_ = device;
  if (bytes > 0) CONCORD_CUDA_CHECK(cudaMalloc(&buffer.data_, bytes));
  buffer.size_ = bytes;
  return StatusOr<DeviceBuffer>(std::move(buffer));
}

DeviceBuffer::DeviceBuffer(DeviceBuffer&& other) noexcept
    : device_(other.device_),
      data_(std::exchange(other.data_, nullptr)),
      size_(std::exchange(other.size_, 0)) {}

DeviceBuffer& DeviceBuffer::operator=(DeviceBuffer&& other) noexcept {
  if (this != &other) {
    Release();
    device_ = other.device_;
    data_ = std::exchange(other.data_, nullptr);
    size_ = std::exchange(other.size_, 0);
  }
  return *this;
}

DeviceBuffer::~DeviceBuffer() {
  Release();
}

void DeviceBuffer::Release() {
  if (data_ == nullptr) return;
  DeviceGuard guard;
  if (guard.Set(device_) == cudaSuccess) cudaFree(data_);
  data_ = nullptr;
  size_ = 0;
}

Status DeviceBuffer::CopyFromHost(size_t offset, const void* src, size_t bytes) {
  if (offset > size_ || bytes > size_ - offset) {
    return InvalidArgument("DeviceBuffer::CopyFromHost: range past the end of the buffer");
  }
  if (bytes == 0) return Status::Ok();
  CONCORD_CUDA_CHECK(
      cudaMemcpy(static_cast<char*>(data_) + offset, src, bytes, cudaMemcpyHostToDevice));
  return Status::Ok();
}

Status DeviceBuffer::CopyToHost(void* dst, size_t offset, size_t bytes) const {
  if (offset > size_ || bytes > size_ - offset) {
    return InvalidArgument("DeviceBuffer::CopyToHost: range past the end of the buffer");
  }
  if (bytes == 0) return Status::Ok();
  CONCORD_CUDA_CHECK(
      cudaMemcpy(dst, static_cast<const char*>(data_) + offset, bytes, cudaMemcpyDeviceToHost));
  return Status::Ok();
}

Status DeviceBuffer::Fill(uint8_t byte) {
  if (size_ == 0) return Status::Ok();
  DeviceGuard guard;
  CONCORD_CUDA_CHECK(guard.Set(device_));
  CONCORD_CUDA_CHECK(cudaMemset(data_, byte, size_));
  CONCORD_CUDA_CHECK(cudaDeviceSynchronize());
  return Status::Ok();
}

Status CopyDeviceToDevice(void* dst, const void* src, size_t bytes, void* stream) {
  if (bytes == 0) return Status::Ok();
  CONCORD_CUDA_CHECK(cudaMemcpyAsync(dst, src, bytes, cudaMemcpyDeviceToDevice,
                                     static_cast<cudaStream_t>(stream)));
  return Status::Ok();
}

Status SynchronizeStream(void* stream) {
  CONCORD_CUDA_CHECK(cudaStreamSynchronize(static_cast<cudaStream_t>(stream)));
  return Status::Ok();
}

}  // namespace cuda
}  // namespace concord
