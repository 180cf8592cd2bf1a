// Checks of one operation as the application submits it, before anything is queued, and the
// names Concord reserves for its own operations. Stateless; thread-safe.
#pragma once

#include <string>

#include "core/tensor_queue.h"

namespace concord {

// Tensor names starting with this are Concord's own (barriers, the finalize barrier).
inline constexpr const char* kReservedPrefix = "__concord";

// The barrier every rank runs in Engine::Shutdown(): once it ran, peers may close at will.
std::string FinalizeName();
// The name of the barrier with sequence number `seq`: ranks match barriers by their order.
std::string BarrierName(uint64_t seq);
// The barrier of a rank's `seq`th concord_join, and whether a name is one.
std::string JoinName(uint64_t seq);
bool IsJoinName(const std::string& name);

// Checks one request as the C API receives it: name, dtype, shape, op-specific fields and
// pointers. kInvalidArgument naming the tensor and what is wrong; nothing is changed.
Status ValidateEntry(const QueueEntry& entry, int world_size);

}  // namespace concord
