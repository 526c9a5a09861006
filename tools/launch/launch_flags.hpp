// `commgrid launch`'s flags: their registration (torchrun's names and spellings too) and
// their parsing into LaunchSettings, every bad value an error naming the flag.
#pragma once

#include <CLI/CLI.hpp>

#include <string>
#include <vector>

#include "launch/launch_settings.hpp"

namespace commgrid::cli {

/// The flags as given, still text (parsed by parse_launch_flags, which names each one).
struct LaunchFlags {
  std::string nproc, timeout, grace = "5", nnodes = "1", node_rank, master_addr, master_port;
  std::string rdzv_id, output = "prefixed", stop_before_exec, spares, max_restarts, store;
  bool standalone = false;
  std::vector<std::string> command;
};

/// Registers launch's flags and its PROGRAM ARGS on `app`, writing into `flags`.
void add_launch_flags(CLI::App& app, LaunchFlags& flags);

/// Checks the flags and the job's variables (COMMGRID_JOB_ID, COMMGRID_TOKEN) and makes the
/// settings: ConfigError (exit 2) naming the flag or variable for bad input. Prints launch's
/// warnings (a multi-node job without a token) on stderr.
[[nodiscard]] LaunchSettings parse_launch_flags(const LaunchFlags& flags);

}  // namespace commgrid::cli
