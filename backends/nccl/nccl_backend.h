// The NCCL device backend: CUDA tensors' collectives on one GPU per rank, asynchronous, with the
// contract of backends/device_backend.h. Plain C++ header: NCCL and CUDA stay in the .cu file.
//
// Set-up: rank 0 creates the NCCL unique id and puts it in the rendezvous store under
// options.prefix (the other ranks read it there, waiting at most options.timeout). The store, not
// the control plane, carries it: it is authenticated by the job's token, namespaced per
// communicator, and available at init before the engine's thread owns the control plane, whose
// wire protocol then stays the negotiation's alone. The communicator is non-blocking
// (ncclConfig_t::blocking = 0), so no NCCL call can hang the caller past a deadline.
#pragma once

#include <memory>

#include "backends/backend.h"
#include "backends/device_backend.h"

namespace concord {

// The device this rank uses (local_rank modulo the usable devices), or kUnavailable naming why
// there is none (CUDA's error string and code, and NCCL's version).
StatusOr<int> ProbeNcclDevice(int local_rank);

// Collective over every rank of options (see above).
StatusOr<std::unique_ptr<DeviceBackend>> CreateNcclBackend(int device,
                                                           const BackendOptions& options,
                                                           Store* store);

}  // namespace concord
