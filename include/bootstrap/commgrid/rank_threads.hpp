// Ranks as threads: a whole job in one process, each rank a thread with its own world over
// one in-memory store. The engine is the caller's (a world factory); commgrid::gloo's
// run_local_ranks (<commgrid/local_ranks.hpp>) is the usual entry.
#pragma once

#include <exception>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "commgrid/communicator.hpp"
#include "commgrid/store.hpp"

namespace commgrid {

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

/// Makes the world of rank `rank` of `size` ranks over `store` (collective over the ranks).
using RankThreadWorldFactory =
    std::function<std::unique_ptr<Communicator>(std::shared_ptr<Store> store, int rank, int size)>;

/// Runs `fn(world)` on `size` ranks, each a thread of this process whose world
/// `make_world` creates over one in-memory store, and returns when every thread has ended.
/// When a rank throws, the store is aborted and that rank's world is destroyed, so the
/// other ranks fail promptly (or by their timeout) instead of hanging. Throws
/// InvalidValueError ("ranks") for size < 1.
LocalRunResult run_rank_threads_collect(int size, const RankThreadWorldFactory& make_world,
                                        const std::function<void(Communicator& world)>& fn);

/// Throws RankFailedError naming the first real failure of `result`, if any.
void throw_first_failure(const LocalRunResult& result);

}  // namespace commgrid
