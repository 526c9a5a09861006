// The processes' output on its way to launch's stdout and stderr: each stream cut into whole
// lines (concurrent processes never interleave within a line), each line with its process's
// label ("[rank 3] ", docs/launching.md) or as it is, or dropped, as --output says.
#pragma once

#include <string>

#include "launch/launch_settings.hpp"
#include "launch/posix.hpp"

namespace commgrid::cli {

/// One output stream (stdout or stderr) of one process.
class Stream {
 public:
  Stream() = default;
  Stream(Fd fd, int target) : fd_(std::move(fd)), target_(target) {}

  [[nodiscard]] bool open() const noexcept { return fd_.open(); }
  [[nodiscard]] int fd() const noexcept { return fd_.get(); }
  /// Whether bytes wait to be written (a line, or the start of one).
  [[nodiscard]] bool has_pending() const noexcept { return !pending_.empty(); }

  /// One read(2) of what the process wrote, kept until emit(); at the end of the stream (or
  /// a read error) the descriptor is closed.
  void read_some();
  /// Reads whatever is there without waiting, then closes the descriptor (a dead process's
  /// last words, before its restart gets a new stream).
  void read_rest();
  /// Writes the whole lines read so far to the target, `prefix` before each, or drops them
  /// when !show. A partial line goes out with flush_partial (the stream ended) or once it
  /// is very long, ended by a newline.
  void emit(const std::string& prefix, bool show, bool flush_partial);
  /// Closes the descriptor (what is pending stays for emit()).
  void close() noexcept { fd_.reset(); }

 private:
  Fd fd_;
  int target_ = 1;
  std::string pending_;
};

/// Where one process's lines go under an --output mode.
struct Routing {
  std::string out_prefix, err_prefix;  ///< "[rank 3] " or ""
  bool show_out = true;                ///< false: its stdout is read and dropped
};

/// The routing of a process whose label is `label` ("[rank 3]", "[spare 0]") and which does
/// (`rank0`) or does not hold logical rank 0: prefixed, every line labelled; raw, none;
/// rank0, logical rank 0's lines as they are, the others' stderr labelled and their stdout
/// dropped.
[[nodiscard]] Routing route(OutputMode mode, const std::string& label, bool rank0);

}  // namespace commgrid::cli
