// Ranks as forked child processes of a gtest test, for what needs a process per rank (concord_init
// through the C API, each rank with an environment of its own), and a limit on how long they run.
#pragma once

#include <gtest/gtest.h>
#include <signal.h>
#include <sys/types.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <functional>
#include <thread>
#include <vector>

namespace concord {
namespace harness {

// RunForkedRanks(size, body, limit) forks one child per rank, 0 .. size - 1, which runs
// body(rank) and _exits with what it returns; then waits for every child and returns each rank's
// wait status (waitpid's).
//
// Contract: call it while the test's process runs no other thread (a child has only the forking
// thread; a lock another thread held would stay held in it). `body` runs in the child only, and
// leaves through _exit (no gtest teardown, no atexit handlers). A child still running `limit`
// after the forks is SIGKILLed (its status says so), so no test hangs. A fork that fails is a test
// failure, and that rank's status is -1.
inline std::vector<int> RunForkedRanks(int size, const std::function<int(int rank)>& body,
                                       std::chrono::milliseconds limit) {
  std::vector<pid_t> pids(static_cast<size_t>(size), -1);
  for (int rank = 0; rank < size; ++rank) {
    pids[rank] = ::fork();
    EXPECT_GE(pids[rank], 0) << "fork for rank " << rank;
    if (pids[rank] == 0) ::_exit(body(rank));
  }
  const auto deadline = std::chrono::steady_clock::now() + limit;
  std::vector<int> statuses(static_cast<size_t>(size), -1);
  for (int rank = 0; rank < size; ++rank) {
    if (pids[rank] < 0) continue;
    int status = 0;
    while (::waitpid(pids[rank], &status, WNOHANG) == 0) {
      if (std::chrono::steady_clock::now() >= deadline) {
        ::kill(pids[rank], SIGKILL);
        ::waitpid(pids[rank], &status, 0);
        break;
      }
      std::this_thread::sleep_for(std::chrono::milliseconds(20));
    }
    statuses[rank] = status;
  }
  return statuses;
}

}  // namespace harness
}  // namespace concord
