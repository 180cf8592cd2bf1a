#include "core/device_setup.h"

#include <string>

#include "backends/device_backend.h"

namespace concord {

namespace {

// No device backend: `why` when this build has one, else that it has none.
DevicePlane NoDeviceBackend(const std::string& why) {
  DevicePlane plane;
  plane.unavailable = Status(Code::kUnavailable,
                             BuiltDeviceBackends().empty()
                                 ? "this Concord was built without a GPU backend (CUDA and NCCL "
                                   "were not found at configure time)"
                                 : why);
  return plane;
}

}  // namespace

int DeviceLocalRank(const Config& config) {
  return config.device_local_rank >= 0 ? config.device_local_rank : config.local_rank;
}

DevicePlane MpiDevicePlane(const Config& config) {
  return NoDeviceBackend(
      "CONCORD_BACKEND=" + config.backend +
      (config.backend == "mpi" ? "" : " chose mpi (the job was started by mpirun)") +
      ": an MPI communicator carries CPU tensors only and starts no GPU backend; for CUDA "
      "tensors set CONCORD_BACKEND=nccl (CPU tensors on Gloo, CUDA tensors on NCCL; it runs "
      "under mpirun too)");
}

StatusOr<DevicePlane> StartDevicePlane(const Config& config, const BackendOptions& options,
                                       Store* store, Deadline deadline) {
  const bool required = config.backend == "nccl";
  if (!required && config.backend != "auto") {
    return NoDeviceBackend("CONCORD_BACKEND=" + config.backend +
                           " starts no GPU backend (CUDA tensors need auto or nccl)");
  }
  DevicePlane plane;
  // Each rank says whether it can start NCCL ("ok" or why not); all ranks read every answer.
  StatusOr<int> device = ProbeDeviceBackend("nccl", DeviceLocalRank(config));
  const std::string prefix = options.prefix + "/device";
  CONCORD_RETURN_IF_ERROR(store->Set(prefix + "/probe/" + std::to_string(config.rank),
                                     device.ok() ? "ok" : device.status().message()));
  for (int r = 0; r < config.size; ++r) {
    CONCORD_ASSIGN_OR_RETURN(std::string answer,
                             store->Get(prefix + "/probe/" + std::to_string(r), deadline));
    if (answer == "ok") continue;
    const Status why(Code::kUnavailable,
                     "the nccl backend cannot start on rank " + std::to_string(r) + ": " + answer);
    if (required) return why.WithContext("CONCORD_BACKEND=nccl");
    plane.unavailable = why;
    return plane;
  }
  BackendOptions device_options = options;
  device_options.prefix = prefix;
  auto backend = CreateDeviceBackend("nccl", *device, device_options, store);
  if (!backend.ok()) return backend.status().WithContext("starting the nccl backend");
  plane.backend = std::move(*backend);
  plane.unavailable = Status::Ok();
  return plane;
}

}  // namespace concord
