// `commgrid verify --job job.json --local N`: a multi-module job's groups created on Gloo
// rank-threads and proven on the wire.
#pragma once

#include <chrono>
#include <optional>
#include <string>

namespace commgrid::cli {

/// Runs world_size rank-threads (the job's world size; `local`, when given, must equal it),
/// creates every module's group sets and checks each with an allgather of world ranks.
/// Prints one line per module and group set; returns 0 when all pass, 1 otherwise. Throws
/// ConfigError for a bad job file or a --local that differs from the job's world size.
[[nodiscard]] int run_verify_job(const std::string& path, std::optional<int> local,
                                 std::chrono::milliseconds timeout);

}  // namespace commgrid::cli
