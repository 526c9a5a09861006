// `commgrid verify --backend nccl`: the groups created on GPUs, one per rank. The NCCL world
// is bootstrapped from rank-threads over Gloo (--local N, one GPU each), from the store
// launcher's environment (commgrid launch), or from MPI (under mpirun).
#pragma once

#include <chrono>
#include <optional>

#include "layout_flags.hpp"
#include "verify_run.hpp"

namespace commgrid::cli {

/// Runs verify on NCCL and returns the exit code (0 verified, 1 a check, a device or the
/// communication failed, 2 bad input or a config mismatch). Throws ConfigError for bad
/// flags before any communication.
int run_verify_nccl(const LayoutFlags& layout, const VerifyOptions& options,
                    std::chrono::milliseconds timeout, std::optional<int> local_ranks);

}  // namespace commgrid::cli
