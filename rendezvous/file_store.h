// A Store over a directory that every rank on one host can see.
#pragma once

#include <chrono>
#include <memory>
#include <string>
#include <vector>

#include "rendezvous/store.h"

namespace concord {

// Contract: each key is one file in the directory (the directory is not owned: files stay after
// destruction, so use a fresh directory per job). Key bytes are encoded into safe file names (long
// keys become nested directories), so any key works. Set writes a temporary file and renames it,
// so readers see a value whole or not at all. Get, Wait and GetFirst poll with a short backoff
// sleep until the deadline. Add serialises writers with flock() on a per-key lock file, waiting at
// most lock_timeout, and keeps the counter as decimal text. Thread- and process-safe; no state in
// memory beyond the path.
class FileStore : public Store {
 public:
  // What Create requires of the directory. Whoever can write to it can forge any rank's keys.
  enum class Access {
    // A directory the user named (CONCORD_STORE=file://...): used as it is, since one shared by
    // the job's hosts or by a group of users may rightly be group-writable or owned by another
    // user. Keeping it private to the job is the user's part.
    kAsGiven,
    // A directory at a predictable path in a directory everyone can write (Concord's own
    // /tmp/concord-UID-JOBID), which another user could have made first: it must be a directory
    // itself (not a symlink), owned by this process's effective user, with no group or other write
    // permission; otherwise kInvalidArgument names it and says why.
    kPrivate,
  };

  // Creates dir (and its parents) when missing, with mode 0700. dir must be absolute.
  static StatusOr<std::unique_ptr<FileStore>> Create(
      const std::string& dir, std::chrono::milliseconds lock_timeout = std::chrono::seconds(30),
      Access access = Access::kAsGiven);

  Status Set(const std::string& key, const std::string& value) override;
  StatusOr<std::string> Get(const std::string& key, Deadline deadline) override;
  Status Wait(const std::vector<std::string>& keys, Deadline deadline) override;
  StatusOr<FoundKey> GetFirst(const std::vector<std::string>& keys, Deadline deadline) override;
  StatusOr<int64_t> Add(const std::string& key, int64_t delta) override;

  const std::string& dir() const { return dir_; }

  // name as one file-name component: bytes other than [A-Za-z0-9._-] become %XX, so the encoding
  // is injective and never holds '/'. Keys are stored under this encoding.
  static std::string EncodeName(const std::string& name);

 private:
  FileStore(std::string dir, std::chrono::milliseconds lock_timeout)
      : dir_(std::move(dir)), lock_timeout_(lock_timeout) {}
  // The path of key's value file ("kind" is 'k' for values, 'l' for lock files); creates the
  // intermediate directories of long keys when create_dirs.
  StatusOr<std::string> PathFor(const std::string& key, char kind, bool create_dirs) const;
  // Reads the value file: true and *value when it exists, false when missing.
  StatusOr<bool> TryRead(const std::string& path, std::string* value) const;
  Status WriteAtomically(const std::string& path, const std::string& value) const;

  const std::string dir_;
  const std::chrono::milliseconds lock_timeout_;
};

}  // namespace concord
