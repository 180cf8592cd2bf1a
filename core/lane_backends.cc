#include "core/lane_backends.h"

#include <algorithm>
#include <map>
#include <utility>
#include <vector>

#include "base/log.h"
#include "rendezvous/store.h"

namespace concord {
namespace {

size_t Threshold(int64_t bytes) {
  return bytes < 0 ? SIZE_MAX : static_cast<size_t>(bytes);
}

void Log(const Config& config, LogLevel level, const std::string& message) {
  LogLine(static_cast<LogLevel>(config.log_level), level, config.rank, message);
}

// Every rank says whether its part of a lane's set-up worked; all learn whether all did (the
// first failure's message, which names its rank), so that they fall back or fail together.
Status AgreeAcrossRanks(const Config& config, Store* store, const std::string& key,
                        const Status& mine, Deadline deadline) {
  CONCORD_RETURN_IF_ERROR(
      store->Set(key + "/" + std::to_string(config.rank), mine.ok() ? "ok" : "!" + mine.message()));
  for (int r = 0; r < config.size; ++r) {
    CONCORD_ASSIGN_OR_RETURN(std::string theirs,
                             store->Get(key + "/" + std::to_string(r), deadline));
    // The message names the rank (ShmSegment::Open's do).
    if (theirs != "ok") return Status(Code::kUnavailable, theirs.substr(1));
  }
  return Status::Ok();
}

StatusOr<std::unique_ptr<Backend>> Flat(const Config& config, const BackendOptions& options,
                                        Store* store, int lane) {
  const std::string name = config.ResolvedBackend();
  auto backend = CreateBackend(name, options, store);
  if (!backend.ok()) {
    return backend.status().WithContext("starting the " + name + " backend (lane " +
                                        std::to_string(lane) + ")");
  }
  return backend;
}

// Shared memory among `ranks` (this rank is ranks[index]) under `prefix`. kUnavailable on every
// rank of them alike when it cannot be set up.
StatusOr<std::unique_ptr<Backend>> Shm(const Config& config, const BackendOptions& options,
                                       Store* store, int index, int ranks,
                                       const std::string& prefix) {
  BackendOptions shm = options;
  shm.rank = index;
  shm.size = ranks;
  shm.prefix = prefix;
  return CreateShmBackend(shm, store, static_cast<size_t>(config.shm_buffer_bytes),
                          Threshold(config.shm_direct_threshold_bytes));
}

// Lane `lane` of a communicator whose hosts each run layout.local_size ranks: the
// hierarchical backend, or (auto) the flat one when shared memory fails on any host (then
// *fell_back is set).
StatusOr<std::unique_ptr<Backend>> Hierarchical(const Config& config, const HostLayout& layout,
                                                const BackendOptions& options, Store* store,
                                                const std::string& prefix, int lane,
                                                Deadline deadline, bool* fell_back) {
  const std::string tag = "/lane" + std::to_string(lane);
  // The host's ranks, in rank order: their errors name them so, not by their local ranks.
  BackendOptions host_options = options;
  for (int r = 0; r < static_cast<int>(layout.host_of.size()); ++r) {
    if (layout.host_of[r] == layout.host) host_options.rank_names.push_back(r);
  }
  StatusOr<std::unique_ptr<Backend>> local =
      Shm(config, host_options, store, layout.local_rank, layout.local_size,
          prefix + "/shm/host" + std::to_string(layout.host) + tag);
  if (!local.ok() && local.status().code() != Code::kUnavailable) return local.status();
  const Status agreed =
      AgreeAcrossRanks(config, store, prefix + "/hier" + tag, local.status(), deadline);
  if (agreed.code() != Code::kUnavailable && !agreed.ok()) return agreed;
  // Refused on every rank alike, before any rank starts the flat backend (whose connections a
  // rank that gave up would leave the others waiting for).
  if (!agreed.ok() && (config.hierarchical == "on" || config.shm == "on")) {
    const char* setting = config.hierarchical == "on" ? "hierarchical" : "shm";
    return agreed.WithContext(config.SourceOf(setting) + " = on needs shared memory on every host");
  }
  CONCORD_ASSIGN_OR_RETURN(std::unique_ptr<Backend> flat, Flat(config, options, store, lane));
  if (!agreed.ok()) {
    Log(config, LogLevel::kWarning,
        "lane " + std::to_string(lane) + " is flat: " + agreed.message());
    *fell_back = true;
    return flat;
  }
  // Among the ranks of this local rank on every host (rank_names[h]: host h's), which its errors
  // name by their ranks here, not by their hosts.
  BackendOptions cross = options;
  cross.rank = layout.host;
  cross.size = layout.hosts;
  cross.prefix = options.prefix + "/cross" + std::to_string(layout.local_rank) + tag;
  cross.rank_names.assign(layout.hosts, -1);
  std::vector<int> seen(layout.hosts, 0);  // ranks passed on each host
  for (int r = 0; r < static_cast<int>(layout.host_of.size()); ++r) {
    const int h = layout.host_of[r];
    if (seen[h]++ == layout.local_rank) cross.rank_names[h] = r;
  }
  auto across = CreateBackend(config.ResolvedBackend(), cross, store);
  if (!across.ok()) {
    return across.status().WithContext("starting the backend across hosts (lane " +
                                       std::to_string(lane) + ")");
  }
  return CreateHierarchicalBackend(config.rank, layout.host_of, std::move(*local),
                                   std::move(*across), std::move(flat),
                                   Threshold(config.hierarchical_threshold_bytes));
}

}  // namespace

StatusOr<HostLayout> ExchangeHostLayout(const Config& config, Store* store,
                                        const std::string& prefix, Deadline deadline) {
  const std::string mine = ShmHostIdentity(config.host_id);
  CONCORD_RETURN_IF_ERROR(store->Set(prefix + "/host/" + std::to_string(config.rank), mine));
  std::map<std::string, int> host_of;  // identity -> host number
  std::vector<int> sizes;
  HostLayout layout;
  for (int r = 0; r < config.size; ++r) {
    CONCORD_ASSIGN_OR_RETURN(std::string theirs,
                             store->Get(prefix + "/host/" + std::to_string(r), deadline));
    const auto [it, added] = host_of.emplace(theirs, static_cast<int>(sizes.size()));
    if (added) sizes.push_back(0);
    layout.host_of.push_back(it->second);
    if (r == config.rank) {
      layout.host = it->second;
      layout.local_rank = sizes[it->second];
    }
    ++sizes[it->second];
    if (theirs != mine && layout.elsewhere < 0) layout.elsewhere = r;
  }
  layout.hosts = static_cast<int>(sizes.size());
  layout.local_size = sizes[layout.host];
  layout.uniform =
      std::all_of(sizes.begin(), sizes.end(), [&](int n) { return n == layout.local_size; });
  return layout;
}

StatusOr<std::vector<std::unique_ptr<Backend>>> CreateLaneBackends(const Config& config,
                                                                   const BackendOptions& options,
                                                                   Store* store,
                                                                   const std::string& prefix,
                                                                   Deadline deadline) {
  HostLayout layout;
  if (config.size > 1 && config.shm != "off") {
    CONCORD_ASSIGN_OR_RETURN(layout, ExchangeHostLayout(config, store, prefix, deadline));
  }
  const bool one_host = config.size > 1 && config.shm != "off" && layout.hosts == 1;
  const bool hierarchical = config.shm != "off" && config.hierarchical != "off" &&
                            layout.hosts > 1 && layout.uniform && layout.local_size > 1;
  if (config.shm == "on" && !one_host && !hierarchical && config.size > 1) {
    return InvalidArgument(config.SourceOf("shm") + " = on, but rank " +
                           std::to_string(layout.elsewhere) +
                           " runs on another host than this one, and the hosts do not each run "
                           "the same number (> 1) of ranks for hierarchical collectives");
  }
  if (config.hierarchical == "on" && !hierarchical && !one_host && config.size > 1) {
    return InvalidArgument(config.SourceOf("hierarchical") +
                           " = on, but the ranks are not spread evenly, more than one per host, "
                           "over several hosts (or CONCORD_SHM = off)");
  }
  std::vector<std::unique_ptr<Backend>> lanes;
  int flat_lanes = 0;  // lanes that fell back to the flat backend (each logged a warning)
  for (int lane = 0; lane < config.lanes; ++lane) {
    BackendOptions lane_options = options;
    if (lane > 0) lane_options.prefix += "/lane" + std::to_string(lane);
    std::unique_ptr<Backend> backend;
    bool fell_back = false;
    if (hierarchical) {
      CONCORD_ASSIGN_OR_RETURN(backend, Hierarchical(config, layout, lane_options, store, prefix,
                                                     lane, deadline, &fell_back));
    } else if (one_host) {
      auto made = Shm(config, lane_options, store, config.rank, config.size,
                      prefix + "/shm/lane" + std::to_string(lane));
      // Every rank got the same answer: all fall back together, or all fail.
      if (made.ok()) {
        backend = std::move(*made);
      } else if (made.status().code() != Code::kUnavailable || config.shm == "on") {
        return made.status().WithContext("starting shared memory (lane " + std::to_string(lane) +
                                         ", " + config.SourceOf("shm") + " = " + config.shm + ")");
      } else {
        Log(config, LogLevel::kWarning,
            "lane " + std::to_string(lane) + " uses the " + config.ResolvedBackend() +
                " backend: " + made.status().message());
        fell_back = true;
      }
    }
    if (!backend) {
      CONCORD_ASSIGN_OR_RETURN(backend, Flat(config, lane_options, store, lane));
    }
    if (fell_back) ++flat_lanes;
    lanes.push_back(std::move(backend));
  }
  // Said once the lanes are up, so it tells what was built (every rank agreed on it); a lane that
  // fell back said so itself.
  if (one_host && flat_lanes == 0) {
    Log(config, LogLevel::kInfo,
        "collectives use shared memory: all " + std::to_string(config.size) +
            " ranks are on this host");
  } else if (hierarchical && flat_lanes == 0) {
    Log(config, LogLevel::kInfo,
        "allreduces, allgathers (all ranks' bytes together) and broadcasts of " +
            std::to_string(config.hierarchical_threshold_bytes) +
            " bytes and more are hierarchical: " + std::to_string(layout.hosts) + " hosts x " +
            std::to_string(layout.local_size) + " ranks (shared memory within a host, " +
            config.ResolvedBackend() +
            " across hosts); smaller ones, reduce-scatters, all-to-alls and barriers run flat "
            "on " +
            config.ResolvedBackend());
  } else if (!one_host && !hierarchical && config.size > 1) {
    Log(config, LogLevel::kInfo, "collectives run flat on " + config.ResolvedBackend());
  }
  return lanes;
}

}  // namespace concord
