#include "core/lane_plan.h"

#include <algorithm>
#include <cstdint>

namespace concord {
namespace {

// Whether the batch is a direct allreduce that joins a span group.
bool Spans(const FusionBatch& batch, const Response& r) {
  return !batch.fused && r.error == Code::kOk && r.request.op == OpType::kAllreduce;
}

std::vector<SpanGroup> GroupDirectAllreduces(const std::vector<FusionBatch>& plan,
                                             const std::vector<size_t>& batches,
                                             const std::vector<const Response*>& responses) {
  std::vector<SpanGroup> groups;
  for (size_t b : batches) {
    const size_t i = plan[b].members.front();
    const Response& r = *responses[i];
    if (!Spans(plan[b], r)) continue;
    const ReduceOp op = WireReduceOp(r.request.reduce_op);
    auto group = std::find_if(groups.begin(), groups.end(), [&](const SpanGroup& g) {
      return g.dtype == r.request.dtype && g.op == op;
    });
    if (group == groups.end())
      group = groups.insert(groups.end(), SpanGroup{r.request.dtype, op, {}, 0});
    group->members.push_back(i);
    group->elements += static_cast<size_t>(r.request.NumElements());
  }
  return groups;
}

// Cuts a group's elements, laid end to end, into `shares` nearly equal runs of pieces.
std::vector<std::vector<AllreducePiece>> CutShares(const SpanGroup& g, size_t shares,
                                                   const std::vector<const Response*>& responses) {
  std::vector<std::vector<AllreducePiece>> out;
  // Share k starts at element floor(elements * k / shares), computed without the product, which
  // overflows for groups past 2^64 / shares elements: (q * shares + r) * k / shares is
  // q * k + r * k / shares, and r * k < shares^2.
  const size_t q = g.elements / shares, r = g.elements % shares;
  auto start = [q, r, shares](size_t k) { return q * k + r * k / shares; };
  size_t member = 0, used = 0;  // the next element to hand out: `used` of members[member]
  for (size_t k = 0; k < shares; ++k) {
    const size_t end = start(k + 1);
    size_t at = start(k);
    std::vector<AllreducePiece> pieces;
    while (at < end) {
      const size_t i = g.members[member];
      const size_t n = static_cast<size_t>(responses[i]->request.NumElements());
      const size_t take = std::min(n - used, end - at);
      if (take > 0) pieces.push_back(AllreducePiece{i, used, take});
      at += take;
      used += take;
      if (used == n) {
        ++member;
        used = 0;
      }
    }
    out.push_back(std::move(pieces));
  }
  return out;
}

}  // namespace

LanePlan PlanLanes(const std::vector<FusionBatch>& plan, const std::vector<size_t>& batches,
                   const std::vector<const Response*>& responses, size_t lanes,
                   size_t min_share_bytes) {
  LanePlan out;
  out.by_lane.resize(lanes);
  std::vector<size_t> load(lanes, 0);
  auto assign = [&](LaneWork w, size_t bytes) {
    const size_t lane =
        static_cast<size_t>(std::min_element(load.begin(), load.end()) - load.begin());
    out.by_lane[lane].push_back(std::move(w));
    load[lane] += std::max<size_t>(bytes, 1);
  };
  out.groups = GroupDirectAllreduces(plan, batches, responses);
  for (const SpanGroup& g : out.groups) {
    const size_t elem = DTypeSize(g.dtype);
    size_t group_bytes = 0;
    if (__builtin_mul_overflow(g.elements, elem, &group_bytes)) group_bytes = SIZE_MAX;
    const size_t shares = std::clamp<size_t>(group_bytes / min_share_bytes, 1, lanes);
    for (auto& pieces : CutShares(g, shares, responses)) {
      if (pieces.empty()) continue;
      size_t bytes = 0;
      for (const AllreducePiece& p : pieces) bytes += p.count * elem;
      assign(LaneWork{0, std::move(pieces)}, bytes);
    }
  }
  for (size_t b : batches) {
    if (!Spans(plan[b], *responses[plan[b].members.front()]))
      assign(LaneWork{b, {}}, plan[b].bytes);
  }
  return out;
}

}  // namespace concord
