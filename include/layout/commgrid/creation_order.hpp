// The creation order of the per-group strategy: every group of a layout, in the sequence in
// which Megatron-core's initialize_model_parallel creates them (the seed's, or HEAD's under
// compat head). Pure: no backend, no communication.
#pragma once

#include <cstdint>
#include <functional>
#include <span>
#include <vector>

#include "commgrid/group_kind.hpp"
#include "commgrid/layout.hpp"

namespace commgrid {

/// One group-creation call (Megatron's new_group): every rank of the world makes it.
struct CreationStep {
  GroupKind kind = GroupKind::tp;
  int level = 0;              ///< the hcp / hybrid_dp_cp level; 0 for every other kind
  std::int64_t index = 0;     ///< the group's index in Layout::groups(kind, level)
  std::vector<Rank> members;  ///< as Megatron passes them: the kind's member order
  bool operator==(const CreationStep&) const = default;
};

/// A kind that Megatron-core does not create because its groups are another kind's: it
/// points its global at the parent's group (intra_dp_cp at dp_cp with one dist-opt
/// instance; under compat head also dp_gtp_remat at dp and dp_cp_gtp_remat at dp_cp when
/// gtp_remat = 1, expt_dp_gtp_remat at expt_dp when expert_gtp_remat = 1, ...).
struct CreationAlias {
  GroupKind kind = GroupKind::intra_dp_cp;
  GroupKind parent = GroupKind::dp_cp;
  bool operator==(const CreationAlias&) const = default;
};

/// Called once per creation call, in order. `members` is valid during the call only.
using CreationVisitor = std::function<void(GroupKind kind, int level, std::int64_t index,
                                           std::span<const Rank> members)>;

/// Visits every group of `kinds` (kinds of the layout, in any order; empty: every kind the
/// layout has) in Megatron-core's creation order:
/// - compat seed: the seed's sequence (the layout spec, §11): dp; dp_cp,
///   each followed by its intra_dp_cp chunks; cp, each followed by its hcp levels; mp; tp;
///   pp, each followed by its embd and pos_embd group; tp_dp_cp; tp_dp; tp_cp; ep; expt_tp;
///   tp_ep; tp_ep_pp; expt_dp, each followed by its intra_expt_dp and inter_dist_opt groups;
///   intra_dist_opt.
/// - compat head: HEAD's initialize_model_parallel then create_all_gather_groups
///   (docs/megatron-head.md, "Creation order"), recorded from HEAD's own code in
///   tests/data/head_creation_order/.
/// An alias kind (creation_aliases) is skipped when its parent is among `kinds`; without its
/// parent it is created where Megatron would create the parent's groups. Throws
/// UnknownKindError for a kind the layout does not have.
void for_each_creation(const Layout& layout, std::span<const GroupKind> kinds,
                       const CreationVisitor& visit);

/// The same steps as a list (O(total members) memory).
[[nodiscard]] std::vector<CreationStep> creation_sequence(const Layout& layout,
                                                          std::span<const GroupKind> kinds = {});

/// The aliases among `kinds` (empty: every kind of the layout) whose parent is also among
/// them: kinds that reuse their parent's communicators instead of being created.
[[nodiscard]] std::vector<CreationAlias> creation_aliases(const Layout& layout,
                                                          std::span<const GroupKind> kinds = {});

}  // namespace commgrid
