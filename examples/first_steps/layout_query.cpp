// First steps, 1: the layout alone. Which ranks talk to which in a 4,096-GPU MoE job: one
// rank's groups computed directly (no enumeration, no communication), where that rank sits
// on its node, and whether the order suits 8-GPU nodes.
//
//   example_layout_query [RANK]
#include <commgrid/commgrid.hpp>

#include <cstdlib>
#include <iostream>
#include <string>

int main(int argc, char** argv) {
  commgrid::ParallelConfig config;
  config.world_size = 4096;
  config.tp = 8;
  config.pp = 16;
  config.cp = 2;
  config.ep = 8;
  config.etp = 1;
  try {
    const commgrid::Layout layout(config);  // validates: a bad config throws ConfigError
    const commgrid::Rank rank = argc > 1 ? std::stoll(argv[1]) : 3000;
    layout.check_rank(rank);

    const commgrid::RankCoordinates x = layout.coordinates(rank);
    std::cout << "rank " << rank << ": tp " << x.tp << ", cp " << x.cp << ", dp " << x.dp << ", pp "
              << x.pp << " (expert grid: ep " << x.ep << ", expert_dp " << x.expert_dp << ")\n";
    for (commgrid::GroupKind kind : {commgrid::GroupKind::tp, commgrid::GroupKind::cp,
                                     commgrid::GroupKind::ep, commgrid::GroupKind::pp}) {
      const std::optional<commgrid::GroupRef> group = layout.group_of(kind, rank);
      std::cout << "  " << commgrid::kind_name(kind) << " group " << group->index << ", rank "
                << group->comm_rank << " of " << group->members.size() << ":";
      for (commgrid::Rank m : group->members) std::cout << ' ' << m;
      std::cout << '\n';
    }

    // Nodes of 8 GPUs: rank r runs on node r / 8. Which kinds cross nodes, and what order
    // would serve them best (tp first, then cp, ep, expt_tp).
    const commgrid::NodeMap nodes(8);
    std::cout << "node " << nodes.node(rank) << ", device " << nodes.device(rank) << '\n';
    const commgrid::TopologyReport report = commgrid::check_topology(layout, {}, nodes);
    for (const commgrid::TopologyWarning& w : report.warnings)
      std::cout << (w.avoidable ? "fix: " : "note: ") << w.message() << '\n';
    std::cout << "best order for these nodes: " << report.best_order << '\n';

    // A check a user can rely on: rank's tp group holds 8 consecutive ranks on its node.
    const auto tp = layout.group_of(commgrid::GroupKind::tp, rank);
    const bool ok = tp->members.size() == 8 && nodes.nodes_spanned(tp->members) == 1;
    std::cout << (ok ? "ok" : "unexpected tp group") << '\n';
    return ok ? EXIT_SUCCESS : EXIT_FAILURE;
  } catch (const commgrid::ConfigError& e) {
    std::cerr << "error: " << e.what() << '\n';
    return 2;
  }
}
