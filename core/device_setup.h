// Starting the device side of a communicator: which backend serves CUDA tensors. Separate from
// bootstrap.cc so the CPU backends' start-up stays as it was.
#pragma once

#include "backends/backend.h"
#include "core/config.h"
#include "core/engine.h"
#include "rendezvous/store.h"

namespace concord {

// By config.backend: "nccl" requires the NCCL backend (an error at init naming why it cannot
// start: not built, no usable GPU on some rank); "auto" starts it when it is built and every rank
// has a usable GPU, and otherwise starts none, keeping the reason for the CUDA tensors' errors;
// any other name starts none. Every rank first publishes in the store whether it can start it, so
// all ranks make the same choice; the NCCL communicator itself starts at the first CUDA
// collective (backends/nccl/nccl_backend.h). Collective; blocks at most until `deadline`. `options`
// are the CPU backend's (the device backend uses its own key prefix under options.prefix).
StatusOr<DevicePlane> StartDevicePlane(const Config& config, const BackendOptions& options,
                                       Store* store, Deadline deadline);

// The local rank whose GPU `config`'s device plane uses (the device is it modulo the usable CUDA
// devices): config.device_local_rank when set (a sub-communicator: its parent's), else local_rank.
int DeviceLocalRank(const Config& config);

// The device side of an MPI communicator (CONCORD_BACKEND=mpi, or auto under mpirun; world or
// sub-communicator): none, with the reason CUDA tensors are refused and what to set instead.
DevicePlane MpiDevicePlane(const Config& config);

}  // namespace concord
