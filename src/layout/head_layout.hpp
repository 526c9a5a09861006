// Internal: the groups of a compat-head config, built whole (HEAD's sixth axis, rank
// offsets and the ragged hybrid groups do not fit the closed forms of the seed's Layout).
#pragma once

#include <array>
#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <vector>

#include "commgrid/config.hpp"
#include "commgrid/group_kind.hpp"
#include "commgrid/group_list.hpp"
#include "commgrid/layout.hpp"

namespace commgrid::detail {

/// Every group of HEAD's RankGenerator for a token mask: groups enumerated by the
/// unmasked coordinates (first axis of the order fastest), members by the masked ones,
/// each rank plus `offset`. `order` and `sizes` are parallel; every mask token must be in
/// `order` (the caller checked).
GroupList ordered_grid_groups(std::span<const std::string> order,
                              std::span<const std::int64_t> sizes, std::int64_t offset,
                              std::span<const std::string> mask);

/// One level of one kind, with a rank -> group index table.
struct HeadLevel {
  GroupList groups;
  std::vector<std::int32_t> group_of_rank;  ///< per world rank; -1 when in no group
  std::optional<std::int64_t> uniform_size; ///< the size of every group, when equal
  std::int64_t num_members = 0;
};

/// Every kind of a head config (an empty vector: the kind does not exist).
struct HeadGroups {
  std::array<std::vector<HeadLevel>, kNumKinds> kinds;
  std::vector<std::int64_t> hybrid_sizes;  ///< n of each hybrid_dp_cp level
  std::vector<std::string> dense_order, expert_order;
  std::vector<std::int64_t> dense_sizes, expert_sizes;  ///< parallel to the orders
};

/// Builds every group of a validated head config. `embedding(k, pp_group)` gives the
/// members of the embd / pos_embd group of a pipeline group.
std::shared_ptr<const HeadGroups> build_head_groups(
    const ParallelConfig& c,
    const std::function<std::vector<Rank>(GroupKind, std::span<const Rank>)>& embedding);

}  // namespace commgrid::detail
