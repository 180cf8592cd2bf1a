// Gloo over TCP: the default CPU backend. See backend.h for the contract.
#pragma once

#include <memory>

#include "backends/backend.h"

namespace concord {

class Store;

// Connects a full mesh of Gloo TCP pairs through the store (keys under options.prefix).
StatusOr<std::unique_ptr<Backend>> CreateGlooBackend(const BackendOptions& options, Store* store);

}  // namespace concord
