// Device memory for the conformance suite's CUDA mode (mp_conformance --device cuda): the GPU a
// rank's communicator uses, and buffers on it filled from and read back into host vectors. With
// CONCORD_CUDA off the suite is built without CUDA: DeviceForRank says so and no buffer may be
// made. A CUDA error ends the process (exit 1) with the call, file and line: the suite cannot go on
// without its buffers.
#ifndef CONCORD_TESTS_MP_DEVICE_MEMORY_H_
#define CONCORD_TESTS_MP_DEVICE_MEMORY_H_

#include <cstddef>
#include <string>
#include <vector>

namespace mp {

// The CUDA device the engine gives this rank (local_rank modulo the devices), made current for
// this thread; -1 and *why when there is none or this build has no CUDA.
int DeviceForRank(int local_rank, std::string* why);

// One allocation on the current device holding a copy of a host vector (none for an empty one:
// data() is NULL). Owns it; move-only; not thread-safe. Copies have reached their destination
// when they return.
class DeviceBuffer {
 public:
  DeviceBuffer() = default;
  explicit DeviceBuffer(const std::vector<unsigned char>& host);
  ~DeviceBuffer();
  DeviceBuffer(DeviceBuffer&& other) noexcept;
  DeviceBuffer& operator=(DeviceBuffer&& other) noexcept;
  DeviceBuffer(const DeviceBuffer&) = delete;
  DeviceBuffer& operator=(const DeviceBuffer&) = delete;

  void* data() const { return data_; }
  // Copies the device bytes back over *host (which keeps its size, the buffer's).
  void CopyTo(std::vector<unsigned char>* host) const;

 private:
  void* data_ = nullptr;
  size_t size_ = 0;
};

}  // namespace mp

#endif  // CONCORD_TESTS_MP_DEVICE_MEMORY_H_
