// soak: runs a model's training step over and over for minutes or hours and watches the process
// for growth: resident memory, open file descriptors and threads. Start it under concordrun:
//
//   concordrun -np 2 soak --minutes 30 --names static --compute-ms 200 --out /tmp/soak-{rank}.csv
//   concordrun -np 2 soak --minutes 30 --names fresh --compute-ms 200
//
// Each step is what a framework does: every gradient of the workload (default ResNet-50, 161
// float32 tensors, 102 MB) is filled (a value of its rank, step and index), its allreduce (sum,
// in place) enqueued by name in backward order, all of them waited for, then the step ended
// (concord_end_step); three elements of every result are checked against the exact sum. Then the
// program sleeps --compute-ms, standing in for forward and backward. --names static keeps the
// workload's names, so every step after the first is negotiated through the response cache;
// --names fresh appends "@<step>" to every name, so every step is new to the cache. Rank 0 decides
// when the time is up; the decision travels with each step as one more allreduce ("soak.stop",
// with the step's suffix in fresh mode), so every rank runs the same steps.
//
// Every --sample-s seconds each rank samples itself: VmRSS and Threads from /proc/self/status, the
// entries of /proc/self/fd. --out FILE writes the samples as CSV (t_s,step,rss_kb,fds,threads);
// "{rank}" in FILE becomes the rank, else ranks after 0 append ".<rank>". The public API has no
// counters; CONCORD_LOG_LEVEL=2 logs the engine's at finalize.
//
// At the end each rank prints its summary: steps/s, the time a step spends in Concord, and over the
// samples after --warmup-s: RSS min/max, its spread ((max - min) / min) and least-squares slope,
// and fds and threads first/last/min/max. Exit status: 0 when the RSS spread after warm-up is
// within --rss-tolerance percent and fds and threads did not change after warm-up; 1 when one of
// them did; 2 for a usage error or a run too short to have samples after warm-up; 3 for a wrong
// sum or a Concord error.
#include <dirent.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include "concord/concord.h"
#include "perf/workload.h"

namespace {

using Clock = std::chrono::steady_clock;

struct Options {
  double minutes = 0;  // 0: until --steps
  long steps = 0;      // 0: until --minutes
  bool fresh = false;
  int compute_ms = 0;
  double sample_s = 5;
  double warmup_s = 60;
  double rss_tolerance = 5;  // percent
  std::string out;
  std::string workload = CONCORD_DEFAULT_WORKLOAD;
};

struct Sample {
  double t = 0;  // seconds since the first step began
  long step = 0;
  long rss_kb = 0;
  long fds = 0;
  long threads = 0;
};

[[noreturn]] void Usage(const std::string& why) {
  std::fprintf(stderr,
               "soak: %s\n"
               "usage: soak [--minutes M] [--steps N] [--names static|fresh] [--compute-ms MS]\n"
               "            [--sample-s S] [--warmup-s S] [--rss-tolerance PERCENT] [--out FILE]\n"
               "            [--workload FILE]\n"
               "(at least one of --minutes and --steps; the run ends at the first reached)\n",
               why.c_str());
  std::exit(2);
}

double ParseNumber(const std::string& flag, const std::string& text, double min) {
  char* end = nullptr;
  const double v = std::strtod(text.c_str(), &end);
  if (text.empty() || *end != '\0' || !(v >= min)) {
    Usage(flag + " takes a number >= " + std::to_string(min) + ", not '" + text + "'");
  }
  return v;
}

Options ParseOptions(int argc, char** argv) {
  Options o;
  for (int i = 1; i < argc; ++i) {
    const std::string a = argv[i];
    if (i + 1 >= argc) Usage("missing value after " + a);
    const std::string v = argv[++i];
    if (a == "--minutes") {
      o.minutes = ParseNumber(a, v, 0);
    } else if (a == "--steps") {
      o.steps = static_cast<long>(ParseNumber(a, v, 0));
    } else if (a == "--names") {
      if (v != "static" && v != "fresh") Usage("--names takes static or fresh, not '" + v + "'");
      o.fresh = v == "fresh";
    } else if (a == "--compute-ms") {
      o.compute_ms = static_cast<int>(ParseNumber(a, v, 0));
    } else if (a == "--sample-s") {
      o.sample_s = ParseNumber(a, v, 0.01);
    } else if (a == "--warmup-s") {
      o.warmup_s = ParseNumber(a, v, 0);
    } else if (a == "--rss-tolerance") {
      o.rss_tolerance = ParseNumber(a, v, 0);
    } else if (a == "--out") {
      o.out = v;
    } else if (a == "--workload") {
      o.workload = v;
    } else {
      Usage("unknown option " + a);
    }
  }
  if (o.minutes <= 0 && o.steps <= 0) Usage("give --minutes or --steps");
  return o;
}

// VmRSS (kB) and Threads from /proc/self/status, and the number of open descriptors.
Sample SampleSelf(double t, long step) {
  Sample s;
  s.t = t;
  s.step = step;
  std::ifstream status("/proc/self/status");
  std::string line;
  while (std::getline(status, line)) {
    if (line.rfind("VmRSS:", 0) == 0) s.rss_kb = std::atol(line.c_str() + 6);
    if (line.rfind("Threads:", 0) == 0) s.threads = std::atol(line.c_str() + 8);
  }
  if (DIR* dir = opendir("/proc/self/fd")) {
    while (const dirent* e = readdir(dir)) {
      if (e->d_name[0] != '.') ++s.fds;
    }
    closedir(dir);
    --s.fds;  // the directory's own descriptor
  }
  return s;
}

// Each open descriptor and what it is ("3 socket:[1234]"), for a report of which one came or went.
std::string FdListing() {
  std::string listing;
  if (DIR* dir = opendir("/proc/self/fd")) {
    const int own = dirfd(dir);
    while (const dirent* e = readdir(dir)) {
      if (e->d_name[0] == '.' || std::atoi(e->d_name) == own) continue;
      char target[256] = {0};
      const std::string path = std::string("/proc/self/fd/") + e->d_name;
      const ssize_t n = readlink(path.c_str(), target, sizeof(target) - 1);
      listing += std::string(listing.empty() ? "" : ", ") + e->d_name + " " +
                 (n > 0 ? std::string(target, static_cast<size_t>(n)) : "?");
    }
    closedir(dir);
  }
  return listing;
}

// The descriptors at the first sample after the warm-up, and at the first later sample that
// counted another number of them: what a failed soak says changed.
struct FdChange {
  std::string at_warmup, changed;
  double changed_t = 0;
};

std::string OutPath(const std::string& pattern, int rank) {
  const size_t at = pattern.find("{rank}");
  if (at != std::string::npos) {
    return pattern.substr(0, at) + std::to_string(rank) + pattern.substr(at + 6);
  }
  return rank == 0 ? pattern : pattern + "." + std::to_string(rank);
}

// Least-squares slope of y over x (per unit of x); 0 with fewer than two distinct x.
double Slope(const std::vector<double>& x, const std::vector<double>& y) {
  const double n = static_cast<double>(x.size());
  double sx = 0, sy = 0, sxx = 0, sxy = 0;
  for (size_t i = 0; i < x.size(); ++i) {
    sx += x[i];
    sy += y[i];
    sxx += x[i] * x[i];
    sxy += x[i] * y[i];
  }
  const double d = n * sxx - sx * sx;
  return d > 0 ? (n * sxy - sx * sy) / d : 0;
}

struct Range {
  long first = 0, last = 0, min = 0, max = 0;
};

Range RangeOf(const std::vector<Sample>& s, long Sample::*field) {
  Range r{s.front().*field, s.back().*field, s.front().*field, s.front().*field};
  for (const Sample& x : s) {
    r.min = std::min(r.min, x.*field);
    r.max = std::max(r.max, x.*field);
  }
  return r;
}

// Prints this rank's summary; returns the exit status (0 pass, 1 growth, 2 no samples).
int Summarize(const Options& o, int rank, const std::vector<Sample>& all, long steps,
              double seconds, double comm_seconds, const FdChange& fd_change) {
  const char* mode = o.fresh ? "fresh" : "static";
  std::printf(
      "soak: rank %d: %s names, %ld steps in %.1f s: %.2f steps/s, %.1f ms a step in "
      "Concord (fill, allreduces, check; the %d ms compute sleep excluded)\n",
      rank, mode, steps, seconds, steps / seconds, 1e3 * comm_seconds / steps, o.compute_ms);
  std::vector<Sample> after;
  for (const Sample& s : all) {
    if (s.t >= o.warmup_s) after.push_back(s);
  }
  const Range whole = RangeOf(all, &Sample::rss_kb);
  std::printf("soak: rank %d: whole run: RSS first %.1f MB, last %.1f MB, max %.1f MB\n", rank,
              whole.first / 1e3, whole.last / 1e3, whole.max / 1e3);
  if (after.size() < 2) {
    std::printf("soak: rank %d: FAIL: %zu samples after the %.0f s warm-up; run longer\n", rank,
                after.size(), o.warmup_s);
    return 2;
  }
  const Range rss = RangeOf(after, &Sample::rss_kb);
  const Range fds = RangeOf(after, &Sample::fds);
  const Range threads = RangeOf(after, &Sample::threads);
  const double spread = 100.0 * static_cast<double>(rss.max - rss.min) / rss.min;
  std::vector<double> t, kb;
  for (const Sample& s : after) {
    t.push_back(s.t / 3600);
    kb.push_back(static_cast<double>(s.rss_kb));
  }
  std::printf(
      "soak: rank %d: after warm-up (%.0f s to %.0f s, %zu samples, steps %ld to %ld): "
      "RSS min %.1f MB, max %.1f MB, spread %.2f %% (limit %.1f %%), slope %+.2f MB/h\n",
      rank, after.front().t, after.back().t, after.size(), after.front().step, after.back().step,
      rss.min / 1e3, rss.max / 1e3, spread, o.rss_tolerance, Slope(t, kb) / 1e3);
  std::printf(
      "soak: rank %d: after warm-up: fds first %ld last %ld min %ld max %ld; threads "
      "first %ld last %ld min %ld max %ld\n",
      rank, fds.first, fds.last, fds.min, fds.max, threads.first, threads.last, threads.min,
      threads.max);
  std::string why;
  if (spread > o.rss_tolerance) why += " RSS spread over the limit;";
  if (fds.min != fds.max) why += " open fds changed;";
  if (threads.min != threads.max) why += " threads changed;";
  std::printf("soak: rank %d: %s%s\n", rank, why.empty() ? "PASS" : "FAIL:", why.c_str());
  if (fds.min != fds.max) {
    std::printf("soak: rank %d: descriptors at %.1f s: %s\nsoak: rank %d: at %.1f s: %s\n", rank,
                after.front().t, fd_change.at_warmup.c_str(), rank, fd_change.changed_t,
                fd_change.changed.c_str());
  }
  return why.empty() ? 0 : 1;
}

// Checks the status of a Concord call; false (after saying why) when it failed.
bool Ok(concord_status_t status, concord_comm_t comm, const char* what) {
  if (status == CONCORD_SUCCESS) return true;
  std::fprintf(stderr, "soak: %s: %s: %s\n", what, concord_status_string(status),
               concord_comm_last_error(comm));
  return false;
}

// The steps and the samples; returns the exit status.
int RunSteps(const Options& o, const concord::Workload& w, concord_comm_t comm) {
  int rank = 0, size = 1;
  if (!Ok(concord_comm_rank(comm, &rank), comm, "rank") ||
      !Ok(concord_comm_size(comm, &size), comm, "size")) {
    return 3;
  }
  std::vector<std::vector<float>> grads;
  std::vector<concord_tensor_t> tensors;
  for (const auto& t : w.tensors) {
    grads.emplace_back(static_cast<size_t>(t.elements));
    tensors.push_back({grads.back().data(), CONCORD_FLOAT32, static_cast<int>(t.shape.size()),
                       t.shape.data(), CONCORD_DEVICE_CPU});
  }
  if (rank == 0) {
    std::printf(
        "soak: %s, %zu tensors, %.1f MB, %d ranks, %s names, compute %d ms, for %g min "
        "or %ld steps (0: no limit), samples every %g s, warm-up %g s\n",
        w.name.c_str(), w.tensors.size(), w.total_bytes / 1e6, size, o.fresh ? "fresh" : "static",
        o.compute_ms, o.minutes, o.steps, o.sample_s, o.warmup_s);
    std::fflush(stdout);
  }
  std::ofstream out;
  if (!o.out.empty()) {
    out.open(OutPath(o.out, rank));
    if (!out) {
      std::fprintf(stderr, "soak: cannot write %s\n", OutPath(o.out, rank).c_str());
      return 2;
    }
    out << "t_s,step,rss_kb,fds,threads\n";
  }
  std::vector<Sample> samples;
  FdChange fd_change;
  long warmup_fds = -1;
  auto record = [&](const Sample& s) {
    samples.push_back(s);
    if (s.t >= o.warmup_s && warmup_fds < 0) {
      warmup_fds = s.fds;
      fd_change.at_warmup = FdListing();
    } else if (warmup_fds >= 0 && s.fds != warmup_fds && fd_change.changed.empty()) {
      fd_change.changed = FdListing();
      fd_change.changed_t = s.t;
    }
    if (out.is_open()) {
      out << s.t << ',' << s.step << ',' << s.rss_kb << ',' << s.fds << ',' << s.threads
          << std::endl;
    }
  };

  concord_allreduce_opts_t sum, max;
  concord_allreduce_opts_init(&sum);
  concord_allreduce_opts_init(&max);
  max.op = CONCORD_MAX;
  int64_t one = 1;
  const Clock::time_point start = Clock::now();
  auto elapsed = [&] { return std::chrono::duration<double>(Clock::now() - start).count(); };
  record(SampleSelf(0, 0));
  double next_sample = o.sample_s, comm_seconds = 0;
  long step = 0, checked = 0;
  std::vector<concord_request_t> pending(grads.size() + 1);
  for (bool stop = false; !stop;) {
    const Clock::time_point step_start = Clock::now();
    const std::string suffix = o.fresh ? "@" + std::to_string(step) : "";
    // Tensor i holds rank + 1 + (step + i) % 7, so a result given to the wrong tensor or step
    // shows.
    for (size_t i = 0; i < grads.size(); ++i) {
      std::fill(grads[i].begin(), grads[i].end(), static_cast<float>(rank + 1 + (step + i) % 7));
    }
    int32_t stop_flag = (rank == 0 && o.minutes > 0 && elapsed() >= o.minutes * 60) ||
                        (o.steps > 0 && step + 1 >= o.steps);
    const concord_tensor_t flag = {&stop_flag, CONCORD_INT32, 1, &one, CONCORD_DEVICE_CPU};
    for (size_t i = 0; i < grads.size(); ++i) {
      const std::string name = w.tensors[i].name + suffix;
      if (!Ok(concord_allreduce_async(comm, name.c_str(), &tensors[i], nullptr, &sum, nullptr,
                                      nullptr, &pending[i]),
              comm, "enqueue")) {
        return 3;
      }
    }
    if (!Ok(concord_allreduce_async(comm, ("soak.stop" + suffix).c_str(), &flag, nullptr, &max,
                                    nullptr, nullptr, &pending.back()),
            comm, "enqueue")) {
      return 3;
    }
    for (concord_request_t r : pending) {
      const concord_status_t status = concord_wait(r, -1);
      if (status != CONCORD_SUCCESS) {
        std::fprintf(stderr, "soak: rank %d: step %ld: %s: %s\n", rank, step,
                     concord_status_string(status), concord_request_error(r));
        return 3;
      }
      concord_request_free(r);
    }
    if (!Ok(concord_end_step(comm), comm, "end_step")) return 3;
    for (size_t i = 0; i < grads.size(); ++i) {
      const std::vector<float>& g = grads[i];
      const auto want = static_cast<float>(size * (size + 1) / 2 + size * ((step + i) % 7));
      for (size_t at : {size_t{0}, g.size() / 2, g.size() - 1}) {
        if (g[at] != want) {
          std::fprintf(stderr, "soak: rank %d: step %ld: %s[%zu] = %g, want %g\n", rank, step,
                       w.tensors[i].name.c_str(), at, g[at], want);
          return 3;
        }
        ++checked;
      }
    }
    comm_seconds += std::chrono::duration<double>(Clock::now() - step_start).count();
    stop = stop_flag != 0;
    ++step;
    const double now = elapsed();
    if (now >= next_sample || stop) {
      record(SampleSelf(now, step));
      while (next_sample <= now) next_sample += o.sample_s;
    }
    if (!stop && o.compute_ms > 0) {
      std::this_thread::sleep_for(std::chrono::milliseconds(o.compute_ms));
    }
  }
  const double seconds = elapsed();
  std::printf("soak: rank %d: %ld sums checked, all exact\n", rank, checked);
  return Summarize(o, rank, samples, step, seconds, comm_seconds, fd_change);
}

int Run(const Options& o) {
  auto loaded = concord::LoadWorkload(o.workload);
  if (!loaded.ok()) {
    std::fprintf(stderr, "soak: %s\n", loaded.status().ToString().c_str());
    return 2;
  }
  const concord::Workload& w = *loaded;
  for (const auto& t : w.tensors) {
    if (t.dtype != concord::DType::kFloat32) {
      std::fprintf(stderr, "soak: %s: tensor '%s' is not float32 (soak checks float32 sums)\n",
                   o.workload.c_str(), t.name.c_str());
      return 2;
    }
  }
  concord_comm_t comm = nullptr;
  if (concord_init(&comm) != CONCORD_SUCCESS) {
    std::fprintf(stderr, "soak: init: %s\n", concord_comm_last_error(nullptr));
    return 3;
  }
  const int rc = RunSteps(o, w, comm);
  if (concord_finalize(comm) != CONCORD_SUCCESS) {
    std::fprintf(stderr, "soak: finalize: %s\n", concord_comm_last_error(nullptr));
    return rc == 0 ? 3 : rc;
  }
  return rc;
}

}  // namespace

int main(int argc, char** argv) {
  return Run(ParseOptions(argc, argv));
}
