// Starting a communicator: from a Config to a running Engine. Opens the rendezvous store (from
// CONCORD_STORE, or torchrun's MASTER_ADDR/MASTER_PORT, or a per-job file store when every rank
// is on this host, or nothing at all for a lone process), picks this communicator's key prefix,
// connects the control plane and the backend, and starts the engine. Collective: every rank calls
// it, in the same order for every communicator it creates. Blocks at most config.timeout_s.
#pragma once

#include <memory>

#include "core/config.h"
#include "core/engine.h"

namespace concord {

StatusOr<std::unique_ptr<Engine>> CreateEngine(Config config);

}  // namespace concord
