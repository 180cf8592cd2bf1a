#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include <algorithm>
#include <array>
#include <chrono>
#include <cstring>
#include <thread>
#include <utility>
#include <vector>

#include "backends/cuda/cuda_check.h"
#include "backends/cuda/cuda_packer.h"

namespace concord {
namespace cuda {
namespace {

constexpr int kThreads = 256;  // per block; one block copies one PackChunk
constexpr size_t kTableSlots = 4;
// How often a launch that waits for a table slot looks again, where the caller gives no wait.
constexpr std::chrono::microseconds kSlotPoll{20};

// How a launch treats elements: a plain byte copy (scale 1), or a scaled copy per floating type.
enum class Mode { kCopy, kHalf, kBFloat16, kFloat, kDouble };

template <Mode M>
struct Elem;
template <>
struct Elem<Mode::kCopy> {
  using T = unsigned char;
};
template <>
struct Elem<Mode::kHalf> {
  using T = __half;
  __device__ static T Scale(T x, float f, double) { return __float2half_rn(__half2float(x) * f); }
};
template <>
struct Elem<Mode::kBFloat16> {
  using T = __nv_bfloat16;
  __device__ static T Scale(T x, float f, double) {
    return __float2bfloat16_rn(__bfloat162float(x) * f);
  }
};
template <>
struct Elem<Mode::kFloat> {
  using T = float;
  __device__ static T Scale(T x, float f, double) { return x * f; }
};
template <>
struct Elem<Mode::kDouble> {
  using T = double;
  __device__ static T Scale(T x, float, double d) { return x * d; }
};

// The machine word of each vector width.
template <int W>
struct Word;
template <>
struct Word<16> {
  using Type = uint4;
};
template <>
struct Word<8> {
  using Type = uint2;
};
template <>
struct Word<4> {
  using Type = unsigned int;
};
template <>
struct Word<2> {
  using Type = unsigned short;
};
template <>
struct Word<1> {
  using Type = unsigned char;
};

// Copies bytes [begin, end) of one tensor from src to dst with W-byte words, then the tail that is
// not a whole word with one element at a time. Both pointers are W-aligned at begin.
template <Mode M, int W>
__device__ void CopyRange(char* dst, const char* src, uint64_t begin, uint64_t end, float f,
                          double d) {
  using V = typename Word<W>::Type;
  using T = typename Elem<M>::T;
  static_assert(W % sizeof(T) == 0, "a word holds whole elements");
  const uint64_t words_end = begin + (end - begin) / W * W;
#pragma unroll 4
  for (uint64_t i = begin + threadIdx.x * W; i < words_end; i += kThreads * W) {
    V v = *reinterpret_cast<const V*>(src + i);
    if constexpr (M != Mode::kCopy) {
      T e[W / sizeof(T)];
      memcpy(e, &v, W);
#pragma unroll
      for (int k = 0; k < static_cast<int>(W / sizeof(T)); ++k) e[k] = Elem<M>::Scale(e[k], f, d);
      memcpy(&v, e, W);
    }
    *reinterpret_cast<V*>(dst + i) = v;
  }
  for (uint64_t i = words_end + threadIdx.x * sizeof(T); i < end; i += kThreads * sizeof(T)) {
    T x = *reinterpret_cast<const T*>(src + i);
    if constexpr (M != Mode::kCopy) x = Elem<M>::Scale(x, f, d);
    *reinterpret_cast<T*>(dst + i) = x;
  }
}

// Picks the instantiation for the entry's width; widths narrower than an element never occur
// (PlanPack refuses addresses not aligned to their element size).
template <Mode M>
__device__ void CopyRangeAnyWidth(uint32_t width, char* dst, const char* src, uint64_t begin,
                                  uint64_t end, float f, double d) {
  constexpr size_t kElement = sizeof(typename Elem<M>::T);
  switch (width) {
    case 16:
      return CopyRange<M, 16>(dst, src, begin, end, f, d);
    case 8:
      return CopyRange<M, 8>(dst, src, begin, end, f, d);
    case 4:
      if constexpr (kElement <= 4) return CopyRange<M, 4>(dst, src, begin, end, f, d);
      break;
    case 2:
      if constexpr (kElement <= 2) return CopyRange<M, 2>(dst, src, begin, end, f, d);
      break;
    case 1:
      if constexpr (kElement <= 1) return CopyRange<M, 1>(dst, src, begin, end, f, d);
      break;
  }
  __trap();  // a table the planner cannot produce
}

// One block per chunk: pack copies tensor -> slot, unpack slot -> tensor.
__global__ void __launch_bounds__(kThreads)
    PackKernel(const PackEntry* entries, const PackChunk* chunks, char* buffer, double scale,
               bool unpack) {
  const PackChunk chunk = chunks[blockIdx.x];
  const PackEntry entry = entries[chunk.entry];
  char* user = reinterpret_cast<char*>(entry.user);
  char* slot = buffer + entry.offset;
  char* dst = unpack ? user : slot;
  const char* src = unpack ? slot : user;
  const float f = static_cast<float>(scale);
  const uint32_t w = entry.vector_bytes;
  if (scale == 1.0) {
    return CopyRangeAnyWidth<Mode::kCopy>(w, dst, src, chunk.begin, chunk.end, f, scale);
  }
  switch (static_cast<DType>(entry.dtype)) {
    case DType::kFloat16:
      return CopyRangeAnyWidth<Mode::kHalf>(w, dst, src, chunk.begin, chunk.end, f, scale);
    case DType::kBFloat16:
      return CopyRangeAnyWidth<Mode::kBFloat16>(w, dst, src, chunk.begin, chunk.end, f, scale);
    case DType::kFloat32:
      return CopyRangeAnyWidth<Mode::kFloat>(w, dst, src, chunk.begin, chunk.end, f, scale);
    case DType::kFloat64:
      return CopyRangeAnyWidth<Mode::kDouble>(w, dst, src, chunk.begin, chunk.end, f, scale);
    default:
      __trap();  // integers with a scale other than 1: CheckLaunch refuses them
  }
}

size_t RoundUp(size_t v, size_t to) {
  return (v + to - 1) / to * to;
}

}  // namespace

// A slot holds one launch's tables (entries, then chunks) on the device and in pinned staging
// memory; `done` is recorded after the launch that read them.
struct TableSlot {
  void* device = nullptr;
  void* host = nullptr;
  size_t capacity = 0;
  cudaEvent_t done = nullptr;
  bool in_use = false;
};

// Device and pinned memory that a slot outgrew. Freed with the packer only: cudaFree and
// cudaFreeHost wait for the whole device, and a collective queued on it may wait for a peer that
// never comes (the caller's lock held meanwhile would keep that collective from being aborted).
struct Outgrown {
  void* device = nullptr;
  void* host = nullptr;
};

struct CudaPacker::Impl {
  int device = 0;
  std::array<TableSlot, kTableSlots> slots;
  std::vector<Outgrown> outgrown;
  size_t next = 0;

  ~Impl() {
    DeviceGuard guard;
    if (guard.Set(device) != cudaSuccess) return;
    for (TableSlot& s : slots) {
      if (s.in_use) cudaEventSynchronize(s.done);
      if (s.done != nullptr) cudaEventDestroy(s.done);
      cudaFree(s.device);
      cudaFreeHost(s.host);
    }
    for (Outgrown& o : outgrown) {
      cudaFree(o.device);
      cudaFreeHost(o.host);
    }
  }

  // Makes `slot` free and at least `bytes` large. While its launch has not finished, polls it,
  // calling `wait` between polls (or sleeping kSlotPoll where there is none); an error from
  // `wait` ends the wait and is returned, the slot untouched.
  Status Prepare(TableSlot& slot, size_t bytes, const SlotWait& wait) {
    while (slot.in_use) {
      const cudaError_t query = cudaEventQuery(slot.done);
      if (query == cudaSuccess) break;
      if (query != cudaErrorNotReady) return CudaError(query, "cudaEventQuery", __FILE__, __LINE__);
      if (wait) {
        CONCORD_RETURN_IF_ERROR(wait());
      } else {
        std::this_thread::sleep_for(kSlotPoll);
      }
    }
    slot.in_use = false;
    if (slot.capacity >= bytes) return Status::Ok();
    const size_t capacity = std::max(bytes, 2 * slot.capacity + 4096);
    void* grown_device = nullptr;
    void* grown_host = nullptr;
    CONCORD_CUDA_CHECK(cudaMalloc(&grown_device, capacity));
    if (const cudaError_t e = cudaMallocHost(&grown_host, capacity); e != cudaSuccess) {
      cudaFree(grown_device);  // nothing has used it: no queued work to wait for
      return CudaError(e, "cudaMallocHost", __FILE__, __LINE__);
    }
    if (slot.device != nullptr) outgrown.push_back(Outgrown{slot.device, slot.host});
    slot.device = grown_device;
    slot.host = grown_host;
    slot.capacity = capacity;
    return Status::Ok();
  }
};

CudaPacker::CudaPacker(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}
CudaPacker::~CudaPacker() = default;

StatusOr<std::unique_ptr<CudaPacker>> CudaPacker::Create(int device) {
  auto impl = std::make_unique<Impl>();
  impl->device = device;
  DeviceGuard guard;
  CONCORD_CUDA_CHECK(guard.Set(device));
  for (TableSlot& s : impl->slots) {
    CONCORD_CUDA_CHECK(cudaEventCreateWithFlags(&s.done, cudaEventDisableTiming));
  }
  return std::unique_ptr<CudaPacker>(new CudaPacker(std::move(impl)));
}

Status CudaPacker::Pack(const PackPlan& plan, void* buffer, size_t buffer_bytes, double prescale,
                        void* stream, const SlotWait& wait) {
  return Launch(plan, buffer, buffer_bytes, prescale, /*unpack=*/false, stream, wait)
      .WithContext("CudaPacker::Pack");
}

Status CudaPacker::Unpack(const PackPlan& plan, const void* buffer, size_t buffer_bytes,
                          double postscale, void* stream, const SlotWait& wait) {
  return Launch(plan, buffer, buffer_bytes, postscale, /*unpack=*/true, stream, wait)
      .WithContext("CudaPacker::Unpack");
}

Status CudaPacker::Launch(const PackPlan& plan, const void* buffer, size_t buffer_bytes,
                          double scale, bool unpack, void* stream, const SlotWait& wait) {
  CONCORD_RETURN_IF_ERROR(CheckLaunch(plan, buffer, buffer_bytes, scale));
  if (plan.chunks.empty()) return Status::Ok();  // only empty tensors: nothing to copy
  DeviceGuard guard;
  CONCORD_CUDA_CHECK(guard.Set(impl_->device));
  TableSlot& slot = impl_->slots[impl_->next % kTableSlots];
  const size_t entry_bytes = RoundUp(plan.entries.size() * sizeof(PackEntry), 16);
  const size_t chunk_bytes = plan.chunks.size() * sizeof(PackChunk);
  CONCORD_RETURN_IF_ERROR(impl_->Prepare(slot, entry_bytes + chunk_bytes, wait));
  ++impl_->next;  // only once the slot is this launch's: a wait that failed takes the same again
  char* host = static_cast<char*>(slot.host);
  std::memcpy(host, plan.entries.data(), plan.entries.size() * sizeof(PackEntry));
  std::memcpy(host + entry_bytes, plan.chunks.data(), chunk_bytes);
  const auto s = static_cast<cudaStream_t>(stream);
  CONCORD_CUDA_CHECK(
      cudaMemcpyAsync(slot.device, host, entry_bytes + chunk_bytes, cudaMemcpyHostToDevice, s));
  const char* device = static_cast<const char*>(slot.device);
  PackKernel<<<static_cast<unsigned>(plan.chunks.size()), kThreads, 0, s>>>(
      reinterpret_cast<const PackEntry*>(device),
      reinterpret_cast<const PackChunk*>(device + entry_bytes),
      static_cast<char*>(const_cast<void*>(buffer)), scale, unpack);
  const cudaError_t launched = cudaGetLastError();
  // Recorded even when the launch failed: the table copy may still be reading the staging memory.
  CONCORD_CUDA_CHECK(cudaEventRecord(slot.done, s));
  slot.in_use = true;
  if (launched != cudaSuccess) return CudaError(launched, "PackKernel<<<>>>", __FILE__, __LINE__);
  return Status::Ok();
}

}  // namespace cuda
}  // namespace concord
