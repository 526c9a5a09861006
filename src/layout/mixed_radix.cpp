#include "commgrid/mixed_radix.hpp"

#include <algorithm>

#include "commgrid/error.hpp"

namespace commgrid::detail {
namespace {
constexpr bool in(DimMask m, int i) noexcept { return (m >> i) & 1u; }
}  // namespace

MixedRadix::MixedRadix(std::span<const std::int64_t> sizes, Rank offset) : offset_(offset) {
  COMMGRID_ENFORCE(sizes.size() <= static_cast<std::size_t>(kMaxDims),
                   "a grid of " + std::to_string(sizes.size()) + " dims");
  n_ = static_cast<int>(sizes.size());
  std::int64_t g = 1;
  for (int i = 0; i < n_; ++i) {
    COMMGRID_ENFORCE(sizes[static_cast<std::size_t>(i)] >= 1, "a grid dim of size < 1");
    size_[i] = sizes[static_cast<std::size_t>(i)];
    stride_[i] = g;
    g *= size_[i];
  }
  count_ = g;
}

std::int64_t MixedRadix::group_size(DimMask masked) const noexcept {
  std::int64_t g = 1;
  for (int i = 0; i < n_; ++i)
    if (in(masked, i)) g *= size_[i];
  return g;
}

std::int64_t MixedRadix::group_index(DimMask masked, Rank r) const noexcept {
  std::int64_t q = 0, radix = 1;
  for (int i = 0; i < n_; ++i) {
    if (in(masked, i)) continue;
    q += coordinate(r, i) * radix;
    radix *= size_[i];
  }
  return q;
}

std::int64_t MixedRadix::position(DimMask masked, Rank r) const noexcept {
  std::int64_t k = 0, radix = 1;
  for (int i = 0; i < n_; ++i) {
    if (!in(masked, i)) continue;
    k += coordinate(r, i) * radix;
    radix *= size_[i];
  }
  return k;
}

Rank MixedRadix::member(DimMask masked, std::int64_t q, std::int64_t k) const noexcept {
  Rank r = offset_;
  for (int i = 0; i < n_; ++i) {
    std::int64_t& digits = in(masked, i) ? k : q;
    r += (digits % size_[i]) * stride_[i];
    digits /= size_[i];
  }
  return r;
}

std::vector<Rank> MixedRadix::group_of(DimMask masked, Rank r) const {
  Rank base = r;
  for (int i = 0; i < n_; ++i)
    if (in(masked, i)) base -= coordinate(r, i) * stride_[i];
  std::vector<Rank> members(static_cast<std::size_t>(group_size(masked)));
  // member(masked, 0, k) counts the offset once; base already holds it.
  for (std::size_t k = 0; k < members.size(); ++k)
    members[k] = base - offset_ + member(masked, 0, static_cast<std::int64_t>(k));
  return members;
}

void MixedRadix::fill(DimMask masked, std::int64_t first, std::span<Rank> out) const noexcept {
  // The concatenated member list is one odometer over the dims, the masked ones (in grid
  // order) fastest, then the unmasked ones. Dims of size 1 add nothing, and a dim whose
  // stride continues the previous one (stride == size * stride before it) merges with it:
  // expt_tp with etp 1 becomes one run 0, 1, ..., W-1, and most kinds a few long runs.
  struct Dim {
    std::int64_t size = 1, stride = 1;
  };
  std::array<Dim, kMaxDims> dim{};
  int n = 0;
  auto add = [&](int i) {
    const std::int64_t s = size_[i], t = stride_[i];
    if (s == 1) return;
    if (n > 0 && dim[n - 1].stride * dim[n - 1].size == t) {
      dim[n - 1].size *= s;
      return;
    }
    dim[n++] = {s, t};
  };
  for (int i = 0; i < n_; ++i)
    if (in(masked, i)) add(i);
  for (int i = 0; i < n_; ++i)
    if (!in(masked, i)) add(i);
  if (n == 0) {  // a grid of one rank
    for (Rank& r : out) r = offset_;
    return;
  }
  // The odometer's digits at `first`; base is the rank of digits 1.. (digit 0 excluded).
  std::array<std::int64_t, kMaxDims> digit{};
  std::int64_t rest = first;
  Rank base = offset_;
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

}  // namespace commgrid::detail
