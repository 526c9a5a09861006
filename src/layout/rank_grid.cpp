#include "commgrid/rank_grid.hpp"

#include <algorithm>

namespace commgrid {

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

GroupList RankGrid::groups(AxisSet masked) const {
  const std::int64_t g = group_size(masked);
  GroupList out;
  const std::span<Rank> buf =
      out.assign_uniform(static_cast<std::size_t>(world_size_ / g), static_cast<std::size_t>(g));
  fill(masked, 0, buf);
  return out;
}

void RankGrid::fill(AxisSet masked, std::int64_t first, std::span<Rank> out) const noexcept {
  // The concatenated member list is one odometer over the axes, the masked ones (in grid
  // order) fastest, then the unmasked ones. Axes of size 1 add nothing, and an axis whose
  // stride continues the previous one (stride == size * stride before it) merges with it:
  // expt_tp with etp 1 becomes one run 0, 1, ..., W-1, and most kinds a few long runs.
  struct Dim {
    std::int64_t size = 1, stride = 1;
  };
  std::array<Dim, kNumAxes> dim{};
  int n = 0;
  auto add = [&](Axis a) {
    const std::int64_t s = sizes_[idx(a)], t = strides_[idx(a)];
    if (s == 1) return;
    if (n > 0 && dim[n - 1].stride * dim[n - 1].size == t) {
      dim[n - 1].size *= s;
      return;
    }
    dim[n++] = {s, t};
  };
  for (Axis a : order_)
    if (masked.contains(a)) add(a);
  for (Axis a : order_)
    if (!masked.contains(a)) add(a);
  if (n == 0) {  // a world of one rank
    for (Rank& r : out) r = 0;
    return;
  }
  // The odometer's digits at `first`; base is the rank of digits 1.. (digit 0 excluded).
  std::array<std::int64_t, kNumAxes> digit{};
  std::int64_t rest = first;
  Rank base = 0;
  for (int j = 0; j < n; ++j) {
    digit[j] = rest % dim[j].size;
    rest /= dim[j].size;
    if (j > 0) base += digit[j] * dim[j].stride;
  }
  const std::int64_t s0 = dim[0].size, t0 = dim[0].stride;
  const std::int64_t s1 = n > 1 ? dim[1].size : 1, t1 = n > 1 ? dim[1].stride : 0;
  Rank* __restrict dst = out.data();
  auto left = static_cast<std::int64_t>(out.size());
  std::int64_t d0 = digit[0];
  // Steps digits from `from` on by one, moving base along.
  auto advance = [&](int from) {
    for (int j = from; j < n; ++j) {
      base += dim[j].stride;
      if (++digit[j] < dim[j].size) return;
      base -= digit[j] * dim[j].stride;
      digit[j] = 0;
    }
  };
  while (left > 0) {
    if (d0 == 0 && n > 1 && digit[1] == 0 && left >= s0 * s1 && s0 < 64) {
      // Whole blocks of the two fastest digits: short first digits (cp 2, tp 8) would
      // otherwise pay an odometer step every few members.
      for (std::int64_t k1 = 0; k1 < s1; ++k1) {
        const Rank b1 = base + k1 * t1;
        for (std::int64_t k0 = 0; k0 < s0; ++k0) dst[k0] = b1 + k0 * t0;
        dst += s0;
      }
      left -= s0 * s1;
      // digit 1 wrapped to 0: carry into digit 2.
      advance(2);
      continue;
    }
    const std::int64_t cnt = std::min(s0 - d0, left);
    if (t0 == 1) {
      for (std::int64_t k = 0; k < cnt; ++k) dst[k] = base + d0 + k;
    } else {
      for (std::int64_t k = 0; k < cnt; ++k) dst[k] = base + (d0 + k) * t0;
    }
    dst += cnt;
    left -= cnt;
    d0 = 0;
    advance(1);
  }
}

}  // namespace commgrid
