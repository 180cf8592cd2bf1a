// The data plane of each lane of a store-based communicator, chosen from where its ranks run
// (README, Configuration: CONCORD_SHM, CONCORD_HIERARCHICAL):
//   - every rank on this host: shared memory (backends/shm);
//   - several hosts, each with the same number (> 1) of ranks: the hierarchical backend (shared
//     memory within the host, the configured backend across hosts, and over all ranks);
//   - otherwise, or when turned off: the configured backend (Gloo) over all ranks.
// Collective: every rank of the communicator calls it with the same settings (job-wide). Every
// rank makes the same choice, including a fallback when shared memory cannot be set up on some
// host.
#pragma once

#include <memory>
#include <string>
#include <vector>

#include "backends/backend.h"
#include "base/clock.h"
#include "core/config.h"

namespace concord {

class Store;

// Where this communicator's ranks run, from the host identities every rank publishes.
struct HostLayout {
  int hosts = 1;             // distinct hosts, numbered in the order of their lowest rank
  int host = 0;              // this rank's host
  int local_rank = 0;        // this rank's position among the ranks of its host, in rank order
  int local_size = 1;        // the ranks on this host
  bool uniform = true;       // every host runs local_size ranks
  int elsewhere = -1;        // the lowest rank on another host than this one, or -1
  std::vector<int> host_of;  // every rank's host (a host's ranks need not be consecutive)
};

// Publishes this rank's host identity under prefix/host/<rank> and reads everyone's.
StatusOr<HostLayout> ExchangeHostLayout(const Config& config, Store* store,
                                        const std::string& prefix, Deadline deadline);

// One backend per lane for `config.lanes` lanes. `options` are the configured backend's (its
// prefix is lane 0's; lane L adds "/lane<L>").
StatusOr<std::vector<std::unique_ptr<Backend>>> CreateLaneBackends(const Config& config,
                                                                   const BackendOptions& options,
                                                                   Store* store,
                                                                   const std::string& prefix,
                                                                   Deadline deadline);

}  // namespace concord
