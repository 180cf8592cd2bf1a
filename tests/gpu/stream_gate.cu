#include <cuda_runtime.h>

#include <utility>

#include "backends/cuda/cuda_check.h"
#include "tests/gpu/stream_gate.h"

namespace concord {
namespace cuda {

StatusOr<std::unique_ptr<StreamGate>> StreamGate::Close(int device, void* stream) {
  CONCORD_CUDA_CHECK(cudaSetDevice(device));
  std::unique_ptr<StreamGate> gate(new StreamGate(device, stream));
  CONCORD_CUDA_CHECK(
      cudaLaunchHostFunc(static_cast<cudaStream_t>(stream), &StreamGate::Hold, gate.get()));
  return StatusOr<std::unique_ptr<StreamGate>>(std::move(gate));
}

StreamGate::~StreamGate() {
  Open();
  if (cudaSetDevice(device_) == cudaSuccess) {
    cudaStreamSynchronize(static_cast<cudaStream_t>(stream_));  // Hold() has returned
  }
}

void StreamGate::Open() {
  {
    std::lock_guard<std::mutex> lock(mu_);
    open_ = true;
  }
  cv_.notify_all();
}

void StreamGate::Hold(void* gate) {
  auto* self = static_cast<StreamGate*>(gate);
  std::unique_lock<std::mutex> lock(self->mu_);
  self->cv_.wait(lock, [self] { return self->open_; });
}

}  // namespace cuda
}  // namespace concord
