// Host-side planning of a batched pack (many user tensors into one fusion buffer) and of its
// unpack (the buffer back into the tensors). Plain C++: it never touches a device, so it builds and
// is tested without CUDA. One plan serves both directions: the CUDA kernels (cuda_packer.h) read
// its tables. Free functions; a PackPlan is a value (copyable, thread-compatible).
//
// Layout: tensor i gets the slot [entries[i].offset, entries[i].offset + entries[i].bytes) of the
// buffer; every slot starts at a multiple of `alignment` (padding between slots is never written),
// slots never overlap, and they appear in input order. Work is cut into chunks of at most
// `chunk_bytes` of one tensor; one thread block copies one chunk, so a launch covers any number of
// tensors (no fixed cap, unlike Horovod's 160).
#pragma once

#include <cstddef>
#include <cstdint>
#include <vector>

#include "base/dtype.h"
#include "base/status.h"

namespace concord {
namespace cuda {

// One tensor to pack: its device address (unpack writes there), element type and element count.
struct PackTensor {
  const void* data = nullptr;
  DType dtype = DType::kFloat32;
  size_t count = 0;
};

struct PackOptions {
  size_t alignment = 16;       // slot alignment: a power of two from 8 (the widest element) to 4096
  size_t chunk_bytes = 65536;  // most bytes one thread block copies: a multiple of 16
};

// One row per tensor of the table the kernel reads (copied verbatim to the device).
struct PackEntry {
  uint64_t user;          // device address of the user's tensor
  uint64_t offset;        // byte offset of the tensor's slot in the fusion buffer
  uint64_t bytes;         // element count x element size
  uint32_t dtype;         // a DType value
  uint32_t vector_bytes;  // width of the kernel's loads and stores: 16, 8, 4, 2 or 1
};
static_assert(sizeof(PackEntry) == 32, "PackEntry is shared with the kernel");

// One thread block's work: bytes [begin, end) of tensor `entry` (begin is a multiple of 16).
struct PackChunk {
  uint64_t begin;
  uint64_t end;
  uint32_t entry;
  uint32_t reserved;  // zero; keeps the row 8-byte aligned
};
static_assert(sizeof(PackChunk) == 24, "PackChunk is shared with the kernel");

struct PackPlan {
  size_t alignment = 0;
  size_t total_bytes = 0;          // buffer bytes the slots span, padding included
  size_t payload_bytes = 0;        // sum of the tensors' bytes
  std::vector<PackEntry> entries;  // one per tensor, in input order
  std::vector<PackChunk> chunks;   // one per thread block, tensor by tensor
};

// The widest of 16/8/4/2/1 bytes that divides both the user address and the slot alignment. Both
// ends of every load are then aligned; a byte count that is not a multiple of it leaves a tail the
// kernel copies one element at a time.
uint32_t VectorBytes(uint64_t user_address, size_t slot_alignment);

// Plans the slots and chunks. Refuses (InvalidArgument, naming the tensor) an unknown dtype, a null
// address with a non-zero count, an address not aligned to its element size, sizes that overflow,
// and options out of range.
StatusOr<PackPlan> PlanPack(const std::vector<PackTensor>& tensors,
                            const PackOptions& options = {});

// Checks one pack or unpack launch before anything reaches the device: the buffer is non-null (when
// the plan has bytes), aligned to the plan's alignment and at least total_bytes long; the scale is
// finite; integer tensors are only copied (scale exactly 1).
Status CheckLaunch(const PackPlan& plan, const void* buffer, size_t buffer_bytes, double scale);

}  // namespace cuda
}  // namespace concord
