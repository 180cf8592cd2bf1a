// A communicator's metrics: what its operations and collectives cost, recorded as the engine
// works and rendered three ways (core/metrics_render.cc): JSON (concord_comm_metrics, Python
// comm.metrics()), Prometheus text (the CONCORD_METRICS_PORT endpoint) and the end-of-job summary
// concordrun prints (CONCORD_SUMMARY_DIR).
//
// What is recorded, and by whom:
//  - an operation, when its request completes (RequestState::Complete): op, dtype, bytes, the
//    bytes this rank put on the wire for it, its status, and its phases: negotiation (enqueue
//    until the engine took it out of the queue to run it), execution (until it completed) and
//    the completion callback; the total feeds a latency histogram by op and size bucket;
//  - a collective, when a lane's backend returns (MeteredBackend): lane, backend, the backend's
//    op, bytes, seconds (the collective alone), in a histogram by op and size bucket;
//  - fused batches and how full they were, compressed bytes in and out, stall warnings;
//  - rank 0's straggler totals (core/straggler.h), copied in by the engine as they change.
//
// Contract: owned by the engine, shared (shared_ptr) with the requests it meters, which may
// complete on any of the engine's threads and after the engine is gone. Every method is
// thread-safe (one mutex; one record is a few map updates, once per operation or collective,
// never per element).
#pragma once

#include <array>
#include <cstdint>
#include <map>
#include <string>
#include <tuple>
#include <vector>

#include "base/clock.h"
#include "base/dtype.h"
#include "base/mutex.h"
#include "base/status.h"
#include "core/straggler.h"

namespace concord {

// A latency histogram with fixed bounds (seconds), Prometheus-style: counts[i] is the number of
// samples <= kBounds[i] and above the previous bound; the last count is the rest (+Inf).
struct LatencyHistogram {
  static constexpr std::array<double, 17> kBounds = {50e-6,  100e-6, 250e-6, 500e-6, 1e-3,   2.5e-3,
                                                     5e-3,   10e-3,  25e-3,  50e-3,  100e-3, 250e-3,
                                                     500e-3, 1.0,    2.5,    5.0,    10.0};
  std::array<uint64_t, kBounds.size() + 1> counts{};
  uint64_t count = 0;
  double sum = 0.0;

  void Add(double seconds);
};

// The size buckets of the histograms: upper bounds in bytes; the last bucket is the rest.
constexpr std::array<uint64_t, 4> kSizeBucketBounds = {uint64_t{4} << 10, uint64_t{64} << 10,
                                                       uint64_t{1} << 20, uint64_t{16} << 20};
size_t SizeBucket(uint64_t bytes);
// The bucket's label: its bound in bytes ("4096"), "+Inf" for the last.
std::string SizeBucketLabel(size_t bucket);

// One completed operation (see the file comment).
struct OpSample {
  const char* op = "";  // OpTypeName, "send" or "recv"
  DType dtype = DType::kUint8;
  uint64_t bytes = 0;
  uint64_t wire_bytes = 0;
  Code code = Code::kOk;
  double negotiation_s = 0.0;
  double execution_s = 0.0;
  double callback_s = 0.0;
};

class Metrics {
 public:
  Metrics();

  void RecordOp(const OpSample& sample) EXCLUDES(mu_);
  // A backend collective on `lane` (its backend `backend`), `seconds` long; failed ones count
  // as errors, not in the histogram.
  void RecordCollective(int lane, const char* backend, const char* op, uint64_t bytes,
                        double seconds, bool ok) EXCLUDES(mu_);
  // A fused batch of `tensors` tensors, `bytes` of a fusion buffer of `capacity`.
  void RecordFusedBatch(size_t tensors, uint64_t bytes, uint64_t capacity) EXCLUDES(mu_);
  // A compressed batch: `raw` bytes of tensors encoded into `encoded` bytes.
  void RecordCompression(uint64_t raw, uint64_t encoded) EXCLUDES(mu_);
  void RecordStallWarnings(uint64_t n) EXCLUDES(mu_);
  void SetStragglers(const StragglerTotals& totals) EXCLUDES(mu_);

  // Keys and totals, for the renderers (core/metrics_render.cc).
  struct OpTotals {
    uint64_t count = 0, bytes = 0, wire_bytes = 0, errors = 0;
    double negotiation_s = 0.0, execution_s = 0.0, callback_s = 0.0;
  };
  struct CollectiveTotals {
    uint64_t count = 0, bytes = 0, errors = 0;
    double seconds = 0.0;
  };
  using OpKey = std::tuple<std::string, DType>;               // op, dtype
  using SizedKey = std::tuple<std::string, size_t>;           // op, size bucket
  using LaneKey = std::tuple<int, std::string, std::string>;  // lane, backend, op
  using LaneSizedKey = std::tuple<int, std::string, size_t>;  // lane, op, size bucket
  struct Snapshot {
    double uptime_s = 0.0;
    std::map<OpKey, OpTotals> ops;
    std::map<SizedKey, LatencyHistogram> latency;
    std::map<std::string, uint64_t> errors;  // by status name
    std::map<LaneKey, CollectiveTotals> collectives;
    std::map<LaneSizedKey, LatencyHistogram> collective_latency;
    uint64_t fused_batches = 0, fused_batch_tensors = 0;
    double fusion_fill_sum = 0.0;  // sum over fused batches of bytes / capacity
    uint64_t compression_raw = 0, compression_encoded = 0;
    uint64_t stall_warnings = 0;
    StragglerTotals stragglers;
  };
  Snapshot Take() const EXCLUDES(mu_);

 private:
  const Clock::time_point start_;
  mutable Mutex mu_;
  Snapshot s_ GUARDED_BY(mu_);
};

}  // namespace concord
