// Lane scheduling: how one segment of a response list is spread over the engine's lanes.
//
// The direct (unfused) allreduces of the segment that share a dtype and backend reduction (an
// average reduces as a sum) form a span group: one collective over all their buffers
// (Backend::AllreduceSpans), cut into shares of at least `min_share_bytes`, at most one per lane,
// that run concurrently. Every other batch runs whole. Each piece of work goes to the lane with
// the fewest bytes so far. A pure function of its input, so every rank, running the same plan,
// makes the same choices and the lanes' collectives match. Stateless; thread-safe.
#pragma once

#include <cstddef>
#include <vector>

#include "core/fusion_planner.h"
#include "core/request.h"

namespace concord {

// Elements [begin, begin + count) of the direct allreduce `member` (an index into the responses).
struct AllreducePiece {
  size_t member = 0;
  size_t begin = 0;
  size_t count = 0;
};

// One piece of a lane's work: a share of a span group (pieces non-empty, one dtype and reduction)
// or a whole batch (pieces empty: plan[batch]).
struct LaneWork {
  size_t batch = 0;
  std::vector<AllreducePiece> pieces;
};

struct SpanGroup {
  DType dtype = DType::kFloat32;
  ReduceOp op = ReduceOp::kSum;  // the backend's reduction: an average runs as a sum
  std::vector<size_t> members;   // indices into the responses, in plan order
  size_t elements = 0;
};

struct LanePlan {
  std::vector<std::vector<LaneWork>> by_lane;  // in the order each lane runs them
  std::vector<SpanGroup> groups;               // complete once every lane is done
};

// Plans `batches` (indices into `plan`, whose members index `responses`) over `lanes` lanes
// (at least 1); `min_share_bytes` is at least 1.
LanePlan PlanLanes(const std::vector<FusionBatch>& plan, const std::vector<size_t>& batches,
                   const std::vector<const Response*>& responses, size_t lanes,
                   size_t min_share_bytes);

}  // namespace concord
