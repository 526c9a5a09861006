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

/// The text with its line breaks turned into spaces and trailing spaces dropped, so that an
/// error stays exactly one line on stderr.
[[nodiscard]] inline std::string one_line(std::string s) {
  for (char& c : s)
    if (c == '\n' || c == '\r') c = ' ';
  while (!s.empty() && s.back() == ' ') s.pop_back();
  return s;
}

/// Registration functions, one per subcommand file (cmd_<name>.cpp).
[[nodiscard]] Command add_plan_command(CLI::App& root);
[[nodiscard]] Command add_verify_command(CLI::App& root);
[[nodiscard]] Command add_launch_command(CLI::App& root);
[[nodiscard]] Command add_bench_command(CLI::App& root);

}  // namespace commgrid::cli
