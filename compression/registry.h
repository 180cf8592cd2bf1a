// Creating compressors by name, with parameters parsed from a string:
//   spec   := name [ ":" key "=" value { "," key "=" value } ]
//   "none" | "fp16" | "bf16" | "topk:density=0.01" |
//   "topk:density=0.001,method=sampled,values=fp16"
// Names and keys are case-sensitive; spaces around names, keys and values are ignored.
// topk keys: density (required, a number in (0, 1]), method (exact | sampled; default sampled),
// values (fp32 | fp16; default fp32). none, fp16 and bf16 take no parameters.
// Errors (InvalidArgument) name the problem: an unknown compressor (listing the known ones), an
// unknown or repeated key, a missing or malformed value, a density outside (0, 1].
// Free functions over a constant table; thread-safe.
#pragma once

#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include "compression/compressor.h"

namespace concord {
namespace compression {

StatusOr<std::unique_ptr<Compressor>> CreateCompressor(std::string_view spec);

// The known compressor names, in a fixed order.
std::vector<std::string> CompressorNames();

}  // namespace compression
}  // namespace concord
