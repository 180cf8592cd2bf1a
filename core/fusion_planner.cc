#include "core/fusion_planner.h"

namespace concord {
namespace {

bool Fusable(const Response& r, const FusionOptions& o) {
  const OpType op = r.request.op;
  // Device tensors fuse into allreduces only: the device backend runs the other kinds one tensor
  // at a time.
  if (r.request.device != -1 && op != OpType::kAllreduce) return false;
  if (r.error != Code::kOk || (!ReducesWhole(op) && op != OpType::kReducescatter)) return false;
  // A compressed tensor is encoded into the fusion buffer whatever its size: no copy to save.
  if (!r.request.compression.empty()) return true;
  return o.threshold > 0 && r.request.NumBytes() < o.direct_bytes &&
         r.request.NumBytes() <= o.threshold;
}

// One fused collective: one operation, dtype, reduction, scaling and compression, and one divisor
// for an average (as many joined ranks). Reducescatters fuse whatever their splits and shapes
// (engine_exchange_ops.cc packs every tensor's blocks rank-major).
bool Compatible(const Response& x, const Response& y) {
  const TensorRequest& a = x.request;
  const TensorRequest& b = y.request;
  return a.op == b.op && a.dtype == b.dtype && a.reduce_op == b.reduce_op &&
         a.prescale == b.prescale && a.postscale == b.postscale && a.device == b.device &&
         a.compression == b.compression && x.joined.size() == y.joined.size();
}

}  // namespace

size_t FusedMessageBytes(size_t payload, size_t elem_size) {
  if (payload >= (size_t{1} << 20)) return payload;
  size_t bytes = elem_size;
  while (bytes < payload) bytes *= 2;
  return bytes;
}

std::vector<FusionBatch> PlanFusion(const std::vector<const Response*>& responses,
                                    const FusionOptions& options) {
  std::vector<FusionBatch> batches;
  std::vector<bool> assigned(responses.size(), false);
  for (size_t i = 0; i < responses.size(); ++i) {
    if (assigned[i]) continue;
    assigned[i] = true;
    FusionBatch batch;
    batch.members.push_back(i);
    batch.bytes = responses[i]->request.NumBytes();
    if (Fusable(*responses[i], options)) {
      for (size_t j = i + 1; j < responses.size(); ++j) {
        if (assigned[j] || !Fusable(*responses[j], options) ||
            !Compatible(*responses[i], *responses[j])) {
          continue;
        }
        const size_t bytes = responses[j]->request.NumBytes();
        if (batch.bytes + bytes > options.threshold) continue;
        assigned[j] = true;
        batch.members.push_back(j);
        batch.bytes += bytes;
      }
      batch.fused = true;
    }
    batches.push_back(std::move(batch));
  }
  return batches;
}

}  // namespace concord
