#include "rendezvous/file_store.h"

#include <errno.h>
#include <fcntl.h>
#include <sys/file.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cstdio>
#include <thread>

#include "rendezvous/net.h"

namespace concord {

namespace {

// File names stay well under NAME_MAX (255) with room for the two-character kind prefix.
constexpr size_t kMaxComponent = 200;

Status MakeDir(const std::string& path) {
  if (::mkdir(path.c_str(), 0700) == 0 || errno == EEXIST) return Status::Ok();
  return ErrnoError("file store: mkdir " + path, errno);
}

// kInvalidArgument unless dir is a directory itself (not a symlink to one), owned by this
// process's effective user, that neither its group nor others may write.
Status CheckPrivate(const std::string& dir) {
  struct stat st;
  if (::lstat(dir.c_str(), &st) != 0) return ErrnoError("file store: lstat " + dir, errno);
  const std::string refused = "file store: refusing directory '" + dir + "': ";
  const std::string advice =
      " (another user may have made it to read or forge this job's keys; "
      "remove it, or set CONCORD_STORE)";
  if (S_ISLNK(st.st_mode)) return InvalidArgument(refused + "it is a symbolic link" + advice);
  if (!S_ISDIR(st.st_mode)) return InvalidArgument(refused + "it is not a directory");
  if (st.st_uid != ::geteuid()) {
    return InvalidArgument(refused + "it belongs to user " + std::to_string(st.st_uid) +
                           ", not to this user (" + std::to_string(::geteuid()) + ")" + advice);
  }
  if ((st.st_mode & (S_IWGRP | S_IWOTH)) != 0) {
    char mode[8];
    std::snprintf(mode, sizeof(mode), "%04o", static_cast<unsigned>(st.st_mode & 07777));
    return InvalidArgument(refused + "its group or others may write to it (mode " + mode + ")" +
                           advice);
  }
  return Status::Ok();
}

// Sleeps a little (growing from 1 ms to 20 ms), never past the deadline.
void Backoff(std::chrono::milliseconds* delay, Deadline deadline) {
  auto until = Clock::now() + *delay;
  if (!deadline.infinite() && deadline.at() < until) until = deadline.at();
  std::this_thread::sleep_until(until);
  *delay = std::min(*delay * 2, std::chrono::milliseconds(20));
}

}  // namespace

StatusOr<std::unique_ptr<FileStore>> FileStore::Create(const std::string& dir,
                                                       std::chrono::milliseconds lock_timeout,
                                                       Access access) {
  if (dir.empty() || dir[0] != '/') {
    return InvalidArgument("file store: directory '" + dir + "' is not an absolute path");
  }
  for (size_t pos = dir.find('/', 1); pos != std::string::npos; pos = dir.find('/', pos + 1)) {
    CONCORD_RETURN_IF_ERROR(MakeDir(dir.substr(0, pos)));
  }
  CONCORD_RETURN_IF_ERROR(MakeDir(dir));
  std::string clean = dir;
  while (clean.size() > 1 && clean.back() == '/') clean.pop_back();
  // After mkdir: whether this call made the directory or found it, it is checked the same way
  // (without the trailing '/', which would make lstat follow a symlink).
  if (access == Access::kPrivate) CONCORD_RETURN_IF_ERROR(CheckPrivate(clean));
  struct stat st;
  if (::stat(dir.c_str(), &st) != 0) return ErrnoError("file store: stat " + dir, errno);
  if (!S_ISDIR(st.st_mode)) return InvalidArgument("file store: '" + dir + "' is not a directory");
  return std::unique_ptr<FileStore>(new FileStore(clean, lock_timeout));
}

std::string FileStore::EncodeName(const std::string& name) {
  static const char kHex[] = "0123456789ABCDEF";
  std::string out;
  for (unsigned char c : name) {
    if ((c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') || c == '.' ||
        c == '_' || c == '-') {
      out.push_back(static_cast<char>(c));
    } else {
      out.push_back('%');
      out.push_back(kHex[c >> 4]);
      out.push_back(kHex[c & 15]);
    }
  }
  return out;
}

StatusOr<std::string> FileStore::PathFor(const std::string& key, char kind,
                                         bool create_dirs) const {
  const std::string encoded = EncodeName(key);
  std::string path = dir_;
  size_t pos = 0;
  while (encoded.size() - pos > kMaxComponent) {
    path += "/d_" + encoded.substr(pos, kMaxComponent);
    pos += kMaxComponent;
    if (create_dirs) CONCORD_RETURN_IF_ERROR(MakeDir(path));
  }
  path += "/";
  path += kind;
  path += "_" + encoded.substr(pos);
  return path;
}

StatusOr<bool> FileStore::TryRead(const std::string& path, std::string* value) const {
  net::Fd fd(::open(path.c_str(), O_RDONLY | O_CLOEXEC));
  if (!fd.valid()) {
    if (errno == ENOENT || errno == ENOTDIR) return false;
    return ErrnoError("file store: open " + path, errno);
  }
  std::string out;
  char buf[65536];
  for (;;) {
    const ssize_t n = ::read(fd.get(), buf, sizeof(buf));
    if (n > 0) {
      out.append(buf, static_cast<size_t>(n));
    } else if (n == 0) {
      break;
    } else if (errno != EINTR) {
      return ErrnoError("file store: read " + path, errno);
    }
  }
  *value = std::move(out);
  return true;
}

Status FileStore::WriteAtomically(const std::string& path, const std::string& value) const {
  std::string tmp = path.substr(0, path.rfind('/') + 1) + ".tmp.XXXXXX";
  net::Fd fd(::mkostemp(&tmp[0], O_CLOEXEC));
  if (!fd.valid()) return ErrnoError("file store: create temporary file in " + dir_, errno);
  size_t done = 0;
  while (done < value.size()) {
    const ssize_t n = ::write(fd.get(), value.data() + done, value.size() - done);
    if (n < 0 && errno == EINTR) continue;
    if (n < 0) {
      const int err = errno;
      ::unlink(tmp.c_str());
      return ErrnoError("file store: write " + tmp, err);
    }
    done += static_cast<size_t>(n);
  }
  fd.Reset();
  if (::rename(tmp.c_str(), path.c_str()) != 0) {
    const int err = errno;
    ::unlink(tmp.c_str());
    return ErrnoError("file store: rename to " + path, err);
  }
  return Status::Ok();
}

Status FileStore::Set(const std::string& key, const std::string& value) {
  CONCORD_ASSIGN_OR_RETURN(const std::string path, PathFor(key, 'k', /*create_dirs=*/true));
  return WriteAtomically(path, value);
}

StatusOr<std::string> FileStore::Get(const std::string& key, Deadline deadline) {
  CONCORD_ASSIGN_OR_RETURN(FoundKey found, GetFirst({key}, deadline));
  return std::move(found.value);
}

StatusOr<FoundKey> FileStore::GetFirst(const std::vector<std::string>& keys, Deadline deadline) {
  if (keys.empty()) return InvalidArgument("store: GetFirst of no keys");
  std::vector<std::string> paths;
  for (const std::string& key : keys) {
    CONCORD_ASSIGN_OR_RETURN(std::string path, PathFor(key, 'k', /*create_dirs=*/false));
    paths.push_back(std::move(path));
  }
  std::chrono::milliseconds delay(1);
  for (;;) {
    for (size_t i = 0; i < paths.size(); ++i) {
      std::string value;
      CONCORD_ASSIGN_OR_RETURN(const bool found, TryRead(paths[i], &value));
      if (found) return FoundKey{i, std::move(value)};
    }
    if (deadline.passed()) return TimeoutError(NoKeyAppearedMessage(keys));
    Backoff(&delay, deadline);
  }
}

Status FileStore::Wait(const std::vector<std::string>& keys, Deadline deadline) {
  for (const std::string& key : keys) {
    CONCORD_ASSIGN_OR_RETURN(const std::string path, PathFor(key, 'k', /*create_dirs=*/false));
    std::chrono::milliseconds delay(1);
    for (;;) {
      if (::access(path.c_str(), F_OK) == 0) break;
      if (errno != ENOENT && errno != ENOTDIR) {
        return ErrnoError("file store: access " + path, errno);
      }
      if (deadline.passed()) {
        return TimeoutError("store: key '" + key + "' did not appear before the deadline");
      }
      Backoff(&delay, deadline);
    }
  }
  return Status::Ok();
}

StatusOr<int64_t> FileStore::Add(const std::string& key, int64_t delta) {
  CONCORD_ASSIGN_OR_RETURN(const std::string lock_path, PathFor(key, 'l', /*create_dirs=*/true));
  CONCORD_ASSIGN_OR_RETURN(const std::string path, PathFor(key, 'k', /*create_dirs=*/false));
  net::Fd lock(::open(lock_path.c_str(), O_RDWR | O_CREAT | O_CLOEXEC, 0600));
  if (!lock.valid()) return ErrnoError("file store: open " + lock_path, errno);
  const Deadline deadline = Deadline::After(lock_timeout_);
  std::chrono::milliseconds delay(1);
  while (::flock(lock.get(), LOCK_EX | LOCK_NB) != 0) {
    if (errno != EWOULDBLOCK && errno != EINTR) {
      return ErrnoError("file store: flock " + lock_path, errno);
    }
    if (deadline.passed()) {
      return TimeoutError("store: could not lock counter '" + key + "' before the deadline");
    }
    Backoff(&delay, deadline);
  }
  // The lock is released when `lock` closes, after the new value has been renamed into place.
  std::string text;
  CONCORD_ASSIGN_OR_RETURN(const bool found, TryRead(path, &text));
  int64_t value = 0;
  if (found && !net::ParseInt64(text, &value)) {
    return InvalidArgument("store: Add on key '" + key + "', which does not hold an integer");
  }
  if (__builtin_add_overflow(value, delta, &value)) {
    return InvalidArgument("store: Add on key '" + key + "' overflows int64");
  }
  CONCORD_RETURN_IF_ERROR(WriteAtomically(path, std::to_string(value)));
  return value;
}

}  // namespace concord
