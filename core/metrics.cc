#include "core/metrics.h"

#include <algorithm>

namespace concord {

void LatencyHistogram::Add(double seconds) {
  const auto it = std::lower_bound(kBounds.begin(), kBounds.end(), seconds);
  ++counts[static_cast<size_t>(it - kBounds.begin())];
  ++count;
  sum += seconds;
}

size_t SizeBucket(uint64_t bytes) {
  const auto it = std::lower_bound(kSizeBucketBounds.begin(), kSizeBucketBounds.end(), bytes);
  return static_cast<size_t>(it - kSizeBucketBounds.begin());
}

std::string SizeBucketLabel(size_t bucket) {
  return bucket < kSizeBucketBounds.size() ? std::to_string(kSizeBucketBounds[bucket]) : "+Inf";
}

Metrics::Metrics() : start_(Clock::now()) {}

void Metrics::RecordOp(const OpSample& sample) {
  MutexLock lock(mu_);
  OpTotals& t = s_.ops[OpKey(sample.op, sample.dtype)];
  ++t.count;
  t.bytes += sample.bytes;
  t.wire_bytes += sample.wire_bytes;
  t.negotiation_s += sample.negotiation_s;
  t.execution_s += sample.execution_s;
  t.callback_s += sample.callback_s;
  if (sample.code != Code::kOk) {
    ++t.errors;
    ++s_.errors[CodeName(sample.code)];
    return;
  }
  s_.latency[SizedKey(sample.op, SizeBucket(sample.bytes))].Add(sample.negotiation_s +
                                                                sample.execution_s);
}

void Metrics::RecordCollective(int lane, const char* backend, const char* op, uint64_t bytes,
                               double seconds, bool ok) {
  MutexLock lock(mu_);
  CollectiveTotals& t = s_.collectives[LaneKey(lane, backend, op)];
  ++t.count;
  t.bytes += bytes;
  t.seconds += seconds;
  if (!ok) {
    ++t.errors;
    return;
  }
  s_.collective_latency[LaneSizedKey(lane, op, SizeBucket(bytes))].Add(seconds);
}

void Metrics::RecordFusedBatch(size_t tensors, uint64_t bytes, uint64_t capacity) {
  MutexLock lock(mu_);
  ++s_.fused_batches;
  s_.fused_batch_tensors += tensors;
  if (capacity > 0) {
    s_.fusion_fill_sum += std::min(1.0, static_cast<double>(bytes) / static_cast<double>(capacity));
  }
}

void Metrics::RecordCompression(uint64_t raw, uint64_t encoded) {
  MutexLock lock(mu_);
  s_.compression_raw += raw;
  s_.compression_encoded += encoded;
}

void Metrics::RecordStallWarnings(uint64_t n) {
  MutexLock lock(mu_);
  s_.stall_warnings += n;
}

void Metrics::SetStragglers(const StragglerTotals& totals) {
  MutexLock lock(mu_);
  s_.stragglers = totals;  // into the vectors' existing capacity
}

Metrics::Snapshot Metrics::Take() const {
  MutexLock lock(mu_);
  Snapshot s = s_;
  s.uptime_s = std::chrono::duration<double>(Clock::now() - start_).count();
  return s;
}

}  // namespace concord
