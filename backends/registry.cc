// The one place that knows which backends were built. Core asks here by name; it never includes a
// backend's own header.
#include "backends/backend.h"
#include "backends/gloo/gloo_backend.h"

namespace concord {

std::vector<std::string> BuiltBackends() {
  return {"gloo", "gloo-ibverbs"};
}

StatusOr<std::unique_ptr<Backend>> CreateBackend(const std::string& name,
                                                 const BackendOptions& options, Store* store) {
  if (name == "gloo" || name == "auto" || name.empty()) return CreateGlooBackend(options, store);
  if (name == "gloo-ibverbs") {
    return CreateGlooBackend(options, store, gloo_internal::GlooTransport::kIbverbs);
  }
  std::string built;
  for (const auto& b : BuiltBackends()) built += (built.empty() ? "" : ", ") + b;
  return Status(Code::kUnavailable,
                "backend '" + name + "' is not built into this Concord (built: " + built + ")");
}

}  // namespace concord
