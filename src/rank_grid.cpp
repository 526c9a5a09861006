#include "commgrid/rank_grid.hpp"

namespace commgrid {
namespace {

// The axes of the grid, in grid order, split into masked and unmasked ones.
struct Split {
  std::array<Axis, kNumAxes> masked{}, unmasked{};
  int n_masked = 0, n_unmasked = 0;
};

Split split_axes(const std::array<Axis, kNumAxes>& order, AxisSet masked) {
  Split s;
  for (Axis a : order) {
    if (masked.contains(a))
      s.masked[s.n_masked++] = a;
    else
      s.unmasked[s.n_unmasked++] = a;
  }
  return s;
}

}  // namespace

RankGrid::RankGrid(const std::array<std::int64_t, kNumAxes>& sizes,
                   const std::array<Axis, kNumAxes>& order)
    : sizes_(sizes), order_(order) {
  std::int64_t g = 1;
  for (Axis a : order_) {
    strides_[idx(a)] = g;
    g *= sizes_[idx(a)];
  }
  world_size_ = g;
}

std::array<std::int64_t, kNumAxes> RankGrid::coordinates(Rank r) const noexcept {
  std::array<std::int64_t, kNumAxes> c{};
  for (Axis a : kAllAxes) c[idx(a)] = coordinate(r, a);
  return c;
}

std::int64_t RankGrid::group_size(AxisSet masked) const noexcept {
  std::int64_t g = 1;
  for (Axis a : kAllAxes)
    if (masked.contains(a)) g *= sizes_[idx(a)];
  return g;
}

std::int64_t RankGrid::num_groups(AxisSet masked) const noexcept {
  return world_size_ / group_size(masked);
}

std::int64_t RankGrid::group_index(AxisSet masked, Rank r) const noexcept {
  std::int64_t q = 0, radix = 1;
  for (Axis a : order_) {
    if (masked.contains(a)) continue;
    q += coordinate(r, a) * radix;
    radix *= sizes_[idx(a)];
  }
  return q;
}

std::int64_t RankGrid::position(AxisSet masked, Rank r) const noexcept {
  std::int64_t k = 0, radix = 1;
  for (Axis a : order_) {
    if (!masked.contains(a)) continue;
    k += coordinate(r, a) * radix;
    radix *= sizes_[idx(a)];
  }
  return k;
}

Rank RankGrid::member(AxisSet masked, std::int64_t q, std::int64_t k) const noexcept {
  Rank r = 0;
  for (Axis a : order_) {
    const std::int64_t s = sizes_[idx(a)];
    std::int64_t& digits = masked.contains(a) ? k : q;
    r += (digits % s) * strides_[idx(a)];
    digits /= s;
  }
  return r;
}

std::vector<Rank> RankGrid::group_of(AxisSet masked, Rank r) const {
  Rank base = r;
  for (Axis a : order_)
    if (masked.contains(a)) base -= coordinate(r, a) * strides_[idx(a)];
  std::vector<Rank> members(static_cast<std::size_t>(group_size(masked)));
  for (std::size_t k = 0; k < members.size(); ++k)
    members[k] = base + member(masked, 0, static_cast<std::int64_t>(k));
  return members;
}

void RankGrid::advance(const std::array<Axis, kNumAxes>& axes, int first, int count,
                       std::array<std::int64_t, kNumAxes>& digit, Rank& rank) const noexcept {
  for (int j = first; j < count; ++j) {
    const Axis a = axes[static_cast<std::size_t>(j)];
    rank += strides_[idx(a)];
    if (++digit[static_cast<std::size_t>(j)] < sizes_[idx(a)]) return;
    rank -= digit[static_cast<std::size_t>(j)] * strides_[idx(a)];
    digit[static_cast<std::size_t>(j)] = 0;
  }
}

GroupList RankGrid::groups(AxisSet masked) const {
  const Split s = split_axes(order_, masked);
  const std::int64_t g = group_size(masked);
  const std::int64_t n = world_size_ / g;
  // Offsets of the members relative to the group's base, computed once; every group is
  // its base plus these offsets. The first unmasked axis (the fastest-moving group digit)
  // is a tight loop; the other unmasked axes advance like an odometer.
  std::vector<Rank> offsets(static_cast<std::size_t>(g));
  {
    std::array<std::int64_t, kNumAxes> digit{};
    Rank off = 0;
    for (std::int64_t k = 0; k < g; ++k) {
      offsets[static_cast<std::size_t>(k)] = off;
      advance(s.masked, 0, s.n_masked, digit, off);
    }
  }
  GroupList out;
  Rank* __restrict dst =
      out.assign_uniform(static_cast<std::size_t>(n), static_cast<std::size_t>(g)).data();
  const Rank* __restrict off = offsets.data();
  const std::int64_t inner = s.n_unmasked > 0 ? sizes_[idx(s.unmasked[0])] : 1;
  const std::int64_t inner_stride = s.n_unmasked > 0 ? strides_[idx(s.unmasked[0])] : 0;
  std::array<std::int64_t, kNumAxes> digit{};
  Rank base = 0;
  for (std::int64_t outer = n / inner; outer > 0; --outer) {
    if (g == 1) {
      for (std::int64_t d = 0; d < inner; ++d) dst[d] = base + d * inner_stride;
      dst += inner;
    } else {
      for (std::int64_t d = 0; d < inner; ++d) {
        const Rank b = base + d * inner_stride;
        for (std::int64_t k = 0; k < g; ++k) dst[k] = b + off[k];
        dst += g;
      }
    }
    advance(s.unmasked, 1, s.n_unmasked, digit, base);
  }
  return out;
}

}  // namespace commgrid
