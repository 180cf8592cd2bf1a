// The job settings: what every rank of a communicator must share, or the ranks would plan
// different collectives (fusion threshold, cache capacity), build different algorithms (backend,
// Gloo algorithm) or read each other's bytes differently (Concord's version and wire version,
// base/wire_version.h). At a start, rank 0 gives its settings and every other rank compares them
// with its own and refuses to start on a difference, naming it and both values.
#pragma once

#include <string>
#include <utility>
#include <vector>

#include "backends/backend.h"
#include "base/clock.h"
#include "base/status.h"
#include "core/config.h"
#include "rendezvous/store.h"

namespace concord {

// (name, value) in the order they are compared: the build's first, since ranks of different
// builds may differ in every other setting too, or name them differently.
std::vector<std::pair<std::string, std::string>> JobSettings(const Config& c);

// JobSettings as "NAME=value\n" lines: what rank 0 gives. The layout never changes.
std::string JobSettingsBlob(const Config& c);

// This rank's settings against rank 0's blob: Ok, or kInvalidArgument naming the first setting
// that differs and both values. A blob from a build that compares settings this one does not know
// (or lacks one it knows) is refused as a different build.
Status CompareJobSettings(const Config& c, const std::string& rank0_blob);

// Through the store: rank 0 sets `<prefix>/settings`, the others get it (by `deadline`) and
// compare.
Status CheckJobSettings(const Config& c, Store* store, const std::string& prefix,
                        Deadline deadline);

// Through a backend's broadcast (no store: MPI): rank 0's settings reach every rank, which
// compares.
Status CheckJobSettings(const Config& c, Backend* backend);

}  // namespace concord
