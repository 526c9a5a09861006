// RankGrid: an orthogonal grid of the six axes over a span of ranks.
#pragma once

#include <array>
#include <cstdint>
#include <span>
#include <vector>

#include "commgrid/axis.hpp"
#include "commgrid/group_list.hpp"
#include "commgrid/mixed_radix.hpp"

namespace commgrid {

/// A mixed-radix grid of the six axes over ranks [offset, offset + world_size()): the first
/// axis of the order has stride 1, each next axis the product of the sizes before it. A set
/// of axes (the masked axes) defines a kind of group: ranks that differ only in masked
/// coordinates. Every query about one rank is O(group size) or O(1), independent of the
/// world size. Rank arguments are global ranks and must lie in the grid (contains()).
class RankGrid {
 public:
  /// sizes: indexed by Axis; order: all six axes, innermost first. The product of the
  /// sizes plus the offset must not exceed kMaxWorldSize (the caller validated the config).
  RankGrid(const std::array<std::int64_t, kNumAxes>& sizes, const std::array<Axis, kNumAxes>& order,
           Rank offset = 0);

  /// The number of ranks the grid lays out (the product of the sizes).
  [[nodiscard]] std::int64_t world_size() const noexcept { return core_.count(); }
  /// The smallest rank of the grid.
  [[nodiscard]] Rank offset() const noexcept { return core_.offset(); }
  /// Whether r lies in [offset, offset + world_size).
  [[nodiscard]] bool contains(Rank r) const noexcept { return core_.contains(r); }
  [[nodiscard]] std::int64_t size(Axis a) const noexcept { return core_.size(dim_[idx(a)]); }
  [[nodiscard]] std::int64_t stride(Axis a) const noexcept { return core_.stride(dim_[idx(a)]); }
  [[nodiscard]] const std::array<Axis, kNumAxes>& order() const noexcept { return order_; }

  /// r's coordinate on axis a: floor((r - offset) / stride) mod size.
  [[nodiscard]] std::int64_t coordinate(Rank r, Axis a) const noexcept {
    return core_.coordinate(r, dim_[idx(a)]);
  }
  /// All coordinates of r, indexed by Axis.
  [[nodiscard]] std::array<std::int64_t, kNumAxes> coordinates(Rank r) const noexcept;

  /// Number of ranks in a group of the masked axes: the product of their sizes.
  [[nodiscard]] std::int64_t group_size(AxisSet masked) const noexcept {
    return core_.group_size(mask(masked));
  }
  /// Number of groups of the masked axes: world_size / group_size.
  [[nodiscard]] std::int64_t num_groups(AxisSet masked) const noexcept {
    return core_.num_groups(mask(masked));
  }
  /// Index of r's group in enumeration order (groups are listed by their smallest member).
  [[nodiscard]] std::int64_t group_index(AxisSet masked, Rank r) const noexcept {
    return core_.group_index(mask(masked), r);
  }
  /// r's position inside its group (members are ascending).
  [[nodiscard]] std::int64_t position(AxisSet masked, Rank r) const noexcept {
    return core_.position(mask(masked), r);
  }
  /// Member k of group q.
  [[nodiscard]] Rank member(AxisSet masked, std::int64_t q, std::int64_t k) const noexcept {
    return core_.member(mask(masked), q, k);
  }
  /// The members of r's group, in member order.
  [[nodiscard]] std::vector<Rank> group_of(AxisSet masked, Rank r) const {
    return core_.group_of(mask(masked), r);
  }
  /// Every group of the masked axes, in enumeration order.
  [[nodiscard]] GroupList groups(AxisSet masked) const;
  /// Entries [first, first + out.size()) of the member list of every group of the masked
  /// axes concatenated in enumeration order (entry i is member i mod g of group i / g).
  /// O(out.size()) and no other memory, so any part of any world can be streamed.
  /// Requires 0 <= first and first + out.size() <= world_size().
  void fill(AxisSet masked, std::int64_t first, std::span<Rank> out) const noexcept {
    core_.fill(mask(masked), first, out);
  }

 private:
  static constexpr int idx(Axis a) noexcept { return static_cast<int>(a); }
  /// The masked axes as dims of the core (their positions in the order).
  [[nodiscard]] detail::DimMask mask(AxisSet masked) const noexcept;
  detail::MixedRadix core_;
  std::array<int, kNumAxes> dim_{};  ///< per Axis: its position in the order
  std::array<Axis, kNumAxes> order_{};
};

}  // namespace commgrid
