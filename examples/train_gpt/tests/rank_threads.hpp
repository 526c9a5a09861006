// What the in-process train_gpt tests share: a training run on Gloo rank-threads, every
// rank's per-step results kept, and the relative difference used to compare with one rank.
#pragma once

#include <algorithm>
#include <cmath>
#include <commgrid/commgrid.hpp>
#include <mutex>
#include <vector>

#include "setup.hpp"

namespace train_gpt::test {

/// Trains `config` on `layout.world_size` rank-threads; element r holds rank r's steps.
inline std::vector<std::vector<StepResult>> run_on_rank_threads(
    const commgrid::ParallelConfig& layout, const TrainConfig& config, GroupFault fault) {
  const auto n = static_cast<int>(layout.world_size);
  std::mutex mutex;
  std::vector<std::vector<StepResult>> per_rank(static_cast<std::size_t>(n));
  commgrid::GlooOptions gloo;
  gloo.timeout = std::chrono::seconds(120);
  commgrid::run_local_ranks(
      n,
      [&](commgrid::Communicator& world) {
        auto r = run_rank(world, layout, config, fault);
        std::lock_guard lock(mutex);
        per_rank[static_cast<std::size_t>(world.rank())] = std::move(r);
      },
      gloo);
  return per_rank;
}

/// |a - b| / |b|.
inline double rel(double a, double b) { return std::abs(a - b) / std::max(std::abs(b), 1e-300); }

}  // namespace train_gpt::test
