// What ranks negotiate about: the description of one named operation (TensorRequest), and the
// coordinator's verdict on it (Response). Plain value types; the wire format is in message.h.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "base/dtype.h"
#include "base/status.h"
#include "concord/concord.h"

namespace concord {

enum class OpType : uint8_t {
  kAllreduce = 0,
  kAllgather = 1,
  kBroadcast = 2,
  kBarrier = 3,
  kReducescatter = 4,
  kAlltoall = 5,
  kReduce = 6,  // an allreduce whose result only `root` keeps
  kGather = 7   // an allgather whose result only `root` keeps
};
constexpr int kNumOpTypes = 8;
const char* OpTypeName(OpType op);
// Allreduce and reduce: every rank's whole tensor is reduced elementwise (same op, scales,
// joined-rank identity, fusion and inline rules; a reduce's non-roots discard the result).
inline bool ReducesWhole(OpType op) {
  return op == OpType::kAllreduce || op == OpType::kReduce;
}
// Allgather and gather: every rank's first-dimension block, concatenated in rank order (each
// rank's first dimension its own, carried in Response::first_dims).
inline bool GathersRows(OpType op) {
  return op == OpType::kAllgather || op == OpType::kGather;
}
// The operations with a root: broadcast, reduce, gather (TensorRequest::root is negotiated).
inline bool HasRoot(OpType op) {
  return op == OpType::kBroadcast || op == OpType::kReduce || op == OpType::kGather;
}
constexpr int32_t kDeviceTensor = 0;  // TensorRequest::device of a negotiated CUDA tensor
// The most dimensions a tensor has: the C API's limit, checked at enqueue and on the wire.
constexpr size_t kMaxDims = CONCORD_MAX_DIMS;
// Sanity bound on sizes from callers and from the wire: no tensor has more elements and no result
// (an allgather's) more bytes. Beyond any memory, and small enough that such a size times a dtype
// size, or a sum of a few, never overflows 64 bits.
constexpr int64_t kMaxTensorSize = int64_t{1} << 50;
// The longest tensor name, in bytes, checked at enqueue: a name travels in the control plane's
// messages (whose strings are at most 1 MiB, core/message.cc) and is quoted in errors and stall
// warnings, more than once in some.
constexpr size_t kMaxNameBytes = 64 << 10;

// One rank's request for one tensor name. Every field but `name` is checked across ranks.
struct TensorRequest {
  std::string name;
  OpType op = OpType::kAllreduce;
  DType dtype = DType::kFloat32;
  std::vector<int64_t> shape;  // for (all)gather and alltoall, shape[0] may differ between ranks
  ReduceOp reduce_op = ReduceOp::kSum;
  int32_t root = 0;  // broadcast, reduce, gather
  double prescale = 1.0;
  double postscale = 1.0;
  // -1: CPU. A CUDA tensor is negotiated as kDeviceTensor: each rank's tensors are on its own GPU
  // (the device backend's device(), which differs between ranks), so only the kind is compared.
  int32_t device = -1;
  std::string compression;  // allreduce: a compressor's canonical spec ("" = none)
  std::string group;        // non-empty: member of a group submitted atomically
  int32_t group_size = 0;   // members in the group (0 when not grouped)
  // Counts along the first dimension, one per rank, summing to shape[0] (empty for other ops).
  // Reducescatter: the rows each rank receives, the same on every rank. Alltoall: the rows this
  // rank sends to each rank, its own (they differ between ranks). Filled at enqueue (the even
  // split when the caller gave none: NormalizeSplits).
  std::vector<int64_t> splits;

  int64_t NumElements() const;
  size_t NumBytes() const { return static_cast<size_t>(NumElements()) * DTypeSize(dtype); }
  bool operator==(const TensorRequest& o) const;
  bool operator!=(const TensorRequest& o) const { return !(*this == o); }
};

// The coordinator's answer for one name, identical on every rank. `request` is rank 0's request;
// for allgather, gather and alltoall, first_dims[r] is rank r's first dimension; for alltoall,
// splits[r * size + d] is what rank r sends to rank d (rank r's request.splits, so what rank d
// receives from every rank is column d). A non-OK `error` means the operation must not run: every
// rank that submitted the name completes it with that error.
struct Response {
  TensorRequest request;
  std::vector<int64_t> first_dims;
  std::vector<int64_t> splits;
  Code error = Code::kOk;
  std::string error_message;
  // The ranks whose requests an error completes; empty means every rank. A stall timeout names
  // the ranks that submitted, so a late rank's fresh request is left to negotiate again.
  std::vector<int32_t> error_ranks;
  // Ranks that had joined (concord_join) and take part without a tensor of their own: they
  // contribute the reduction's identity (no rows to an allgather), and an average divides by the
  // others. For a join itself: every rank, in the order they joined (the last one last).
  std::vector<int32_t> joined;

  bool AppliesTo(int rank) const;
  bool Joined(int rank) const;
  // The ranks whose tensors an allreduce combines (what an average divides by).
  int Contributors(int size) const { return size - static_cast<int>(joined.size()); }

  // The request that `rank` must have made for this response (its own first dimension).
  TensorRequest RequestOf(int rank) const;
  // Whether `request` is that request; compares in place, without building a copy.
  bool IsRequestOf(const TensorRequest& request, int rank) const;
};

}  // namespace concord
