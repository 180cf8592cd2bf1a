// Helpers shared by the compression tests: a compressor from a spec, and aligned buffers.
#pragma once

#include <gtest/gtest.h>

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "compression/registry.h"

namespace concord {
namespace compression {
namespace testing_util {

// The compressor for `spec`; fails the test when the registry refuses it.
inline std::unique_ptr<Compressor> Make(const std::string& spec) {
  auto c = CreateCompressor(spec);
  EXPECT_TRUE(c.ok()) << c.status().ToString();
  return std::move(*c);
}

// An 8-byte-aligned buffer of at least `bytes`.
struct Buffer {
  explicit Buffer(size_t bytes) : words(bytes / 8 + 1) {}
  uint8_t* data() { return reinterpret_cast<uint8_t*>(words.data()); }
  std::vector<uint64_t> words;
};

}  // namespace testing_util
}  // namespace compression
}  // namespace concord
