// The environment of each process launch starts: launch's own environment less every
// variable launch sets, then commgrid's and torchrun's variables for this process
// (docs/launching.md, docs/resilience.md for those of --spares).
#pragma once

#include <string>
#include <vector>

#include "launch/launch_settings.hpp"

namespace commgrid::cli {

/// "NAME=value" strings for local process `local` in its `incarnation` (0, then one more
/// per restart), meeting the others at `store`.
[[nodiscard]] std::vector<std::string> child_environment(const LaunchSettings& settings, int local,
                                                         int incarnation, const std::string& store);

}  // namespace commgrid::cli
