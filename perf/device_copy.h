// Blocking copies between host memory and CUDA device memory, in plain C++, for the checked runs
// of concord-perf --backend nccl (perf/bench_common.h's known data in, the result out). Each sets
// `device` for the call (restoring the caller's as cuda::DeviceGuard does) and returns once every
// piece of work on the device has finished and the bytes are where they were copied to, so that
// work on any stream after it reads the new bytes, and the bytes read back are those the device
// work before it wrote. CUDA errors come back as a Status with the call, CUDA's message and the
// file:line. Thread-safe.
#pragma once

#include <cstddef>

#include "base/status.h"

namespace concord {

Status CopyHostToDevice(int device, void* dst, const void* src, size_t bytes);
Status CopyDeviceToHost(int device, void* dst, const void* src, size_t bytes);

}  // namespace concord
