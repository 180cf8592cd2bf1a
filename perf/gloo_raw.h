// Raw Gloo, for benchmarks: one allreduce algorithm built once over one persistent float32 buffer
// and run repeatedly, without Concord's backend around it. concord-perf prints its times as
// "raw gloo <algorithm>" rows next to Concord's own.
#pragma once

#include <chrono>
#include <cstddef>
#include <string>
#include <vector>

#include "base/status.h"
#include "rendezvous/store.h"

namespace concord {

struct RawGlooOptions {
  int rank = 0;
  int size = 1;
  std::string iface;               // network interface ("" = use host)
  std::string host;                // address to bind and advertise ("" = 127.0.0.1)
  std::string prefix;              // key namespace in the store; distinct per run
  std::string algorithm = "ring";  // ring, ring_chunked, halving_doubling, bcube or allreduce
  size_t count = 1024;             // float32 elements
  int iterations = 10;             // timed runs
  int warmup = 2;                  // untimed runs first
  std::chrono::milliseconds timeout{30000};
};

// Collective over options.size ranks (all call it with the same options but rank). Connects its
// own Gloo context through `store`, builds the algorithm once (float32 sum, Gloo's own kernel),
// runs warmup + iterations allreduces (a barrier first and after the warm-up, then back to back)
// and returns the seconds each timed run took on this rank. Then it runs once more on known data
// (perf/bench_common.h) and checks the result: a wrong one is a MISMATCH error naming the rank and
// the first wrong element, never a time. Blocks; errors (bad options, rendezvous or Gloo failure)
// come back as a Status. Thread-safe for distinct prefixes.
StatusOr<std::vector<double>> RunRawGlooAllreduce(const RawGlooOptions& options, Store* store);

// The same for Gloo's own reduce-scatter, all-to-all, allgather and broadcast of options.count
// float32 elements (a multiple of the ranks, split evenly): algorithm "reduce_scatter_hd"
// (ReduceScatterHalvingDoubling, sum, built once, in place), "alltoall" (gloo::alltoall),
// "alltoallv" (gloo::alltoallv with every rank's counts), "allgather" (gloo::allgather: count /
// size from each rank, count in all) or "broadcast" (gloo::broadcast of count from rank 0), their
// options built once over persistent buffers. Checked the same way.
StatusOr<std::vector<double>> RunRawGlooExchange(const RawGlooOptions& options, Store* store);

// The same for point to point: ranks in pairs (rank ^ 1) exchange count floats each way with
// Gloo's unbound buffers (recv posted, send, wait for both), one fixed slot; options.algorithm is
// ignored. Returns the seconds each timed exchange took on this rank; checked the same way.
// options.size must be even.
StatusOr<std::vector<double>> RunRawGlooSendRecv(const RawGlooOptions& options, Store* store);

}  // namespace concord
