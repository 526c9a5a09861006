// Runs the built commgrid command and captures its exit code, stdout and stderr.
#pragma once

#include <sys/wait.h>
#include <unistd.h>
#include <chrono>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <string>
#include <vector>

namespace commgrid::test {

struct CliResult {
  int code = -1;
  std::string out, err;
  double seconds = 0;  ///< wall time of the command
};

inline std::string shell_quote(const std::string& s) {
  std::string q = "'";
  for (char c : s) q += c == '\'' ? std::string("'\\''") : std::string(1, c);
  return q + "'";
}

inline std::string slurp(const std::filesystem::path& p) {
  std::ifstream in(p, std::ios::binary);
  std::ostringstream s;
  s << in.rdbuf();
  return s.str();
}

/// Runs a shell command with stdin closed and stdout and stderr captured.
inline CliResult run_shell(const std::string& command) {
  static int serial = 0;
  const auto dir = std::filesystem::temp_directory_path();
  const std::string stem =
      "commgrid-test-" + std::to_string(::getpid()) + "-" + std::to_string(serial++);
  const auto out = dir / (stem + ".out"), err = dir / (stem + ".err");
  const std::string cmd = "( " + command + " ) </dev/null >" + shell_quote(out.string()) + " 2>" +
                          shell_quote(err.string());
  const auto t0 = std::chrono::steady_clock::now();
  const int status = std::system(cmd.c_str());
  CliResult r;
  r.seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  r.code = WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
  r.out = slurp(out);
  r.err = slurp(err);
  std::filesystem::remove(out);
  std::filesystem::remove(err);
  return r;
}

/// Runs `exe args...`; a time limit (coreutils timeout) turns a hang into exit code 124
/// instead of a stuck test.
inline CliResult run_cli(const std::string& exe, const std::vector<std::string>& args,
                         int time_limit_s = 60) {
  std::string cmd = "timeout " + std::to_string(time_limit_s) + " " + shell_quote(exe);
  for (const auto& a : args) cmd += " " + shell_quote(a);
  return run_shell(cmd);
}

}  // namespace commgrid::test
