// Raw NCCL, for benchmarks: ncclAllReduce (float32 sum, in place) on a device buffer the caller
// owns, through a communicator of its own, without Concord around it. concord-perf --backend nccl
// prints its times as "raw nccl" rows next to Concord's on the same buffer.
#pragma once

#include <chrono>
#include <cstddef>
#include <string>
#include <vector>

#include "base/status.h"
#include "rendezvous/store.h"

namespace concord {

struct RawNcclOptions {
  int rank = 0;
  int size = 1;
  int device = 0;       // the buffer's device
  std::string prefix;   // key namespace in the store (the unique id goes there); distinct per run
  size_t count = 1024;  // float32 elements at `buffer`
  int iterations = 10;  // timed runs
  int warmup = 2;       // untimed runs first
  std::chrono::milliseconds timeout{30000};
};

// Collective over options.size ranks. Creates a blocking NCCL communicator (rank 0's unique id
// through `store`), runs warmup + iterations allreduces on `buffer`, each timed on the host from
// enqueue to stream synchronisation, then one more on known data (perf/bench_common.h, copied in
// from the host) whose result is copied back and checked: a wrong one is a MISMATCH error naming
// the rank and the first wrong element, never a time. Destroys the communicator and returns the
// seconds of each timed run on this rank. Blocks; errors (CUDA, NCCL with its version) come back
// as a Status.
StatusOr<std::vector<double>> RunRawNcclAllreduce(const RawNcclOptions& options, void* buffer,
                                                  Store* store);

}  // namespace concord
