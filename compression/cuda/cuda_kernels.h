// GPU forms of the compressors' kernels, for tensors in device memory (library
// concord_compression_cuda, built only when CMake finds a CUDA compiler). Plain C++ header: no CUDA
// types, the stream is a cudaStream_t passed as void* (nullptr: the default stream).
//
// Each call enqueues kernels on `stream` and returns without waiting for them. A failed launch or
// call comes back as a Status naming the CUDA call, its file and line: Unavailable when there is no
// device or driver, BackendError otherwise. A null buffer (with elements to touch) or one not
// aligned to its element size is InvalidArgument before anything is launched (in a kernel it would
// fault and leave the CUDA context unusable). Results are the CPU kernels' bits: the same scalar
// conversions (base/half_convert.h), nan inputs kept as x86 keeps them through the scale and the
// accumulation, the same top-k set in the same order (topk.h, exact method; every nan one key);
// only the nan payloads top-k's accumulation leaves in acc may differ (the GPU's are canonical).
// Thread-safety: as CUDA's; calls on different streams may run concurrently, but one top-k
// workspace serves one call at a time.
#pragma once

#include <cstddef>
#include <cstdint>

#include "base/status.h"
#include "compression/cast_kernels.h"

namespace concord {
namespace compression {

// As EncodeFloats / DecodeToFloats / AccumulateFloats (cast_kernels.h). 16-bit buffers must be
// 2-byte aligned, unlike the CPU's (encoded buffers are 8-byte aligned by the compressor
// contract); float buffers 4-byte aligned.
Status CudaEncodeFloats(HalfFormat format, const float* in, size_t n, float scale, void* out,
                        void* stream);
Status CudaDecodeToFloats(HalfFormat format, const void* in, size_t n, float* out, void* stream);
Status CudaAccumulateFloats(HalfFormat format, const void* in, size_t n, float* dense,
                            void* stream);

// Device memory CudaSelectTopk needs for up to n elements; allocate once, reuse across calls.
StatusOr<size_t> CudaTopkWorkspaceBytes(size_t n);

// As SelectTopk (topk.h) with the exact method: when grad is non-null, acc[i] += scale * grad[i];
// then selected[0..k) = the indices of acc's k largest magnitudes, increasing (ties to the lower
// index, nan above inf). A radix select on the magnitude's bits (three histogram passes fix the
// k-th magnitude), then one stable compaction of the elements above it and of the first ties.
// All pointers are device memory (workspace 8-byte aligned, as cudaMalloc's); k <= n < 2^32.
Status CudaSelectTopk(const float* grad, float scale, float* acc, size_t n, size_t k,
                      uint32_t* selected, void* workspace, size_t workspace_bytes, void* stream);

}  // namespace compression
}  // namespace concord
