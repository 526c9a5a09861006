// How errors show a timeout ("30 s", "2.5 s"): one form for the core and every backend.
// Not installed.
#pragma once

#include <chrono>
#include <sstream>
#include <string>

namespace commgrid {

/// A timeout in seconds as errors show it: "30 s", "2.5 s".
inline std::string seconds_text(std::chrono::milliseconds t) {
  std::ostringstream s;
  s << static_cast<double>(t.count()) / 1000.0 << " s";
  return s.str();
}

}  // namespace commgrid
