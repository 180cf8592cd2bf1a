// The engine's metrics (core/metrics.h) as the outside sees them: JSON, Prometheus text, and
// the end-of-job summary a world communicator's rank writes at finalize for concordrun.
#include <unistd.h>

#include <cerrno>
#include <cstdio>
#include <cstring>

#include "core/engine.h"
#include "core/metrics_render.h"

namespace concord {

MetricsContext Engine::MetricsContextNow() const {
  MetricsContext c;
  c.rank = config_.rank;
  c.size = config_.size;
  char host[256] = {};
  if (gethostname(host, sizeof(host) - 1) == 0) c.host = host;
  auto load = [](const std::atomic<uint64_t>& v) { return v.load(std::memory_order_relaxed); };
  c.counters = {{"responses_cached", load(stats_.responses_cached)},
                {"responses_full", load(stats_.responses_full)},
                {"response_lists", load(stats_.response_lists)},
                {"collectives", load(stats_.batches)},
                {"fused_tensors", load(stats_.fused_tensors)},
                {"inline_reductions", load(stats_.inline_reductions)},
                {"device_launches", load(stats_.device_launches)},
                {"cache_evictions", load(stats_.cache_evictions)}};
  return c;
}

std::string Engine::MetricsJson() const {
  return MetricsToJson(metrics_->Take(), MetricsContextNow());
}

std::string Engine::MetricsPrometheus() const {
  return MetricsToPrometheus(metrics_->Take(), MetricsContextNow());
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
