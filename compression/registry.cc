#include "compression/registry.h"

#include <cerrno>
#include <cmath>
#include <cstdlib>
#include <utility>

#include "base/c_locale.h"
#include "compression/casts.h"
#include "compression/topk.h"

namespace concord {
namespace compression {
namespace {

using Params = std::vector<std::pair<std::string, std::string>>;
using Factory = StatusOr<std::unique_ptr<Compressor>> (*)(const Params& params);

std::string_view Trim(std::string_view s) {
  const char* spaces = " \t\n\r";
  const size_t first = s.find_first_not_of(spaces);
  if (first == std::string_view::npos) return {};
  return s.substr(first, s.find_last_not_of(spaces) - first + 1);
}

// Splits "k=v,k=v" into pairs, refusing empty parts, missing '=' and repeated keys.
StatusOr<Params> ParseParams(std::string_view name, std::string_view text) {
  Params params;
  size_t start = 0;
  while (start <= text.size()) {
    const size_t comma = std::min(text.find(',', start), text.size());
    const std::string_view item = text.substr(start, comma - start);
    const size_t eq = item.find('=');
    const std::string key(Trim(item.substr(0, eq)));
    if (eq == std::string_view::npos || key.empty() || Trim(item.substr(eq + 1)).empty()) {
      return InvalidArgument("compressor '" + std::string(name) + "': parameter '" +
                             std::string(Trim(item)) + "' is not of the form key=value");
    }
    for (const auto& [k, v] : params) {
      if (k == key) {
        return InvalidArgument("compressor '" + std::string(name) + "': parameter '" + key +
                               "' given twice");
      }
    }
    params.emplace_back(key, std::string(Trim(item.substr(eq + 1))));
    start = comma + 1;
  }
  return params;
}

StatusOr<std::unique_ptr<Compressor>> NoParams(const char* name, const Params& params,
                                               std::unique_ptr<Compressor> compressor) {
  if (!params.empty()) {
    return InvalidArgument("compressor '" + std::string(name) + "' takes no parameters, given '" +
                           params.front().first + "'");
  }
  return compressor;
}

StatusOr<std::unique_ptr<Compressor>> MakeNone(const Params& params) {
  return NoParams("none", params, MakeNoneCompressor());
}
StatusOr<std::unique_ptr<Compressor>> MakeFp16(const Params& params) {
  return NoParams("fp16", params, MakeCastCompressor(HalfFormat::kFloat16));
}
StatusOr<std::unique_ptr<Compressor>> MakeBf16(const Params& params) {
  return NoParams("bf16", params, MakeCastCompressor(HalfFormat::kBFloat16));
}

StatusOr<std::unique_ptr<Compressor>> MakeTopk(const Params& params) {
  TopkOptions options;
  bool have_density = false;
  for (const auto& [key, value] : params) {
    if (key == "density") {
      char* end = nullptr;
      int error = 0;
      {
        const ScopedCLocale c_locale;  // "0.001" whatever the application's LC_NUMERIC
        errno = 0;
        options.density = std::strtod(value.c_str(), &end);
        error = errno;
      }
      if (end != value.c_str() + value.size() || value.empty()) {
        return InvalidArgument("topk: density '" + value + "' is not a number");
      }
      // Past a double's range (1e-400 underflows to 0, 1e999 overflows): a number, but no
      // density. A subnormal (1e-310, also ERANGE) is a density: k = 1.
      if ((error == ERANGE && options.density == 0.0) || !std::isfinite(options.density)) {
        return InvalidArgument("topk: density '" + value + "' is not in (0, 1]");
      }
      have_density = true;
    } else if (key == "method") {
      if (value == "exact") {
        options.method = TopkMethod::kExact;
      } else if (value == "sampled") {
        options.method = TopkMethod::kSampled;
      } else {
        return InvalidArgument("topk: method '" + value + "' is not one of exact, sampled");
      }
    } else if (key == "values") {
      if (value == "fp32") {
        options.fp16_values = false;
      } else if (value == "fp16") {
        options.fp16_values = true;
      } else {
        return InvalidArgument("topk: values '" + value + "' is not one of fp32, fp16");
      }
    } else {
      return InvalidArgument("topk: unknown parameter '" + key +
                             "' (known: density, method, values)");
    }
  }
  if (!have_density) return InvalidArgument("topk needs a density, e.g. topk:density=0.01");
  return MakeTopkCompressor(options);
}

struct Entry {
  const char* name;
  Factory factory;
};
constexpr Entry kRegistry[] = {
    {"none", MakeNone},
    {"fp16", MakeFp16},
    {"bf16", MakeBf16},
    {"topk", MakeTopk},
};

}  // namespace

std::vector<std::string> CompressorNames() {
  std::vector<std::string> names;
  for (const Entry& e : kRegistry) names.emplace_back(e.name);
  return names;
}

StatusOr<std::unique_ptr<Compressor>> CreateCompressor(std::string_view spec) {
  const size_t colon = spec.find(':');
  const std::string_view name = Trim(spec.substr(0, colon));
  for (const Entry& e : kRegistry) {
    if (name != e.name) continue;
    Params params;
    if (colon != std::string_view::npos) {
      CONCORD_ASSIGN_OR_RETURN(params, ParseParams(name, spec.substr(colon + 1)));
    }
    return e.factory(params);
  }
  std::string known;
  for (const Entry& e : kRegistry) known += std::string(known.empty() ? "" : ", ") + e.name;
  return InvalidArgument("unknown compressor '" + std::string(name) + "' (known: " + known + ")");
}

}  // namespace compression
}  // namespace concord
