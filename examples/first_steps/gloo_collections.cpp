// First steps, 2: a whole job in one process. Eight ranks run as threads over Gloo; each
// creates its groups (tp 2, pp 2, ep 2, so dp 2), hands the model and gradient collections
// to "model code", and checks one allreduce in each group against the sum it must give.
#include <commgrid/commgrid.hpp>

#include <cstdlib>
#include <iostream>
#include <mutex>
#include <vector>

namespace {

// What a model layer would do with its collections: reduce over tensor parallel, then
// average gradients over data parallel. Returns the two results.
std::pair<float, float> layer_step(const commgrid::ModelCommProcessGroups& model,
                                   const commgrid::GradCommProcessGroups& grads, float value) {
  std::vector<float> activation = {value};
  model.tp()->allreduce(std::span<float>(activation), commgrid::ReduceOp::sum)->wait();
  std::vector<float> gradient = {value};
  grads.dp()->allreduce(std::span<float>(gradient), commgrid::ReduceOp::sum)->wait();
  return {activation[0], gradient[0]};
}

}  // namespace

int main() {
  commgrid::ParallelConfig config;
  config.world_size = 8;
  config.tp = 2;
  config.pp = 2;
  config.ep = 2;
  std::mutex print;
  try {
    commgrid::run_local_ranks(8, [&](commgrid::Communicator& world) {
      commgrid::ProcessGroups groups;
      groups.initialize(world, config);
      const auto model = commgrid::ModelCommProcessGroups::from_state(groups);
      const auto grads = commgrid::GradCommProcessGroups::from_state(groups);
      const commgrid::Rank rank = groups.world_rank();
      const auto [tp_sum, dp_sum] = layer_step(model, grads, static_cast<float>(rank));
      // The sums of the members' ranks, from the layout: what the wire must have delivered.
      float want_tp = 0, want_dp = 0;
      for (commgrid::Rank m : groups.global_ranks(commgrid::GroupKind::tp))
        want_tp += static_cast<float>(m);
      for (commgrid::Rank m : groups.global_ranks(commgrid::GroupKind::dp))
        want_dp += static_cast<float>(m);
      if (tp_sum != want_tp || dp_sum != want_dp)
        throw commgrid::Error("rank " + std::to_string(rank) + ": sums " + std::to_string(tp_sum) +
                              ", " + std::to_string(dp_sum) + " differ from the layout's");
      const std::lock_guard<std::mutex> lock(print);
      std::cout << "rank " << rank << ": tp " << model.tp().describe() << " sum " << tp_sum
                << ", dp " << grads.dp().describe() << " sum " << dp_sum << '\n';
    });
  } catch (const commgrid::Error& e) {
    std::cerr << "error: " << e.what() << '\n';
    return EXIT_FAILURE;
  }
  std::cout << "ok: 8 ranks, every group checked\n";
  return EXIT_SUCCESS;
}
