// Ranks as threads of one process over Gloo: the bootstrap's rank-threads runner with a
// Gloo world per rank.
#include <climits>
#include <string>

#include "commgrid/local_ranks.hpp"
#include "gloo_options.hpp"

namespace commgrid {

LocalRunResult run_local_ranks_collect(Rank size,
                                       const std::function<void(Communicator& world)>& fn,
                                       const GlooOptions& options) {
  if (size < 1 || size > INT_MAX)
    throw InvalidValueError("ranks", "local ranks: the number of ranks must be in [1, " +
                                         std::to_string(INT_MAX) + "], got " +
                                         std::to_string(size));
  gloo_backend::check_unset_placement(options, "local ranks");
  return run_rank_threads_collect(
      static_cast<int>(size),
      [&options](std::shared_ptr<Store> store, int rank, int n) {
        GlooOptions mine = options;
        mine.store = std::move(store);
        mine.rank = rank;
        mine.size = n;
        return make_gloo_world(mine);
      },
      fn);
}

void run_local_ranks(Rank size, const std::function<void(Communicator& world)>& fn,
                     const GlooOptions& options) {
  throw_first_failure(run_local_ranks_collect(size, fn, options));
}

}  // namespace commgrid
