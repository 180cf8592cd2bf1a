// Device memory for the multi-process suites' CUDA mode (mp_conformance and mp_p2p --device
// cuda): the GPU a rank's communicator uses, and buffers on it filled from and read back into host
// vectors. With
// CONCORD_CUDA off the suite is built without CUDA: DeviceOrExit says so and no buffer may be
// made. A CUDA error ends the process (exit 1) with the call, file and line: the suite cannot go on
// without its buffers.
#ifndef CONCORD_TESTS_MP_DEVICE_MEMORY_H_
#define CONCORD_TESTS_MP_DEVICE_MEMORY_H_

#include <cstddef>
#include <vector>

namespace mp {

// The CUDA device the engine gives this rank (CONCORD_LOCAL_RANK modulo the devices), made
// current for this thread: call it before concord_init, whose NCCL communicator starts on the
// current device. Exits 2 saying why when there is none or this build has no CUDA.
int DeviceOrExit();

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

// Where an operation on `device` (-1: the CPU) finds `host`'s bytes: host's own memory (NULL when
// empty), or a copy of them on the device, made into *copy.
void* Place(std::vector<unsigned char>& host, int device, DeviceBuffer* copy);

}  // namespace mp

#endif  // CONCORD_TESTS_MP_DEVICE_MEMORY_H_
