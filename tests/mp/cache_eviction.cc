// The bounded response cache across real processes (core/response_cache.h): ranks that submit
// with skew a mix of static names and one-off names, with a small CONCORD_CACHE_CAPACITY, so that
// the cache evicts every step while bits are on their way to the coordinator.
//
//   concordrun -np 3 ./mp_cache_eviction [--static N] [--oneoff-per-step K] [--mixed-steps S]
//                                       [--oneoff N1] [--static-steps S2] [--min-hit-rate R]
//
// Phase 1 (mixed): S steps, each of N static names and K names never seen again, submitted
// asynchronously in a rank-dependent order with rank- and step-dependent sleeps, small ones
// (reduced inline by the coordinator) and large ones (the backend's path). Phase 2 (one-off):
// N1 names never seen again, one step. Phase 3 (static): S2 steps of the N static names only.
// Every sum is checked exactly. Then the cache must have kept serving the static names: at least
// R of phase 3's operations went through the cache. Prints the counts (concord_stats_t) and one
// PASS line per rank; exits non-zero on any failure.
#include <algorithm>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <thread>
#include <vector>

#include "mp_common.h"
#include "tests/common/check.h"

namespace {

struct Options {
  int statics = 8;
  int oneoff_per_step = 4;
  int mixed_steps = 60;
  int oneoff = 1100;
  int static_steps = 200;
  double min_hit_rate = 0.9;
};

[[noreturn]] void Usage(const std::string& why) {
  std::fprintf(stderr,
               "mp_cache_eviction: %s\nusage: mp_cache_eviction [--static N] "
               "[--oneoff-per-step K] [--mixed-steps S] [--oneoff N1] [--static-steps S2] "
               "[--min-hit-rate R]\n",
               why.c_str());
  std::exit(2);
}

Options Parse(int argc, char** argv) {
  Options o;
  for (int i = 1; i < argc; ++i) {
    const std::string a = argv[i];
    if (i + 1 >= argc) Usage(a + " needs a value");
    const char* v = argv[++i];
    if (a == "--static") {
      o.statics = std::atoi(v);
    } else if (a == "--oneoff-per-step") {
      o.oneoff_per_step = std::atoi(v);
    } else if (a == "--mixed-steps") {
      o.mixed_steps = std::atoi(v);
    } else if (a == "--oneoff") {
      o.oneoff = std::atoi(v);
    } else if (a == "--static-steps") {
      o.static_steps = std::atoi(v);
    } else if (a == "--min-hit-rate") {
      o.min_hit_rate = std::atof(v);
    } else {
      Usage("unknown option " + a);
    }
  }
  return o;
}

// One allreduce in flight: its name, buffer and what its elements must sum to.
struct Op {
  std::string name;
  std::vector<int32_t> data;
  int64_t shape = 0;
  int salt = 0;
  concord_request_t request = nullptr;
};

int g_rank = 0, g_size = 1;

// Element i of the tensor with `salt` on `rank`: small, so that sums are exact.
int32_t Value(int rank, int salt, int64_t i) {
  return (rank + 1) * static_cast<int32_t>((i + salt) % 7 + 1);
}

// Large enough that some tensors take the backend's path instead of the inline reduction.
int64_t Elements(int salt) {
  return salt % 3 == 0 ? 12000 : 1 + salt % 5;
}

// Submits `names` (each with its salt) asynchronously, sleeping per rank and step between
// submissions, waits for all and checks every sum.
void RunStep(concord_comm_t comm, const std::vector<std::pair<std::string, int>>& names, int step,
             bool skew) {
  std::vector<Op> ops(names.size());
  for (size_t k = 0; k < names.size(); ++k) {
    // Every rank submits the same names in its own order.
    const auto& [name, salt] = names[(k + static_cast<size_t>(g_rank) * 3) % names.size()];
    Op& op = ops[k];
    op.name = name;
    op.salt = salt;
    op.shape = Elements(salt);
    op.data.resize(static_cast<size_t>(op.shape));
    for (int64_t i = 0; i < op.shape; ++i) op.data[i] = Value(g_rank, salt, i);
    if (skew && (k + static_cast<size_t>(step) + static_cast<size_t>(g_rank)) % 3 == 0) {
      std::this_thread::sleep_for(std::chrono::microseconds(150 * ((g_rank + step) % 4)));
    }
    concord_tensor_t t = {op.data.data(), CONCORD_INT32, 1, &op.shape, CONCORD_DEVICE_CPU};
    CHECK_STATUS(concord_allreduce_async(comm, op.name.c_str(), &t, nullptr, nullptr, nullptr,
                                         nullptr, &op.request),
                 CONCORD_SUCCESS);
  }
  const int32_t ranks_sum = g_size * (g_size + 1) / 2;
  for (Op& op : ops) {
    if (op.request == nullptr) continue;
    const concord_status_t s = concord_wait(op.request, 60);
    CHECKF(s == CONCORD_SUCCESS, "%s: %s: %s", op.name.c_str(), concord_status_string(s),
           concord_request_error(op.request));
    concord_request_free(op.request);
    if (s != CONCORD_SUCCESS) continue;
    for (int64_t i = 0; i < op.shape; ++i) {
      const int32_t want = ranks_sum * static_cast<int32_t>((i + op.salt) % 7 + 1);
      if (op.data[i] != want) {
        FAILF("%s[%lld] = %d, want %d", op.name.c_str(), static_cast<long long>(i), op.data[i],
              want);
        break;
      }
    }
  }
  CHECK_STATUS(concord_end_step(comm), CONCORD_SUCCESS);
}

concord_stats_t Stats(concord_comm_t comm) {
  concord_stats_t s;
  std::memset(&s, 0, sizeof(s));
  s.struct_size = sizeof(s);
  CHECK_STATUS(concord_comm_stats(comm, &s), CONCORD_SUCCESS);
  return s;
}

}  // namespace

int main(int argc, char** argv) {
  const Options o = Parse(argc, argv);
  concord_comm_t comm = mp::InitOrExit(&g_rank, &g_size);
  std::vector<std::pair<std::string, int>> statics;
  for (int n = 0; n < o.statics; ++n) statics.emplace_back("static." + std::to_string(n), n);

  const double t0 = mp::Now();
  for (int step = 0; step < o.mixed_steps; ++step) {
    std::vector<std::pair<std::string, int>> names = statics;
    for (int k = 0; k < o.oneoff_per_step; ++k) {
      names.emplace_back("mixed." + std::to_string(step) + "." + std::to_string(k), step + k);
    }
    RunStep(comm, names, step, true);
  }
  const concord_stats_t after_mixed = Stats(comm);

  std::vector<std::pair<std::string, int>> oneoff;
  for (int n = 0; n < o.oneoff; ++n) oneoff.emplace_back("oneoff." + std::to_string(n), n);
  if (!oneoff.empty()) RunStep(comm, oneoff, 0, false);

  const concord_stats_t before_static = Stats(comm);
  for (int step = 0; step < o.static_steps; ++step) RunStep(comm, statics, step, step % 2 == 0);
  const concord_stats_t after = Stats(comm);

  const uint64_t ops = static_cast<uint64_t>(o.static_steps) * statics.size();
  const uint64_t hits = after.responses_cached - before_static.responses_cached;
  std::printf(
      "cache_eviction: rank %d: capacity %s: mixed phase (%d steps of %d static + %d one-off "
      "names): %llu cache hits, %llu evictions; static phase after %d one-off names: %llu cache "
      "hits of %llu operations; %llu evictions in all; %.1f s\n",
      g_rank,
      std::getenv("CONCORD_CACHE_CAPACITY") ? std::getenv("CONCORD_CACHE_CAPACITY") : "1024",
      o.mixed_steps, o.statics, o.oneoff_per_step,
      static_cast<unsigned long long>(after_mixed.responses_cached),
      static_cast<unsigned long long>(after_mixed.cache_evictions), o.oneoff,
      static_cast<unsigned long long>(hits), static_cast<unsigned long long>(ops),
      static_cast<unsigned long long>(after.cache_evictions), mp::Now() - t0);
  CHECKF(static_cast<double>(hits) >= o.min_hit_rate * static_cast<double>(ops),
         "the static names went through the cache %llu times in %llu operations (want at least "
         "%.0f%%)",
         static_cast<unsigned long long>(hits), static_cast<unsigned long long>(ops),
         o.min_hit_rate * 100);
  const concord_status_t fin = concord_finalize(comm);
  CHECKF(fin == CONCORD_SUCCESS, "concord_finalize: %s", concord_status_string(fin));
  if (CheckFailures() != 0) {
    std::printf("cache_eviction: rank %d: FAIL (%d failures)\n", g_rank, CheckFailures());
    return 1;
  }
  std::printf("cache_eviction: rank %d: PASS\n", g_rank);
  return 0;
}
