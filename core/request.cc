#include "core/request.h"

#include <algorithm>
#include <utility>

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
    case OpType::kReducescatter:
      return "reducescatter";
    case OpType::kAlltoall:
      return "alltoall";
    case OpType::kReduce:
      return "reduce";
    case OpType::kGather:
      return "gather";
  }
  return "unknown";
}

int64_t TensorRequest::NumElements() const {
  // A zero dimension first: the product of the others may overflow (the parser and the enqueue
  // checks bound non-empty shapes only).
  if (std::find(shape.begin(), shape.end(), 0) != shape.end()) return 0;
  int64_t n = 1;
  for (int64_t d : shape) n *= d;
  return n;
}

bool TensorRequest::operator==(const TensorRequest& o) const {
  return name == o.name && op == o.op && dtype == o.dtype && shape == o.shape &&
         reduce_op == o.reduce_op && root == o.root && prescale == o.prescale &&
         postscale == o.postscale && device == o.device && compression == o.compression &&
         group == o.group && group_size == o.group_size && splits == o.splits;
}

bool Response::AppliesTo(int rank) const {
  if (error_ranks.empty()) return true;
  for (int32_t r : error_ranks) {
    if (r == rank) return true;
  }
  return false;
}

namespace {

// Whether the response carries per-rank first dimensions (and, for alltoall, splits) that
// `rank`'s own request must be compared with instead of rank 0's.
bool PerRank(const Response& r, int rank) {
  const OpType op = r.request.op;
  return (GathersRows(op) || op == OpType::kAlltoall) && !r.request.shape.empty() && rank >= 0 &&
         static_cast<size_t>(rank) < r.first_dims.size();
}

// Rank `rank`'s row of an alltoall response's splits; empty when the response has none for it.
std::pair<const int64_t*, size_t> SplitsRow(const Response& r, int rank) {
  const size_t n = r.first_dims.size();
  if (r.request.op != OpType::kAlltoall || n == 0 || r.splits.size() != n * n) return {nullptr, 0};
  return {r.splits.data() + static_cast<size_t>(rank) * n, n};
}

}  // namespace

bool Response::Joined(int rank) const {
  for (int32_t r : joined) {
    if (r == rank) return true;
  }
  return false;
}

bool Response::IsRequestOf(const TensorRequest& q, int rank) const {
  const TensorRequest& r = request;
  const bool own_first_dim = PerRank(*this, rank);
  if (q.shape.size() != r.shape.size()) return false;
  for (size_t d = 0; d < r.shape.size(); ++d) {
    const int64_t want = d == 0 && own_first_dim ? first_dims[rank] : r.shape[d];
    if (q.shape[d] != want) return false;
  }
  if (r.op == OpType::kAlltoall && own_first_dim) {
    const auto [row, n] = SplitsRow(*this, rank);
    if (q.splits.size() != n || !std::equal(q.splits.begin(), q.splits.end(), row)) return false;
  } else if (q.splits != r.splits) {
    return false;
  }
  return q.name == r.name && q.op == r.op && q.dtype == r.dtype && q.reduce_op == r.reduce_op &&
         q.root == r.root && q.prescale == r.prescale && q.postscale == r.postscale &&
         q.device == r.device && q.compression == r.compression && q.group == r.group &&
         q.group_size == r.group_size;
}

TensorRequest Response::RequestOf(int rank) const {
  TensorRequest r = request;
  if (PerRank(*this, rank)) {
    r.shape[0] = first_dims[rank];
    if (r.op == OpType::kAlltoall) {
      const auto [row, n] = SplitsRow(*this, rank);
      r.splits.assign(row, row + n);
    }
  }
  return r;
}

}  // namespace concord
