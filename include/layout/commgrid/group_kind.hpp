// GroupKind: the catalogue of group kinds, named exactly as Megatron-core's fields.
#pragma once

#include <array>
#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

namespace commgrid {

/// Every kind of group, in the order Megatron-core's reference output lists them.
enum class GroupKind : std::uint8_t {
  dp_cp,
  intra_dp_cp,
  dp,
  cp,
  hcp,
  mp,
  tp,
  pp,
  embd,
  pos_embd,
  tp_dp_cp,
  tp_dp,
  tp_cp,
  ep,
  expt_tp,
  tp_ep,
  tp_ep_pp,
  expt_dp,
  intra_expt_dp,
  inter_dist_opt,
  intra_dist_opt,
  // Megatron-core HEAD only (ParallelConfig::compat == head); a seed Layout has none of them.
  gtp_remat,
  expt_gtp_remat,
  dp_gtp_remat,
  dp_cp_gtp_remat,
  expt_dp_gtp_remat,
  tp_ep_pp_with_egtp_remat,
  hybrid_dp_cp,  ///< one level per size n = 2, 4, ...; printed as hybrid_dp_cp_<n>
  dp_cp_ag,
  expt_dp_ag,
};

inline constexpr int kNumKinds = 30;

/// The number of kinds Megatron-core had at the seed's commit (the first in all_kinds()).
inline constexpr int kNumSeedKinds = 21;

/// Whether the kind exists only under compat head.
constexpr bool is_head_kind(GroupKind k) noexcept { return static_cast<int>(k) >= kNumSeedKinds; }

/// Every kind in reference order.
const std::array<GroupKind, kNumKinds>& all_kinds() noexcept;

/// The kind's name: "tp", "dp_cp", ...
std::string_view kind_name(GroupKind k) noexcept;

/// The kind with that name, or nullopt.
std::optional<GroupKind> find_kind(std::string_view name) noexcept;

/// The kind with that name; throws UnknownKindError naming it and listing the valid names.
GroupKind parse_kind(std::string_view name);

/// Parses "k1,k2,...": each a kind name; throws UnknownKindError (every unknown name) or
/// ConfigError (an empty list or a repeated name).
std::vector<GroupKind> parse_kinds(std::string_view list);

/// "tp, pp, ..." : every kind name, comma-separated (for error messages).
std::string all_kind_names();

}  // namespace commgrid
