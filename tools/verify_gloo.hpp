// `commgrid verify --backend gloo`: ranks as threads of this process (--local N), or this
// process as one rank of a job started by `commgrid launch` (COMMGRID_* environment).
#pragma once

#include <chrono>
#include <optional>

#include "layout_flags.hpp"
#include "verify_run.hpp"

namespace commgrid::cli {

/// Runs verify on Gloo and returns the exit code (0 verified, 1 a check or the
/// communication failed, 2 bad input or a config mismatch). With `local_ranks`, runs that
/// many rank-threads over an in-memory store and prints the report once; without, builds
/// this rank's world from COMMGRID_RANK, COMMGRID_WORLD_SIZE and COMMGRID_STORE (rank 0
/// prints). Throws ConfigError for bad flags or environment, before any communication.
int run_verify_gloo(const LayoutFlags& layout, const VerifyOptions& options,
                    std::chrono::milliseconds timeout, std::optional<int> local_ranks);

}  // namespace commgrid::cli
