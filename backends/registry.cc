// The one place that knows which backends were built. Core asks here by name; it never includes a
// backend's own header. A new backend adds its name to BuiltBackends() and its case below.
#include "backends/backend.h"
#include "backends/gloo/gloo_backend.h"
#ifdef CONCORD_HAVE_MPI
#include "backends/mpi/mpi_backend.h"
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
  if (name == "gloo") return CreateGlooBackend(options, store);
  if (name == "gloo-ibverbs") {
    return CreateGlooBackend(options, store, gloo_internal::GlooTransport::kIbverbs);
  }
  return NotBuilt(name);
}

StatusOr<MpiTransports> CreateMpiTransports(std::chrono::milliseconds timeout) {
#ifdef CONCORD_HAVE_MPI
  CONCORD_ASSIGN_OR_RETURN(std::shared_ptr<MpiEnvironment> env, MpiEnvironment::Acquire());
  MpiTransports t;
  CONCORD_ASSIGN_OR_RETURN(t.control, CreateMpiControlPlane(env, timeout));
  CONCORD_ASSIGN_OR_RETURN(t.backend, CreateMpiBackend(env, timeout));
  t.rank = t.backend->rank();
  t.size = t.backend->size();
  t.keep_alive = std::move(env);
  return t;
#else
  (void)timeout;
  return NotBuilt("mpi");
#endif
}

}  // namespace concord
