// The one place that sees the world and ProcessGroups: creates the groups of a layout on
// one rank, takes the two collections from them and hands only those to train().
#pragma once

#include <commgrid/commgrid.hpp>
#include <cstdint>
#include <vector>

#include "trainer.hpp"

namespace train_gpt {

/// Test-only faults in the groups handed to the model, to prove that a wrong group is
/// caught by the comparison with one rank.
enum class GroupFault : std::uint8_t {
  none,
  /// The model's tp field gets the dp_cp group and the gradients' dp_cp field the tp group.
  swap_tp_dp_cp,
  /// The gradients' expt_dp field gets the dense dp group (MoE).
  dp_as_expt_dp,
};

/// The two collections of one rank.
struct Collections {
  commgrid::ModelCommProcessGroups model;
  commgrid::GradCommProcessGroups grads;
};

/// Every field of both collections from an initialized ProcessGroups, with `fault` applied.
Collections make_collections(const commgrid::ProcessGroups& groups,
                             GroupFault fault = GroupFault::none);

/// One rank of a run: creates the layout's groups over `world` (collective over it), takes
/// the collections and trains. Throws ConfigError for a config that does not fit.
std::vector<StepResult> run_rank(commgrid::Communicator& world,
                                 const commgrid::ParallelConfig& layout, const TrainConfig& config,
                                 GroupFault fault = GroupFault::none);

}  // namespace train_gpt
