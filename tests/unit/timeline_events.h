// A rank's timeline file (core/timeline.h) read back for engine tests: its complete slices ("X"
// events, one a line as the timeline writes them) with their track, times, name and raw args.
#pragma once

#include <fstream>
#include <regex>
#include <string>
#include <vector>

namespace concord {
namespace timeline_testing {

struct SliceEvent {
  int track = 0;
  double begin_us = 0, end_us = 0;
  std::string name;
  std::string args;  // the args object's JSON text, "" when none

  // Whether this slice lies within `outer` (to the writer's 0.1 us rounding).
  bool Inside(const SliceEvent& outer) const {
    return begin_us + 0.2 >= outer.begin_us && end_us <= outer.end_us + 0.2;
  }
};

// Every slice of the file at `path`, in file order; none when it cannot be read.
inline std::vector<SliceEvent> ReadSlices(const std::string& path) {
  static const std::regex kSlice(
      R"re(^\{"ph":"X","pid":\d+,"tid":(\d+),"ts":([0-9.]+),"dur":([0-9.]+),"name":"([^"]*)"(?:,"args":(\{.*\}))?\},?$)re");
  std::vector<SliceEvent> slices;
  std::ifstream in(path);
  std::string line;
  std::smatch m;
  while (std::getline(in, line)) {
    if (!std::regex_match(line, m, kSlice)) continue;
    SliceEvent s;
    s.track = std::stoi(m[1]);
    s.begin_us = std::stod(m[2]);
    s.end_us = s.begin_us + std::stod(m[3]);
    s.name = m[4];
    s.args = m[5];
    slices.push_back(std::move(s));
  }
  return slices;
}

// The slices named `name`.
inline std::vector<SliceEvent> Named(const std::vector<SliceEvent>& all, const std::string& name) {
  std::vector<SliceEvent> out;
  for (const SliceEvent& s : all) {
    if (s.name == name) out.push_back(s);
  }
  return out;
}

}  // namespace timeline_testing
}  // namespace concord
