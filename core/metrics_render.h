// The three renderings of a communicator's metrics (core/metrics.h): JSON for the C API and
// Python, Prometheus text (exposition format 0.0.4) for the metrics endpoint, and the summary
// file concordrun reads at the end of a job. Pure functions of a snapshot and its context.
#pragma once

#include <cstdint>
#include <string>
#include <utility>
#include <vector>

#include "core/metrics.h"

namespace concord {

// What the metrics do not hold themselves: who this is, and the engine's counters
// (concord_stats_t's names and values, in that order).
struct MetricsContext {
  int rank = 0;
  int size = 1;
  std::string host;
  std::string endpoint;  // the metrics endpoint's "address:port"; empty: none
  std::vector<std::pair<std::string, uint64_t>> counters;
};

// One JSON object (README.md's "Metrics" section describes every field).
std::string MetricsToJson(const Metrics::Snapshot& s, const MetricsContext& c);
// Every series labelled rank="R"; histograms with cumulative buckets, _sum and _count.
std::string MetricsToPrometheus(const Metrics::Snapshot& s, const MetricsContext& c);
// The `key value` lines of the end-of-job summary (tools/run_summary.h reads them).
std::string MetricsToSummary(const Metrics::Snapshot& s, const MetricsContext& c);

}  // namespace concord
