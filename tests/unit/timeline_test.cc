// The timeline recorder and writer (core/timeline.h) on its own: what a file holds and in which
// order, fused batches with their members, names escaped (JsonQuote: valid UTF-8 whatever the
// bytes), the files' names (a sub-communicator's apart from the world's), events dropped past the
// queue's limit, and its errors: a path that cannot be opened, or that another timeline writes, a
// FIFO without a reader, a second start, a write that fails later (the disk is full: /dev/full)
// and a start after it, a clock offset that is not finite.
#include "core/timeline.h"

#include <fcntl.h>
#include <gtest/gtest.h>
#include <sys/stat.h>
#include <unistd.h>

#include <chrono>
#include <cmath>
#include <cstdio>
#include <fstream>
#include <future>
#include <map>
#include <memory>
#include <regex>
#include <sstream>
#include <string>
#include <vector>

#include "base/json.h"
#include "core/metrics.h"
#include "core/request_state.h"
#include "tests/common/comma_locale.h"

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

// A FIFO that no process reads is refused at once (opening it for writing would block init until a
// reader came); one that a process reads is written as a file is.
TEST(TimelineTest, AFifoWithoutAReaderIsRefusedNotWaitedFor) {
  const std::string base = TempPath("fifo");
  const std::string fifo = base + ".rank0";
  ASSERT_EQ(::mkfifo(fifo.c_str(), 0600), 0);
  auto opening =
      std::async(std::launch::async, [&] { return OpenTimelineFile(base, 0, "timeline"); });
  if (opening.wait_for(std::chrono::seconds(2)) != std::future_status::ready) {
    const int reader = ::open(fifo.c_str(), O_RDONLY | O_NONBLOCK);  // lets the open return
    opening.wait();
    ::close(reader);
    std::remove(fifo.c_str());
    FAIL() << "opening a FIFO without a reader blocked";
  }
  auto refused = opening.get();
  ASSERT_FALSE(refused.ok());
  EXPECT_EQ(refused.status().code(), Code::kInvalidArgument);
  EXPECT_NE(refused.status().message().find(fifo + ": a FIFO that no process reads"),
            std::string::npos)
      << refused.status().message();

  const int reader = ::open(fifo.c_str(), O_RDONLY | O_NONBLOCK);
  ASSERT_GE(reader, 0);
  auto file = OpenTimelineFile(base, 0, "timeline");
  ASSERT_TRUE(file.ok()) << file.status().ToString();
  Timeline t(0, 1, [](const std::string& m) { ADD_FAILURE() << m; });
  ASSERT_TRUE(t.Start(std::move(*file)).ok());
  t.Stop();
  char buf[4096];
  const ssize_t n = ::read(reader, buf, sizeof(buf));
  ::close(reader);
  std::remove(fifo.c_str());
  ASSERT_GT(n, 0);
  const std::string text(buf, static_cast<size_t>(n));
  EXPECT_EQ(text.rfind("{\"traceEvents\":[\n", 0), 0u) << text;
  EXPECT_EQ(text.substr(text.size() - 4), "\n]}\n");
}

// A clock offset that is not a finite number is left out: "nan" would make the file invalid JSON.
TEST(TimelineTest, AClockOffsetThatIsNotFiniteIsNotWritten) {
  const std::string base = TempPath("nan_clock");
  for (const ClockOffset clock : {ClockOffset{std::nan(""), 1.0}, ClockOffset{1.0, HUGE_VAL}}) {
    auto file = OpenTimelineFile(base, 0, "timeline");
    ASSERT_TRUE(file.ok()) << file.status().ToString();
    Timeline t(0, 2, [](const std::string& m) { ADD_FAILURE() << m; });
    ASSERT_TRUE(t.Start(std::move(*file), clock).ok());
    t.Stop();
    const std::string text = Read(base + ".rank0");
    EXPECT_EQ(text.find("concord_clock"), std::string::npos) << text;
    Find(text, "\"concord_size\":2,\"concord_start_us\":");
  }
  std::remove((base + ".rank0").c_str());
}

// An application (or Python's locale.setlocale(locale.LC_ALL, "")) may set a locale whose numbers
// have a decimal comma: the clock offset is still written "12.500". It used to be written
// "12,500", which made the file invalid JSON (a number, then a stray member).
TEST(TimelineTest, TheClockOffsetIsWrittenInTheCLocaleWhateverTheApplicationSet) {
  const std::string base = TempPath("comma_clock");
  {
    const harness::CommaLocale comma;
    if (!comma.active()) GTEST_SKIP() << comma.why();
    auto file = OpenTimelineFile(base, 0, "timeline");
    ASSERT_TRUE(file.ok()) << file.status().ToString();
    Timeline t(0, 2, [](const std::string& m) { ADD_FAILURE() << m; });
    ASSERT_TRUE(t.Start(std::move(*file), ClockOffset{12.5, 0.25}).ok());
    t.Stop();
  }
  const std::string text = Read(base + ".rank0");
  Find(text, ",\"concord_clock_offset_us\":12.500,\"concord_clock_error_us\":0.250}");
  std::remove((base + ".rank0").c_str());
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

// Events dropped before a write that fails are told in a warning too (the count was only told at
// a stop, which a timeline that turned itself off never reaches).
TEST(TimelineTest, AFailedWriteTellsWhatWasDroppedBeforeIt) {
  const std::string base = TempPath("full_dropped");
  ASSERT_EQ(::symlink("/dev/full", (base + ".rank0").c_str()), 0);
  std::vector<std::string> warnings;
  Timeline t(
      0, 1, [&](const std::string& m) { warnings.push_back(m); }, /*max_pending=*/6);
  auto file = OpenTimelineFile(base, 0, "timeline");
  ASSERT_TRUE(file.ok()) << file.status().ToString();
  const auto started = Clock::now();
  ASSERT_TRUE(t.Start(std::move(*file)).ok());
  const auto t0 = Clock::now();
  t.Tensor("first", "allreduce", 4, At(t0, 0, 1, 2, 3, 3));            // a name and 3 phases
  t.Slice(Timeline::kEngineTrack, "cycle", t0, t0 + microseconds(1));  // a name and the slice
  t.Tensor("second", "allreduce", 8, At(t0, 4, 5, 6, 7, 7));           // 4 dropped
  if (Clock::now() - started >= std::chrono::milliseconds(90)) {
    t.Stop();
    std::remove((base + ".rank0").c_str());
    GTEST_SKIP() << "this machine took 90 ms to queue 10 events: the writer may have run between";
  }
  for (int i = 0; i < 400 && t.on(); ++i) std::this_thread::sleep_for(std::chrono::milliseconds(5));
  EXPECT_FALSE(t.on());
  t.Stop();
  ASSERT_EQ(warnings.size(), 2u);
  EXPECT_NE(warnings[0].find("timeline: 4 events were dropped"), std::string::npos) << warnings[0];
  EXPECT_NE(warnings[1].find("No space left on device"), std::string::npos) << warnings[1];
  std::remove((base + ".rank0").c_str());
}

// A timeline that turned itself off after a failed write can be followed by another, which works
// (the failed one's writer thread had returned unjoined: starting another terminated the process).
TEST(TimelineTest, StartsAgainAfterAFailedWrite) {
  const std::string full = TempPath("full_again");
  const std::string good = TempPath("good_again");
  ASSERT_EQ(::symlink("/dev/full", (full + ".rank0").c_str()), 0);
  std::vector<std::string> warnings;
  Timeline t(0, 1, [&](const std::string& m) { warnings.push_back(m); });
  auto file = OpenTimelineFile(full, 0, "timeline");
  ASSERT_TRUE(file.ok()) << file.status().ToString();
  ASSERT_TRUE(t.Start(std::move(*file)).ok());
  const auto t0 = Clock::now();
  for (int i = 0; i < 400 && t.on(); ++i) {
    t.Tensor("x", "allreduce", 4, At(t0, 0, 0, 0, 0, 0));
    std::this_thread::sleep_for(std::chrono::milliseconds(5));
  }
  ASSERT_FALSE(t.on());
  auto again = OpenTimelineFile(good, 0, "timeline");
  ASSERT_TRUE(again.ok()) << again.status().ToString();
  ASSERT_TRUE(t.Start(std::move(*again)).ok());
  EXPECT_TRUE(t.on());
  const auto t1 = Clock::now();
  t.Tensor("y", "allreduce", 4, At(t1, 0, 1, 2, 3, 3));
  t.Stop();
  ASSERT_EQ(warnings.size(), 1u);  // the first timeline's failure only
  const std::string text = Read(good + ".rank0");
  EXPECT_EQ(text.rfind("{\"traceEvents\":[\n", 0), 0u);
  EXPECT_EQ(text.substr(text.size() - 4), "\n]}\n");
  Find(text, "\"tid\":100,\"name\":\"thread_name\",\"args\":{\"name\":\"y\"}}");
  Find(text, "\"dur\":1.0,\"name\":\"execute\",\"args\":{\"op\":\"allreduce\",\"bytes\":4}}");
  std::remove((full + ".rank0").c_str());
  std::remove((good + ".rank0").c_str());
}

// Names are any bytes (a tensor's, a host's): the JSON text keeps well-formed UTF-8 as it is and
// replaces every other byte with U+FFFD, so that a file stays valid JSON (which is UTF-8).
TEST(JsonQuoteTest, KeepsUtf8AndReplacesEveryInvalidByte) {
  EXPECT_EQ(JsonQuote("q\"b\\n\n\x01"), "\"q\\\"b\\\\n\\u000a\\u0001\"");
  // 2, 3 and 4 bytes, DEL, and the highest of each length.
  const std::string valid =
      "utf8 \xc3\xa9 \xe2\x82\xac \xf0\x9f\x98\x80 \x7f \xdf\xbf \xef\xbf\xbf "
      "\xf4\x8f\xbf\xbf";
  EXPECT_EQ(JsonQuote(valid), "\"" + valid + "\"");
  const std::string r = "\xef\xbf\xbd";  // U+FFFD
  EXPECT_EQ(JsonQuote("bad\xff\xfe!"), "\"bad" + r + r + "!\"");
  EXPECT_EQ(JsonQuote("\x80"), "\"" + r + "\"");                          // a lone continuation
  EXPECT_EQ(JsonQuote("\xc0\xaf"), "\"" + r + r + "\"");                  // overlong '/'
  EXPECT_EQ(JsonQuote("\xe0\x80\xaf"), "\"" + r + r + r + "\"");          // overlong '/'
  EXPECT_EQ(JsonQuote("\xf0\x80\x80\xaf"), "\"" + r + r + r + r + "\"");  // overlong '/'
  EXPECT_EQ(JsonQuote("\xed\xa0\x80"), "\"" + r + r + r + "\"");          // a surrogate
  EXPECT_EQ(JsonQuote("\xf4\x90\x80\x80"), "\"" + r + r + r + r + "\"");  // past U+10FFFF
  EXPECT_EQ(JsonQuote("\xe2\x82"), "\"" + r + r + "\"");                  // cut short at the end
  EXPECT_EQ(JsonQuote("\xe2\x82x"), "\"" + r + r + "x\"");                // cut short
  EXPECT_EQ(JsonQuote("a\xc3\"b"), "\"a" + r + "\\\"b\"");                // cut short by a quote
}

// Each communicator's rank writes its own file: a sub-communicator's ranks, whose numbers repeat
// those of the world and of the other sub-communicators, write under a name of their communicator
// (its membership); a file another timeline writes is refused, and left whole.
TEST(TimelineTest, FilesAreNamedPerCommunicatorAndNeverShared) {
  const std::string base = TempPath("names");
  const std::string a =
      "sub-communicator (split 0, color 0) of 1 ranks: its ranks 0..0 are parent "
      "ranks 0";
  const std::string b =
      "sub-communicator (split 0, color 1) of 1 ranks: its ranks 0..0 are parent "
      "ranks 1";
  EXPECT_EQ(TimelineFileName(base, 3, ""), base + ".rank3");
  const std::string name_a = TimelineFileName(base, 0, a);
  EXPECT_EQ(name_a, TimelineFileName(base, 0, a));  // alike on every member
  EXPECT_EQ(name_a.rfind(base + ".comm", 0), 0u) << name_a;
  EXPECT_EQ(name_a.size(), base.size() + std::string(".comm12345678.rank0").size()) << name_a;
  EXPECT_EQ(TimelineFileName(base, 1, a), name_a.substr(0, name_a.size() - 1) + "1");
  EXPECT_NE(TimelineFileName(base, 0, b), name_a);

  Timeline world(0, 2, [](const std::string&) {});
  Timeline sub(0, 1, [](const std::string&) {});
  auto world_file = OpenTimelineFile(base, 0, "timeline");
  auto sub_file = OpenTimelineFile(base, 0, "timeline", a);
  ASSERT_TRUE(world_file.ok() && sub_file.ok());
  EXPECT_EQ(sub_file->path, name_a);
  ASSERT_TRUE(world.Start(std::move(*world_file)).ok());
  ASSERT_TRUE(sub.Start(std::move(*sub_file)).ok());
  const auto t0 = Clock::now();
  world.Tensor("w", "allreduce", 4, At(t0, 0, 1, 2, 3, 3));
  sub.Tensor("s", "allreduce", 4, At(t0, 0, 1, 2, 3, 3));
  // The same file again (as a second process given the same name would): refused, nothing lost.
  auto shared = OpenTimelineFile(base, 0, "timeline", a);
  ASSERT_FALSE(shared.ok());
  EXPECT_EQ(shared.status().code(), Code::kInvalidArgument);
  EXPECT_NE(shared.status().message().find("timeline = " + base +
                                           ": cannot write the timeline "
                                           "file " +
                                           name_a + ": another timeline is writing it"),
            std::string::npos)
      << shared.status().message();
  world.Stop();
  sub.Stop();
  const std::string world_text = Read(base + ".rank0");
  const std::string sub_text = Read(name_a);
  Find(world_text, "\"args\":{\"name\":\"w\"}}");
  EXPECT_EQ(world_text.find("concord_communicator"), std::string::npos);
  Find(sub_text, "\"concord_size\":1,");
  Find(sub_text, "\"concord_communicator\":\"" + a + "\"}}");
  Find(sub_text, "\"args\":{\"name\":\"s\"}}");
  EXPECT_EQ(sub_text.substr(sub_text.size() - 4), "\n]}\n");
  // Once closed, the file can be written again (truncated: a new trace).
  auto reopened = OpenTimelineFile(base, 0, "timeline", a);
  ASSERT_TRUE(reopened.ok()) << reopened.status().ToString();
  reopened->file.reset();
  EXPECT_EQ(Read(name_a), "");
  std::remove((base + ".rank0").c_str());
  std::remove(name_a.c_str());
}

// Events past the queue's limit are dropped; a track whose name was among them is named with its
// next event (not left nameless for the rest of the trace), and an execute whose op and bytes
// were dropped has them written on its tensor's next.
TEST(TimelineTest, ATrackWhoseNameWasDroppedIsNamedWithItsNextEvent) {
  std::vector<std::string> warnings;
  Timeline t(
      0, 1, [&](const std::string& m) { warnings.push_back(m); }, /*max_pending=*/6);
  const std::string base = TempPath("dropped");
  auto file = OpenTimelineFile(base, 0, "timeline");
  ASSERT_TRUE(file.ok()) << file.status().ToString();
  const auto started = Clock::now();
  ASSERT_TRUE(t.Start(std::move(*file)).ok());
  const auto t0 = Clock::now();
  // Before the writer's first write (100 ms after the start): the queue holds 6 events.
  t.Tensor("first", "allreduce", 4, At(t0, 0, 1, 2, 3, 3));  // its track's name and 3 phases
  t.Slice(Timeline::kEngineTrack, "cycle", t0, t0 + microseconds(1));  // the track's name and it
  t.Tensor("second", "allreduce", 8, At(t0, 4, 5, 6, 7, 7));           // dropped, name and phases
  t.Slice(Timeline::kLaneTrack, "allreduce", t0, t0 + microseconds(1), 8, "gloo");  // dropped
  if (Clock::now() - started >= std::chrono::milliseconds(90)) {
    t.Stop();
    std::remove((base + ".rank0").c_str());
    GTEST_SKIP() << "this machine took 90 ms to queue 12 events: the writer may have run between";
  }
  // Until the writer has taken the queue (and written it).
  for (int i = 0; i < 1000 && Read(base + ".rank0").find("\"cycle\"") == std::string::npos; ++i) {
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
  t.Tensor("second", "allreduce", 8, At(t0, 10, 11, 12, 13, 13));
  t.Slice(Timeline::kLaneTrack, "allreduce", t0 + microseconds(10), t0 + microseconds(11), 8,
          "gloo");
  t.Stop();
  ASSERT_EQ(warnings.size(), 1u);
  EXPECT_NE(warnings[0].find("timeline: 6 events were dropped"), std::string::npos) << warnings[0];
  const std::string text = Read(base + ".rank0");
  Find(text, "\"tid\":101,\"name\":\"thread_name\",\"args\":{\"name\":\"second\"}}");
  // Its second operation's phases only, the execute with its op and bytes.
  size_t phases = 0;
  for (size_t at = text.find("\"tid\":101,\"ts\":"); at != std::string::npos;
       at = text.find("\"tid\":101,\"ts\":", at + 1)) {
    ++phases;
  }
  EXPECT_EQ(phases, 3u) << text;
  Find(text, "\"dur\":1.0,\"name\":\"execute\",\"args\":{\"op\":\"allreduce\",\"bytes\":8}}");
  Find(text, "\"tid\":1,\"name\":\"thread_name\",\"args\":{\"name\":\"lane 0\"}}");
  std::remove((base + ".rank0").c_str());
}

// A recv that takes the sender's shape is metered with 0 bytes until it completes: its execute
// carries the bytes it received, as the metrics do (it recorded 0).
TEST(TimelineTest, ARecvOfTheSendersShapeRecordsTheBytesItReceived) {
  const std::string base = TempPath("recv");
  auto file = OpenTimelineFile(base, 0, "timeline");
  ASSERT_TRUE(file.ok()) << file.status().ToString();
  auto t = std::make_shared<Timeline>(0, 2, [](const std::string& m) { ADD_FAILURE() << m; });
  ASSERT_TRUE(t->Start(std::move(*file)).ok());
  auto metrics = std::make_shared<Metrics>();
  RequestState recv;
  recv.Meter(metrics, "recv", DType::kUint8, 0, Clock::now(), /*from_output=*/true);
  recv.Trace(t, "from rank 1");
  recv.output().bytes = 24;
  recv.output().dtype = DType::kFloat32;
  recv.Complete(Status::Ok());
  t->Stop();
  const std::string text = Read(base + ".rank0");
  Find(text, "\"name\":\"execute\",\"args\":{\"op\":\"recv\",\"bytes\":24}}");
  EXPECT_EQ(text.find("\"bytes\":0"), std::string::npos) << text;
  std::remove((base + ".rank0").c_str());
}

// A job whose tensor names change every step: the timeline remembers at most max_tensors of them
// (the least recently recorded is forgotten), and the trace stays valid: each track keeps one name,
// every slice's track is named, a name still in use keeps its track, and a forgotten one that
// comes back gets a new track named again.
TEST(TimelineTest, RemembersABoundedNumberOfTensorNamesAndKeepsEachTrackOneName) {
  const std::string base = TempPath("names");
  auto file = OpenTimelineFile(base, 0, "timeline");
  ASSERT_TRUE(file.ok()) << file.status().ToString();
  constexpr size_t kRemembered = 8;
  Timeline t(
      0, 1, [](const std::string& m) { ADD_FAILURE() << m; }, Timeline::kMaxPending, kRemembered);
  ASSERT_TRUE(t.Start(std::move(*file)).ok());
  const auto t0 = Clock::now();
  for (int step = 0; step < 200; ++step) {
    const int at = 10 * step;
    t.Tensor("loss", "allreduce", 4, At(t0, at, at + 1, at + 2, at + 3, at + 3));
    t.Tensor("grad.step" + std::to_string(step), "allreduce", 8,
             At(t0, at, at + 1, at + 2, at + 3, at + 3));
    ASSERT_LE(t.tensor_count(), kRemembered) << "step " << step;
  }
  EXPECT_EQ(t.tensor_count(), kRemembered);
  // grad.step0 was forgotten long ago: it comes back on a track of its own.
  t.Tensor("grad.step0", "allreduce", 8, At(t0, 3000, 3001, 3002, 3003, 3003));
  EXPECT_EQ(t.tensor_count(), kRemembered);
  t.Stop();

  const std::string text = Read(base + ".rank0");
  EXPECT_EQ(text.substr(text.size() - 4), "\n]}\n");
  std::map<int64_t, std::string> track_names;  // tid -> its thread_name
  std::map<std::string, std::vector<int64_t>> name_tracks;
  static const std::regex kName(
      R"re("tid":(\d+),"name":"thread_name","args":\{"name":"([^"]*)"\})re");
  for (auto it = std::sregex_iterator(text.begin(), text.end(), kName);
       it != std::sregex_iterator(); ++it) {
    const int64_t tid = std::stoll((*it)[1]);
    EXPECT_TRUE(track_names.emplace(tid, (*it)[2]).second) << "track " << tid << " named twice";
    name_tracks[(*it)[2]].push_back(tid);
  }
  static const std::regex kSlice(R"re("ph":"X","pid":0,"tid":(\d+),)re");
  size_t slices = 0;
  for (auto it = std::sregex_iterator(text.begin(), text.end(), kSlice);
       it != std::sregex_iterator(); ++it, ++slices) {
    EXPECT_EQ(track_names.count(std::stoll((*it)[1])), 1u) << "unnamed track " << (*it)[1];
  }
  EXPECT_EQ(slices, (200u * 2 + 1) * 3);  // negotiate, queued, execute of every operation
  EXPECT_EQ(name_tracks["loss"], std::vector<int64_t>{Timeline::kTensorTrack});
  EXPECT_EQ(name_tracks["grad.step0"],
            (std::vector<int64_t>{Timeline::kTensorTrack + 1, Timeline::kTensorTrack + 201}));
  EXPECT_EQ(name_tracks["grad.step199"], std::vector<int64_t>{Timeline::kTensorTrack + 200});
  // Each grad track's first execute carries its op and bytes, grad.step0's new one's too.
  const std::string sized = "\"name\":\"execute\",\"args\":{\"op\":\"allreduce\",\"bytes\":8}}";
  size_t with_args = 0;
  for (size_t at = text.find(sized); at != std::string::npos; at = text.find(sized, at + 1)) {
    ++with_args;
  }
  EXPECT_EQ(with_args, 201u);
  std::remove((base + ".rank0").c_str());
}

}  // namespace
}  // namespace concord
