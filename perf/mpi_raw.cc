#include "perf/mpi_raw.h"

#include <mpi.h>

#include <algorithm>
#include <climits>
#include <vector>

namespace concord {

std::string RawMpiUnavailableReason() {
  int initialized = 0, level = MPI_THREAD_SINGLE;
  MPI_Initialized(&initialized);
  if (!initialized) return "MPI is not initialised (run with --backend mpi under mpirun)";
  MPI_Query_thread(&level);
  if (level != MPI_THREAD_MULTIPLE) {
    return "MPI is not MPI_THREAD_MULTIPLE, so this thread may not call MPI beside Concord's";
  }
  return "";
}

namespace {

double MedianOf(std::vector<double> times) {
  if (times.empty()) return 0;
  std::sort(times.begin(), times.end());
  const size_t m = times.size();
  return m % 2 ? times[m / 2] : (times[m / 2 - 1] + times[m / 2]) / 2;
}

}  // namespace

double TimeRawMpiSendrecv(const void* send, void* recv, size_t bytes, int warmup, int iters) {
  int rank = 0;
  MPI_Comm_rank(MPI_COMM_WORLD, &rank);
  const int peer = rank ^ 1;
  const int n = static_cast<int>(std::min<size_t>(bytes, INT_MAX));
  std::vector<double> times;
  MPI_Barrier(MPI_COMM_WORLD);
  for (int i = 0; i < warmup + iters; ++i) {
    const double t0 = MPI_Wtime();
    MPI_Sendrecv(send, n, MPI_BYTE, peer, 1, recv, n, MPI_BYTE, peer, 1, MPI_COMM_WORLD,
                 MPI_STATUS_IGNORE);
    if (i >= warmup) times.push_back(MPI_Wtime() - t0);
  }
  return MedianOf(times);
}

double TimeRawMpiAllreduce(float* buffer, size_t count, int warmup, int iters) {
  std::vector<double> times;
  MPI_Barrier(MPI_COMM_WORLD);
  const int n = static_cast<int>(std::min<size_t>(count, INT_MAX));
  for (int i = 0; i < warmup + iters; ++i) {
    const double t0 = MPI_Wtime();
    MPI_Allreduce(MPI_IN_PLACE, buffer, n, MPI_FLOAT, MPI_SUM, MPI_COMM_WORLD);
    if (i >= warmup) times.push_back(MPI_Wtime() - t0);
  }
  if (times.empty()) return 0;
  std::sort(times.begin(), times.end());
  const size_t m = times.size();
  return m % 2 ? times[m / 2] : (times[m / 2 - 1] + times[m / 2]) / 2;
}

}  // namespace concord
