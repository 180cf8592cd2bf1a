#include "core/job_settings.h"

#include <cstdint>
#include <map>

#include "base/wire_version.h"

namespace concord {
namespace {

constexpr char kVersionName[] = "Concord version";
constexpr char kWireName[] = "Concord wire version";

std::string VersionText() {
  return std::to_string(CONCORD_VERSION_MAJOR) + "." + std::to_string(CONCORD_VERSION_MINOR) + "." +
         std::to_string(CONCORD_VERSION_PATCH);
}

// "NAME=value" lines into a map; a line without '=' is kept whole as a name with no value.
std::map<std::string, std::string> ParseBlob(const std::string& blob) {
  std::map<std::string, std::string> settings;
  size_t at = 0;
  while (at < blob.size()) {
    size_t end = blob.find('\n', at);
    if (end == std::string::npos) end = blob.size();
    const std::string line = blob.substr(at, end - at);
    at = end + 1;
    if (line.empty()) continue;
    const size_t eq = line.find('=');
    if (eq == std::string::npos) {
      settings[line] = "";
    } else {
      settings[line.substr(0, eq)] = line.substr(eq + 1);
    }
  }
  return settings;
}

Status DifferentBuild(const Config& c, const std::string& what) {
  return InvalidArgument(
      "rank 0 and rank " + std::to_string(c.rank) + " run different builds of Concord: " + what +
      " (rank " + std::to_string(c.rank) + " runs Concord " + VersionText() + ", wire version " +
      std::to_string(kWireVersion) + "); give every rank the same libconcord");
}

}  // namespace

std::vector<std::pair<std::string, std::string>> JobSettings(const Config& c) {
  return {{kWireName, std::to_string(kWireVersion)},
          {kVersionName, VersionText()},
          {"CONCORD_BACKEND", c.backend},
          {"CONCORD_GLOO_ALGORITHM", c.gloo_algorithm},
          {"CONCORD_FUSION_THRESHOLD", std::to_string(c.fusion_threshold_bytes)},
          {"CONCORD_DIRECT_THRESHOLD", std::to_string(c.direct_threshold_bytes)},
          {"CONCORD_CACHE_CAPACITY", std::to_string(c.cache_capacity)},
          {"CONCORD_LANES", std::to_string(c.lanes)},
          {"CONCORD_SHM", c.shm},
          {"CONCORD_SHM_BYTES", std::to_string(c.shm_buffer_bytes)},
          {"CONCORD_SHM_DIRECT_THRESHOLD", std::to_string(c.shm_direct_threshold_bytes)},
          {"CONCORD_HIERARCHICAL", c.hierarchical},
          {"CONCORD_HIERARCHICAL_THRESHOLD", std::to_string(c.hierarchical_threshold_bytes)},
          {"CONCORD_DETERMINISTIC", c.deterministic ? "1" : "0"},
          // Set, every rank measures its clock offset from rank 0's at init (core/clock_sync.h).
          {"CONCORD_TIMELINE (set or not)", c.timeline.empty() ? "not set" : "set"}};
}

std::string JobSettingsBlob(const Config& c) {
  std::string blob;
  for (const auto& [name, value] : JobSettings(c)) blob += name + "=" + value + "\n";
  return blob;
}

Status CompareJobSettings(const Config& c, const std::string& rank0_blob) {
  if (rank0_blob == JobSettingsBlob(c)) return Status::Ok();
  std::map<std::string, std::string> rank0 = ParseBlob(rank0_blob);
  // The builds first: what else differs may only be how they name it.
  for (const char* name : {kWireName, kVersionName}) {
    const auto theirs = rank0.find(name);
    if (theirs == rank0.end()) {
      return DifferentBuild(c, std::string("rank 0's job settings give no ") + name +
                                   " (a build from before wire versions)");
    }
  }
  for (const auto& [name, value] : JobSettings(c)) {
    const auto theirs = rank0.find(name);
    if (theirs == rank0.end()) {
      return DifferentBuild(c, "rank 0's job settings do not give " + name);
    }
    if (theirs->second != value) {
      if (name == kWireName || name == kVersionName) {
        return DifferentBuild(c, "rank 0 has " + name + " " + theirs->second);
      }
      return InvalidArgument(name + " must be the same on every rank: rank 0 has '" +
                             theirs->second + "', rank " + std::to_string(c.rank) + " has '" +
                             value + "'");
    }
    rank0.erase(theirs);
  }
  if (rank0.empty()) return DifferentBuild(c, "rank 0 lays out its job settings differently");
  return DifferentBuild(c, "rank 0's job settings also give " + rank0.begin()->first +
                               " (it compares settings this build does not know)");
}

Status CheckJobSettings(const Config& c, Store* store, const std::string& prefix,
                        Deadline deadline) {
  const std::string key = prefix + "/settings";
  if (c.rank == 0) return store->Set(key, JobSettingsBlob(c));
  CONCORD_ASSIGN_OR_RETURN(std::string theirs, store->Get(key, deadline));
  return CompareJobSettings(c, theirs);
}

Status CheckJobSettings(const Config& c, Backend* backend) {
  std::string blob = JobSettingsBlob(c);
  uint64_t length = blob.size();
  CONCORD_RETURN_IF_ERROR(backend->Broadcast(&length, sizeof(length), 0));
  blob.resize(length);
  CONCORD_RETURN_IF_ERROR(backend->Broadcast(blob.data(), blob.size(), 0));
  return CompareJobSettings(c, blob);
}

}  // namespace concord
