#include "tools/run_summary.h"

#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <stdlib.h>
#include <unistd.h>

#include <algorithm>
#include <charconv>
#include <climits>
#include <cmath>
#include <cstdarg>
#include <cstdio>
#include <cstdlib>
#include <map>
#include <sstream>
#include <system_error>

#include "base/c_locale.h"

namespace concord {
namespace {

// A summary file larger than this is not one the engine wrote.
constexpr size_t kMaxFileBytes = 1 << 20;
// Up to this many ranks, one line each; above, the kTopRanks with the most time in collectives.
constexpr size_t kMaxRankLines = 24;
constexpr size_t kTopRanks = 10;
// How long the list of ranks without a summary may grow in a large job's summary.
constexpr size_t kMaxRankList = 60;

const char kNoSummary[] = "no summary (rank exited before finalize?)";

std::vector<std::string> Words(const std::string& line) {
  std::vector<std::string> words;
  std::istringstream in(line);
  std::string w;
  while (in >> w) words.push_back(w);
  return words;
}

// A decimal number ("0.5", "1e-3") whatever the application's LC_NUMERIC: std::from_chars ignores
// it, where strtod under de_DE would stop at the '.' of "0.5".
bool ParseSeconds(const std::string& text, double* value) {
  double v = 0;
  const char* end = text.data() + text.size();
  const std::from_chars_result r = std::from_chars(text.data(), end, v);
  if (r.ec != std::errc() || r.ptr != end || !std::isfinite(v) || v < 0) return false;
  *value = v;
  return true;
}

bool ParseCount(const std::string& text, uint64_t* value) {
  if (text.empty() || text.size() > 20 ||
      text.find_first_not_of("0123456789") != std::string::npos) {
    return false;
  }
  errno = 0;
  const unsigned long long v = std::strtoull(text.c_str(), nullptr, 10);
  if (errno == ERANGE) return false;
  *value = v;
  return true;
}

bool ParseRank(const std::string& text, int* rank) {
  uint64_t v = 0;
  if (!ParseCount(text, &v) || v > static_cast<uint64_t>(INT_MAX)) return false;
  *rank = static_cast<int>(v);
  return true;
}

// "98.8 MB", "1.23 GB" (decimal units, three significant digits), "512 B". A value that rounds to
// 1000 of a unit is written in the next ("1 MB", never "1e+03 KB").
std::string HumanBytes(uint64_t bytes) {
  static const char* const kUnits[] = {"B", "KB", "MB", "GB", "TB", "PB"};
  constexpr size_t kLastUnit = sizeof(kUnits) / sizeof(kUnits[0]) - 1;
  double v = static_cast<double>(bytes);
  char number[32];
  for (size_t unit = 0;; ++unit) {
    std::snprintf(number, sizeof(number), unit == 0 ? "%.0f" : "%.3g", v);
    if (unit == kLastUnit || std::strtod(number, nullptr) < 1000) {
      return std::string(number) + " " + kUnits[unit];
    }
    v /= 1000;
  }
}

std::string Format(const char* format, ...) __attribute__((format(printf, 1, 2)));
std::string Format(const char* format, ...) {
  char buf[512];
  va_list args;
  va_start(args, format);
  std::vsnprintf(buf, sizeof(buf), format, args);
  va_end(args);
  return buf;
}

// A time per operation: "0.971 ms", "20 ms", "1.5 s" (three significant digits, or whole seconds
// from 1000 s on; never "1e+03 ms").
std::string PerOp(double seconds) {
  const std::string ms = Format("%.3g", seconds * 1000);
  if (std::strtod(ms.c_str(), nullptr) < 1000) return ms + " ms";
  const std::string s = Format("%.3g", seconds);
  return (std::strtod(s.c_str(), nullptr) < 1000 ? s : Format("%.0f", seconds)) + " s";
}

std::string Percent(double share) {
  return Format("%.0f%%", share * 100);
}

// "3, 17-20, 31" (ranks ascending), cut with ", ..." past kMaxRankList characters.
std::string RankList(const std::vector<int>& ranks) {
  std::string out;
  for (size_t i = 0; i < ranks.size();) {
    size_t j = i;
    while (j + 1 < ranks.size() && ranks[j + 1] == ranks[j] + 1) ++j;
    std::string item = std::to_string(ranks[i]);
    if (j > i) item += "-" + std::to_string(ranks[j]);
    if (!out.empty() && out.size() + item.size() > kMaxRankList) return out + ", ...";
    out += (out.empty() ? "" : ", ") + item;
    i = j + 1;
  }
  return out;
}

// The table's columns; the header and every rank's line use it.
#define CONCORD_ROW_FORMAT "%5s %-14.14s %7s %8s %7s %9s %9s %6s  %-22.22s %4s\n"

// A host name without its domain ("gpu-3" for "gpu-3.cluster.example.com"); addresses whole.
std::string ShortHost(const std::string& host) {
  if (host.empty()) return "?";
  if (host.find_first_not_of("0123456789.") == std::string::npos) return host;
  return host.substr(0, host.find('.'));
}

// One rank's line; `last` is its straggler share as text ("-" when unknown).
std::string RankLine(const RankReport& r, const std::string& last) {
  if (!r.summary) return Format("%5d %s\n", r.rank, r.missing.c_str());
  const RankSummary& s = *r.summary;
  const PhaseTime* slowest = nullptr;
  for (const PhaseTime& p : s.phases) {
    if (slowest == nullptr || p.seconds > slowest->seconds) slowest = &p;
  }
  std::string phase = "-";
  if (slowest != nullptr) {
    phase = slowest->name.substr(0, 14) + " ";
    phase += s.ops == 0 ? "-" : PerOp(slowest->seconds / static_cast<double>(s.ops));
  }
  const std::string of_wall =
      s.wall_s > 0 ? Format("%.1f%%", 100 * s.collective_s / s.wall_s) : std::string("-");
  return Format(CONCORD_ROW_FORMAT, std::to_string(r.rank).c_str(), ShortHost(s.host).c_str(),
                Format("%.1f", s.wall_s).c_str(), Format("%.2f", s.collective_s).c_str(),
                of_wall.c_str(), HumanBytes(s.bytes).c_str(), std::to_string(s.ops).c_str(),
                std::to_string(s.errors).c_str(), phase.c_str(), last.c_str());
}

}  // namespace

StatusOr<RankSummary> ParseRankSummary(const std::string& text) {
  RankSummary s;
  std::map<std::string, bool> seen = {{"rank", false},  {"wall_s", false}, {"ops", false},
                                      {"bytes", false}, {"errors", false}, {"collective_s", false}};
  std::istringstream in(text);
  std::string line;
  for (int number = 1; std::getline(in, line); ++number) {
    const std::vector<std::string> w = Words(line.substr(0, line.find('#')));
    if (w.empty()) continue;
    const std::string& key = w[0];
    const std::string where = "line " + std::to_string(number) + " ('" + key + "')";
    const auto need = [&](size_t fields) {
      return w.size() > fields ? Status::Ok()
                               : InvalidArgument(where + ": needs " + std::to_string(fields) +
                                                 (fields == 1 ? " value" : " values"));
    };
    bool good = true;
    if (key == "rank") {
      CONCORD_RETURN_IF_ERROR(need(1));
      good = ParseRank(w[1], &s.rank);
    } else if (key == "host") {
      CONCORD_RETURN_IF_ERROR(need(1));
      s.host = w[1];
    } else if (key == "wall_s" || key == "collective_s") {
      CONCORD_RETURN_IF_ERROR(need(1));
      good = ParseSeconds(w[1], key == "wall_s" ? &s.wall_s : &s.collective_s);
    } else if (key == "ops" || key == "bytes" || key == "errors") {
      CONCORD_RETURN_IF_ERROR(need(1));
      good = ParseCount(w[1], key == "ops" ? &s.ops : key == "bytes" ? &s.bytes : &s.errors);
    } else if (key == "phase") {
      CONCORD_RETURN_IF_ERROR(need(2));
      double seconds = 0;
      good = ParseSeconds(w[2], &seconds);
      auto it = std::find_if(s.phases.begin(), s.phases.end(),
                             [&](const PhaseTime& p) { return p.name == w[1]; });
      if (it == s.phases.end()) {
        s.phases.push_back({w[1], seconds});
      } else {
        it->seconds += seconds;
      }
    } else if (key == "straggler") {
      CONCORD_RETURN_IF_ERROR(need(3));
      StragglerShare st;
      good = ParseRank(w[1], &st.rank) && ParseSeconds(w[2], &st.share) && st.share <= 1 &&
             ParseSeconds(w[3], &st.wait_s);
      s.stragglers.push_back(st);
    } else {
      continue;  // a key of a newer engine
    }
    if (!good) return InvalidArgument(where + ": bad value in '" + line + "'");
    if (seen.count(key) != 0) seen[key] = true;
  }
  for (const auto& [key, present] : seen) {
    if (!present) return InvalidArgument("no '" + key + "' line");
  }
  return s;
}

RankReport ReadRankReport(const std::string& dir, int rank) {
  RankReport r;
  r.rank = rank;
  const std::string path = dir + "/rank-" + std::to_string(rank) + ".txt";
  const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) {
    r.missing = errno == ENOENT
                    ? kNoSummary
                    : "cannot read " + path + ": " + ErrnoError("open", errno).message();
    return r;
  }
  std::string text;
  char buf[65536];
  ssize_t n = 0;
  while (text.size() <= kMaxFileBytes && (n = ::read(fd, buf, sizeof(buf))) != 0) {
    if (n < 0) {
      if (errno == EINTR) continue;
      break;
    }
    text.append(buf, static_cast<size_t>(n));
  }
  const int read_errno = n < 0 ? errno : 0;
  ::close(fd);
  if (read_errno != 0) {
    r.missing = "cannot read " + path + ": " + ErrnoError("read", read_errno).message();
  } else if (text.size() > kMaxFileBytes) {
    r.missing = "bad summary file " + path + ": over 1 MiB";
  } else {
    StatusOr<RankSummary> s = ParseRankSummary(text);
    if (!s.ok()) {
      r.missing = "bad summary file " + path + ": " + s.status().message();
    } else if (s->rank != rank) {
      r.missing = "bad summary file " + path + ": it says rank " + std::to_string(s->rank);
    } else {
      r.summary = std::move(s.value());
    }
  }
  return r;
}

std::string FormatJobSummary(const std::vector<RankReport>& reports) {
  const ScopedCLocale c_locale;  // "12.5", not "12,5", whatever the application's LC_NUMERIC
  size_t with_summary = 0;
  uint64_t ops = 0;
  uint64_t bytes = 0;
  uint64_t errors = 0;
  std::map<int, StragglerShare> shares;  // from rank 0's file
  std::map<int, std::string> hosts;
  double wall0 = 0.0;  // rank 0's wall time
  for (const RankReport& r : reports) {
    if (!r.summary) continue;
    ++with_summary;
    ops += r.summary->ops;
    bytes += r.summary->bytes;
    errors += r.summary->errors;
    hosts[r.rank] = r.summary->host;
    if (r.rank == 0) {
      wall0 = r.summary->wall_s;
      for (const StragglerShare& s : r.summary->stragglers) shares[s.rank] = s;
    }
  }
  if (with_summary == 0) return "";
  // Without rank 0's straggler lines nothing is known; with them, a rank without a line was
  // never last.
  const auto last = [&](int rank) -> std::string {
    if (shares.empty()) return "-";
    const auto it = shares.find(rank);
    return it == shares.end() ? "0%" : Percent(it->second.share);
  };
  std::string out = Format(
      "concordrun: job summary: %zu ranks, %zu with a summary: %s moved in %llu operations, "
      "%llu with errors\n",
      reports.size(), with_summary, HumanBytes(bytes).c_str(), static_cast<unsigned long long>(ops),
      static_cast<unsigned long long>(errors));
  out += Format(CONCORD_ROW_FORMAT, "rank", "host", "wall s", "coll s", "of wall", "moved", "ops",
                "errors", "slowest phase, per op", "last");
  if (reports.size() <= kMaxRankLines) {
    for (const RankReport& r : reports) out += RankLine(r, last(r.rank));
  } else {
    std::vector<const RankReport*> shown;
    std::vector<int> missing;
    for (const RankReport& r : reports) {
      if (r.summary) {
        shown.push_back(&r);
      } else {
        missing.push_back(r.rank);
      }
    }
    std::sort(shown.begin(), shown.end(), [](const RankReport* a, const RankReport* b) {
      if (a->summary->collective_s != b->summary->collective_s) {
        return a->summary->collective_s > b->summary->collective_s;
      }
      return a->rank < b->rank;
    });
    const size_t more = shown.size() > kTopRanks ? shown.size() - kTopRanks : 0;
    double least = 0;
    double most = 0;
    if (more > 0) {
      most = shown[kTopRanks]->summary->collective_s;
      least = shown.back()->summary->collective_s;
      shown.resize(kTopRanks);
    }
    std::sort(shown.begin(), shown.end(),
              [](const RankReport* a, const RankReport* b) { return a->rank < b->rank; });
    for (const RankReport* r : shown) out += RankLine(*r, last(r->rank));
    if (more > 0) {
      out += Format("  ... %zu more ranks with a summary, %.2f-%.2f s in collectives each\n", more,
                    least, most);
    }
    if (!missing.empty()) {
      std::sort(missing.begin(), missing.end());
      const RankReport* first = nullptr;
      for (const RankReport& r : reports) {
        if (r.rank == missing[0]) first = &r;
      }
      out += Format("  %zu ranks wrote no summary (%s); rank %d: %s\n", missing.size(),
                    RankList(missing).c_str(), missing[0],
                    first != nullptr ? first->missing.c_str() : kNoSummary);
    }
  }
  if (!shares.empty() && reports.size() >= 2) {
    const StragglerShare* top = nullptr;
    for (const auto& [rank, s] : shares) {
      if (top == nullptr || s.share > top->share) top = &s;
    }
    const double bar = std::max(0.5, 1.5 / static_cast<double>(reports.size()));
    // And the wait was worth it: at least 5% of the job, as the straggler report's rule.
    if (top->share >= bar && top->wait_s >= 0.05 * wall0) {
      const auto host = hosts.find(top->rank);
      const std::string where =
          host != hosts.end() && !host->second.empty() ? " (" + host->second + ")" : "";
      // Short jobs wait milliseconds: "0.0 s" would hide them.
      const std::string waited =
          top->wait_s >= 1.0 ? Format("%.1f s", top->wait_s) : Format("%.0f ms", top->wait_s * 1e3);
      out += Format(
          "top straggler: rank %d%s arrived last in %s of the cycles; the others waited %s for "
          "it in total\n",
          top->rank, where.c_str(), Percent(top->share).c_str(), waited.c_str());
    }
  }
  return out;
}

std::string SummarizeJob(const std::string& dir, const std::vector<std::string>& remote_hosts) {
  std::vector<RankReport> reports;
  for (size_t r = 0; r < remote_hosts.size(); ++r) {
    if (remote_hosts[r].empty()) {
      reports.push_back(ReadRankReport(dir, static_cast<int>(r)));
    } else {
      RankReport report;
      report.rank = static_cast<int>(r);
      report.missing = "no summary (on " + remote_hosts[r] + ": only local ranks write one)";
      reports.push_back(std::move(report));
    }
  }
  return FormatJobSummary(reports);
}

StatusOr<std::string> MakeSummaryDir() {
  const char* tmp = std::getenv("TMPDIR");
  std::string path = (tmp != nullptr && *tmp != '\0' ? std::string(tmp) : "/tmp");
  path += "/concordrun-XXXXXX";
  if (::mkdtemp(&path[0]) == nullptr) return ErrnoError("mkdtemp " + path, errno);
  return path;
}

Status RemoveSummaryDir(const std::string& dir) {
  DIR* d = ::opendir(dir.c_str());
  if (d == nullptr) return ErrnoError("opendir " + dir, errno);
  Status status;
  while (const dirent* e = ::readdir(d)) {
    const std::string name = e->d_name;
    if (name == "." || name == "..") continue;
    if (::unlinkat(::dirfd(d), name.c_str(), 0) != 0 && status.ok()) {
      status = ErrnoError("unlink " + dir + "/" + name, errno);
    }
  }
  ::closedir(d);
  if (::rmdir(dir.c_str()) != 0 && status.ok()) status = ErrnoError("rmdir " + dir, errno);
  return status;
}

#undef CONCORD_ROW_FORMAT

}  // namespace concord
