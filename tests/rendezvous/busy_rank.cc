// A rank whose engine is busy for longer than CONCORD_TIMEOUT_S is not declared dead: the control
// plane's heartbeats come from its own thread, not from the thread that steps the engine. Run by
// concordrun at 2 or more ranks with --timeout 1 (tests/rendezvous/CMakeLists.txt):
//
//   rank 1 enqueues an allreduce whose completion callback sleeps kBusySeconds (three timeouts).
//   The thread that completes it is the one stepping rank 1's engine, so for that long rank 1
//   neither receives nor steps, while the other ranks wait in the control plane for its next
//   request. Then every rank runs another allreduce, which must succeed with the right sum, and
//   finalizes cleanly.
//
// Prints "BUSY_OK rank R" when every check passed, else "rank R: FAIL ..." lines; exits non-zero
// on failure. Only the C API is used.
#include <chrono>
#include <cstdio>
#include <thread>
#include <vector>

#include "concord/concord.h"
#include "tests/common/check.h"

namespace {

constexpr double kBusySeconds = 3.0;
constexpr int64_t kCount = 1024;  // 4 KiB of float32

void SleepingCallback(concord_request_t /*request*/, concord_status_t /*status*/,
                      void* /*user_data*/) {
  std::this_thread::sleep_for(std::chrono::duration<double>(kBusySeconds));
}

// A float32 sum of every rank's (rank + 1) over kCount elements, named `name`.
void Allreduce(concord_comm_t comm, const char* name, int rank, int size,
               concord_callback_t callback) {
  std::vector<float> data(kCount, static_cast<float>(rank + 1));
  const int64_t shape[1] = {kCount};
  const concord_tensor_t t = {data.data(), CONCORD_FLOAT32, 1, shape, CONCORD_DEVICE_CPU};
  concord_request_t request = nullptr;
  CHECK_STATUS(
      concord_allreduce_async(comm, name, &t, nullptr, nullptr, callback, nullptr, &request),
      CONCORD_SUCCESS);
  if (request == nullptr) return;
  const concord_status_t s = concord_wait(request, 60.0);
  CHECKF(s == CONCORD_SUCCESS, "allreduce '%s': %s: %s", name, concord_status_string(s),
         concord_request_error(request));
  const float want = static_cast<float>(size * (size + 1) / 2);
  if (s == CONCORD_SUCCESS) {
    CHECKF(data[0] == want && data[kCount - 1] == want, "allreduce '%s': %g, want %g", name,
           static_cast<double>(data[0]), static_cast<double>(want));
  }
  concord_request_free(request);
}

}  // namespace

int main() {
  concord_comm_t comm = nullptr;
  const concord_status_t init = concord_init(&comm);
  if (init != CONCORD_SUCCESS) {
    std::fprintf(stderr, "rank ?: FAIL concord_init: %s: %s\n", concord_status_string(init),
                 concord_comm_last_error(nullptr));
    return 1;
  }
  int rank = 0, size = 1;
  concord_comm_rank(comm, &rank);
  concord_comm_size(comm, &size);
  CheckSetContext("rank %d", rank);
  const auto start = std::chrono::steady_clock::now();
  Allreduce(comm, "busy", rank, size, rank == 1 ? SleepingCallback : nullptr);
  Allreduce(comm, "after", rank, size, nullptr);
  const double took =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  // Rank 1's wait ends after its callback; the others' second allreduce waits for rank 1.
  CHECKF(took >= kBusySeconds, "done after %.3f s: rank 1 was not busy for %.1f s", took,
         kBusySeconds);
  CHECK_STATUS(concord_finalize(comm), CONCORD_SUCCESS);
  if (CheckFailures() != 0) return 1;
  std::printf("BUSY_OK rank %d after %.3f s\n", rank, took);
  return 0;
}
