// Runs a PackPlan (pack_plan.h) on a GPU: Pack copies every tensor of the plan into its slot of a
// fusion buffer in ONE kernel launch, multiplying by the prescale in the same pass; Unpack copies
// the slots back into the tensors, multiplying by the postscale. float16 and bfloat16 scale in
// float, float32 and float64 in their own precision (as base/dtype.h's CopyScaled does on the CPU);
// integer tensors are only copied (any other scale is refused). A scale of exactly 1 is a pure
// copy. Loads are 16 bytes wide where the addresses allow (PackEntry::vector_bytes), narrower
// otherwise.
//
// Ownership: the packer owns a small ring of table slots (device memory, pinned host staging and an
// event each); the plan's tables are copied into one with a single async copy on the caller's
// stream, so the plan may be destroyed when Pack/Unpack return, but the buffer and the tensors must
// stay valid until the stream has run the launch. Blocking: Pack and Unpack only enqueue; they wait
// on the host only when the slot they take (the ring's next) still holds an unfinished launch,
// polling it and calling the caller's SlotWait between polls: so a caller that holds a lock (the
// NCCL backend's, which its completion thread needs to abort a collective stuck on a dead peer)
// releases it there, and ends the wait (aborted, past its deadline) by returning an error. A slot
// that must grow keeps its old memory until the packer goes (freeing it would wait for the whole
// device). Not thread-safe: one packer per engine thread. Streams are `void*` (a cudaStream_t;
// nullptr is the legacy default stream) and must belong to the packer's device.
#pragma once

#include <cstddef>
#include <functional>
#include <memory>

#include "backends/cuda/pack_plan.h"
#include "base/status.h"

namespace concord {
namespace cuda {

// Called between polls while a launch waits for its table slot; an error ends the wait, and
// Pack/Unpack return it with nothing enqueued. None: the wait sleeps between polls until the slot
// is free.
using SlotWait = std::function<Status()>;

class CudaPacker {
 public:
  // Fails (Unavailable, with the CUDA error) when `device` cannot be used.
  static StatusOr<std::unique_ptr<CudaPacker>> Create(int device);
  ~CudaPacker();
  CudaPacker(const CudaPacker&) = delete;
  CudaPacker& operator=(const CudaPacker&) = delete;

  // buffer[slot i] = tensor i * prescale, for every tensor of the plan.
  Status Pack(const PackPlan& plan, void* buffer, size_t buffer_bytes, double prescale,
              void* stream, const SlotWait& wait = {});
  // tensor i = buffer[slot i] * postscale, for every tensor of the plan.
  Status Unpack(const PackPlan& plan, const void* buffer, size_t buffer_bytes, double postscale,
                void* stream, const SlotWait& wait = {});

 private:
  struct Impl;
  explicit CudaPacker(std::unique_ptr<Impl> impl);
  Status Launch(const PackPlan& plan, const void* buffer, size_t buffer_bytes, double scale,
                bool unpack, void* stream, const SlotWait& wait);

  std::unique_ptr<Impl> impl_;
};

}  // namespace cuda
}  // namespace concord
