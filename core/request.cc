#include "core/request.h"

namespace concord {

const char* OpTypeName(OpType op) {
  switch (op) {
    case OpType::kAllreduce:
      return "allreduce";
    case OpType::kAllgather:
      return "allgather";
    case OpType::kBroadcast:
      return "broadcast";
    case OpType::kBarrier:
      return "barrier";
  }
  return "unknown";
}

int64_t TensorRequest::NumElements() const {
  int64_t n = 1;
  for (int64_t d : shape) n *= d;
  return n;
}

bool TensorRequest::operator==(const TensorRequest& o) const {
  return name == o.name && op == o.op && dtype == o.dtype && shape == o.shape &&
         reduce_op == o.reduce_op && root == o.root && prescale == o.prescale &&
         postscale == o.postscale && device == o.device && compression == o.compression &&
         group == o.group && group_size == o.group_size;
}

bool Response::AppliesTo(int rank) const {
  if (error_ranks.empty()) return true;
  for (int32_t r : error_ranks) {
    if (r == rank) return true;
  }
  return false;
}

bool Response::Joined(int rank) const {
  for (int32_t r : joined) {
    if (r == rank) return true;
  }
  return false;
}

bool Response::IsRequestOf(const TensorRequest& q, int rank) const {
  const TensorRequest& r = request;
  const bool own_first_dim = r.op == OpType::kAllgather && !r.shape.empty() && rank >= 0 &&
                             static_cast<size_t>(rank) < first_dims.size();
  if (q.shape.size() != r.shape.size()) return false;
  for (size_t d = 0; d < r.shape.size(); ++d) {
    const int64_t want = d == 0 && own_first_dim ? first_dims[rank] : r.shape[d];
    if (q.shape[d] != want) return false;
  }
  return q.name == r.name && q.op == r.op && q.dtype == r.dtype && q.reduce_op == r.reduce_op &&
         q.root == r.root && q.prescale == r.prescale && q.postscale == r.postscale &&
         q.device == r.device && q.compression == r.compression && q.group == r.group &&
         q.group_size == r.group_size;
}

TensorRequest Response::RequestOf(int rank) const {
  TensorRequest r = request;
  if (r.op == OpType::kAllgather && !r.shape.empty() && rank >= 0 &&
      static_cast<size_t>(rank) < first_dims.size()) {
    r.shape[0] = first_dims[rank];
  }
  return r;
}

}  // namespace concord
