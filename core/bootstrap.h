// Starting a communicator: from a Config to a running Engine. Opens the rendezvous store (from
// CONCORD_STORE, or torchrun's MASTER_ADDR/MASTER_PORT, or a per-job file store when every rank
// is on this host, or nothing at all for a lone process), picks this communicator's key prefix,
// connects the control plane and the backend, and starts the engine. Collective: every rank calls
// it, in the same order for every communicator it creates. Blocks at most config.timeout_s.
#pragma once

#include <atomic>
#include <chrono>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "core/config.h"
#include "core/engine.h"

namespace concord {

struct Rendezvous;  // the store (and its server, under torchrun): bootstrap.cc

// What a communicator was started from, kept with its engine so that it can be split
// (core/comm_split.h): the rendezvous and key prefix its sub-communicators start under, and the
// world rank of each of its ranks (over which, on MPI, they start). Shared by the communicator's
// handle and by the engines of its sub-communicators (whose keep_alive holds the rendezvous), so
// the store outlives every communicator that uses it.
struct CommOrigin {
  std::shared_ptr<Rendezvous> rendezvous;  // null on MPI
  // This communicator's store keys; on MPI (no store) its name, "mpi/<rank 0's draw>" for one
  // that init started: unique in the job either way, as its sub-communicators' names extend it.
  std::string prefix;
  std::string host;  // the address its control plane advertises
  // Rank here -> rank in the communicator that init started (on MPI, MPI_COMM_WORLD's).
  std::vector<int> world_ranks;
  // Splits of this communicator so far: the Nth split on every rank is the same split.
  std::atomic<uint64_t> splits{0};
};

struct Communicator {
  std::unique_ptr<Engine> engine;
  std::shared_ptr<CommOrigin> origin;
};

// A start that fails on one rank fails it on every rank, promptly, naming the rank and its error,
// which that rank publishes in the store (`<prefix>/failed`: kPeerFailure, "rank R failed to
// start: ..."). Before its control-plane connection is up, the others' waits look at it every
// kParentCheck; after it, they learn of the failure through the control plane (its connection
// closes), and it was published before that close (under torchrun, a failure before the store is
// open is left to torchrun, which stops the others). A rank whose start ended on a peer's closed
// connection publishes nothing of its own. Once a failure is published, every other rank's error,
// however its start ended (rank 0 failed with it and closed its connections), leads with it:
// kPeerFailure, "rank R failed to start: ...", then this rank's own error where it says more.
// Every rank keeps the communicator number it took, so retried inits (on every rank) meet under
// the next prefix.
StatusOr<Communicator> CreateCommunicator(Config config);
// CreateCommunicator's engine alone (tests, benchmarks).
StatusOr<std::unique_ptr<Engine>> CreateEngine(Config config);

// Starts the communicator of a split (core/comm_split.h): `config` is the parent's, with this
// rank's rank, size and local rank among the members, whose world ranks are `world_ranks`. On the
// parent's store under `prefix`, or, on MPI, over those MPI_COMM_WORLD ranks
// (MPI_Comm_create_group, told apart from other sub-communicators started at once by `prefix`'s
// digest). Collective over the members only. On the store, its
// waits for the other members' keys look at `parent_failure` (called only during this call) every
// kParentCheck: once the parent has failed (a member died), the start fails with that error,
// naming the rank, instead of waiting out the timeout; a start that failed as a member's death
// would make it fail (a lost connection, a timeout) waits up to kParentGrace for the parent to
// learn of one, and any other failure (a setting refused) returns at once. A member whose start
// fails on its own publishes its failure under `prefix`, as CreateCommunicator's ranks do: before
// its control plane is up (its control plane cannot bind), the other members' waits end within
// kParentCheck; after it (a lane that cannot listen), before its connections close, after the
// wait for the parent where its error looks like a death's. The others' errors lead with it
// (kPeerFailure, "rank R (world rank W) failed to start: ...").
// Where its own error names one of its ranks, it names the world rank too ("rank 1 (world rank
// 3)").
StatusOr<Communicator> StartSubCommunicator(const Config& config, const CommOrigin& parent,
                                            const std::string& prefix, std::vector<int> world_ranks,
                                            const std::function<Status()>& parent_failure);
inline constexpr std::chrono::milliseconds kParentCheck{100};
inline constexpr std::chrono::milliseconds kParentGrace{500};

}  // namespace concord
