// Errors of the command line for people: one whole line each, and parse errors that say
// which flag is wrong, what was probably meant and where the help is. Shared by the
// commgrid command and the example programs that take its layout flags.
#pragma once

#include <CLI/CLI.hpp>

#include <exception>
#include <string>
#include <string_view>

namespace commgrid::cli {

/// Writes "error: TEXT" and a newline to stderr in one write(2), after flushing stdout, so
/// that a rank stopped right after it (by launch, or by its own exit) never leaves half a
/// line. Line breaks inside TEXT become spaces.
void print_error(std::string_view text);

/// The exit code of a failure, the one mapping of the command and the example programs:
/// 2 for bad input (commgrid::ConfigError and its family, ranks given different flags
/// included), 1 for everything else (a backend failure, a timeout, an abort, a bug).
int exit_code_of(const std::exception_ptr& error) noexcept;

/// Prints `error` as one "error: ..." line (a non-commgrid exception as "internal: ...")
/// and returns exit_code_of(error). For the last catch of a program's main.
int report_error(const std::exception_ptr& error);

/// A parse error of `root` explained: "plan: unknown flag --world-sise (did you mean
/// --world-size?); see commgrid plan --help", "plan: --tp needs a value (got the flag
/// --pp instead); see commgrid plan --help", "plan: unexpected argument \"4\" ...". The
/// (sub)command is the one argv selects; `program` names root in the pointer to the help
/// ("commgrid", "train_gpt"). Falls back to CLI11's own message, with the pointer.
std::string explain_parse_error(const CLI::App& root, const CLI::ParseError& error, int argc,
                                const char* const* argv, std::string_view program);

/// The name among `candidates` closest to `word` by edit distance (or, with allow_prefix,
/// the one candidate that `word` begins), or "" when none is close enough to be a likely
/// typo. Leading dashes are ignored.
std::string closest_name(std::string_view word, const std::vector<std::string>& candidates,
                         bool allow_prefix = true);

}  // namespace commgrid::cli
