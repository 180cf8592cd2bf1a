// gloo_algos: measures Gloo's allreduce algorithms (float32 sum, in place, buffers reused) with
// ranks as threads over loopback, through Concord's Gloo backend (algorithm forced) and raw
// (perf/gloo_raw), and prints median milliseconds per size. The backend's "auto" table comes from
// this. Both sides are timed alike, as perf/gloo_raw times the raw side and concord-perf its rows:
// kWarmup untimed runs, ranks lined up before the first of them and before the first timed run,
// then the timed runs back to back, each timed on its own (the backend side once had a barrier
// before every run and the raw side not, so its runs started together and the raw side's did
// not). Each side's figure is the median over iterations on each rank,
// the most of any rank, as concord-perf takes its rows (rank 0's alone once stood for both). Each
// side's result is checked after its timed runs: one more run on known data (perf/gloo_raw's, and
// the same check here for the backend).
// Usage: gloo_algos [ranks (2)] [iterations (10)] [max MiB (64)]
#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "backends/gloo/gloo_backend.h"
#include "base/clock.h"
#include "perf/bench_common.h"
#include "perf/gloo_raw.h"
#include "rendezvous/hash_store.h"

namespace concord {
namespace {

using bench::Median;

// Untimed runs before the timed ones, on both sides.
constexpr int kWarmup = 2;

// The most of any rank's median seconds over `iterations` backend allreduces of `count` floats.
StatusOr<double> TimeBackend(int size, const std::string& algorithm, size_t count, int iterations,
                             int run) {
  HashStore store;
  std::vector<StatusOr<double>> results(size, StatusOr<double>(Internal("not run")));
  std::vector<std::thread> threads;
  for (int rank = 0; rank < size; ++rank) {
    threads.emplace_back([&, rank] {
      BackendOptions options;
      options.rank = rank;
      options.size = size;
      options.prefix = "b" + std::to_string(run);
      options.algorithm = algorithm;
      StatusOr<std::unique_ptr<Backend>> backend = CreateGlooBackend(options, &store);
      if (!backend.ok()) {
        results[rank] = backend.status();
        return;
      }
      std::vector<float> data(count, 1.0f);
      std::vector<double> seconds;
      for (int i = 0; i < kWarmup + iterations; ++i) {
        Status status = i == 0 || i == kWarmup ? (*backend)->Barrier() : Status::Ok();
        const auto start = Clock::now();
        if (status.ok())
          status = (*backend)->Allreduce(data.data(), count, DType::kFloat32, ReduceOp::kSum);
        if (!status.ok()) {
          results[rank] = status;
          return;
        }
        const std::chrono::duration<double> took = Clock::now() - start;
        if (i >= kWarmup) seconds.push_back(took.count());
      }
      // As the raw side: one run on known data, checked, and no rank closes its backend while a
      // peer still receives.
      for (size_t e = 0; e < count; ++e) {
        data[e] = static_cast<float>(bench::ReductionInput(CONCORD_SUM, rank, size, e));
      }
      Status status = (*backend)->Allreduce(data.data(), count, DType::kFloat32, ReduceOp::kSum);
      if (status.ok()) status = (*backend)->Barrier();
      const std::string wrong = bench::FirstWrongElement(
          count, [&](size_t e) { return data[e]; }, bench::ReductionExpected);
      if (status.ok() && !wrong.empty()) {
        status =
            Status(Code::kMismatch, "concord backend " + algorithm + ": wrong result on rank " +
                                        std::to_string(rank) + ": " + wrong);
      }
      results[rank] = status.ok() ? StatusOr<double>(Median(seconds)) : status;
    });
  }
  for (auto& t : threads) t.join();
  double slowest = 0;
  for (const auto& r : results) {
    if (!r.ok()) return r.status();
    slowest = std::max(slowest, *r);
  }
  return slowest;
}

StatusOr<double> TimeRaw(int size, const std::string& algorithm, size_t count, int iterations,
                         int run) {
  HashStore store;
  std::vector<StatusOr<std::vector<double>>> results(size, Internal("not run"));
  std::vector<std::thread> threads;
  for (int rank = 0; rank < size; ++rank) {
    threads.emplace_back([&, rank] {
      RawGlooOptions options;
      options.rank = rank;
      options.size = size;
      options.prefix = "r" + std::to_string(run);
      options.algorithm = algorithm;
      options.count = count;
      options.iterations = iterations;
      options.warmup = kWarmup;
      results[rank] = RunRawGlooAllreduce(options, &store);
    });
  }
  for (auto& t : threads) t.join();
  double slowest = 0;
  for (const auto& r : results) {
    if (!r.ok()) return r.status();
    slowest = std::max(slowest, Median(*r));
  }
  return slowest;
}

[[noreturn]] void Usage(const std::string& why) {
  std::fprintf(stderr,
               "gloo_algos: %s\nusage: gloo_algos [ranks (2)] [iterations (10)] [max MiB (64)]\n",
               why.c_str());
  std::exit(2);
}

int Main(int argc, char** argv) {
  // Read whole and in range: atoi read "0" or "x" as 0 ranks, and rank 0's result was then read
  // from an empty vector.
  if (argc > 4) Usage("too many arguments");
  const int size =
      argc > 1 ? static_cast<int>(bench::ParseInteger("ranks", argv[1], 1, 256, Usage)) : 2;
  const int iterations =
      argc > 2 ? static_cast<int>(bench::ParseInteger("iterations", argv[2], 1, 1000000, Usage))
               : 10;
  const size_t max_bytes =
      static_cast<size_t>(argc > 3 ? bench::ParseInteger("max MiB", argv[3], 1, 1 << 20, Usage)
                                   : 64)
      << 20;
  const char* algorithms[] = {"ring", "ring_chunked", "halving_doubling", "bcube", "allreduce"};
  std::printf(
      "%d ranks, float32 sum, ms: median of %d iterations, back to back after %d warm-up, max over "
      "ranks (concord backend forced / raw gloo)\n",
      size, iterations, kWarmup);
  std::printf("%10s", "bytes");
  for (const char* a : algorithms) std::printf(" %23s", a);
  std::printf("\n");
  int run = 0;
  for (size_t bytes = 4096; bytes <= max_bytes; bytes *= 4) {
    std::printf("%10zu", bytes);
    for (const char* a : algorithms) {
      StatusOr<double> backend = TimeBackend(size, a, bytes / 4, iterations, run++);
      StatusOr<double> raw = TimeRaw(size, a, bytes / 4, iterations, run++);
      if (backend.ok() && raw.ok()) {
        std::printf(" %11.3f / %9.3f", *backend * 1e3, *raw * 1e3);
      } else if (raw.ok() && backend.status().code() == Code::kInvalidArgument) {
        std::printf(" %11s / %9.3f", "refused", *raw * 1e3);  // bcube: see gloo_backend.cc
      } else {
        std::printf(" %23s", "n/a");
        const Status& error = backend.ok() ? raw.status() : backend.status();
        std::fprintf(stderr, "%s %zu bytes: %s\n", a, bytes, error.ToString().c_str());
      }
      std::fflush(stdout);
    }
    std::printf("\n");
  }
  return 0;
}

}  // namespace
}  // namespace concord

int main(int argc, char** argv) {
  return concord::Main(argc, argv);
}
