#include "commgrid/rank_grid.hpp"

#include "commgrid/error.hpp"

namespace commgrid {

RankGrid::RankGrid(const std::array<std::int64_t, kNumAxes>& sizes,
                   const std::array<Axis, kNumAxes>& order, Rank offset)
    : order_(order) {
  std::array<std::int64_t, kNumAxes> in_order{};
  std::array<bool, kNumAxes> seen{};
  for (int i = 0; i < kNumAxes; ++i) {
    COMMGRID_ENFORCE(!seen[idx(order_[i])], "a grid order names an axis twice");
    seen[idx(order_[i])] = true;
    dim_[idx(order_[i])] = i;
    in_order[i] = sizes[idx(order_[i])];
  }
  core_ = detail::MixedRadix(in_order, offset);
}

detail::DimMask RankGrid::mask(AxisSet masked) const noexcept {
  detail::DimMask m = 0;
  for (Axis a : kAllAxes)
    if (masked.contains(a)) m |= detail::DimMask{1} << dim_[idx(a)];
  return m;
}

std::array<std::int64_t, kNumAxes> RankGrid::coordinates(Rank r) const noexcept {
  std::array<std::int64_t, kNumAxes> c{};
  for (Axis a : kAllAxes) c[idx(a)] = coordinate(r, a);
  return c;
}

GroupList RankGrid::groups(AxisSet masked) const {
  const std::int64_t g = group_size(masked);
  GroupList out;
  const std::span<Rank> buf =
      out.assign_uniform(static_cast<std::size_t>(world_size() / g), static_cast<std::size_t>(g));
  fill(masked, 0, buf);
  return out;
}

}  // namespace commgrid
