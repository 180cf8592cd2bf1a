// The device side of Concord in plain C++ (no CUDA header leaks out): whether a usable GPU exists
// and why not, NCCL's version, device memory, and the device-to-device copy the benchmarks compare
// with. Streams are passed as `void*` (a cudaStream_t; nullptr is the legacy default stream). Free
// functions are thread-safe; each call sets the device it needs and restores the caller's.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>

#include "base/status.h"

namespace concord {
namespace cuda {

// The number of usable CUDA devices; Unavailable, with cudaGetDeviceCount's error string and code,
// when there is none (no GPU, no driver: error 35 on a machine without one).
StatusOr<int> DeviceCount();

// "NVIDIA H200, sm_90, 132 SMs, 139.8 GiB" for the benchmark's report.
StatusOr<std::string> DeviceDescription(int device);

// NCCL's version as "2.28.9" from ncclGetVersion (the library linked, not the header), or a phrase
// saying why it is unknown. Needs no GPU.
std::string NcclVersion();

// One cudaMalloc'd allocation on one device. Owns it (cudaFree at destruction); move-only; not
// thread-safe. The copies block until done.
class DeviceBuffer {
 public:
  static StatusOr<DeviceBuffer> Allocate(int device, size_t bytes);

  DeviceBuffer() = default;
  DeviceBuffer(DeviceBuffer&& other) noexcept;
  DeviceBuffer& operator=(DeviceBuffer&& other) noexcept;
  DeviceBuffer(const DeviceBuffer&) = delete;
  DeviceBuffer& operator=(const DeviceBuffer&) = delete;
  ~DeviceBuffer();

  void* data() const { return data_; }
  size_t size() const { return size_; }
  int device() const { return device_; }

  Status CopyFromHost(size_t offset, const void* src, size_t bytes);
  Status CopyToHost(void* dst, size_t offset, size_t bytes) const;
  Status Fill(uint8_t byte);

 private:
  void Release();

  int device_ = 0;
  void* data_ = nullptr;
  size_t size_ = 0;
};

// cudaMemcpyAsync device to device on `stream` (returns once enqueued).
Status CopyDeviceToDevice(void* dst, const void* src, size_t bytes, void* stream);

// Blocks until everything enqueued on `stream` has finished; reports any asynchronous error.
Status SynchronizeStream(void* stream);

}  // namespace cuda
}  // namespace concord
