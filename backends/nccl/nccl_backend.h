// The NCCL device backend: CUDA tensors' collectives on one GPU per rank, asynchronous, with the
// contract of backends/device_backend.h. Plain C++ header: NCCL and CUDA stay in the .cu file.
//
// Set-up: creating the backend talks to no peer (streams, packer, completion thread). The NCCL
// communicator starts at the first Launch(), which every rank makes for the same collective: rank
// 0 creates the NCCL unique id and puts it in the rendezvous store under options.prefix, the other
// ranks read it there, waiting at most until that collective's deadline. So a communicator that
// never carries a CUDA collective (a CPU-only sub-communicator) costs no NCCL start-up, and the
// first CUDA collective of each communicator takes NCCL's start-up time. The store, not the
// control plane, carries the id: it is authenticated by the job's token, namespaced per
// communicator, and reachable from the engine's thread without touching the negotiation's wire
// protocol. The communicator is non-blocking (ncclConfig_t::blocking = 0), so no NCCL call can
// hang the caller past a deadline.
#pragma once

#include <memory>

#include "backends/backend.h"
#include "backends/device_backend.h"

namespace concord {

// The device this rank uses (local_rank modulo the usable devices), or kUnavailable naming why
// there is none (CUDA's error string and code, and NCCL's version).
StatusOr<int> ProbeNcclDevice(int local_rank);

// Local (see above); `store` must outlive the backend.
StatusOr<std::unique_ptr<DeviceBackend>> CreateNcclBackend(int device,
                                                           const BackendOptions& options,
                                                           Store* store);

}  // namespace concord
