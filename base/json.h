// JSON text helpers shared by the metrics and the timeline, which write JSON by hand.
#pragma once

#include <cstdio>
#include <string>

namespace concord {

// `s` as a JSON string literal: quotes and backslashes escaped, control characters as \uXXXX.
// Also a valid Prometheus label value for the names Concord writes.
inline std::string JsonQuote(const std::string& s) {
  std::string out = "\"";
  for (const char c : s) {
    if (c == '"' || c == '\\') {
      out += '\\';
      out += c;
    } else if (static_cast<unsigned char>(c) < 0x20) {
      char buf[8];
      std::snprintf(buf, sizeof(buf), "\\u%04x", static_cast<unsigned>(c));
      out += buf;
    } else {
      out += c;
    }
  }
  return out + "\"";
}

}  // namespace concord
