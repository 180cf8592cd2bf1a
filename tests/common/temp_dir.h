// A fresh directory under /tmp for a test (a FileStore's, say), removed with what is in it when
// the object goes away.
#pragma once

#include <stdlib.h>

#include <filesystem>
#include <string>
#include <system_error>

namespace concord {
namespace harness {

// Contract: the constructor creates /tmp/<prefix>XXXXXX; path() is "" if that failed (check it
// with ASSERT_FALSE(dir.path().empty())). The destructor removes the tree, ignoring errors.
// Not copyable; not thread-safe (own it in the test's thread, share path()).
class TempDir {
 public:
  explicit TempDir(const std::string& prefix) {
    std::string name = "/tmp/" + prefix + "XXXXXX";
    if (::mkdtemp(&name[0]) != nullptr) path_ = name;
  }
  ~TempDir() {
    std::error_code ignored;
    if (!path_.empty()) std::filesystem::remove_all(path_, ignored);
  }
  TempDir(const TempDir&) = delete;
  TempDir& operator=(const TempDir&) = delete;

  const std::string& path() const { return path_; }

 private:
  std::string path_;
};

}  // namespace harness
}  // namespace concord
