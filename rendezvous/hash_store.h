// An in-memory Store for tests that run ranks as threads of one process.
#pragma once

#include <map>
#include <string>
#include <vector>

#include "base/mutex.h"
#include "rendezvous/store.h"

namespace concord {

// Contract: owns its key-value map. Thread-safe (one mutex); Get, Wait and GetFirst block on a
// condition variable until the keys appear or the deadline passes (kTimeout naming the missing
// key). Add keeps counters as decimal text, so Get of a counter returns e.g. "3"; Add on a key
// holding anything else is kInvalidArgument. Must outlive every call in progress.
class HashStore : public Store {
 public:
  HashStore() = default;
  HashStore(const HashStore&) = delete;
  HashStore& operator=(const HashStore&) = delete;

  Status Set(const std::string& key, const std::string& value) override EXCLUDES(mu_);
  StatusOr<std::string> Get(const std::string& key, Deadline deadline) override EXCLUDES(mu_);
  Status Wait(const std::vector<std::string>& keys, Deadline deadline) override EXCLUDES(mu_);
  StatusOr<FoundKey> GetFirst(const std::vector<std::string>& keys, Deadline deadline) override
      EXCLUDES(mu_);
  StatusOr<int64_t> Add(const std::string& key, int64_t delta) override EXCLUDES(mu_);

 private:
  // Waits until every key exists; returns the first missing one on timeout.
  Status WaitLocked(const std::vector<std::string>& keys, Deadline deadline) REQUIRES(mu_);

  Mutex mu_;
  CondVar changed_;
  std::map<std::string, std::string> values_ GUARDED_BY(mu_);
};

}  // namespace concord
