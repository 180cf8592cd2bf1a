// Minimal leveled logging to stderr, prefixed "[concord rank R] LEVEL". The level comes from the
// engine's Config (CONCORD_LOG_LEVEL); each call is one write(2), so lines from threads do not mix.
#pragma once

#include <string>

namespace concord {

enum class LogLevel : int { kError = 0, kWarning = 1, kInfo = 2, kDebug = 3 };

// Writes one line if `level` is at or below `threshold`.
void LogLine(LogLevel threshold, LogLevel level, int rank, const std::string& message);

}  // namespace concord
