// concordrun's end-of-job summary: where each rank's time went, from the file each rank's engine
// writes at finalize into the directory concordrun names in CONCORD_SUMMARY_DIR.
//
// The file, <CONCORD_SUMMARY_DIR>/rank-<R>.txt, is text: one "key value..." per line, fields
// separated by spaces or tabs; "#" starts a comment (to the end of the line); blank lines,
// comments and unknown keys are ignored, so that either side may grow. Keys:
//   rank R                  required; R must be the rank the file is named after
//   host NAME               optional
//   wall_s S                required; seconds from init to finalize
//   ops N                   required; operations completed
//   bytes N                 required; tensor bytes of the completed operations
//   errors N                required; operations completed with an error
//   collective_s S          required; time inside backend collectives (the busiest lane's)
//   phase NAME S            any number; seconds summed over the operations spent in phase NAME
//                           (negotiation, queued, pack, collective, unpack, callback, or any
//                           other name); a name given twice adds up
//   straggler R SHARE S     rank 0's file only, any number: rank R arrived last in SHARE (0..1)
//                           of the cycles, and the others waited S seconds for it in total
// Numbers are decimal (integers for ops, bytes, errors and ranks), finite and not negative. A file
// with a required key missing or a value that does not parse is reported as a bad file (its
// reason shown), never half-read. The writer should write a temporary name in the directory and
// rename it to rank-<R>.txt, so that a rank killed while writing leaves no half file.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "base/status.h"

namespace concord {

struct PhaseTime {
  std::string name;
  double seconds = 0;
};

struct StragglerShare {
  int rank = 0;
  double share = 0;   // of the cycles it arrived last, 0..1
  double wait_s = 0;  // the others' wait for it, in total
};

// One rank's summary file, parsed. Value type.
struct RankSummary {
  int rank = -1;
  std::string host;
  double wall_s = 0;
  uint64_t ops = 0;
  uint64_t bytes = 0;
  uint64_t errors = 0;
  double collective_s = 0;
  std::vector<PhaseTime> phases;  // in the order of their first lines
  std::vector<StragglerShare> stragglers;
};

// What concordrun knows of one rank at the end of the job: its summary, or why there is none.
struct RankReport {
  int rank = 0;
  std::optional<RankSummary> summary;
  std::string missing;  // e.g. "no summary (rank exited before finalize?)"
};

// Parses one file's text as the comment above says; kInvalidArgument naming the line otherwise.
StatusOr<RankSummary> ParseRankSummary(const std::string& text);

// Reads <dir>/rank-<rank>.txt. Never fails: a missing file is reported as
// "no summary (rank exited before finalize?)", an unreadable or bad one with its reason.
RankReport ReadRankReport(const std::string& dir, int rank);

// The summary table for the whole job (reports in rank order), lines ending in '\n', at most
// about 30 lines whatever the job's size: one line per rank up to 24 ranks; above, the 10 ranks
// with the most time in collectives, then how many more there are and which wrote no summary.
// Rank 0's straggler lines give each rank's "last" share; the top straggler gets its own line
// when it arrived last in at least half the cycles and in at least 1.5/size of them (what an
// even spread gives, times 1.5: 75% at 2 ranks; core/straggler.h uses the same bar), and the
// others waited for it at least 5% of rank 0's wall time (a rank last by microseconds in every
// cycle is no straggler). "" when no
// rank wrote a summary (a program that does not use Concord).
std::string FormatJobSummary(const std::vector<RankReport>& reports);

// FormatJobSummary of a job of remote_hosts.size() ranks that wrote into dir; remote_hosts[r]
// names the host of rank r when it ran on another host (it had no CONCORD_SUMMARY_DIR), else "".
std::string SummarizeJob(const std::string& dir, const std::vector<std::string>& remote_hosts);

// Creates a fresh private directory (mode 0700) under $TMPDIR, else /tmp, for the ranks' files.
StatusOr<std::string> MakeSummaryDir();
// Removes the files in dir and dir itself (not recursing: the ranks write only files).
Status RemoveSummaryDir(const std::string& dir);

}  // namespace concord
