// Raw MPI_Allreduce timing for concord-perf --backend mpi ("raw MPI_Allreduce" rows): the
// baseline Concord-over-MPI is compared with, on the same buffer in the same run.
#pragma once

#include <cstddef>
#include <string>
#include <vector>

namespace concord {

// Empty when the application may call MPI next to Concord's engine thread (MPI is initialised
// with MPI_THREAD_MULTIPLE); else why not.
std::string RawMpiUnavailableReason();

// Runs warmup + iters in-place MPI_Allreduce (float32 sum) of `count` floats in `buffer` over
// MPI_COMM_WORLD, an MPI_Barrier before the warm-up and before the timed runs, each timed on its
// own; returns this rank's seconds for each of the `iters`. concord-perf checks the result of one
// more run on known data.
std::vector<double> TimeRawMpiAllreduce(float* buffer, size_t count, int warmup, int iters);

// The same for MPI_Reduce_scatter_block (float32 sum: `in` holds size x `block` floats, `out`
// receives `block`) and MPI_Alltoallv (float32, `block` floats to and from every rank, the
// counts and displacements an uneven alltoall passes), over MPI_COMM_WORLD.
std::vector<double> TimeRawMpiReduceScatterBlock(const float* in, float* out, size_t block,
                                                 int warmup, int iters);
std::vector<double> TimeRawMpiAlltoallv(const float* in, float* out, size_t block, int warmup,
                                        int iters);
// The same for MPI_Allgather (`block` floats from every rank into size x `block` in `out`) and
// MPI_Bcast (`count` floats from rank 0), over MPI_COMM_WORLD.
std::vector<double> TimeRawMpiAllgather(const float* in, float* out, size_t block, int warmup,
                                        int iters);
std::vector<double> TimeRawMpiBcast(float* buffer, size_t count, int warmup, int iters);
// The same for MPI_Sendrecv of `bytes` between pairs of ranks (rank ^ 1) over MPI_COMM_WORLD.
std::vector<double> TimeRawMpiSendrecv(const void* send, void* recv, size_t bytes, int warmup,
                                       int iters);

}  // namespace concord
