#include "tools/shm_leftovers.h"

#include <dirent.h>
#include <sys/mman.h>

#include <string>
#include <vector>

namespace concord {

int RemoveSegmentsOf(pid_t pid) {
  const std::string prefix = "concord-" + std::to_string(pid) + "-";
  std::vector<std::string> names;
  if (DIR* d = ::opendir("/dev/shm")) {
    while (const dirent* e = ::readdir(d)) {
      if (std::string(e->d_name).rfind(prefix, 0) == 0) names.push_back(e->d_name);
    }
    ::closedir(d);
  }
  int removed = 0;
  for (const std::string& name : names) {
    if (::shm_unlink(("/" + name).c_str()) == 0) ++removed;
  }
  return removed;
}

}  // namespace concord
