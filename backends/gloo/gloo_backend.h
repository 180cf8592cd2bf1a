// Gloo over TCP: the default CPU backend. See backend.h for the contract.
#pragma once

#include <memory>

#include "backends/backend.h"
#include "backends/gloo/gloo_context.h"

namespace concord {

class Store;

// Connects a full mesh of Gloo pairs of `transport` through the store (keys under options.prefix).
// ibverbs fails at once with kUnavailable, naming what is missing, on a host without an RDMA
// device.
StatusOr<std::unique_ptr<Backend>> CreateGlooBackend(
    const BackendOptions& options, Store* store,
    gloo_internal::GlooTransport transport = gloo_internal::GlooTransport::kTcp);

}  // namespace concord
