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

// The seconds of each of `iters` runs of `run` after `warmup` more, each timed on its own, with an
// MPI_Barrier before the warm-up and another before the timed runs (as concord-perf times Concord's
// rows and perf/gloo_raw Gloo's: without the second, the first timed runs paid for ranks still
// apart after the warm-up).
template <typename Run>
std::vector<double> TimeMpi(int warmup, int iters, Run run) {
  std::vector<double> times;
  for (int i = 0; i < warmup + iters; ++i) {
    if (i == 0 || i == warmup) MPI_Barrier(MPI_COMM_WORLD);
    const double t0 = MPI_Wtime();
    run();
    if (i >= warmup) times.push_back(MPI_Wtime() - t0);
  }
  return times;
}

}  // namespace

std::vector<double> TimeRawMpiSendrecv(const void* send, void* recv, size_t bytes, int warmup,
                                       int iters) {
  int rank = 0;
  MPI_Comm_rank(MPI_COMM_WORLD, &rank);
  const int peer = rank ^ 1;
  const int n = static_cast<int>(std::min<size_t>(bytes, INT_MAX));
  return TimeMpi(warmup, iters, [&] {
    MPI_Sendrecv(send, n, MPI_BYTE, peer, 1, recv, n, MPI_BYTE, peer, 1, MPI_COMM_WORLD,
                 MPI_STATUS_IGNORE);
  });
}

std::vector<double> TimeRawMpiAllreduce(float* buffer, size_t count, int warmup, int iters) {
  const int n = static_cast<int>(std::min<size_t>(count, INT_MAX));
  return TimeMpi(warmup, iters, [&] {
    MPI_Allreduce(MPI_IN_PLACE, buffer, n, MPI_FLOAT, MPI_SUM, MPI_COMM_WORLD);
  });
}

std::vector<double> TimeRawMpiReduceScatterBlock(const float* in, float* out, size_t block,
                                                 int warmup, int iters) {
  const int n = static_cast<int>(std::min<size_t>(block, INT_MAX));
  return TimeMpi(warmup, iters,
                 [&] { MPI_Reduce_scatter_block(in, out, n, MPI_FLOAT, MPI_SUM, MPI_COMM_WORLD); });
}

std::vector<double> TimeRawMpiAlltoallv(const float* in, float* out, size_t block, int warmup,
                                        int iters) {
  int size = 1;
  MPI_Comm_size(MPI_COMM_WORLD, &size);
  const int n = static_cast<int>(std::min<size_t>(block, INT_MAX / std::max(size, 1)));
  std::vector<int> counts(size, n), displs(size);
  for (int r = 0; r < size; ++r) displs[r] = r * n;
  return TimeMpi(warmup, iters, [&] {
    MPI_Alltoallv(in, counts.data(), displs.data(), MPI_FLOAT, out, counts.data(), displs.data(),
                  MPI_FLOAT, MPI_COMM_WORLD);
  });
}

std::vector<double> TimeRawMpiAllgather(const float* in, float* out, size_t block, int warmup,
                                        int iters) {
  const int n = static_cast<int>(std::min<size_t>(block, INT_MAX));
  return TimeMpi(warmup, iters,
                 [&] { MPI_Allgather(in, n, MPI_FLOAT, out, n, MPI_FLOAT, MPI_COMM_WORLD); });
}

std::vector<double> TimeRawMpiBcast(float* buffer, size_t count, int warmup, int iters) {
  const int n = static_cast<int>(std::min<size_t>(count, INT_MAX));
  return TimeMpi(warmup, iters, [&] { MPI_Bcast(buffer, n, MPI_FLOAT, 0, MPI_COMM_WORLD); });
}

}  // namespace concord
