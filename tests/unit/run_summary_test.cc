#include "tools/run_summary.h"

#include <gtest/gtest.h>
#include <sys/stat.h>

#include <fstream>
#include <sstream>
#include <string>
#include <vector>

#include "tests/common/comma_locale.h"

namespace concord {
namespace {

const char kRank0[] =
    "# written by rank 0 at finalize\n"
    "rank 0\n"
    "host node-a\n"
    "wall_s 12.5            # init to finalize\n"
    "ops 4120               # operations completed\n"
    "bytes 98765432\n"
    "errors 0\n"
    "collective_s 4.25\n"
    "phase negotiation 1.10 # seconds summed over operations\n"
    "phase pack 0.20\n"
    "\n"
    "phase collective\t4.0\n"
    "straggler 3 0.87 41.2\n"
    "straggler 1 0.05 0.4\n";

// A file with the required keys and the given extra lines.
std::string File(int rank, double collective_s, const std::string& extra = "") {
  std::ostringstream out;
  out << "rank " << rank << "\nhost node-" << rank << "\nwall_s 10\nops 100\nbytes 2000000000\n"
      << "errors 0\ncollective_s " << collective_s << "\n"
      << extra;
  return out.str();
}

RankReport Report(int rank, const std::string& text) {
  RankReport r;
  r.rank = rank;
  StatusOr<RankSummary> s = ParseRankSummary(text);
  EXPECT_TRUE(s.ok()) << s.status().ToString();
  if (s.ok()) r.summary = s.value();
  return r;
}

RankReport Missing(int rank) {
  RankReport r;
  r.rank = rank;
  r.missing = "no summary (rank exited before finalize?)";
  return r;
}

std::vector<std::string> Lines(const std::string& text) {
  std::vector<std::string> lines;
  std::istringstream in(text);
  std::string line;
  while (std::getline(in, line)) lines.push_back(line);
  return lines;
}

// The line of the table that starts with the rank number.
std::string RowOf(const std::string& table, int rank) {
  char prefix[16];
  std::snprintf(prefix, sizeof(prefix), "%5d ", rank);
  for (const std::string& line : Lines(table)) {
    if (line.rfind(prefix, 0) == 0) return line;
  }
  return "<no row for rank " + std::to_string(rank) + ">";
}

TEST(RunSummaryTest, ParsesEveryKeyIgnoringCommentsAndBlankLines) {
  StatusOr<RankSummary> s = ParseRankSummary(kRank0);
  ASSERT_TRUE(s.ok()) << s.status().ToString();
  EXPECT_EQ(s->rank, 0);
  EXPECT_EQ(s->host, "node-a");
  EXPECT_DOUBLE_EQ(s->wall_s, 12.5);
  EXPECT_EQ(s->ops, 4120u);
  EXPECT_EQ(s->bytes, 98765432u);
  EXPECT_EQ(s->errors, 0u);
  EXPECT_DOUBLE_EQ(s->collective_s, 4.25);
  ASSERT_EQ(s->phases.size(), 3u);
  EXPECT_EQ(s->phases[0].name, "negotiation");
  EXPECT_DOUBLE_EQ(s->phases[0].seconds, 1.10);
  EXPECT_EQ(s->phases[2].name, "collective");
  ASSERT_EQ(s->stragglers.size(), 2u);
  EXPECT_EQ(s->stragglers[0].rank, 3);
  EXPECT_DOUBLE_EQ(s->stragglers[0].share, 0.87);
  EXPECT_DOUBLE_EQ(s->stragglers[0].wait_s, 41.2);
}

TEST(RunSummaryTest, ToleratesUnknownKeysExtraFieldsAndRepeatedPhases) {
  StatusOr<RankSummary> s = ParseRankSummary(
      File(2, 1.5, "gpu_util 0.93\nphase pack 0.5 extra\nphase pack 0.25\nphase x.y 1e-3\n"));
  ASSERT_TRUE(s.ok()) << s.status().ToString();
  ASSERT_EQ(s->phases.size(), 2u);
  EXPECT_DOUBLE_EQ(s->phases[0].seconds, 0.75);
  EXPECT_DOUBLE_EQ(s->phases[1].seconds, 0.001);
}

TEST(RunSummaryTest, RefusesAGarbledFileNamingTheLine) {
  const struct {
    std::string text;
    std::string message;
  } cases[] = {
      {"rank 0\nwall_s 1\nbytes 0\nerrors 0\ncollective_s 0\n", "no 'ops' line"},
      {"", "no 'bytes' line"},
      {File(0, 1, "ops many\n"), "line 8 ('ops'): bad value in 'ops many'"},
      {File(0, 1, "ops -1\n"), "line 8 ('ops'): bad value in 'ops -1'"},
      {File(0, 1, "wall_s -2\n"), "line 8 ('wall_s'): bad value in 'wall_s -2'"},
      {File(0, 1, "wall_s nan\n"), "line 8 ('wall_s'): bad value in 'wall_s nan'"},
      {File(0, 1, "phase pack\n"), "line 8 ('phase'): needs 2 values"},
      {File(0, 1, "straggler 1 1.5 3\n"), "line 8 ('straggler'): bad value in 'straggler 1 1.5 3'"},
      {File(0, 1, "rank\n"), "line 8 ('rank'): needs 1 value"},
      {File(0, 1, "bytes 99999999999999999999999\n"), "line 8 ('bytes'): bad value"},
  };
  for (const auto& c : cases) {
    StatusOr<RankSummary> s = ParseRankSummary(c.text);
    ASSERT_FALSE(s.ok()) << c.text;
    EXPECT_EQ(s.status().code(), Code::kInvalidArgument);
    EXPECT_EQ(s.status().message().rfind(c.message, 0), 0u)
        << s.status().message() << " vs " << c.message;
  }
}

// The files' numbers are read, and the table's written, with a decimal point whatever LC_NUMERIC
// the application set: under de_DE strtod stopped at the '.' of "12.5" (a bad file), and the
// table would have read "12,5".
TEST(RunSummaryTest, ReadsAndWritesTheCLocalesNumbersWhateverTheApplicationSet) {
  const harness::CommaLocale comma;
  if (!comma.active()) GTEST_SKIP() << comma.why();
  StatusOr<RankSummary> s = ParseRankSummary(kRank0);
  ASSERT_TRUE(s.ok()) << s.status().ToString();
  EXPECT_DOUBLE_EQ(s->wall_s, 12.5);
  EXPECT_DOUBLE_EQ(s->collective_s, 4.25);
  ASSERT_EQ(s->phases.size(), 3u);
  EXPECT_DOUBLE_EQ(s->phases[0].seconds, 1.10);
  ASSERT_EQ(s->stragglers.size(), 2u);
  EXPECT_DOUBLE_EQ(s->stragglers[0].share, 0.87);
  EXPECT_DOUBLE_EQ(s->stragglers[0].wait_s, 41.2);
  const std::string table = FormatJobSummary(
      {Report(0, kRank0), Report(1,
                                 "rank 1\nhost node-1\nwall_s 10\nops 100\nbytes 2000000000\n"
                                 "errors 0\ncollective_s 5\nphase queued 2.5\n")});
  EXPECT_EQ(RowOf(table, 0),
            "    0 node-a            12.5     4.25   34.0%   98.8 MB      4120      0  "
            "collective 0.971 ms      0%");
  EXPECT_EQ(RowOf(table, 1),
            "    1 node-1            10.0     5.00   50.0%      2 GB       100      0  "
            "queued 25 ms             5%");
  EXPECT_NE(table.find("top straggler: rank 3 arrived last in 87% of the cycles; the others "
                       "waited 41.2 s for it in total"),
            std::string::npos)
      << table;
}

TEST(RunSummaryTest, ReadsTheFilesOfADirectoryAndRemovesIt) {
  StatusOr<std::string> dir = MakeSummaryDir();
  ASSERT_TRUE(dir.ok()) << dir.status().ToString();
  struct stat st;
  ASSERT_EQ(::stat(dir->c_str(), &st), 0);
  EXPECT_EQ(st.st_mode & 0777, 0700u);
  std::ofstream(*dir + "/rank-0.txt") << kRank0;
  std::ofstream(*dir + "/rank-1.txt") << "rank 1\nops 3\n";
  std::ofstream(*dir + "/rank-2.txt") << File(5, 1);
  std::ofstream(*dir + "/rank-4.txt.tmp") << "half";

  RankReport r0 = ReadRankReport(*dir, 0);
  ASSERT_TRUE(r0.summary.has_value()) << r0.missing;
  EXPECT_EQ(r0.summary->host, "node-a");
  RankReport r1 = ReadRankReport(*dir, 1);
  EXPECT_FALSE(r1.summary.has_value());
  EXPECT_EQ(r1.missing, "bad summary file " + *dir + "/rank-1.txt: no 'bytes' line");
  RankReport r2 = ReadRankReport(*dir, 2);
  EXPECT_FALSE(r2.summary.has_value());
  EXPECT_EQ(r2.missing, "bad summary file " + *dir + "/rank-2.txt: it says rank 5");
  RankReport r3 = ReadRankReport(*dir, 3);
  EXPECT_FALSE(r3.summary.has_value());
  EXPECT_EQ(r3.missing, "no summary (rank exited before finalize?)");

  EXPECT_TRUE(RemoveSummaryDir(*dir).ok());
  EXPECT_NE(::stat(dir->c_str(), &st), 0);
  EXPECT_FALSE(RemoveSummaryDir(*dir).ok());
}

TEST(RunSummaryTest, SummarizesAJobsDirectoryRemoteRanksWithoutFiles) {
  StatusOr<std::string> dir = MakeSummaryDir();
  ASSERT_TRUE(dir.ok()) << dir.status().ToString();
  std::ofstream(*dir + "/rank-0.txt") << File(0, 1);
  // Rank 1 runs on node-b: a file of its number here is not its own.
  std::ofstream(*dir + "/rank-1.txt") << File(1, 1);
  const std::string table = SummarizeJob(*dir, {"", "node-b", ""});
  EXPECT_EQ(RowOf(table, 0).find(" node-0 "), 5u) << table;
  EXPECT_EQ(RowOf(table, 1), "    1 no summary (on node-b: only local ranks write one)");
  EXPECT_EQ(RowOf(table, 2), "    2 no summary (rank exited before finalize?)");
  EXPECT_TRUE(RemoveSummaryDir(*dir).ok());
}

TEST(RunSummaryTest, OneLinePerRankWithRankZerosStragglerShares) {
  const std::vector<RankReport> reports = {
      Report(0, kRank0), Report(1, File(1, 5, "phase queued 2\nphase pack 0.5\n")), Missing(2),
      Report(3, File(3, 1))};
  const std::string table = FormatJobSummary(reports);
  const std::vector<std::string> lines = Lines(table);
  ASSERT_EQ(lines.size(), 7u) << table;
  EXPECT_EQ(lines[0],
            "concordrun: job summary: 4 ranks, 3 with a summary: 4.1 GB moved in 4320 "
            "operations, 0 with errors");
  EXPECT_EQ(lines[1].rfind(" rank host", 0), 0u);
  // Rank 0: the largest phase is "collective", 4 s over 4120 ops; rank 0 itself was never last.
  EXPECT_EQ(RowOf(table, 0),
            "    0 node-a            12.5     4.25   34.0%   98.8 MB      4120      0  "
            "collective 0.971 ms      0%");
  // Rank 1: "queued", 2 s over 100 ops; rank 0's file has a line for it.
  EXPECT_EQ(RowOf(table, 1),
            "    1 node-1            10.0     5.00   50.0%      2 GB       100      0  "
            "queued 20 ms             5%");
  EXPECT_EQ(RowOf(table, 2), "    2 no summary (rank exited before finalize?)");
  // No phases: "-"; straggler share from rank 0's file.
  EXPECT_EQ(RowOf(table, 3),
            "    3 node-3            10.0     1.00   10.0%      2 GB       100      0  "
            "-                       87%");
  EXPECT_EQ(lines[6],
            "top straggler: rank 3 (node-3) arrived last in 87% of the cycles; the others waited "
            "41.2 s for it in total");
}

// A value that rounds to 1000 of its unit at three significant digits is written in the next one.
TEST(RunSummaryTest, SizesAndTimesThatRoundTo1000TakeTheNextUnit) {
  // Rank 0 moved `bytes`; its slowest phase took `collective_s` over 100 operations.
  const auto row = [](uint64_t bytes, double collective_s) {
    const std::string table = FormatJobSummary(
        {Report(0, "rank 0\nhost h\nwall_s 1000\nops 100\nbytes " + std::to_string(bytes) +
                       "\nerrors 0\ncollective_s 1\nphase collective " +
                       std::to_string(collective_s) + "\n")});
    return Lines(table).at(0) + "\n" + RowOf(table, 0);
  };
  EXPECT_NE(row(999600, 1).find(" 1 MB moved in 100 operations"), std::string::npos)
      << row(999600, 1);
  EXPECT_NE(row(999600, 1).find("   1 MB       100 "), std::string::npos) << row(999600, 1);
  EXPECT_NE(row(999499, 1).find(" 999 KB       100 "), std::string::npos) << row(999499, 1);
  EXPECT_NE(row(999999999, 1).find("   1 GB       100 "), std::string::npos);
  EXPECT_NE(row(999, 1).find("  999 B       100 "), std::string::npos) << row(999, 1);
  EXPECT_NE(row(1000, 1).find("   1 KB       100 "), std::string::npos) << row(1000, 1);
  // 999.7 ms per operation: 1 s; 1500 ms: 1.5 s; 15 minutes: whole seconds.
  EXPECT_NE(row(1, 99.97).find("collective 1 s "), std::string::npos) << row(1, 99.97);
  EXPECT_NE(row(1, 150).find("collective 1.5 s "), std::string::npos) << row(1, 150);
  EXPECT_NE(row(1, 99.94).find("collective 999 ms "), std::string::npos) << row(1, 99.94);
  EXPECT_NE(row(1, 90000).find("collective 900 s "), std::string::npos) << row(1, 90000);
  EXPECT_NE(row(1, 120000).find("collective 1200 s "), std::string::npos) << row(1, 120000);
}

TEST(RunSummaryTest, WithoutStragglerLinesTheSharesAreUnknown) {
  // Rank 0's file missing: nobody knows who was last.
  const std::string table = FormatJobSummary({Missing(0), Report(1, File(1, 2))});
  EXPECT_EQ(RowOf(table, 1).substr(RowOf(table, 1).size() - 5), "    -");
  EXPECT_EQ(table.find("top straggler"), std::string::npos);
  EXPECT_EQ(FormatJobSummary({Missing(0), Missing(1)}), "");
}

TEST(RunSummaryTest, NamesATopStragglerOnlyAboveTheBar) {
  // 2 ranks: 60% is within chance (the bar is 75%); 80% is not.
  const auto two = [](double share) {
    return FormatJobSummary({Report(0, File(0, 1, "straggler 1 " + std::to_string(share) + " 3\n")),
                             Report(1, File(1, 1))});
  };
  EXPECT_EQ(two(0.6).find("top straggler"), std::string::npos);
  EXPECT_NE(two(0.8).find("top straggler: rank 1 (node-1) arrived last in 80%"), std::string::npos);
  // 4 ranks: the bar is 50%.
  std::vector<RankReport> four = {Report(0, File(0, 1, "straggler 2 0.55 3\n"))};
  for (int r = 1; r < 4; ++r) four.push_back(Report(r, File(r, 1)));
  EXPECT_NE(FormatJobSummary(four).find("top straggler: rank 2 (node-2) arrived last in 55%"),
            std::string::npos);
  four[0] = Report(0, File(0, 1, "straggler 2 0.45 3\n"));
  EXPECT_EQ(FormatJobSummary(four).find("top straggler"), std::string::npos);
  // Last every time, but the others waited under 5% of the job for it.
  four[0] = Report(0, File(0, 1, "straggler 2 1 0.01\n"));
  EXPECT_EQ(FormatJobSummary(four).find("top straggler"), std::string::npos);
}

TEST(RunSummaryTest, ALargeJobFitsOnOneScreen) {
  std::vector<RankReport> reports;
  for (int r = 0; r < 1000; ++r) {
    // Ranks 50-59 and 70 wrote nothing; rank r spent r ms per op in collectives.
    reports.push_back((r >= 50 && r < 60) || r == 70 ? Missing(r) : Report(r, File(r, r * 0.1)));
  }
  const std::string table = FormatJobSummary(reports);
  const std::vector<std::string> lines = Lines(table);
  ASSERT_EQ(lines.size(), 14u) << table;
  for (int r = 990; r < 1000; ++r) EXPECT_EQ(RowOf(table, r).find(" node-"), 5u) << r;
  EXPECT_EQ(lines[12], "  ... 979 more ranks with a summary, 0.00-98.90 s in collectives each");
  EXPECT_EQ(lines[13],
            "  11 ranks wrote no summary (50-59, 70); rank 50: no summary (rank exited before "
            "finalize?)");
  // A long list of ranks without a summary is cut.
  for (int r = 0; r < 1000; r += 2) reports[r] = Missing(r);
  const std::vector<std::string> cut = Lines(FormatJobSummary(reports));
  ASSERT_EQ(cut.size(), 14u);
  EXPECT_LT(cut[13].size(), 160u) << cut[13];
  EXPECT_NE(cut[13].find("505 ranks wrote no summary (0, 2, 4,"), std::string::npos) << cut[13];
  EXPECT_NE(cut[13].find(", ...); rank 0:"), std::string::npos) << cut[13];
}

}  // namespace
}  // namespace concord
