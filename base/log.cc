#include "base/log.h"

#include <unistd.h>

namespace concord {

void LogLine(LogLevel threshold, LogLevel level, int rank, const std::string& message) {
  if (static_cast<int>(level) > static_cast<int>(threshold)) return;
  static const char* const kNames[] = {"ERROR", "WARNING", "INFO", "DEBUG"};
  std::string line = "[concord rank " + std::to_string(rank) + "] " +
                     kNames[static_cast<int>(level)] + " " + message + "\n";
  ssize_t ignored = ::write(STDERR_FILENO, line.data(), line.size());
  (void)ignored;
}

}  // namespace concord
