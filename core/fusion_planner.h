// The fusion planner: turns the ordered response list into batches. Small allreduces that can
// share a buffer (same dtype, reduce op, scale factors, compression and device) travel together,
// up to the fusion threshold in bytes, and so do small reducescatters (any splits), apart from the
// allreduces; compressed ones fuse whatever their size (they are encoded into the buffer anyway);
// large ones and every other operation run alone. Deterministic (a pure function of its input),
// so every rank forms the same batches. Stateless and thread-safe.
#pragma once

#include <cstddef>
#include <vector>

#include "core/request.h"

namespace concord {

struct FusionBatch {
  std::vector<size_t> members;  // indices into the response list, in execution order
  size_t bytes = 0;             // payload bytes of all members
  // true: members are packed into the running lane's fusion buffer (even a lone small tensor: the
  // backend then reuses its algorithm objects over that buffer); false: runs alone in place.
  bool fused = false;
};

struct FusionOptions {
  size_t threshold = size_t{64} << 20;  // 0 disables fusion
  // An allreduce or reducescatter at least this large runs alone, on the caller's memory:
  // copying it into and out of the fusion buffer would cost more than the message it saves.
  size_t direct_bytes = size_t{256} << 10;
};

// The bytes a fused batch of `payload` bytes sends: below 1 MiB rounded up to a power of two
// (at least one element), so that batches whose make-up varies from step to step still reuse the
// same few backend algorithm objects instead of building one per distinct size; from 1 MiB on,
// unchanged. A multiple of elem_size. The engine zeroes the padding.
size_t FusedMessageBytes(size_t payload, size_t elem_size);

// Batches in execution order. A batch starts at the first unassigned response and gathers later
// compatible small allreduces or reducescatters (looking ahead past incompatible ones) while they
// fit.
std::vector<FusionBatch> PlanFusion(const std::vector<const Response*>& responses,
                                    const FusionOptions& options);

}  // namespace concord
