// Internal: the two editions of the layout (Megatron-core at the seed's commit, and HEAD)
// as data over one engine. An edition says which order tokens it accepts (HEAD adds the
// gtp_remat axis), which kinds it can build, which validation rules apply in which order,
// and its creation sequence. The rules, the grids and the kinds are written once
// (config.cpp, layout.cpp, creation_order.cpp).
#pragma once

#include <cstdint>
#include <span>

#include "commgrid/axis.hpp"
#include "commgrid/config.hpp"
#include "commgrid/group_kind.hpp"

namespace commgrid::detail {

/// One validation rule (numbers as in the layout spec, §4). Each is written once, in
/// config.cpp; an edition lists those that apply, in the order Megatron-core reports them.
enum class Rule : std::uint8_t {
  head_options_unset,    ///< seed: the HEAD-only fields keep their defaults
  world_size,            ///< 1 and 12: 1 <= world_size <= kMaxWorldSize
  positive_sizes,        ///< 2: every size >= 1 (vpp and hcp levels within int)
  placement,             ///< HEAD: rank_offset >= 0, 1 <= local_world_size, both inside the world
  order_tokens,          ///< 3: a well-formed order of the edition's tokens
  order_has_tp,          ///< HEAD: tp in the order, even when tp = 1
  gtp_without_dist_opt,  ///< HEAD: no gtp_remat > 1 with several dist-opt instances
  dense_divides,         ///< 4 (with 12): the dense grid divides the laid-out ranks
  vpp_needs_pp,          ///< 5
  dense_axes_in_order,   ///< 10 on the dense grid
  expert_divides,        ///< 6 (with 12)
  expert_axes_in_order,  ///< 10 on the expert grid
  pp_last,               ///< 7
  pp_groups_agree,       ///< 11
  dist_opt_divides_dp,   ///< 8a
  hybrid_even,           ///< HEAD: hybrid cp needs an even dp_cp size
  hcp_product,           ///< 9
  dist_opt_divides_edp,  ///< 8b
  all_gather_fits,       ///< HEAD: create_all_gather_groups' grids fit the world
};

/// One step of a creation sequence: a kind created group by group, or a parent kind whose
/// groups are each followed by their children (Megatron creates them interleaved).
enum class Walk : std::uint8_t {
  plain,                  ///< every group of every level of `kind`
  dp_cp_with_intra,       ///< dp_cp, each group followed by its intra_dp_cp chunks
  cp_with_hcp,            ///< cp, each group followed by its hcp levels
  pp_with_embeddings,     ///< pp, each group followed by its embd and pos_embd group
  expt_dp_with_partials,  ///< expt_dp, each followed by intra_expt_dp, then inter_dist_opt
  hybrid_by_parent,       ///< for each dp_cp group, every hybrid level in turn
};
struct SequenceItem {
  Walk walk = Walk::plain;
  GroupKind kind = GroupKind::tp;  ///< for Walk::plain
};

struct Edition {
  Compat compat = Compat::seed;
  /// The order tokens it accepts.
  std::span<const Axis> tokens;
  /// Whether gtp_remat is an axis of its own: accepted in the order, injected where the
  /// order omits it (HEAD's _inject_gtp_remat_axis), part of dp's quotient.
  bool gtp_remat_axis = false;
  /// The validation rules, in the order Megatron reports the first failure.
  std::span<const Rule> rules;
  /// The kinds it can build (whether each exists also depends on the config).
  std::span<const GroupKind> kinds;
  /// Megatron's initialize_model_parallel call sequence.
  std::span<const SequenceItem> creation;

  [[nodiscard]] bool has(GroupKind k) const noexcept {
    for (GroupKind x : kinds)
      if (x == k) return true;
    return false;
  }
};

/// The edition of a compat setting.
const Edition& edition_of(Compat c) noexcept;

}  // namespace commgrid::detail
