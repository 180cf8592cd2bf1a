// The timeline recorder and writer (core/timeline.h) on its own: what a file holds and in which
// order, fused batches with their members, names escaped, and its errors: a path that cannot be
// opened, a second start, a write that fails later (the disk is full: /dev/full).
#include "core/timeline.h"

#include <gtest/gtest.h>
#include <unistd.h>

#include <chrono>
#include <fstream>
#include <sstream>
#include <string>
#include <vector>

#include "base/json.h"

namespace concord {
namespace {

using std::chrono::microseconds;

std::string Read(const std::string& path) {
  std::ifstream in(path);
  std::stringstream s;
  s << in.rdbuf();
  return s.str();
}

std::string TempPath(const std::string& name) {
  return ::testing::TempDir() + "/timeline_test_" + std::to_string(::getpid()) + "_" + name;
}

// An operation's phases at these offsets (microseconds) from t0.
TensorPhases At(Clock::time_point t0, int enqueued, int negotiated, int started, int completed,
                int called_back, int32_t last_rank = -1, uint32_t last_wait_us = 0) {
  TensorPhases p;
  p.enqueued = t0 + microseconds(enqueued);
  p.negotiated = t0 + microseconds(negotiated);
  p.started = t0 + microseconds(started);
  p.completed = t0 + microseconds(completed);
  p.called_back = t0 + microseconds(called_back);
  p.last_rank = last_rank;
  p.last_wait_us = last_wait_us;
  return p;
}

// Where `needle` first occurs in `text`; fails the test when it does not.
size_t Find(const std::string& text, const std::string& needle) {
  const size_t at = text.find(needle);
  EXPECT_NE(at, std::string::npos) << "no " << needle << " in\n" << text;
  return at;
}

TEST(TimelineTest, WritesPhasesInOrderAndBatchMembers) {
  std::vector<std::string> warnings;
  Timeline t(1, 2, [&](const std::string& m) { warnings.push_back(m); });
  const std::string base = TempPath("order");
  auto file = OpenTimelineFile(base, 1, "CONCORD_TIMELINE");
  ASSERT_TRUE(file.ok()) << file.status().ToString();
  EXPECT_EQ(file->path, base + ".rank1");
  // Enqueued before the start (taken before it: a slow run may spend milliseconds in Start).
  const auto before_start = Clock::now() - microseconds(1);
  ASSERT_TRUE(t.Start(std::move(*file)).ok());
  EXPECT_TRUE(t.on());
  const auto t0 = Clock::now();
  // Rank 0 arrived last, 7 us after this rank: the negotiation says so.
  t.Tensor("grad \"a\"", "allreduce", 400, At(t0, 0, 10, 12, 30, 31, 0, 7));
  t.Slice(Timeline::kLaneTrack + 1, "fused allreduce", t0 + microseconds(12), t0 + microseconds(29),
          400, nullptr, "\"members\":[" + JsonQuote("grad \"a\"") + "," + JsonQuote("b") + "]");
  t.Slice(Timeline::kLaneTrack + 1, "allreduce", t0 + microseconds(14), t0 + microseconds(20), 512,
          "gloo");
  // The same op again: its execute carries no args (unchanged); another size: they come back.
  // This rank was last itself: no last_rank.
  t.Tensor("grad \"a\"", "allreduce", 400, At(t0, 40, 41, 41, 42, 43, 1, 9));
  t.Tensor("grad \"a\"", "allreduce", 800, At(t0, 50, 51, 51, 52, 53));
  // A callback under a microsecond is not written.
  t.Tensor("quick", "allreduce", 4, At(t0, 60, 61, 61, 62, 62));
  TensorPhases early = At(t0, 0, 0, 0, 0, 0);
  early.enqueued = before_start;
  t.Tensor("before", "allreduce", 4, early);
  t.Stop();
  EXPECT_FALSE(t.on());
  t.Tensor("after", "allreduce", 4, At(t0, 0, 0, 0, 0, 0));  // after the stop: nothing
  EXPECT_TRUE(warnings.empty());

  const std::string text = Read(base + ".rank1");
  EXPECT_EQ(text.rfind("{\"traceEvents\":[\n", 0), 0u);
  EXPECT_EQ(text.substr(text.size() - 4), "\n]}\n");
  Find(text,
       "\"name\":\"process_name\",\"args\":{\"name\":\"rank 1\",\"concord_rank\":1,"
       "\"concord_size\":2,\"concord_start_us\":");
  // The tensor's track is named once, escaped; its phases follow in order.
  const size_t named = Find(text,
                            "\"tid\":100,\"name\":\"thread_name\",\"args\":{\"name\":"
                            "\"grad \\\"a\\\"\"}}");
  const size_t negotiate = Find(text, "\"tid\":100,\"ts\":");
  EXPECT_LT(named, negotiate);
  const size_t negotiated = Find(text,
                                 "\"dur\":10.0,\"name\":\"negotiate\",\"args\":{"
                                 "\"last_rank\":0,\"last_wait_us\":7}}");
  EXPECT_LT(negotiate, negotiated);
  const size_t queued = Find(text, "\"dur\":2.0,\"name\":\"queued\"}");
  EXPECT_LT(negotiated, queued);
  const size_t execute = Find(text,
                              "\"dur\":18.0,\"name\":\"execute\",\"args\":{\"op\":"
                              "\"allreduce\",\"bytes\":400}}");
  EXPECT_LT(queued, execute);
  Find(text, "\"dur\":1.0,\"name\":\"negotiate\"}");  // last itself
  EXPECT_EQ(text.find("\"last_rank\":1"), std::string::npos);
  const size_t callback = Find(text, "\"dur\":1.0,\"name\":\"callback\"}");
  EXPECT_LT(execute, callback);
  Find(text, "\"tid\":2,\"name\":\"thread_name\",\"args\":{\"name\":\"lane 1\"}}");
  Find(text,
       "\"name\":\"fused allreduce\",\"args\":{\"bytes\":400,\"members\":[\"grad \\\"a\\\"\","
       "\"b\"]}}");
  Find(text, "\"name\":\"allreduce\",\"args\":{\"backend\":\"gloo\",\"bytes\":512}}");
  const size_t again = Find(text, "\"dur\":1.0,\"name\":\"execute\"}");
  const size_t resized = Find(text,
                              "\"dur\":1.0,\"name\":\"execute\",\"args\":{"
                              "\"op\":\"allreduce\",\"bytes\":800}}");
  EXPECT_LT(again, resized);
  Find(text, "\"tid\":101,\"name\":\"thread_name\",\"args\":{\"name\":\"quick\"}}");
  size_t callbacks = 0;
  for (size_t at = text.find("\"callback\""); at != std::string::npos;
       at = text.find("\"callback\"", at + 1)) {
    ++callbacks;
  }
  EXPECT_EQ(callbacks, 3u);  // grad "a"'s, not quick's
  EXPECT_EQ(text.find("before"), std::string::npos);
  EXPECT_EQ(text.find("after"), std::string::npos);
  std::remove((base + ".rank1").c_str());
}

TEST(TimelineTest, StartErrorsNameThePathAndTheReason) {
  auto missing = OpenTimelineFile("/nonexistent-dir/t.json", 0, "CONCORD_TIMELINE");
  ASSERT_FALSE(missing.ok());
  EXPECT_EQ(missing.status().code(), Code::kInvalidArgument);
  EXPECT_NE(missing.status().message().find("CONCORD_TIMELINE = /nonexistent-dir/t.json"),
            std::string::npos)
      << missing.status().message();
  EXPECT_NE(missing.status().message().find("/nonexistent-dir/t.json.rank0: No such file or "
                                            "directory (errno 2)"),
            std::string::npos)
      << missing.status().message();

  Timeline t(0, 1, [](const std::string&) {});
  const std::string base = TempPath("twice");
  auto first = OpenTimelineFile(base, 0, "timeline");
  auto second = OpenTimelineFile(base + "b", 0, "timeline");
  ASSERT_TRUE(first.ok() && second.ok());
  ASSERT_TRUE(t.Start(std::move(*first)).ok());
  const Status again = t.Start(std::move(*second));
  EXPECT_EQ(again.code(), Code::kInvalidArgument);
  EXPECT_NE(again.message().find("already being written to " + base + ".rank0"), std::string::npos)
      << again.message();
  t.Stop();
  t.Stop();  // a second stop: nothing to do
  std::remove((base + ".rank0").c_str());
  std::remove((base + "b.rank0").c_str());
}

// A disk that fills up while the timeline runs: one warning, the timeline turns itself off, and
// recording goes on costing nothing.
TEST(TimelineTest, AFailedWriteWarnsAndTurnsItOff) {
  const std::string base = TempPath("full");
  ASSERT_EQ(::symlink("/dev/full", (base + ".rank0").c_str()), 0);
  std::vector<std::string> warnings;
  Timeline t(0, 1, [&](const std::string& m) { warnings.push_back(m); });
  auto file = OpenTimelineFile(base, 0, "timeline");
  ASSERT_TRUE(file.ok()) << file.status().ToString();
  ASSERT_TRUE(t.Start(std::move(*file)).ok());
  const auto t0 = Clock::now();
  // Until the writer thread (every 100 ms) finds the disk full.
  for (int i = 0; i < 400 && t.on(); ++i) {
    t.Tensor("x", "allreduce", 4, At(t0, 0, 0, 0, 0, 0));
    std::this_thread::sleep_for(std::chrono::milliseconds(5));
  }
  EXPECT_FALSE(t.on());
  t.Tensor("x", "allreduce", 4, At(t0, 0, 0, 0, 0, 0));  // off: nothing
  t.Stop();  // joins the writer thread (which warned); already closed: no second warning
  ASSERT_EQ(warnings.size(), 1u);
  EXPECT_NE(warnings[0].find("timeline: writing " + base +
                             ".rank0 failed: No space left on device;"
                             " the timeline is off, training goes on"),
            std::string::npos)
      << warnings[0];
  std::remove((base + ".rank0").c_str());
}

}  // namespace
}  // namespace concord
