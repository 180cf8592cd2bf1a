#include "core/metrics.h"

#include <gtest/gtest.h>

#include <cstdlib>
#include <memory>
#include <set>
#include <sstream>
#include <string>

#include "base/json.h"
#include "core/metered_backend.h"
#include "core/metrics_render.h"
#include "tests/common/comma_locale.h"
#include "tools/run_summary.h"

namespace concord {
namespace {

TEST(LatencyHistogramTest, ASampleOnABoundCountsInThatBucket) {
  LatencyHistogram h;
  h.Add(50e-6);   // == the first bound
  h.Add(51e-6);   // the second bucket
  h.Add(0.0);     // the first
  h.Add(10.0);    // == the last bound
  h.Add(3600.0);  // beyond: +Inf
  EXPECT_EQ(h.counts[0], 2u);
  EXPECT_EQ(h.counts[1], 1u);
  EXPECT_EQ(h.counts[LatencyHistogram::kBounds.size() - 1], 1u);
  EXPECT_EQ(h.counts[LatencyHistogram::kBounds.size()], 1u);
  EXPECT_EQ(h.count, 5u);
  EXPECT_DOUBLE_EQ(h.sum, 50e-6 + 51e-6 + 10.0 + 3600.0);
}

TEST(SizeBucketTest, BoundsAreInclusive) {
  EXPECT_EQ(SizeBucket(0), 0u);
  EXPECT_EQ(SizeBucket(4096), 0u);
  EXPECT_EQ(SizeBucket(4097), 1u);
  EXPECT_EQ(SizeBucket(uint64_t{16} << 20), 3u);
  EXPECT_EQ(SizeBucket((uint64_t{16} << 20) + 1), 4u);
  EXPECT_EQ(SizeBucketLabel(0), "4096");
  EXPECT_EQ(SizeBucketLabel(4), "+Inf");
}

OpSample Sample(const char* op, uint64_t bytes, Code code = Code::kOk) {
  OpSample s;
  s.op = op;
  s.dtype = DType::kFloat32;
  s.bytes = bytes;
  s.wire_bytes = bytes / 2;
  s.code = code;
  s.negotiation_s = 0.001;
  s.execution_s = 0.002;
  s.callback_s = 0.0005;
  return s;
}

TEST(MetricsTest, OperationsAddUpAndErrorsStayOutOfTheHistograms) {
  Metrics m;
  m.RecordOp(Sample("allreduce", 1000));
  m.RecordOp(Sample("allreduce", 1 << 20));
  m.RecordOp(Sample("allreduce", 8, Code::kMismatch));
  m.RecordOp(Sample("allgather", 0));
  const Metrics::Snapshot s = m.Take();
  const Metrics::OpTotals& ar = s.ops.at(Metrics::OpKey("allreduce", DType::kFloat32));
  EXPECT_EQ(ar.count, 3u);
  EXPECT_EQ(ar.bytes, 1000u + (1u << 20) + 8u);
  EXPECT_EQ(ar.wire_bytes, 500u + (1u << 19) + 4u);
  EXPECT_EQ(ar.errors, 1u);
  EXPECT_DOUBLE_EQ(ar.negotiation_s, 0.003);
  EXPECT_EQ(s.errors.at("MISMATCH"), 1u);
  EXPECT_EQ(s.latency.at(Metrics::SizedKey("allreduce", 0)).count, 1u);
  EXPECT_EQ(s.latency.at(Metrics::SizedKey("allreduce", 2)).count, 1u);
  EXPECT_EQ(s.latency.at(Metrics::SizedKey("allgather", 0)).count, 1u);
  EXPECT_EQ(s.latency.size(), 3u);
  EXPECT_GT(s.uptime_s, 0.0);
}

// A backend whose collectives succeed, or fail with a backend error when told.
class ScriptedBackend : public Backend {
 public:
  bool fail = false;
  const char* name() const override { return "scripted"; }
  int rank() const override { return 0; }
  int size() const override { return 2; }
  Status Allreduce(void*, size_t, DType, ReduceOp) override { return Result(); }
  Status Allgatherv(const void*, void*, const std::vector<size_t>&) override { return Result(); }
  Status Broadcast(void*, size_t, int) override { return Result(); }
  Status Barrier() override { return Result(); }
  Status ReduceScatter(const void*, void*, const std::vector<size_t>&, DType, ReduceOp) override {
    return Result();
  }
  Status Alltoallv(const void*, const std::vector<size_t>&, void*,
                   const std::vector<size_t>&) override {
    return Result();
  }

 private:
  Status Result() const { return fail ? Status(Code::kBackendError, "scripted") : Status::Ok(); }
};

TEST(MeteredBackendTest, RecordsEachCallsBytesUnderItsLaneAndOp) {
  auto metrics = std::make_shared<Metrics>();
  auto scripted = std::make_unique<ScriptedBackend>();
  ScriptedBackend* inner = scripted.get();
  MeteredBackend b(std::move(scripted), 1, metrics, std::make_shared<Timeline>(0, 1, nullptr));
  EXPECT_STREQ(b.name(), "scripted");
  EXPECT_TRUE(b.Allreduce(nullptr, 10, DType::kFloat64, ReduceOp::kSum).ok());
  EXPECT_TRUE(b.AllreduceSpans({{nullptr, 3}, {nullptr, 5}}, DType::kInt32, ReduceOp::kSum).ok());
  EXPECT_TRUE(b.Allgatherv(nullptr, nullptr, {1, 2, 3}).ok());
  EXPECT_TRUE(b.ReduceScatter(nullptr, nullptr, {4, 4}, DType::kFloat16, ReduceOp::kSum).ok());
  EXPECT_TRUE(b.Alltoallv(nullptr, {7, 9}, nullptr, {1, 1}).ok());
  EXPECT_TRUE(b.Broadcast(nullptr, 11, 0).ok());
  EXPECT_TRUE(b.Barrier().ok());
  inner->fail = true;
  EXPECT_EQ(b.Broadcast(nullptr, 5, 0).code(), Code::kBackendError);  // passed through
  const Metrics::Snapshot s = metrics->Take();
  auto at = [&s](const char* op) { return s.collectives.at(Metrics::LaneKey(1, "scripted", op)); };
  EXPECT_EQ(at("allreduce").count, 2u);
  EXPECT_EQ(at("allreduce").bytes, 80u + 32u);
  EXPECT_EQ(at("allgather").bytes, 6u);
  EXPECT_EQ(at("reducescatter").bytes, 16u);
  EXPECT_EQ(at("alltoall").bytes, 16u);
  EXPECT_EQ(at("broadcast").count, 2u);
  EXPECT_EQ(at("broadcast").bytes, 16u);
  EXPECT_EQ(at("broadcast").errors, 1u);
  EXPECT_EQ(at("barrier").count, 1u);
  uint64_t histogram_count = 0;
  for (const auto& [key, h] : s.collective_latency) histogram_count += h.count;
  EXPECT_EQ(histogram_count, 7u);  // the failed call is not in the histograms
}

MetricsContext Context(int rank, int size) {
  MetricsContext c;
  c.rank = rank;
  c.size = size;
  c.host = "node \"a\"\n";
  c.counters = {{"responses_cached", 3},
                {"responses_full", 1},
                {"scratch_bytes", 4096, EngineFigure::Kind::kGauge}};
  return c;
}

TEST(MetricsRenderTest, TheSummaryIsWhatConcordrunReads) {
  Metrics m;
  m.RecordOp(Sample("allreduce", 1000));
  m.RecordOp(Sample("allreduce", 24, Code::kTimeout));
  m.RecordCollective(0, "gloo", "allreduce", 1000, 0.25, true);
  m.RecordCollective(1, "gloo", "allreduce", 1000, 0.5, true);
  StragglerTotals st;
  st.operations = 4;
  st.last = {1, 3};
  st.waited_s = {0.0, 1.5};
  m.SetStragglers(st);
  StatusOr<RankSummary> parsed = ParseRankSummary(MetricsToSummary(m.Take(), Context(0, 2)));
  ASSERT_TRUE(parsed.ok()) << parsed.status().ToString();
  EXPECT_EQ(parsed->rank, 0);
  EXPECT_EQ(parsed->ops, 2u);
  EXPECT_EQ(parsed->bytes, 1024u);
  EXPECT_EQ(parsed->errors, 1u);
  EXPECT_DOUBLE_EQ(parsed->collective_s, 0.5);  // the busiest lane: lanes overlap
  ASSERT_EQ(parsed->phases.size(), 3u);
  EXPECT_EQ(parsed->phases[0].name, "negotiation");
  EXPECT_DOUBLE_EQ(parsed->phases[0].seconds, 0.002);
  ASSERT_EQ(parsed->stragglers.size(), 2u);
  EXPECT_EQ(parsed->stragglers[1].rank, 1);
  EXPECT_DOUBLE_EQ(parsed->stragglers[1].share, 0.75);
  EXPECT_DOUBLE_EQ(parsed->stragglers[1].wait_s, 1.5);
}

TEST(MetricsRenderTest, JsonEscapesTextAndPrometheusLabelsEverySeries) {
  Metrics m;
  m.RecordOp(Sample("broadcast", 10));
  const std::string json = MetricsToJson(m.Take(), Context(1, 2));
  EXPECT_NE(json.find("\"host\":\"node \\\"a\\\"\\u000a\""), std::string::npos) << json;
  EXPECT_NE(json.find("\"cache_hit_rate\":0.75"), std::string::npos) << json;
  EXPECT_NE(json.find("\"stragglers\":{\"operations\":0,\"ranks\":[]}"), std::string::npos);
  const std::string page = MetricsToPrometheus(m.Take(), Context(1, 2));
  EXPECT_NE(
      page.find("concord_operations_total{rank=\"1\",op=\"broadcast\",dtype=\"float32\"} 1\n"),
      std::string::npos)
      << page;
  EXPECT_NE(page.find("concord_engine_responses_cached_total{rank=\"1\"} 3\n"), std::string::npos);
  EXPECT_NE(page.find("concord_operation_latency_seconds_bucket{rank=\"1\",op=\"broadcast\","
                      "size_bucket=\"4096\",le=\"+Inf\"} 1\n"),
            std::string::npos);
  EXPECT_EQ(page.find("straggler"), std::string::npos);  // not rank 0: no straggler series
}

// The engine's figures in the JSON's counters by their concord_stats_t names; in Prometheus a
// counter as a _total counter, a gauge (bytes held now) as a gauge without _total (before: every
// figure a counter, and the memory gauges not exported at all).
TEST(MetricsRenderTest, EngineGaugesAreGaugesAndCountersCounters) {
  Metrics m;
  const std::string json = MetricsToJson(m.Take(), Context(1, 2));
  EXPECT_NE(json.find("\"counters\":{\"responses_cached\":3,\"responses_full\":1,"
                      "\"scratch_bytes\":4096}"),
            std::string::npos)
      << json;
  const std::string page = MetricsToPrometheus(m.Take(), Context(1, 2));
  EXPECT_NE(page.find("# TYPE concord_engine_responses_cached_total counter\n"
                      "concord_engine_responses_cached_total{rank=\"1\"} 3\n"),
            std::string::npos)
      << page;
  EXPECT_NE(page.find("# HELP concord_engine_scratch_bytes Engine gauge scratch_bytes "
                      "(concord_stats_t).\n# TYPE concord_engine_scratch_bytes gauge\n"
                      "concord_engine_scratch_bytes{rank=\"1\"} 4096\n"),
            std::string::npos)
      << page;
  EXPECT_EQ(page.find("scratch_bytes_total"), std::string::npos) << page;
}

bool IsMetricName(const std::string& name) {
  if (name.empty() || (name[0] >= '0' && name[0] <= '9')) return false;
  for (const char c : name) {
    if (!((c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') || c == '_' ||
          c == ':')) {
      return false;
    }
  }
  return true;
}

// The first way `page` breaks the exposition format 0.0.4 as Prometheus reads it, "" for none:
// valid UTF-8; per line `# HELP name text` (text escaping only \\ and \n), `# TYPE name type`
// or a sample `name{label="value",...} number`, label values escaping only \\, \" and \n; each
// family's HELP and TYPE once and before its samples, which follow it together (a histogram's as
// its _bucket, _sum and _count).
std::string ExpositionProblem(const std::string& page) {
  for (size_t i = 0, n = 0; i < page.size(); i += n) {
    n = Utf8SequenceLength(page, i);
    if (n == 0) return "not UTF-8 at byte " + std::to_string(i);
  }
  if (page.empty() || page.back() != '\n') return "no line feed at the end";
  std::set<std::string> families;
  std::string family, type;
  std::istringstream in(page);
  for (std::string line; std::getline(in, line);) {
    const std::string where = " in: " + line;
    if (line.rfind("# HELP ", 0) == 0) {
      const std::string rest = line.substr(7);
      const std::string name = rest.substr(0, rest.find(' '));
      if (!IsMetricName(name)) return "a bad name" + where;
      if (!families.insert(name).second) return "a second HELP" + where;
      for (size_t k = name.size(); k < rest.size(); ++k) {
        if (rest[k] == '\\' && (k + 1 == rest.size() || (rest[++k] != '\\' && rest[k] != 'n'))) {
          return "a bad escape in HELP" + where;
        }
      }
      family = name;
      type.clear();
      continue;
    }
    if (line.rfind("# TYPE ", 0) == 0) {
      std::istringstream words(line.substr(7));
      std::string name;
      words >> name >> type;
      if (name != family) return "a TYPE not after its HELP" + where;
      if (type != "counter" && type != "gauge" && type != "histogram") return "a bad type" + where;
      continue;
    }
    if (line.empty() || line[0] == '#') return "a stray line" + where;
    const size_t brace = line.find('{');
    if (brace == std::string::npos) return "no labels" + where;
    const std::string name = line.substr(0, brace);
    const bool ours =
        name == family ||
        (type == "histogram" &&
         (name == family + "_bucket" || name == family + "_sum" || name == family + "_count"));
    if (!IsMetricName(name) || type.empty() || !ours) return "a sample outside its family" + where;
    size_t k = brace + 1;
    for (;;) {
      const size_t eq = line.find('=', k);
      if (eq == std::string::npos || !IsMetricName(line.substr(k, eq - k))) {
        return "a bad label name" + where;
      }
      if (eq + 1 >= line.size() || line[eq + 1] != '"') return "an unquoted label value" + where;
      for (k = eq + 2; k < line.size() && line[k] != '"'; ++k) {
        if (line[k] != '\\') continue;
        if (++k == line.size() || (line[k] != '\\' && line[k] != '"' && line[k] != 'n')) {
          return "a bad escape in a label value" + where;
        }
      }
      if (k + 1 >= line.size()) return "an unterminated label value" + where;
      if (line[k + 1] == '}') break;
      if (line[k + 1] != ',') return "a bad label separator" + where;
      k += 2;
    }
    if (k + 2 >= line.size() || line[k + 2] != ' ') return "no value" + where;
    const std::string value = line.substr(k + 3);
    char* end = nullptr;
    std::strtod(value.c_str(), &end);
    if (value.empty() || *end != '\0') return "a bad value" + where;
  }
  return "";
}

TEST(MetricsRenderTest, PrometheusTextFollowsTheExpositionFormatWhateverTheNames) {
  const std::string hostile = "a\"b\\c\nd\te\xff";
  Metrics::Snapshot s;
  s.ops[Metrics::OpKey(hostile, DType::kFloat32)].count = 1;
  s.latency[Metrics::SizedKey(hostile, 0)].Add(0.001);
  s.collectives[Metrics::LaneKey(0, hostile, hostile)].count = 1;
  s.collective_latency[Metrics::LaneSizedKey(0, hostile, 4)].Add(1.0);
  s.errors[hostile] = 2;
  s.stragglers = StragglerTotals{3, {1, 2}, {0.5, 1.5}};
  MetricsContext c = Context(0, 2);
  c.counters.push_back({"bad name\n\\", 7});
  const std::string page = MetricsToPrometheus(s, c);
  EXPECT_EQ(ExpositionProblem(page), "") << page;
  // Escaped as the format says (a tab as it is, a byte that is not UTF-8 as U+FFFD).
  EXPECT_NE(page.find("concord_operations_total{rank=\"0\",op=\"a\\\"b\\\\c\\nd\te\xef\xbf\xbd\","),
            std::string::npos)
      << page;
  EXPECT_NE(page.find("# HELP concord_engine_bad_name___total Engine counter bad name\\n\\\\ "
                      "(concord_stats_t).\n# TYPE concord_engine_bad_name___total counter\n"
                      "concord_engine_bad_name___total{rank=\"0\"} 7\n"),
            std::string::npos)
      << page;
}

// An application (or Python's locale.setlocale(locale.LC_ALL, "")) may set a locale whose numbers
// have a decimal comma: the JSON, the Prometheus text and the summary still write "0.75". They used
// to write "0,75", which splits a JSON member and which neither Prometheus nor concordrun reads.
TEST(MetricsRenderTest, NumbersAreWrittenInTheCLocaleWhateverTheApplicationSet) {
  Metrics::Snapshot s;
  s.uptime_s = 1.5;
  Metrics::OpTotals& op = s.ops[Metrics::OpKey("allreduce", DType::kFloat32)];
  op.count = 1;
  op.negotiation_s = 0.25;
  s.latency[Metrics::SizedKey("allreduce", 0)].Add(0.001);
  s.stragglers = StragglerTotals{4, {1, 3}, {0.0, 1.5}};
  std::string json, page, summary;
  {
    const harness::CommaLocale comma;
    if (!comma.active()) GTEST_SKIP() << comma.why();
    json = MetricsToJson(s, Context(0, 2));
    page = MetricsToPrometheus(s, Context(0, 2));
    summary = MetricsToSummary(s, Context(0, 2));
  }
  for (const char* part : {"\"uptime_s\":1.5,", "\"cache_hit_rate\":0.75,",
                           "\"negotiation_s\":0.25,", "\"buckets\":[[5e-05,0],[0.0001,0],",
                           "{\"rank\":1,\"last\":3,\"share\":0.75,\"waited_s\":1.5}"}) {
    EXPECT_NE(json.find(part), std::string::npos) << part << " is not in " << json;
  }
  EXPECT_EQ(ExpositionProblem(page), "") << page;
  for (const char* part :
       {"concord_uptime_seconds{rank=\"0\"} 1.5\n", "concord_cache_hit_ratio{rank=\"0\"} 0.75\n",
        "size_bucket=\"4096\",le=\"0.0025\"} 1\n",
        "concord_straggler_wait_seconds_total{rank=\"0\",straggler=\"1\"} 1.5\n"}) {
    EXPECT_NE(page.find(part), std::string::npos) << part << " is not in " << page;
  }
  StatusOr<RankSummary> parsed = ParseRankSummary(summary);  // concordrun's C locale
  ASSERT_TRUE(parsed.ok()) << parsed.status().ToString() << " in " << summary;
  EXPECT_EQ(parsed->wall_s, 1.5);
  ASSERT_EQ(parsed->phases.size(), 3u);
  EXPECT_EQ(parsed->phases[0].seconds, 0.25);
  ASSERT_EQ(parsed->stragglers.size(), 2u);
  EXPECT_EQ(parsed->stragglers[1].share, 0.75);
  EXPECT_EQ(parsed->stragglers[1].wait_s, 1.5);
}

}  // namespace
}  // namespace concord
