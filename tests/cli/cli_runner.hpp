// Runs the built commgrid command and captures its exit code, stdout and stderr.
#pragma once

#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <string>
#include <sys/wait.h>
#include <unistd.h>
#include <vector>

namespace commgrid::test {

struct CliResult {
  int code = -1;
  std::string out, err;
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

/// Runs `exe args...` through the shell with stdin closed; a time limit (coreutils
/// timeout) turns a hang into exit code 124 instead of a stuck test.
inline CliResult run_cli(const std::string& exe, const std::vector<std::string>& args,
                         int time_limit_s = 60) {
  const auto dir = std::filesystem::temp_directory_path();
  const std::string stem = "commgrid-cli-" + std::to_string(::getpid()) + "-" +
                           std::to_string(std::rand());
  const auto out = dir / (stem + ".out"), err = dir / (stem + ".err");
  std::string cmd = "timeout " + std::to_string(time_limit_s) + " " + shell_quote(exe);
  for (const auto& a : args) cmd += " " + shell_quote(a);
  cmd += " </dev/null >" + shell_quote(out.string()) + " 2>" + shell_quote(err.string());
  const int status = std::system(cmd.c_str());
  CliResult r;
  r.code = WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
  r.out = slurp(out);
  r.err = slurp(err);
  std::filesystem::remove(out);
  std::filesystem::remove(err);
  return r;
}

}  // namespace commgrid::test
