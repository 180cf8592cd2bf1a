#include "core/entry_validation.h"

#include <algorithm>
#include <cmath>
#include <cstring>

namespace concord {
namespace {

// A reducescatter's or alltoall's splits, and a reducescatter's output: it must hold this
// rank's share.
Status CheckSplits(const QueueEntry& e, int world_size, int rank) {
  const TensorRequest& r = e.request;
  CONCORD_RETURN_IF_ERROR(ValidateSplits(r, world_size));
  if (r.op == OpType::kReducescatter) {
    const int64_t rows = rank >= 0 && rank < world_size ? r.splits[rank] : 0;
    const size_t needed = static_cast<size_t>(rows) * RowBytes(r);
    if (needed > 0 && e.output == nullptr) {
      return InvalidArgument("tensor '" + r.name + "': output data is NULL");
    }
    if (needed > e.output_capacity) {
      return InvalidArgument("tensor '" + r.name + "': reducescatter output holds " +
                             std::to_string(e.output_capacity) + " bytes, this rank's " +
                             std::to_string(rows) + " rows need " + std::to_string(needed));
    }
  }
  return Status::Ok();
}

// A broadcast's, reduce's or gather's root: one of the ranks.
Status CheckRoot(const TensorRequest& r, int world_size) {
  if (r.root >= 0 && r.root < world_size) return Status::Ok();
  return InvalidArgument("tensor '" + r.name + "': root " + std::to_string(r.root) +
                         " is outside [0, " + std::to_string(world_size) + ")");
}

// The checks that depend on the operation.
Status ValidateOp(const QueueEntry& e, int64_t elements, int world_size, int rank) {
  const TensorRequest& r = e.request;
  // The message is built only on failure: this runs on every enqueue.
  auto fail = [&r](const std::string& what) {
    return InvalidArgument("tensor '" + r.name + "': " + what);
  };
  switch (r.op) {
    case OpType::kAllreduce:
      if (elements > 0 && e.output == nullptr) return fail("output data is NULL");
      if (!std::isfinite(r.prescale) || !std::isfinite(r.postscale)) {
        return fail("scale factors must be finite");
      }
      if (!IsFloatingPoint(r.dtype) && (r.prescale != 1.0 || r.postscale != 1.0)) {
        return fail("prescale and postscale apply to floating-point dtypes only");
      }
      return Status::Ok();
    case OpType::kReduce:
      CONCORD_RETURN_IF_ERROR(CheckRoot(r, world_size));
      // Only the root writes an output; the others' is ignored (NULL).
      if (rank == r.root && elements > 0 && e.output == nullptr) {
        return fail("output data is NULL on the root");
      }
      if (!std::isfinite(r.prescale) || !std::isfinite(r.postscale)) {
        return fail("scale factors must be finite");
      }
      if (!IsFloatingPoint(r.dtype) && (r.prescale != 1.0 || r.postscale != 1.0)) {
        return fail("prescale and postscale apply to floating-point dtypes only");
      }
      return Status::Ok();
    case OpType::kAllgather:
      if (r.shape.empty()) return fail("allgather needs at least one dimension");
      return Status::Ok();
    case OpType::kGather:
      if (r.shape.empty()) return fail("gather needs at least one dimension");
      return CheckRoot(r, world_size);
    case OpType::kBroadcast:
      CONCORD_RETURN_IF_ERROR(CheckRoot(r, world_size));
      if (elements > 0 && e.output == nullptr) return fail("output data is NULL");
      return Status::Ok();
    case OpType::kBarrier:
      return Status::Ok();
    case OpType::kReducescatter:
      CONCORD_RETURN_IF_ERROR(CheckSplits(e, world_size, rank));
      if (!std::isfinite(r.prescale) || !std::isfinite(r.postscale)) {
        return fail("scale factors must be finite");
      }
      if (!IsFloatingPoint(r.dtype) && (r.prescale != 1.0 || r.postscale != 1.0)) {
        return fail("prescale and postscale apply to floating-point dtypes only");
      }
      return Status::Ok();
    case OpType::kAlltoall:
      return CheckSplits(e, world_size, rank);
  }
  return fail("unknown operation");
}

}  // namespace

Status ValidateSplits(const TensorRequest& r, int world_size) {
  auto fail = [&r](const std::string& what) {
    return InvalidArgument("tensor '" + r.name + "': " + OpTypeName(r.op) + " " + what);
  };
  if (r.shape.empty()) return fail("needs at least one dimension");
  if (r.shape[0] < 0) {
    return fail("has a negative first dimension (" + std::to_string(r.shape[0]) + ")");
  }
  if (r.splits.size() != static_cast<size_t>(world_size)) {
    return fail("needs one split per rank: " + std::to_string(r.splits.size()) + " given for " +
                std::to_string(world_size) + " ranks");
  }
  // Summed exactly, as the coordinator sums them: a sum that only fitted here would end the
  // communicator there.
  int64_t sum = 0;
  for (size_t i = 0; i < r.splits.size(); ++i) {
    if (r.splits[i] < 0) {
      return fail("split " + std::to_string(i) + " is negative (" + std::to_string(r.splits[i]) +
                  ")");
    }
    if (__builtin_add_overflow(sum, r.splits[i], &sum)) {
      return fail("splits overflow a 64-bit sum");
    }
  }
  if (sum != r.shape[0]) {
    return fail("splits sum to " + std::to_string(sum) + ", the first dimension is " +
                std::to_string(r.shape[0]));
  }
  return Status::Ok();
}

size_t RowBytes(const TensorRequest& r) {
  size_t row = DTypeSize(r.dtype);
  for (size_t d = 1; d < r.shape.size(); ++d) row *= static_cast<size_t>(r.shape[d]);
  return row;
}

Status NormalizeSplits(TensorRequest* r, int world_size) {
  if (r->op != OpType::kReducescatter && r->op != OpType::kAlltoall) return Status::Ok();
  if (!r->splits.empty() || r->shape.empty() || world_size < 1) return Status::Ok();
  const int64_t n = r->shape[0];
  if (n < 0) return Status::Ok();  // ValidateEntry reports it
  if (r->op == OpType::kAlltoall && n % world_size != 0) {
    return InvalidArgument("tensor '" + r->name + "': alltoall without splits needs a first " +
                           "dimension divisible by the " + std::to_string(world_size) +
                           " ranks, it is " + std::to_string(n) + "; give splits");
  }
  for (int k = 0; k < world_size; ++k) r->splits.push_back(n / world_size + (k < n % world_size));
  return Status::Ok();
}

std::string FinalizeName() {
  return std::string(kReservedPrefix) + ".finalize";
}

std::string BarrierName(uint64_t seq) {
  return std::string(kReservedPrefix) + ".barrier." + std::to_string(seq);
}

std::string JoinName(uint64_t seq) {
  return std::string(kReservedPrefix) + ".join." + std::to_string(seq);
}

bool IsJoinName(const std::string& name) {
  static const std::string prefix = std::string(kReservedPrefix) + ".join.";
  return name.compare(0, prefix.size(), prefix) == 0;
}

bool IsInternalExchangeName(const std::string& name, OpType op) {
  return op == OpType::kAllgather &&
         name.compare(0, std::strlen(kReservedPrefix), kReservedPrefix) == 0;
}

Status ValidateEntry(const QueueEntry& e, int world_size, int rank) {
  const TensorRequest& r = e.request;
  // A barrier without a name is numbered when the queue accepts it (TensorQueue::Push).
  if (r.name.empty() && r.op != OpType::kBarrier) {
    return InvalidArgument("the tensor name is empty");
  }
  if (r.name.size() > kMaxNameBytes) {
    return InvalidArgument("the tensor name '" + r.name.substr(0, 64) + "...' is " +
                           std::to_string(r.name.size()) + " bytes long; names take at most " +
                           std::to_string(kMaxNameBytes) + " bytes");
  }
  if (r.name.compare(0, std::strlen(kReservedPrefix), kReservedPrefix) == 0 &&
      r.op != OpType::kBarrier) {
    return InvalidArgument("tensor names starting with '" + std::string(kReservedPrefix) +
                           "' are reserved");
  }
  auto fail = [&r](Code code, const std::string& what) {
    return Status(code, "tensor '" + r.name + "': " + what);
  };
  if (!IsValidDType(static_cast<int>(r.dtype)))
    return fail(Code::kInvalidArgument, "unknown dtype");
  if (!IsValidReduceOp(static_cast<int>(r.reduce_op))) {
    return fail(Code::kInvalidArgument, "unknown reduce op");
  }
  if (r.shape.size() > kMaxDims) {
    return fail(Code::kInvalidArgument, "more than " + std::to_string(kMaxDims) + " dimensions");
  }
  int64_t elements = 1;
  for (int64_t d : r.shape) {
    if (d < 0) return fail(Code::kInvalidArgument, "negative dimension " + std::to_string(d));
    if (d > 0 && elements > kMaxTensorSize / d) return fail(Code::kInvalidArgument, "too large");
    elements *= d;
  }
  if (r.device < -1) {
    return fail(Code::kInvalidArgument, "device " + std::to_string(r.device) +
                                            " is neither the CPU (-1) nor a CUDA device id");
  }
  if (elements > 0 && e.input == nullptr && r.op != OpType::kBarrier) {
    return fail(Code::kInvalidArgument, "input data is NULL");
  }
  CONCORD_RETURN_IF_ERROR(ValidateOp(e, elements, world_size, rank));
  if (!e.state) return fail(Code::kInternal, "request without completion state");
  return Status::Ok();
}

}  // namespace concord
