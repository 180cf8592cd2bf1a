// The engine's metrics (core/metrics.h) as the outside sees them: JSON, Prometheus text, and
// the end-of-job summary a world communicator's rank writes at finalize for concordrun; its
// timeline (core/timeline.h).
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdio>
#include <cstring>

#include "base/c_locale.h"
#include "core/engine.h"
#include "core/metrics_render.h"

namespace concord {

MetricsContext Engine::MetricsContextNow() const {
  MetricsContext c;
  c.rank = config_.rank;
  c.size = config_.size;
  char host[256] = {};
  if (gethostname(host, sizeof(host) - 1) == 0) c.host = host;
  c.endpoint = metrics_address_;
  auto load = [](const std::atomic<uint64_t>& v) { return v.load(std::memory_order_relaxed); };
  c.counters = {{"responses_cached", load(stats_.responses_cached)},
                {"responses_full", load(stats_.responses_full)},
                {"response_lists", load(stats_.response_lists)},
                {"collectives", load(stats_.batches)},
                {"fused_tensors", load(stats_.fused_tensors)},
                {"inline_reductions", load(stats_.inline_reductions)},
                {"device_launches", load(stats_.device_launches)},
                {"cache_evictions", load(stats_.cache_evictions)},
                {"topk_residual_evictions", load(stats_.topk_residual_evictions)},
                {"scratch_bytes", load(stats_.scratch_bytes), EngineFigure::Kind::kGauge},
                {"scratch_reallocations", load(stats_.scratch_reallocations)},
                {"kept_result_bytes", load(stats_.kept_result_bytes), EngineFigure::Kind::kGauge}};
  return c;
}

StatusOr<MetricsEndpoint> OpenMetricsEndpoint(const Config& config) {
  MetricsEndpoint endpoint;
  if (config.metrics_port < 0) return endpoint;
  endpoint.engine = std::make_shared<std::atomic<const Engine*>>(nullptr);
  const int port =
      config.metrics_port == 0 ? 0 : config.metrics_port + std::max(0, config.local_rank);
  auto target = endpoint.engine;
  auto render = [target] {
    const Engine* engine = target->load();
    return engine ? engine->MetricsPrometheus() : std::string();
  };
  auto warn = [level = config.log_level, rank = config.rank](const std::string& message) {
    LogLine(static_cast<LogLevel>(level), LogLevel::kWarning, rank, message);
  };
  auto server =
      MetricsServer::Start(config.metrics_address, port, std::move(render), std::move(warn));
  if (!server.ok()) {
    return server.status().WithContext("CONCORD_METRICS_PORT (rank " + std::to_string(config.rank) +
                                       " serves on the port plus its local rank)");
  }
  endpoint.server = std::move(*server);
  return endpoint;
}

void Engine::ServeMetrics(MetricsEndpoint endpoint) {
  if (!endpoint.server) return;
  metrics_address_ = endpoint.server->address();
  metrics_endpoint_ = std::move(endpoint);
  metrics_endpoint_.engine->store(this);
  Log(LogLevel::kInfo, "metrics: http://" + metrics_address_ + "/metrics");
}

Status Engine::SubmitP2p(P2pEntry entry) {
  uint64_t bytes = 0;
  if (entry.send || entry.expect) {
    bytes = DTypeSize(entry.dtype);
    for (int64_t d : entry.shape) bytes *= static_cast<uint64_t>(std::max<int64_t>(d, 0));
  }
  if (entry.state) {
    // A recv that takes the sender's shape learns its bytes and dtype at completion.
    entry.state->Meter(metrics_, entry.send ? "send" : "recv", entry.dtype, bytes, Clock::now(),
                       /*from_output=*/!entry.send && !entry.expect);
  }
  return p2p_->Submit(std::move(entry));
}

std::string Engine::MetricsJson() const {
  return MetricsToJson(metrics_->Take(), MetricsContextNow());
}

std::string Engine::MetricsPrometheus() const {
  return MetricsToPrometheus(metrics_->Take(), MetricsContextNow());
}

Status Engine::StartTimeline(const std::string& path) {
  if (timeline_->on()) {  // refused before the file is created (Start() checks again)
    return InvalidArgument("a timeline is already being written to " + timeline_->path() +
                           "; stop it before starting another");
  }
  CONCORD_ASSIGN_OR_RETURN(TimelineFile file,
                           OpenTimelineFile(path, config_.rank, "timeline", config_.membership));
  return timeline_->Start(std::move(file));
}

std::optional<ClockOffset> Engine::MeasureClockOffset() {
  P2pTransport* transport = p2p_->transport();
  if (config_.size == 1 || transport == nullptr) return std::nullopt;
  ClockSyncOptions options;
  options.deadline = Deadline::After(MillisFromSeconds(config_.timeout_s));
  const auto began = Clock::now();
  const ClockSyncResult result = SyncClock(*transport, options);
  if (!result.status.ok()) {
    Log(LogLevel::kWarning, "timeline: " + result.status.message() +
                                "; perf/concord-timeline merge aligns those ranks on their "
                                "system clocks");
  }
  if (result.offset) {
    const ScopedCLocale c_locale;  // "1.5 us", whatever the application's LC_NUMERIC
    char line[160];
    std::snprintf(line, sizeof(line),
                  "timeline: this rank's clock minus rank 0's: %.1f us +- %.1f us (measured in "
                  "%.1f ms)",
                  result.offset->offset_us, result.offset->error_us,
                  std::chrono::duration<double, std::milli>(Clock::now() - began).count());
    Log(LogLevel::kInfo, line);
  }
  return result.offset;
}

void Engine::WriteSummary() const {
  if (config_.summary_dir.empty() || !config_.membership.empty()) return;
  const std::string path = config_.summary_dir + "/rank-" + std::to_string(config_.rank) + ".txt";
  const std::string partial = path + ".partial";
  const std::string text = MetricsToSummary(metrics_->Take(), MetricsContextNow());
  // Written aside and renamed, so concordrun never reads half a file.
  FILE* f = std::fopen(partial.c_str(), "w");
  bool ok = f != nullptr && std::fwrite(text.data(), 1, text.size(), f) == text.size();
  if (f != nullptr) ok = std::fclose(f) == 0 && ok;
  if (ok) ok = std::rename(partial.c_str(), path.c_str()) == 0;
  if (!ok) {
    Log(LogLevel::kWarning, "the end-of-job summary could not be written to " + path + ": " +
                                std::strerror(errno) + " (CONCORD_SUMMARY_DIR)");
    std::remove(partial.c_str());
  }
}

}  // namespace concord
