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
// Whether a name is one of the engine's internal exchanges (Engine::ExchangeInternal: the
// allgathers of concord_comm_split), which need every rank's own part.
bool IsInternalExchangeName(const std::string& name, OpType op);

// Checks one request as the C API receives it: name, dtype, shape, op-specific fields and
// pointers (a reducescatter's output must hold `rank`'s share). kInvalidArgument naming the
// tensor and what is wrong; nothing is changed.
Status ValidateEntry(const QueueEntry& entry, int world_size, int rank = 0);

// A reducescatter's or alltoall's splits when the caller gave none: the even split of the first
// dimension. Reducescatter: rank k gets n / size rows, the first n % size ranks one more
// (Horovod's rule); alltoall: n / size rows to each rank, kInvalidArgument unless size divides n.
// Leaves given splits, and other operations, alone (ValidateEntry checks them).
Status NormalizeSplits(TensorRequest* request, int world_size);

// A reducescatter's or alltoall's splits (filled): one per rank, none negative, summing to the
// first dimension of a tensor of at least one. kInvalidArgument naming the tensor otherwise.
Status ValidateSplits(const TensorRequest& request, int world_size);

// Bytes of one row (the first dimension's unit) of the request's tensor.
size_t RowBytes(const TensorRequest& request);

}  // namespace concord
