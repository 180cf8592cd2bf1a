// JSON text helpers shared by the metrics and the timeline, which write JSON by hand.
#pragma once

#include <cstdio>
#include <string>

namespace concord {

// The length of the well-formed UTF-8 sequence (RFC 3629: no overlong form, no surrogate, nothing
// past U+10FFFF) that starts at s[i], or 0 when s[i] does not start one.
inline size_t Utf8SequenceLength(const std::string& s, size_t i) {
  const auto byte = [&s](size_t k) { return static_cast<unsigned char>(s[k]); };
  const unsigned char lead = byte(i);
  if (lead < 0x80) return 1;
  size_t n = 0;
  unsigned char low = 0x80, high = 0xbf;  // the second byte's range
  if (lead >= 0xc2 && lead <= 0xdf) {
    n = 2;
  } else if (lead >= 0xe0 && lead <= 0xef) {
    n = 3;
    if (lead == 0xe0) low = 0xa0;   // overlong below U+0800
    if (lead == 0xed) high = 0x9f;  // surrogates U+D800..U+DFFF
  } else if (lead >= 0xf0 && lead <= 0xf4) {
    n = 4;
    if (lead == 0xf0) low = 0x90;   // overlong below U+10000
    if (lead == 0xf4) high = 0x8f;  // past U+10FFFF
  } else {
    return 0;  // a continuation byte, an overlong lead (0xc0, 0xc1) or 0xf5..0xff
  }
  if (s.size() - i < n || byte(i + 1) < low || byte(i + 1) > high) return 0;
  for (size_t k = 2; k < n; ++k) {
    if (byte(i + k) < 0x80 || byte(i + k) > 0xbf) return 0;
  }
  return n;
}

// `s` as a JSON string literal: quotes and backslashes escaped, control characters as \uXXXX,
// well-formed UTF-8 sequences as they are and every other byte as U+FFFD (the replacement
// character, in UTF-8): the text is valid UTF-8 whatever the bytes of `s` (a tensor name is any
// bytes). Not a Prometheus label value (whose escapes differ): core/metrics_render.cc has its own.
inline std::string JsonQuote(const std::string& s) {
  std::string out = "\"";
  for (size_t i = 0, n = 0; i < s.size(); i += n) {
    n = Utf8SequenceLength(s, i);
    const char c = s[i];
    if (n == 0) {
      out += "\xef\xbf\xbd";
      n = 1;
    } else if (n > 1) {
      out.append(s, i, n);
    } else if (c == '"' || c == '\\') {
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
