// Ranks as threads: a whole job in one process, over Gloo and an in-memory store.
// Link commgrid::gloo.
#pragma once

#include <exception>
#include <functional>
#include <string>
#include <vector>

#include "commgrid/communicator.hpp"
#include "commgrid/gloo.hpp"

namespace commgrid {

/// A rank of a local job failed. what() is "rank R: <the rank's own message>"; cause()
/// holds the original exception (rethrow it to recover its type).
class RankFailedError : public Error {
 public:
  RankFailedError(int rank, std::exception_ptr cause, const std::string& message)
      : Error(message), rank_(rank), cause_(std::move(cause)) {}
  /// The rank that failed first.
  [[nodiscard]] int rank() const noexcept { return rank_; }
  /// The exception that rank threw.
  [[nodiscard]] std::exception_ptr cause() const noexcept { return cause_; }

 private:
  int rank_;
  std::exception_ptr cause_;
};

/// What every rank of a local job did.
struct LocalRunResult {
  /// Per rank: nullptr when the rank returned normally, else what it threw.
  std::vector<std::exception_ptr> errors;
  /// The rank whose failure came first and was not a consequence of another's
  /// (AbortedError, a lost peer); -1 when every rank succeeded.
  int first_failed_rank = -1;
  /// "rank R: message" of first_failed_rank; empty on success.
  std::string first_failure;
};

/// Runs `fn(world)` on `size` ranks, each a thread of this process with its own Gloo world
/// over one in-memory store, and returns when every thread has ended. When a rank throws,
/// the store is aborted and that rank's communicators are closed, so the other ranks fail
/// promptly (or by options.timeout) instead of hanging. Throws ConfigError for size < 1.
LocalRunResult run_local_ranks_collect(int size,
                                       const std::function<void(Communicator& world)>& fn,
                                       const GlooOptions& options = {});

/// As run_local_ranks_collect, but throws RankFailedError naming the first real failure.
void run_local_ranks(int size, const std::function<void(Communicator& world)>& fn,
                     const GlooOptions& options = {});

}  // namespace commgrid
