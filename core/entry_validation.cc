#include "core/entry_validation.h"

#include <cmath>
#include <cstring>

namespace concord {
namespace {

// The checks that depend on the operation.
Status ValidateOp(const QueueEntry& e, int64_t elements, int world_size) {
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
    case OpType::kAllgather:
      if (r.shape.empty()) return fail("allgather needs at least one dimension");
      return Status::Ok();
    case OpType::kBroadcast:
      if (r.root < 0 || r.root >= world_size) {
        return fail("root " + std::to_string(r.root) + " is outside [0, " +
                    std::to_string(world_size) + ")");
      }
      if (elements > 0 && e.output == nullptr) return fail("output data is NULL");
      return Status::Ok();
    case OpType::kBarrier:
      return Status::Ok();
  }
  return fail("unknown operation");
}

}  // namespace

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

Status ValidateEntry(const QueueEntry& e, int world_size) {
  const TensorRequest& r = e.request;
  if (r.name.empty()) return InvalidArgument("the tensor name is empty");
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
  CONCORD_RETURN_IF_ERROR(ValidateOp(e, elements, world_size));
  if (!e.state) return fail(Code::kInternal, "request without completion state");
  return Status::Ok();
}

}  // namespace concord
