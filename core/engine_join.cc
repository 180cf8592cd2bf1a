// Join (coordinator.h, protocol point 8): Engine::Join(), and the stand-in entries through which
// a joined rank takes part in operations it never submitted, contributing the reduction's
// identity (no rows to an allgather; a broadcast's data it receives and drops).
#include <cmath>
#include <cstring>
#include <limits>
#include <new>

#include "core/engine.h"

namespace concord {
namespace {

template <typename T>
void FillTyped(void* data, size_t n, T value) {
  T* p = static_cast<T*>(data);
  for (size_t i = 0; i < n; ++i) p[i] = value;
}

// x such that op(x, y) == y for every y. Before the reduction the engine multiplies inputs by
// the prescale factor (floating types only), so the stand-in is that identity divided by it; a
// prescale of 0 makes every contribution 0, so 0 stands in (infinity times 0 is NaN).
template <typename T>
T Identity(ReduceOp op, double prescale) {
  if (prescale == 0) return op == ReduceOp::kProduct ? T(1) : T(0);
  using L = std::numeric_limits<T>;
  const T high = L::has_infinity ? L::infinity() : L::max();
  const T low = L::has_infinity ? -L::infinity() : L::lowest();
  switch (op) {
    case ReduceOp::kSum:
    case ReduceOp::kAverage:
      return T(0);
    case ReduceOp::kProduct:
      return static_cast<T>(1.0 / prescale);
    case ReduceOp::kMin:
      return prescale < 0 ? low : high;
    case ReduceOp::kMax:
      return prescale < 0 ? high : low;
  }
  return T(0);
}

void FillIdentity(void* data, size_t n, DType dtype, ReduceOp op, double prescale) {
  switch (dtype) {
    case DType::kUint8:
      return FillTyped(data, n, Identity<uint8_t>(op, 1));
    case DType::kInt8:
      return FillTyped(data, n, Identity<int8_t>(op, 1));
    case DType::kInt32:
      return FillTyped(data, n, Identity<int32_t>(op, 1));
    case DType::kInt64:
      return FillTyped(data, n, Identity<int64_t>(op, 1));
    case DType::kFloat16:
      return FillTyped(data, n, FloatToHalf(Identity<float>(op, prescale)));
    case DType::kBFloat16:
      return FillTyped(data, n, FloatToBFloat16(Identity<float>(op, prescale)));
    case DType::kFloat32:
      return FillTyped(data, n, Identity<float>(op, prescale));
    case DType::kFloat64:
      return FillTyped(data, n, Identity<double>(op, prescale));
  }
}

}  // namespace

StatusOr<int> Engine::Join() {
  if (OnEngineThread()) {
    return InvalidArgument("concord_join cannot be called from the communicator's own threads");
  }
  {
    MutexLock lock(group_mu_);
    if (open_groups_.count(std::this_thread::get_id()) != 0) {
      return InvalidArgument(
          "concord_join inside a group would wait for itself; call it after "
          "concord_group_end");
    }
  }
  auto state = std::make_shared<RequestState>();
  QueueEntry e;
  e.request.name = JoinName(join_seq_.fetch_add(1));
  e.request.op = OpType::kBarrier;
  e.request.dtype = DType::kUint8;
  e.state = state;
  e.step = step_.load(std::memory_order_relaxed);
  std::vector<QueueEntry> one;
  one.push_back(std::move(e));
  CONCORD_RETURN_IF_ERROR(queue_.Push(std::move(one)));
  // As long as the others' epochs take: a failure or finalize completes it with an error.
  Wait(*state, Deadline::Infinite());
  CONCORD_RETURN_IF_ERROR(state->status());
  return static_cast<int>(state->output().first_dim);
}

StatusOr<QueueEntry> Engine::JoinedEntry(const Response& r) {
  // On the stepping thread: memory this host cannot give for the stand-in's data (the size of the
  // others' tensor) is an error naming the tensor, as in Engine::RunWork, not std::bad_alloc out
  // of the step (std::terminate on the engine's thread, or a waiter's step that drops the list's
  // entries, never completed).
  try {
    QueueEntry e;
    e.request = r.RequestOf(config_.rank);
    e.state = std::make_shared<RequestState>();
    e.stand_in = true;
    const size_t n = static_cast<size_t>(e.request.NumElements());
    // The stand-in's data lives in its own state, as long as the entry.
    auto& owned = e.state->output().owned;
    switch (e.request.op) {
      case OpType::kAllreduce:
      case OpType::kReduce:  // never its root: the coordinator refuses a reduce whose root joined
        owned = result_buffers_->Take(e.request.NumBytes());
        FillIdentity(owned.data(), n, e.request.dtype, e.request.reduce_op, e.request.prescale);
        CONCORD_RETURN_IF_ERROR(AttachCompressor(e));
        break;
      case OpType::kBroadcast:
        owned = result_buffers_->Take(e.request.NumBytes());
        break;
      case OpType::kAllgather:  // no rows of its own; the gathered rows go to the state
      case OpType::kGather:
      case OpType::kBarrier:
        return e;
      case OpType::kReducescatter:  // refused by the coordinator while a rank is joined
      case OpType::kAlltoall:
        return Internal("tensor '" + e.request.name + "': a joined rank cannot stand in for " +
                        OpTypeName(e.request.op));
    }
    e.input = owned.data();
    e.output = owned.data();
    return e;
  } catch (const std::bad_alloc&) {
    const std::string op = OpTypeName(r.request.op);
    return Status(Code::kSystemError, "out of memory for this joined rank's stand-in in the " + op +
                                          " of tensor '" + r.request.name + "'");
  }
}

}  // namespace concord
