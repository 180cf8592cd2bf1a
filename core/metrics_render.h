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

// One of the engine's figures (a concord_stats_t field): a counter only ever grows; a gauge is a
// level now (bytes held), which Prometheus is told so it is not read as a rate.
struct EngineFigure {
  enum class Kind { kCounter, kGauge };
  std::string name;
  uint64_t value = 0;
  Kind kind = Kind::kCounter;
};

// What the metrics do not hold themselves: who this is, and the engine's figures
// (concord_stats_t's names and values, in that order).
struct MetricsContext {
  int rank = 0;
  int size = 1;
  std::string host;
  std::string endpoint;  // the metrics endpoint's "address:port"; empty: none
  std::vector<EngineFigure> counters;
};

// One JSON object (README.md's "Metrics" section describes every field).
std::string MetricsToJson(const Metrics::Snapshot& s, const MetricsContext& c);
// Every series labelled rank="R"; histograms with cumulative buckets, _sum and _count.
std::string MetricsToPrometheus(const Metrics::Snapshot& s, const MetricsContext& c);
// The `key value` lines of the end-of-job summary (tools/run_summary.h reads them).
std::string MetricsToSummary(const Metrics::Snapshot& s, const MetricsContext& c);

}  // namespace concord
