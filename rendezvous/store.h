// Rendezvous: a key-value Store that ranks use to find each other before any transport exists
// (as in Gloo). Keys are strings, values are byte strings; a key is written once per job.
// Implementations: FileStore (one host, a shared directory), TcpStore (a client of the server that
// the launcher runs; every connection must present the job's secret token). All methods are
// thread-safe and every blocking call takes a deadline.
#pragma once

#include <cstddef>
#include <string>
#include <vector>

#include "base/clock.h"
#include "base/status.h"

namespace concord {

// What Store::GetFirst found: the position of the key in the list it was given, and its value.
struct FoundKey {
  size_t index = 0;
  std::string value;
};

// GetFirst's kTimeout message: "store: key 'a' did not appear before the deadline", or for
// several, "store: none of the keys 'a', 'b' appeared before the deadline".
inline std::string NoKeyAppearedMessage(const std::vector<std::string>& keys) {
  if (keys.size() == 1) return "store: key '" + keys[0] + "' did not appear before the deadline";
  std::string listed;
  for (const std::string& key : keys) listed += (listed.empty() ? "'" : ", '") + key + "'";
  return "store: none of the keys " + listed + " appeared before the deadline";
}

class Store {
 public:
  virtual ~Store() = default;
  // Sets key to value (overwrites).
  virtual Status Set(const std::string& key, const std::string& value) = 0;
  // Waits until key exists, then returns its value; kTimeout naming the key when the deadline
  // passes.
  virtual StatusOr<std::string> Get(const std::string& key, Deadline deadline) = 0;
  // Waits until all keys exist.
  virtual Status Wait(const std::vector<std::string>& keys, Deadline deadline) = 0;
  // Waits until any of `keys` exists, then returns the first of them in the list's order that
  // exists, and its value: one wait for a key or for another that ends the wait (a start waits so
  // for a peer's key or the key where a failed rank tells why). kTimeout naming the keys when the
  // deadline passes; kInvalidArgument for an empty list.
  virtual StatusOr<FoundKey> GetFirst(const std::vector<std::string>& keys, Deadline deadline) = 0;
  // Atomically adds delta to the integer stored at key (missing: 0) and returns the new value.
  virtual StatusOr<int64_t> Add(const std::string& key, int64_t delta) = 0;
  // Why a start that meets its peers through this store should stop waiting for them, also where
  // it waits outside the store (for their connections: backends/gloo/gloo_context.h): OK while it
  // should go on. A plain store never gives up; a sub-communicator's view of its parent's store
  // (core/bootstrap.cc) returns the parent's failure (a member died) while the start runs.
  virtual Status GiveUp() { return Status::Ok(); }
};

}  // namespace concord
