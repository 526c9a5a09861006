// RankGrid: an orthogonal grid of the five axes over ranks 0 ... W-1.
#pragma once

#include <array>
#include <cstdint>
#include <span>
#include <vector>

#include "commgrid/axis.hpp"
#include "commgrid/group_list.hpp"

namespace commgrid {

/// A mixed-radix grid: the first axis of the order has stride 1, each next axis the
/// product of the sizes before it. A set of axes (the masked axes) defines a kind of
/// group: ranks that differ only in masked coordinates. Every query about one rank is
/// O(group size) or O(1), independent of the world size.
class RankGrid {
 public:
  /// sizes: indexed by Axis; order: all five axes, innermost first. The product of the
  /// sizes must not exceed kMaxWorldSize (the caller validated the config).
  RankGrid(const std::array<std::int64_t, kNumAxes>& sizes,
           const std::array<Axis, kNumAxes>& order);

  [[nodiscard]] std::int64_t world_size() const noexcept { return world_size_; }
  [[nodiscard]] std::int64_t size(Axis a) const noexcept { return sizes_[idx(a)]; }
  [[nodiscard]] std::int64_t stride(Axis a) const noexcept { return strides_[idx(a)]; }
  [[nodiscard]] const std::array<Axis, kNumAxes>& order() const noexcept { return order_; }

  /// r's coordinate on axis a: floor(r / stride) mod size.
  [[nodiscard]] std::int64_t coordinate(Rank r, Axis a) const noexcept {
    return (r / strides_[idx(a)]) % sizes_[idx(a)];
  }
  /// All coordinates of r, indexed by Axis.
  [[nodiscard]] std::array<std::int64_t, kNumAxes> coordinates(Rank r) const noexcept;

  /// Number of ranks in a group of the masked axes: the product of their sizes.
  [[nodiscard]] std::int64_t group_size(AxisSet masked) const noexcept;
  /// Number of groups of the masked axes: W / group_size.
  [[nodiscard]] std::int64_t num_groups(AxisSet masked) const noexcept;
  /// Index of r's group in enumeration order (groups are listed by their smallest member).
  [[nodiscard]] std::int64_t group_index(AxisSet masked, Rank r) const noexcept;
  /// r's position inside its group (members are ascending).
  [[nodiscard]] std::int64_t position(AxisSet masked, Rank r) const noexcept;
  /// Member k of group q.
  [[nodiscard]] Rank member(AxisSet masked, std::int64_t q, std::int64_t k) const noexcept;
  /// The members of r's group, in member order.
  [[nodiscard]] std::vector<Rank> group_of(AxisSet masked, Rank r) const;
  /// Every group of the masked axes, in enumeration order.
  [[nodiscard]] GroupList groups(AxisSet masked) const;
  /// Entries [first, first + out.size()) of the member list of every group of the masked
  /// axes concatenated in enumeration order (entry i is member i mod g of group i / g).
  /// O(out.size()) and no other memory, so any part of any world can be streamed.
  /// Requires 0 <= first and first + out.size() <= world_size().
  void fill(AxisSet masked, std::int64_t first, std::span<Rank> out) const noexcept;

 private:
  static constexpr int idx(Axis a) noexcept { return static_cast<int>(a); }
  std::array<std::int64_t, kNumAxes> sizes_{};
  std::array<std::int64_t, kNumAxes> strides_{};
  std::array<Axis, kNumAxes> order_{};
  std::int64_t world_size_ = 1;
};

}  // namespace commgrid
