// The commgrid command line: each subcommand registers itself and runs after parsing.
#pragma once

#include <CLI/CLI.hpp>

#include <functional>
#include <string>

namespace commgrid::cli {

/// A registered subcommand: after parsing, `run` is called if `app` was chosen. run()
/// returns the exit code; it throws commgrid::ConfigError (exit 2) for bad input and any
/// other commgrid::Error (exit 1) for runtime failures; main maps them.
struct Command {
  CLI::App* app = nullptr;
  std::function<int()> run;
};

/// Registration functions, one per subcommand file (cmd_<name>.cpp).
Command add_plan_command(CLI::App& root);
Command add_verify_command(CLI::App& root);
Command add_launch_command(CLI::App& root);
Command add_bench_command(CLI::App& root);

}  // namespace commgrid::cli
