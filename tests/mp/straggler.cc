// The straggler report under a launcher (CONCORD_STRAGGLER_REPORT_S): each step every rank
// "computes" (sleeps --compute-ms), rank --slow sleeps --late-ms more, then all allreduce
// --tensors float32 tensors of 1024 elements, check the sums and end the step. Rank 0's log must
// name the slow rank within the run's steps; with --slow -1 it must name none (the test greps).
//   mp_straggler --slow 3 --steps 10 --compute-ms 20 --late-ms 60
//   (then grep "mp_straggler: rank .* PASS" and rank 0's "straggler: rank 3 arrived last")
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <thread>
#include <vector>

#include "tests/mp/mp_common.h"

namespace {

int IntArg(int argc, char** argv, const char* flag, int fallback) {
  for (int i = 1; i + 1 < argc; ++i) {
    if (std::strcmp(argv[i], flag) == 0) return std::atoi(argv[i + 1]);
  }
  return fallback;
}

}  // namespace

int main(int argc, char** argv) {
  const int slow = IntArg(argc, argv, "--slow", -1);
  const int steps = IntArg(argc, argv, "--steps", 10);
  const int compute_ms = IntArg(argc, argv, "--compute-ms", 20);
  const int late_ms = IntArg(argc, argv, "--late-ms", 60);
  const int tensors = IntArg(argc, argv, "--tensors", 8);
  int rank = 0, size = 1;
  concord_comm_t comm = mp::InitOrExit(&rank, &size);
  constexpr int64_t kElements = 1024;
  std::vector<std::vector<float>> data(tensors, std::vector<float>(kElements));
  for (int step = 0; step < steps; ++step) {
    const int sleep_ms = compute_ms + (rank == slow ? late_ms : 0);
    std::this_thread::sleep_for(std::chrono::milliseconds(sleep_ms));
    std::vector<concord_request_t> requests(tensors, nullptr);
    std::vector<int64_t> shape{kElements};
    for (int t = 0; t < tensors; ++t) {
      for (int64_t i = 0; i < kElements; ++i) data[t][i] = static_cast<float>(rank + step + t);
      concord_tensor_t tensor = {data[t].data(), CONCORD_FLOAT32, 1, shape.data(),
                                 CONCORD_DEVICE_CPU};
      const std::string name = "grad." + std::to_string(t);
      CHECK_STATUS(concord_allreduce_async(comm, name.c_str(), &tensor, nullptr, nullptr, nullptr,
                                           nullptr, &requests[t]),
                   CONCORD_SUCCESS);
    }
    for (int t = 0; t < tensors; ++t) {
      CHECK_STATUS(concord_wait(requests[t], 60), CONCORD_SUCCESS);
      concord_request_free(requests[t]);
      // Sum over ranks of rank + step + t: exact in float32 at these sizes.
      const float want = static_cast<float>(size * (step + t) + size * (size - 1) / 2);
      CHECKF(data[t][0] == want && data[t][kElements - 1] == want, "step %d tensor %d: %g, not %g",
             step, t, static_cast<double>(data[t][0]), static_cast<double>(want));
    }
    CHECK_STATUS(concord_end_step(comm), CONCORD_SUCCESS);
  }
  CHECK_STATUS(concord_finalize(comm), CONCORD_SUCCESS);
  if (CheckFailures() != 0) return 1;
  std::printf("mp_straggler: rank %d PASS\n", rank);
  return 0;
}
