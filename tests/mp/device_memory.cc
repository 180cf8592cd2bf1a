#include "device_memory.h"

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <utility>

#ifdef CONCORD_TEST_CUDA
#include <cuda_runtime_api.h>
#endif

namespace mp {

#ifdef CONCORD_TEST_CUDA

namespace {

void Check(cudaError_t e, const char* call, const char* file, int line) {
  if (e == cudaSuccess) return;
  std::fprintf(stderr, "FAIL %s:%d: %s: %s\n", file, line, call, cudaGetErrorString(e));
  std::exit(1);
}
#define MP_CUDA_CHECK(call) Check((call), #call, __FILE__, __LINE__)

}  // namespace

int DeviceOrExit() {
  int count = 0;
  const cudaError_t e = cudaGetDeviceCount(&count);
  if (e != cudaSuccess || count == 0) {
    std::fprintf(stderr, "--device cuda: no GPU: %s\n",
                 e != cudaSuccess ? cudaGetErrorString(e) : "no CUDA device");
    std::exit(2);
  }
  const char* local = std::getenv("CONCORD_LOCAL_RANK");
  const int device = (local != nullptr ? std::max(std::atoi(local), 0) : 0) % count;
  MP_CUDA_CHECK(cudaSetDevice(device));
  return device;
}

DeviceBuffer::DeviceBuffer(const std::vector<unsigned char>& host) : size_(host.size()) {
  if (size_ == 0) return;
  MP_CUDA_CHECK(cudaMalloc(&data_, size_));
  MP_CUDA_CHECK(cudaMemcpy(data_, host.data(), size_, cudaMemcpyHostToDevice));
  // From pageable memory cudaMemcpy may return before its copy reached the device; the plain C API
  // forms wait for no stream, so the bytes must be there before the buffer is submitted.
  MP_CUDA_CHECK(cudaStreamSynchronize(cudaStreamLegacy));
}

DeviceBuffer::~DeviceBuffer() {
  if (data_ != nullptr) MP_CUDA_CHECK(cudaFree(data_));
}

void DeviceBuffer::CopyTo(std::vector<unsigned char>* host) const {
  host->resize(size_);
  if (size_ > 0) MP_CUDA_CHECK(cudaMemcpy(host->data(), data_, size_, cudaMemcpyDeviceToHost));
}

#else  // no CUDA in this build

int DeviceOrExit() {
  std::fprintf(stderr, "--device cuda: this test was built without CUDA (CONCORD_CUDA=OFF)\n");
  std::exit(2);
}

DeviceBuffer::DeviceBuffer(const std::vector<unsigned char>& host) : size_(host.size()) {
  if (size_ == 0) return;
  std::fprintf(stderr, "FAIL: a device buffer in a build without CUDA\n");
  std::exit(1);
}

DeviceBuffer::~DeviceBuffer() = default;

void DeviceBuffer::CopyTo(std::vector<unsigned char>* host) const {
  host->resize(size_);
}

#endif

void* Place(std::vector<unsigned char>& host, int device, DeviceBuffer* copy) {
  if (device < 0) return host.empty() ? nullptr : host.data();
  *copy = DeviceBuffer(host);
  return copy->data();
}

DeviceBuffer::DeviceBuffer(DeviceBuffer&& other) noexcept
    : data_(std::exchange(other.data_, nullptr)), size_(std::exchange(other.size_, 0)) {}

DeviceBuffer& DeviceBuffer::operator=(DeviceBuffer&& other) noexcept {
  if (this != &other) {
    DeviceBuffer old(std::move(*this));
    data_ = std::exchange(other.data_, nullptr);
    size_ = std::exchange(other.size_, 0);
  }
  return *this;
}

}  // namespace mp
