// Rendezvous: a key-value Store that ranks use to find each other before any transport exists
// (as in Gloo). Keys are strings, values are byte strings; a key is written once per job.
// Implementations: FileStore (one host, a shared directory), TcpStore (a client of the server that
// the launcher runs; every connection must present the job's secret token). All methods are
// thread-safe and every blocking call takes a deadline.
#pragma once

#include <string>
#include <vector>

#include "base/clock.h"
#include "base/status.h"

namespace concord {

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
  // Atomically adds delta to the integer stored at key (missing: 0) and returns the new value.
  virtual StatusOr<int64_t> Add(const std::string& key, int64_t delta) = 0;
  // Why a start that meets its peers through this store should stop waiting for them, also where
  // it waits outside the store (for their connections: backends/gloo/gloo_context.h): OK while it
  // should go on. A plain store never gives up; a sub-communicator's view of its parent's store
  // (core/bootstrap.cc) returns the parent's failure (a member died) while the start runs.
  virtual Status GiveUp() { return Status::Ok(); }
};

}  // namespace concord
