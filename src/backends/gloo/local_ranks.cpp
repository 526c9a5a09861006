// Ranks as threads of one process over Gloo: the bootstrap's rank-threads runner with a
// Gloo world per rank.
#include "commgrid/local_ranks.hpp"

namespace commgrid {

LocalRunResult run_local_ranks_collect(int size, const std::function<void(Communicator& world)>& fn,
                                       const GlooOptions& options) {
  return run_rank_threads_collect(
      size,
      [&options](std::shared_ptr<Store> store, int rank, int n) {
        return make_gloo_world(std::move(store), rank, n, options);
      },
      fn);
}

void run_local_ranks(int size, const std::function<void(Communicator& world)>& fn,
                     const GlooOptions& options) {
  throw_first_failure(run_local_ranks_collect(size, fn, options));
}

}  // namespace commgrid
