// `commgrid bench store`: a rendezvous of N simulated ranks through the tcp:// store rank 0
// serves, side by side with a private redis-server doing the same work.
#pragma once

#include <CLI/CLI.hpp>

#include "command.hpp"

namespace commgrid::cli {

/// Adds `store` under `bench`; run() is to be called when it was chosen.
[[nodiscard]] Command add_bench_store_command(CLI::App& bench);

}  // namespace commgrid::cli
