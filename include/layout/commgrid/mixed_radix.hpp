// MixedRadix: the arithmetic of an orthogonal grid of dims over a span of ranks. One
// engine for RankGrid (the six named axes of a layout) and HyperGrid (any named dims).
#pragma once

#include <array>
#include <cstdint>
#include <span>
#include <vector>

#include "commgrid/axis.hpp"

namespace commgrid::detail {

/// The most dims a grid may have.
inline constexpr int kMaxDims = 16;

/// A set of dims, by their index in the grid's order (bit i: dim i).
using DimMask = std::uint32_t;

/// A mixed-radix grid over ranks [offset, offset + count): dim 0 has stride 1, each next dim
/// the product of the sizes before it, and rank offset + sum(c_i * stride_i) has coordinates
/// c_i. A mask of dims defines a kind of group: the ranks that differ only in masked
/// coordinates. Groups are numbered by the unmasked coordinates (first unmasked dim
/// fastest), members by the masked ones (first masked dim fastest), so every group is
/// ascending and the groups are listed by their smallest member. Every query about one rank
/// is O(dims) or O(group size), whatever the number of ranks.
class MixedRadix {
 public:
  MixedRadix() = default;
  /// sizes: one per dim, innermost first, each >= 1, at most kMaxDims, with a product that
  /// fits in int64 (the caller validated them).
  explicit MixedRadix(std::span<const std::int64_t> sizes, Rank offset = 0);

  [[nodiscard]] int dims() const noexcept { return n_; }
  [[nodiscard]] std::int64_t size(int dim) const noexcept { return size_[dim]; }
  [[nodiscard]] std::int64_t stride(int dim) const noexcept { return stride_[dim]; }
  [[nodiscard]] Rank offset() const noexcept { return offset_; }
  /// The number of ranks laid out: the product of the sizes.
  [[nodiscard]] std::int64_t count() const noexcept { return count_; }
  /// Whether r lies in [offset, offset + count).
  [[nodiscard]] bool contains(Rank r) const noexcept {
    return r >= offset_ && r - offset_ < count_;
  }

  /// r's coordinate on a dim (r must be contained).
  [[nodiscard]] std::int64_t coordinate(Rank r, int dim) const noexcept {
    return ((r - offset_) / stride_[dim]) % size_[dim];
  }
  /// The product of the masked sizes.
  [[nodiscard]] std::int64_t group_size(DimMask masked) const noexcept;
  [[nodiscard]] std::int64_t num_groups(DimMask masked) const noexcept {
    return count_ / group_size(masked);
  }
  /// Index of r's group; r's position in it.
  [[nodiscard]] std::int64_t group_index(DimMask masked, Rank r) const noexcept;
  [[nodiscard]] std::int64_t position(DimMask masked, Rank r) const noexcept;
  /// Member k of group q.
  [[nodiscard]] Rank member(DimMask masked, std::int64_t q, std::int64_t k) const noexcept;
  /// The members of r's group, in member order.
  [[nodiscard]] std::vector<Rank> group_of(DimMask masked, Rank r) const;
  /// Entries [first, first + out.size()) of every group's members, group after group: one
  /// odometer over the dims, the masked ones fastest. O(out.size()), no other memory.
  /// Requires 0 <= first and first + out.size() <= count().
  void fill(DimMask masked, std::int64_t first, std::span<Rank> out) const noexcept;

 private:
  std::array<std::int64_t, kMaxDims> size_{};
  std::array<std::int64_t, kMaxDims> stride_{};
  int n_ = 0;
  Rank offset_ = 0;
  std::int64_t count_ = 1;
};

}  // namespace commgrid::detail
