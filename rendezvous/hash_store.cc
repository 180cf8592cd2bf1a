#include "rendezvous/hash_store.h"

#include "rendezvous/net.h"

namespace concord {

Status HashStore::Set(const std::string& key, const std::string& value) {
  {
    MutexLock lock(mu_);
    values_[key] = value;
  }
  changed_.NotifyAll();
  return Status::Ok();
}

Status HashStore::WaitLocked(const std::vector<std::string>& keys, Deadline deadline) {
  for (const std::string& key : keys) {
    while (values_.count(key) == 0) {
      if (!changed_.WaitUntil(mu_, deadline) && values_.count(key) == 0) {
        return TimeoutError("store: key '" + key + "' did not appear before the deadline");
      }
    }
  }
  return Status::Ok();
}

StatusOr<std::string> HashStore::Get(const std::string& key, Deadline deadline) {
  MutexLock lock(mu_);
  CONCORD_RETURN_IF_ERROR(WaitLocked({key}, deadline));
  return values_[key];
}

Status HashStore::Wait(const std::vector<std::string>& keys, Deadline deadline) {
  MutexLock lock(mu_);
  return WaitLocked(keys, deadline);
}

StatusOr<FoundKey> HashStore::GetFirst(const std::vector<std::string>& keys, Deadline deadline) {
  if (keys.empty()) return InvalidArgument("store: GetFirst of no keys");
  MutexLock lock(mu_);
  for (;;) {
    for (size_t i = 0; i < keys.size(); ++i) {
      auto it = values_.find(keys[i]);
      if (it != values_.end()) return FoundKey{i, it->second};
    }
    if (deadline.passed()) return TimeoutError(NoKeyAppearedMessage(keys));
    changed_.WaitUntil(mu_, deadline);
  }
}

StatusOr<int64_t> HashStore::Add(const std::string& key, int64_t delta) {
  int64_t value = 0;
  {
    MutexLock lock(mu_);
    auto it = values_.find(key);
    if (it != values_.end() && !net::ParseInt64(it->second, &value)) {
      return InvalidArgument("store: Add on key '" + key + "', which does not hold an integer");
    }
    if (__builtin_add_overflow(value, delta, &value)) {
      return InvalidArgument("store: Add on key '" + key + "' overflows int64");
    }
    values_[key] = std::to_string(value);
  }
  changed_.NotifyAll();
  return value;
}

}  // namespace concord
