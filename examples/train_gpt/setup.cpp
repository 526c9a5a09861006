#include "setup.hpp"

namespace train_gpt {

Collections make_collections(const commgrid::ProcessGroups& groups, GroupFault fault) {
  Collections c{commgrid::ModelCommProcessGroups::from_state(groups),
                commgrid::GradCommProcessGroups::from_state(groups)};
  if (fault == GroupFault::swap_tp_dp_cp) {
    const commgrid::GroupHandle tp = c.model.tp().handles().front();
    const commgrid::GroupHandle dp_cp = c.grads.dp_cp().handles().front();
    c.model.set("tp", dp_cp);
    c.grads.set("dp_cp", tp);
  }
  if (fault == GroupFault::dp_as_expt_dp) c.grads.set("expt_dp", c.grads.dp().handles().front());
  return c;
}

std::vector<StepResult> run_rank(commgrid::Communicator& world,
                                 const commgrid::ParallelConfig& layout, const TrainConfig& config,
                                 GroupFault fault) {
  check_train_config(config, layout);
  commgrid::ProcessGroups groups;
  // One thread drives every group here, so kinds with the same members share one
  // communicator (fewer connections to make).
  commgrid::InitOptions init;
  init.share_identical_groups = true;
  // The world outlives every group here (the groups and the collections are locals), so a
  // non-owning pointer lets a kind whose group is the whole world reuse it.
  groups.initialize(std::shared_ptr<commgrid::Communicator>(std::shared_ptr<void>(), &world),
                    layout, init);
  const Collections c = make_collections(groups, fault);
  return train(c.model, c.grads, config);
}

}  // namespace train_gpt
