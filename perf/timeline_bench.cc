// timeline-bench: what the timeline (core/timeline.h) costs a model's step, and how large its
// file grows, measured side by side in one run. Start it under concordrun; rank 0 prints.
//
//   concordrun -np 2 timeline-bench --workload perf/workloads/resnet50.txt --steps 50
//       --rounds 2 --timeline /tmp/tl
//
// Each round runs --steps steps with the timeline off and --steps with it on (the order swapped
// every round, so both sides see the same moments of a noisy machine); the "on" steps of round K
// write /tmp/tl-K.rank<R> (concord_timeline_start / _stop). A step enqueues every tensor's
// allreduce in backward order, then waits for all; its time is the median over the steps, the
// most of any rank. Printed: both medians and their ratio per round, and the files' total size
// (every rank's, when they share this host) scaled to 100 steps.
#include <sys/stat.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <string>
#include <vector>

#include "concord/concord.h"
#include "perf/bench_common.h"
#include "perf/workload.h"

namespace {

namespace bench = concord::bench;

[[noreturn]] void Usage(const std::string& why) {
  std::fprintf(stderr,
               "timeline-bench: %s\nusage: timeline-bench --workload FILE --timeline PATH "
               "[--steps N] [--rounds N] [--warmup N]\n",
               why.c_str());
  std::exit(2);
}

void Check(concord_comm_t comm, concord_status_t s, const std::string& what) {
  bench::CheckOrExit("timeline-bench", comm, s, what);
}

double Now() {
  return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count();
}

using concord::bench::Median;

double MaxAcrossRanks(concord_comm_t comm, double value, const std::string& name) {
  return bench::MaxAcrossRanks("timeline-bench", comm, value, name);
}

}  // namespace

int main(int argc, char** argv) {
  std::string workload_path, timeline;
  int steps = 50, rounds = 2, warmup = 5;
  for (int i = 1; i < argc; ++i) {
    const std::string a = argv[i];
    auto next = [&]() -> std::string {
      if (i + 1 >= argc) Usage(a + " needs a value");
      return argv[++i];
    };
    if (a == "--workload") {
      workload_path = next();
    } else if (a == "--timeline") {
      timeline = next();
    } else if (a == "--steps") {
      steps = static_cast<int>(bench::ParseInteger(a, next(), 1, 1000000, Usage));
    } else if (a == "--rounds") {
      rounds = static_cast<int>(bench::ParseInteger(a, next(), 1, 1000000, Usage));
    } else if (a == "--warmup") {
      warmup = static_cast<int>(bench::ParseInteger(a, next(), 0, 1000000, Usage));
    } else {
      Usage("unknown argument '" + a + "'");
    }
  }
  if (workload_path.empty() || timeline.empty()) Usage("--workload and --timeline are needed");
  auto loaded = concord::LoadWorkload(workload_path);
  if (!loaded.ok()) Usage(loaded.status().ToString());
  const concord::Workload& w = *loaded;

  concord_comm_t comm = nullptr;
  if (concord_init(&comm) != CONCORD_SUCCESS) {
    std::fprintf(stderr, "timeline-bench: init failed: %s\n", concord_comm_last_error(nullptr));
    return 1;
  }
  int rank = 0, size = 1;
  concord_comm_rank(comm, &rank);
  concord_comm_size(comm, &size);
  std::vector<std::vector<uint8_t>> buffers;
  for (const auto& t : w.tensors) buffers.emplace_back(t.bytes, 0);
  std::vector<concord_request_t> requests(w.tensors.size());
  auto step_once = [&] {
    Check(comm, concord_barrier(comm), "barrier");
    const double t0 = Now();
    for (size_t i = 0; i < w.tensors.size(); ++i) {
      const auto& t = w.tensors[i];
      concord_tensor_t ct{buffers[i].data(), static_cast<concord_dtype_t>(t.dtype),
                          static_cast<int>(t.shape.size()), t.shape.data(), CONCORD_DEVICE_CPU};
      Check(comm,
            concord_allreduce_async(comm, t.name.c_str(), &ct, nullptr, nullptr, nullptr, nullptr,
                                    &requests[i]),
            "allreduce of " + t.name);
    }
    for (auto* r : requests) {
      Check(comm, concord_wait(r, -1), "allreduce");
      concord_request_free(r);
    }
    return Now() - t0;
  };
  for (int s = 0; s < warmup; ++s) step_once();
  if (rank == 0) {
    std::printf(
        "# timeline-bench %s: %zu tensors, %.1f MB, %d ranks, %d steps per side, %d "
        "rounds\n%-6s %14s %14s %8s\n",
        w.name.c_str(), w.tensors.size(), w.total_bytes / 1e6, size, steps, rounds, "round",
        "off(ms/step)", "on(ms/step)", "on/off");
  }
  std::vector<double> offs, ons, ratios;
  for (int round = 0; round < rounds; ++round) {
    double side[2] = {0, 0};  // off, on
    for (int k = 0; k < 2; ++k) {
      const bool on = (k + round) % 2 == 1;
      const std::string path = timeline + "-" + std::to_string(round);
      if (on) Check(comm, concord_timeline_start(comm, path.c_str()), "timeline start");
      std::vector<double> times;
      for (int s = 0; s < steps; ++s) times.push_back(step_once());
      if (on) Check(comm, concord_timeline_stop(comm), "timeline stop");
      side[on ? 1 : 0] = MaxAcrossRanks(comm, Median(times),
                                        "bench." + std::to_string(round) + "." + std::to_string(k));
    }
    offs.push_back(side[0]);
    ons.push_back(side[1]);
    ratios.push_back(side[1] / side[0]);
    if (rank == 0) {
      std::printf("%-6d %14.2f %14.2f %8.3f\n", round, side[0] * 1e3, side[1] * 1e3, ratios.back());
    }
  }
  Check(comm, concord_barrier(comm), "barrier");
  if (rank == 0) {
    double bytes = 0;
    int files = 0;
    for (int round = 0; round < rounds; ++round) {
      for (int r = 0; r < size; ++r) {
        struct stat st {};
        const std::string f = timeline + "-" + std::to_string(round) + ".rank" + std::to_string(r);
        if (::stat(f.c_str(), &st) == 0) {
          bytes += static_cast<double>(st.st_size);
          ++files;
        }
      }
    }
    std::printf("median   %14.2f %14.2f %8.3f  (median of the rounds' ratios)\n",
                Median(offs) * 1e3, Median(ons) * 1e3, Median(ratios));
    std::printf(
        "timeline files: %d on this host, %.2f MB for %d steps: %.2f MB per 100 steps "
        "(all ranks)\n",
        files, bytes / 1e6, steps * rounds, bytes / 1e6 * 100.0 / (steps * rounds));
  }
  return concord_finalize(comm) == CONCORD_SUCCESS ? 0 : 1;
}
