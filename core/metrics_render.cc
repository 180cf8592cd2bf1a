#include "core/metrics_render.h"

#include <algorithm>
#include <charconv>
#include <cmath>
#include <map>

#include "base/json.h"

namespace concord {
namespace {

// A finite number as JSON and Prometheus write it (both read "%.9g" in the C locale: to_chars
// ignores the application's LC_NUMERIC, whose decimal comma would break both formats).
std::string Num(double v) {
  if (!std::isfinite(v)) v = 0.0;
  char buf[32];
  const std::to_chars_result r =
      std::to_chars(buf, buf + sizeof(buf), v, std::chars_format::general, 9);
  return std::string(buf, r.ptr);
}
std::string Num(uint64_t v) {
  return std::to_string(v);
}

double Ratio(double a, double b) {
  return b > 0.0 ? a / b : 0.0;
}

// JSON: "buckets": [[bound, cumulative count], ..., ["+Inf", count]].
std::string JsonHistogram(const LatencyHistogram& h) {
  std::string out = "\"count\":" + Num(h.count) + ",\"sum_s\":" + Num(h.sum) + ",\"buckets\":[";
  uint64_t cumulative = 0;
  for (size_t i = 0; i < h.counts.size(); ++i) {
    cumulative += h.counts[i];
    out += i ? "," : "";
    out += "[" +
           (i < LatencyHistogram::kBounds.size() ? Num(LatencyHistogram::kBounds[i])
                                                 : std::string("\"+Inf\"")) +
           "," + Num(cumulative) + "]";
  }
  return out + "]";
}

// Per op (over dtypes): the phase sums, for Prometheus and the summary.
std::map<std::string, Metrics::OpTotals> ByOp(const Metrics::Snapshot& s) {
  std::map<std::string, Metrics::OpTotals> by_op;
  for (const auto& [key, t] : s.ops) {
    Metrics::OpTotals& o = by_op[std::get<0>(key)];
    o.count += t.count;
    o.bytes += t.bytes;
    o.wire_bytes += t.wire_bytes;
    o.errors += t.errors;
    o.negotiation_s += t.negotiation_s;
    o.execution_s += t.execution_s;
    o.callback_s += t.callback_s;
  }
  return by_op;
}

uint64_t Counter(const MetricsContext& c, const std::string& name) {
  for (const EngineFigure& f : c.counters) {
    if (f.name == name) return f.value;
  }
  return 0;
}

double CacheHitRate(const MetricsContext& c) {
  const double cached = static_cast<double>(Counter(c, "responses_cached"));
  return Ratio(cached, cached + static_cast<double>(Counter(c, "responses_full")));
}

// `name` as part of a metric name: every byte but [a-zA-Z0-9_] as '_' (names allow ':' too, but
// that is for recording rules).
std::string MetricNamePart(std::string name) {
  for (char& c : name) {
    const bool ok = (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9');
    if (!ok) c = '_';
  }
  return name;
}

// Prometheus text: one family at a time, every series with the rank label first.
class PromWriter {
 public:
  explicit PromWriter(int rank) : rank_label_("rank=\"" + std::to_string(rank) + "\"") {}
  // `help` with backslash and line feed escaped (\\, \n: the format's escapes in HELP text).
  void Family(const std::string& name, const char* type, const std::string& help) {
    out_ += "# HELP " + name + " ";
    for (const char c : help) {
      if (c == '\\') {
        out_ += "\\\\";
      } else if (c == '\n') {
        out_ += "\\n";
      } else {
        out_ += c;
      }
    }
    out_ += "\n# TYPE " + name + " " + type + "\n";
  }
  void Sample(const std::string& name, const std::string& labels, const std::string& value) {
    out_ += name + "{" + rank_label_ + (labels.empty() ? "" : "," + labels) + "} " + value + "\n";
  }
  void Histogram(const std::string& name, const std::string& labels, const LatencyHistogram& h) {
    uint64_t cumulative = 0;
    for (size_t i = 0; i < h.counts.size(); ++i) {
      cumulative += h.counts[i];
      const std::string le = i < LatencyHistogram::kBounds.size()
                                 ? Num(LatencyHistogram::kBounds[i])
                                 : std::string("+Inf");
      Sample(name + "_bucket", labels + ",le=\"" + le + "\"", Num(cumulative));
    }
    Sample(name + "_sum", labels, Num(h.sum));
    Sample(name + "_count", labels, Num(h.count));
  }
  std::string Take() { return std::move(out_); }

 private:
  const std::string rank_label_;
  std::string out_;
};

// `value` as a Prometheus label value (exposition format 0.0.4): quoted, with backslash, double
// quote and line feed escaped (\\, \", \n: the format's only escapes; JSON's \uXXXX is an error
// there), every other well-formed UTF-8 sequence as it is and every other byte as U+FFFD.
std::string LabelValue(const std::string& value) {
  std::string out = "\"";
  for (size_t i = 0, n = 0; i < value.size(); i += n) {
    n = Utf8SequenceLength(value, i);
    if (n == 0) {
      out += "\xef\xbf\xbd";
      n = 1;
    } else if (value[i] == '\\' || value[i] == '"') {
      out += '\\';
      out += value[i];
    } else if (value[i] == '\n') {
      out += "\\n";
    } else {
      out.append(value, i, n);
    }
  }
  return out + "\"";
}

std::string Label(const char* name, const std::string& value) {
  return std::string(name) + "=" + LabelValue(value);
}

std::string LaneLabel(int lane) {
  return Label("lane", std::to_string(lane));
}

}  // namespace

std::string MetricsToJson(const Metrics::Snapshot& s, const MetricsContext& c) {
  std::string j = "{\"version\":1,\"rank\":" + std::to_string(c.rank) +
                  ",\"size\":" + std::to_string(c.size) + ",\"host\":" + JsonQuote(c.host) +
                  ",\"endpoint\":" + JsonQuote(c.endpoint) + ",\"uptime_s\":" + Num(s.uptime_s) +
                  ",\"counters\":{";
  for (size_t i = 0; i < c.counters.size(); ++i) {
    j += (i ? "," : "") + JsonQuote(c.counters[i].name) + ":" + Num(c.counters[i].value);
  }
  j += "},\"cache_hit_rate\":" + Num(CacheHitRate(c)) + ",\"operations\":[";
  uint64_t wire = 0;
  bool first = true;
  for (const auto& [key, t] : s.ops) {
    wire += t.wire_bytes;
    j += (first ? "" : ",") + std::string("{\"op\":") + JsonQuote(std::get<0>(key)) +
         ",\"dtype\":" + JsonQuote(DTypeName(std::get<1>(key))) + ",\"count\":" + Num(t.count) +
         ",\"bytes\":" + Num(t.bytes) + ",\"wire_bytes\":" + Num(t.wire_bytes) +
         ",\"errors\":" + Num(t.errors) + ",\"negotiation_s\":" + Num(t.negotiation_s) +
         ",\"execution_s\":" + Num(t.execution_s) + ",\"callback_s\":" + Num(t.callback_s) + "}";
    first = false;
  }
  j += "],\"latency\":[";
  first = true;
  for (const auto& [key, h] : s.latency) {
    j += (first ? "" : ",") + std::string("{\"op\":") + JsonQuote(std::get<0>(key)) +
         ",\"size_le\":" + JsonQuote(SizeBucketLabel(std::get<1>(key))) + "," + JsonHistogram(h) +
         "}";
    first = false;
  }
  j += "],\"collectives\":[";
  first = true;
  for (const auto& [key, t] : s.collectives) {
    j += (first ? "" : ",") + std::string("{\"lane\":") + std::to_string(std::get<0>(key)) +
         ",\"backend\":" + JsonQuote(std::get<1>(key)) + ",\"op\":" + JsonQuote(std::get<2>(key)) +
         ",\"count\":" + Num(t.count) + ",\"bytes\":" + Num(t.bytes) +
         ",\"seconds\":" + Num(t.seconds) + ",\"errors\":" + Num(t.errors) + "}";
    first = false;
  }
  j += "],\"collective_latency\":[";
  first = true;
  for (const auto& [key, h] : s.collective_latency) {
    j += (first ? "" : ",") + std::string("{\"lane\":") + std::to_string(std::get<0>(key)) +
         ",\"op\":" + JsonQuote(std::get<1>(key)) +
         ",\"size_le\":" + JsonQuote(SizeBucketLabel(std::get<2>(key))) + "," + JsonHistogram(h) +
         "}";
    first = false;
  }
  j += "],\"fusion\":{\"batches\":" + Num(s.fused_batches) +
       ",\"tensors\":" + Num(s.fused_batch_tensors) +
       ",\"mean_fill\":" + Num(Ratio(s.fusion_fill_sum, static_cast<double>(s.fused_batches))) +
       "},\"compression\":{\"raw_bytes\":" + Num(s.compression_raw) +
       ",\"encoded_bytes\":" + Num(s.compression_encoded) + ",\"ratio\":" +
       Num(Ratio(static_cast<double>(s.compression_raw),
                 static_cast<double>(s.compression_encoded))) +
       "},\"wire_bytes\":" + Num(wire) + ",\"stall_warnings\":" + Num(s.stall_warnings) +
       ",\"errors\":{";
  first = true;
  for (const auto& [code, n] : s.errors) {
    j += (first ? "" : ",") + JsonQuote(code) + ":" + Num(n);
    first = false;
  }
  j += "},\"stragglers\":{\"operations\":" + Num(s.stragglers.operations) + ",\"ranks\":[";
  for (size_t r = 0; r < s.stragglers.last.size(); ++r) {
    const double share = Ratio(static_cast<double>(s.stragglers.last[r]),
                               static_cast<double>(s.stragglers.operations));
    j += (r ? "," : "") + std::string("{\"rank\":") + std::to_string(r) +
         ",\"last\":" + Num(s.stragglers.last[r]) + ",\"share\":" + Num(share) +
         ",\"waited_s\":" + Num(s.stragglers.waited_s[r]) + "}";
  }
  return j + "]}}";
}

std::string MetricsToPrometheus(const Metrics::Snapshot& s, const MetricsContext& c) {
  PromWriter w(c.rank);
  w.Family("concord_uptime_seconds", "gauge", "Seconds since the communicator started.");
  w.Sample("concord_uptime_seconds", "", Num(s.uptime_s));
  for (const EngineFigure& f : c.counters) {
    const bool gauge = f.kind == EngineFigure::Kind::kGauge;
    const std::string family =
        "concord_engine_" + MetricNamePart(f.name) + (gauge ? std::string() : "_total");
    w.Family(
        family, gauge ? "gauge" : "counter",
        std::string(gauge ? "Engine gauge " : "Engine counter ") + f.name + " (concord_stats_t).");
    w.Sample(family, "", Num(f.value));
  }
  w.Family("concord_cache_hit_ratio", "gauge", "Operations negotiated as a response-cache bit.");
  w.Sample("concord_cache_hit_ratio", "", Num(CacheHitRate(c)));
  struct OpFamily {
    const char* name;
    const char* help;
    uint64_t Metrics::OpTotals::*field;
  };
  for (const OpFamily& f :
       {OpFamily{"concord_operations_total", "Operations completed.", &Metrics::OpTotals::count},
        OpFamily{"concord_operation_bytes_total", "Tensor bytes of completed operations.",
                 &Metrics::OpTotals::bytes},
        OpFamily{"concord_operation_wire_bytes_total", "Bytes this rank put on the wire.",
                 &Metrics::OpTotals::wire_bytes},
        OpFamily{"concord_operation_errors_total", "Operations completed with an error.",
                 &Metrics::OpTotals::errors}}) {
    w.Family(f.name, "counter", f.help);
    for (const auto& [key, t] : s.ops) {
      w.Sample(f.name,
               Label("op", std::get<0>(key)) + "," + Label("dtype", DTypeName(std::get<1>(key))),
               Num(t.*f.field));
    }
  }
  w.Family("concord_operation_phase_seconds_total", "counter",
           "Seconds summed over operations in each phase (negotiation, execution, callback).");
  for (const auto& [op, t] : ByOp(s)) {
    w.Sample("concord_operation_phase_seconds_total",
             Label("op", op) + "," + Label("phase", "negotiation"), Num(t.negotiation_s));
    w.Sample("concord_operation_phase_seconds_total",
             Label("op", op) + "," + Label("phase", "execution"), Num(t.execution_s));
    w.Sample("concord_operation_phase_seconds_total",
             Label("op", op) + "," + Label("phase", "callback"), Num(t.callback_s));
  }
  w.Family("concord_operation_latency_seconds", "histogram",
           "Enqueue to completion of successful operations, by op and size bucket (bytes).");
  for (const auto& [key, h] : s.latency) {
    w.Histogram("concord_operation_latency_seconds",
                Label("op", std::get<0>(key)) + "," +
                    Label("size_bucket", SizeBucketLabel(std::get<1>(key))),
                h);
  }
  struct CollectiveFamily {
    const char* name;
    const char* help;
    uint64_t Metrics::CollectiveTotals::*field;
  };
  for (const CollectiveFamily& f :
       {CollectiveFamily{"concord_collectives_total", "Backend collectives, by lane and op.",
                         &Metrics::CollectiveTotals::count},
        CollectiveFamily{"concord_collective_bytes_total", "Bytes handed to backend collectives.",
                         &Metrics::CollectiveTotals::bytes},
        CollectiveFamily{"concord_collective_errors_total", "Backend collectives that failed.",
                         &Metrics::CollectiveTotals::errors}}) {
    w.Family(f.name, "counter", f.help);
    for (const auto& [key, t] : s.collectives) {
      w.Sample(f.name,
               LaneLabel(std::get<0>(key)) + "," + Label("backend", std::get<1>(key)) + "," +
                   Label("op", std::get<2>(key)),
               Num(t.*f.field));
    }
  }
  w.Family("concord_collective_seconds", "histogram",
           "Time in the backend collective alone, by lane, op and size bucket (bytes).");
  for (const auto& [key, h] : s.collective_latency) {
    w.Histogram("concord_collective_seconds",
                LaneLabel(std::get<0>(key)) + "," + Label("op", std::get<1>(key)) + "," +
                    Label("size_bucket", SizeBucketLabel(std::get<2>(key))),
                h);
  }
  w.Family("concord_fusion_batches_total", "counter", "Fused batches.");
  w.Sample("concord_fusion_batches_total", "", Num(s.fused_batches));
  w.Family("concord_fusion_fill_ratio_sum", "counter",
           "Sum over fused batches of their bytes over the fusion buffer's size.");
  w.Sample("concord_fusion_fill_ratio_sum", "", Num(s.fusion_fill_sum));
  w.Family("concord_compression_raw_bytes_total", "counter", "Tensor bytes compressed.");
  w.Sample("concord_compression_raw_bytes_total", "", Num(s.compression_raw));
  w.Family("concord_compression_encoded_bytes_total", "counter", "Their encoded bytes.");
  w.Sample("concord_compression_encoded_bytes_total", "", Num(s.compression_encoded));
  w.Family("concord_stall_warnings_total", "counter", "Stall warnings logged.");
  w.Sample("concord_stall_warnings_total", "", Num(s.stall_warnings));
  w.Family("concord_errors_total", "counter", "Operations completed with an error, by status.");
  for (const auto& [code, n] : s.errors)
    w.Sample("concord_errors_total", Label("code", code), Num(n));
  if (!s.stragglers.last.empty()) {
    w.Family("concord_straggler_operations_total", "counter",
             "Operations whose arrivals rank 0 attributed.");
    w.Sample("concord_straggler_operations_total", "", Num(s.stragglers.operations));
    w.Family("concord_straggler_last_total", "counter", "Operations each rank arrived last for.");
    for (size_t r = 0; r < s.stragglers.last.size(); ++r) {
      w.Sample("concord_straggler_last_total", Label("straggler", std::to_string(r)),
               Num(s.stragglers.last[r]));
    }
    w.Family("concord_straggler_wait_seconds_total", "counter",
             "Seconds the other ranks waited for each rank (union of overlapping waits).");
    for (size_t r = 0; r < s.stragglers.waited_s.size(); ++r) {
      w.Sample("concord_straggler_wait_seconds_total", Label("straggler", std::to_string(r)),
               Num(s.stragglers.waited_s[r]));
    }
  }
  return w.Take();
}

std::string MetricsToSummary(const Metrics::Snapshot& s, const MetricsContext& c) {
  Metrics::OpTotals all;
  for (const auto& [op, t] : ByOp(s)) {
    all.count += t.count;
    all.bytes += t.bytes;
    all.errors += t.errors;
    all.negotiation_s += t.negotiation_s;
    all.execution_s += t.execution_s;
    all.callback_s += t.callback_s;
  }
  // The busiest lane's time in collectives: lanes run theirs concurrently, so a sum over lanes
  // could exceed the wall time.
  std::map<int, double> by_lane;
  for (const auto& [key, t] : s.collectives) by_lane[std::get<0>(key)] += t.seconds;
  double collective_s = 0.0;
  for (const auto& [lane, seconds] : by_lane) collective_s = std::max(collective_s, seconds);
  std::string out = "# concord end-of-job summary (key value); tools/run_summary.h reads it\n";
  out += "rank " + std::to_string(c.rank) + "\nhost " + (c.host.empty() ? "-" : c.host) +
         "\nwall_s " + Num(s.uptime_s) + "\nops " + Num(all.count) + "\nbytes " + Num(all.bytes) +
         "\nerrors " + Num(all.errors) + "\ncollective_s " + Num(collective_s) +
         "\nphase negotiation " + Num(all.negotiation_s) + "\nphase execution " +
         Num(all.execution_s) + "\nphase callback " + Num(all.callback_s) + "\n";
  for (size_t r = 0; r < s.stragglers.last.size(); ++r) {
    out += "straggler " + std::to_string(r) + " " +
           Num(Ratio(static_cast<double>(s.stragglers.last[r]),
                     static_cast<double>(s.stragglers.operations))) +
           " " + Num(s.stragglers.waited_s[r]) + "\n";
  }
  return out;
}

}  // namespace concord
