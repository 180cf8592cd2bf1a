// A digest that every process computes alike, whatever the build (std::hash may differ between
// builds): for names that ranks compare.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>

namespace concord {

// FNV-1a, 64 bits.
inline uint64_t Fnv1a(const void* data, size_t bytes) {
  uint64_t h = 1469598103934665603ull;
  const auto* p = static_cast<const unsigned char*>(data);
  for (size_t i = 0; i < bytes; ++i) h = (h ^ p[i]) * 1099511628211ull;
  return h;
}

inline uint64_t Fnv1a(const std::string& text) {
  return Fnv1a(text.data(), text.size());
}

}  // namespace concord
