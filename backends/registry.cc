// The one place that knows which backends were built. Core asks here by name; it never includes a
// backend's own header. A new backend adds its name to BuiltBackends() and its case below.
#include "backends/backend.h"
#include "backends/device_backend.h"
#include "backends/gloo/gloo_backend.h"
#ifdef CONCORD_HAVE_MPI
#include "backends/mpi/mpi_backend.h"
#endif
#ifdef CONCORD_HAVE_NCCL_BACKEND
#include "backends/nccl/nccl_backend.h"
#endif

namespace concord {

std::vector<std::string> BuiltBackends() {
#ifdef CONCORD_HAVE_MPI
  return {"gloo", "gloo-ibverbs", "mpi"};
#else
  return {"gloo", "gloo-ibverbs"};
#endif
}

namespace {

Status NotBuilt(const std::string& name) {
  std::string built;
  for (const auto& b : BuiltBackends()) built += (built.empty() ? "" : ", ") + b;
  return Status(Code::kUnavailable,
                "backend '" + name + "' is not built into this Concord (built: " + built + ")");
}

}  // namespace

StatusOr<std::unique_ptr<Backend>> CreateBackend(const std::string& name,
                                                 const BackendOptions& options, Store* store) {
  // A device backend's name (nccl) still means Gloo for the CPU tensors.
  if (name == "gloo" || name == "nccl") return CreateGlooBackend(options, store);
  if (name == "gloo-ibverbs") {
    return CreateGlooBackend(options, store, gloo_internal::GlooTransport::kIbverbs);
  }
  return NotBuilt(name);
}

StatusOr<MpiTransports> CreateMpiTransports(std::chrono::milliseconds timeout,
                                            const std::vector<int>& world_ranks,
                                            uint64_t identity) {
#ifdef CONCORD_HAVE_MPI
  CONCORD_ASSIGN_OR_RETURN(std::shared_ptr<MpiEnvironment> env, MpiEnvironment::Acquire());
  MPI_Comm base = MPI_COMM_WORLD;
  if (!world_ranks.empty()) {
    CONCORD_ASSIGN_OR_RETURN(base, CreateGroupComm(*env, world_ranks, identity));
  }
  // The group's communicator only seeds the duplicates; it goes whatever happens.
  auto made = [&]() -> StatusOr<MpiTransports> {
    if (base != MPI_COMM_WORLD) {
      CONCORD_RETURN_IF_ERROR(CheckSameIdentity(*env, base, identity, Deadline::After(timeout)));
    }
    MpiTransports t;
    CONCORD_ASSIGN_OR_RETURN(t.control, CreateMpiControlPlane(env, timeout, base));
    CONCORD_ASSIGN_OR_RETURN(t.backend, CreateMpiBackend(env, timeout, kMpiMaxMessageBytes, base));
    t.rank = t.backend->rank();
    t.size = t.backend->size();
    if (t.size > 1) {
      CONCORD_ASSIGN_OR_RETURN(t.p2p, CreateMpiP2pTransport(env, timeout, base));
    }
    return t;
  }();
  if (base != MPI_COMM_WORLD) {
    auto lock = env->Lock();
    if (lock) MPI_Comm_free(&base);
  }
  if (made.ok()) made->keep_alive = std::move(env);
  return made;
#else
  (void)timeout;
  (void)world_ranks;
  (void)identity;
  return NotBuilt("mpi");
#endif
}

std::vector<std::string> BuiltDeviceBackends() {
#ifdef CONCORD_HAVE_NCCL_BACKEND
  return {"nccl"};
#else
  return {};
#endif
}

StatusOr<int> ProbeDeviceBackend(const std::string& name, int local_rank) {
#ifdef CONCORD_HAVE_NCCL_BACKEND
  if (name == "nccl") return ProbeNcclDevice(local_rank);
#endif
  (void)local_rank;
  return Status(Code::kUnavailable,
                "device backend '" + name + "' is not built into this Concord" +
                    (BuiltDeviceBackends().empty() ? " (built without CUDA and NCCL)" : ""));
}

StatusOr<std::unique_ptr<DeviceBackend>> CreateDeviceBackend(const std::string& name, int device,
                                                             const BackendOptions& options,
                                                             Store* store) {
#ifdef CONCORD_HAVE_NCCL_BACKEND
  if (name == "nccl") return CreateNcclBackend(device, options, store);
#endif
  (void)device;
  (void)options;
  (void)store;
  return Status(Code::kUnavailable, "device backend '" + name + "' is not built into this Concord");
}

}  // namespace concord
