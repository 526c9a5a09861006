// GroupList: the groups of one kind, stored flat (one allocation for all members).
#pragma once

#include <cstdint>
#include <memory>
#include <span>
#include <vector>

#include "commgrid/axis.hpp"

namespace commgrid {

namespace detail {
/// An allocator whose value-initialization leaves integers uninitialized, so that a
/// builder that writes every element does not pay for zeroing the buffer first.
template <class T>
struct UninitializedAllocator : std::allocator<T> {
  template <class U>
  struct rebind {
    using other = UninitializedAllocator<U>;
  };
  using std::allocator<T>::allocator;
  template <class U>
  void construct(U* p) noexcept {
    ::new (static_cast<void*>(p)) U;
  }
  template <class U, class... Args>
  void construct(U* p, Args&&... args) {
    ::new (static_cast<void*>(p)) U(std::forward<Args>(args)...);
  }
};
}  // namespace detail

/// A list of groups of ranks, in a kind's enumeration order. Members are stored
/// contiguously, group after group. While every group has the same size (every kind with
/// the default policies) no offsets are stored: group i is [i*g, (i+1)*g).
class GroupList {
 public:
  GroupList() = default;

  /// Appends one group.
  void push_back(std::span<const Rank> members);
  /// Reserves room for n more groups with m more members in all.
  void reserve(std::size_t n, std::size_t m);

  [[nodiscard]] std::size_t size() const noexcept { return count_; }
  [[nodiscard]] bool empty() const noexcept { return count_ == 0; }
  [[nodiscard]] std::span<const Rank> operator[](std::size_t i) const noexcept {
    if (offsets_.empty()) return {members_.data() + i * uniform_size_, uniform_size_};
    return {members_.data() + offsets_[i], members_.data() + offsets_[i + 1]};
  }
  /// All members of all groups, group after group.
  [[nodiscard]] std::span<const Rank> members() const noexcept { return members_; }
  /// Writable storage for a builder that fills groups of equal size directly: makes the
  /// list n groups of g members each and returns the (uninitialized) member buffer.
  std::span<Rank> assign_uniform(std::size_t n, std::size_t g);
  /// Cuts the same members into consecutive groups of g members (g must divide the
  /// number of members): the level-0 hierarchical split of every group at once.
  void regroup(std::size_t g);

  /// The groups as nested vectors (for tests and printing).
  [[nodiscard]] std::vector<std::vector<Rank>> to_vectors() const;

  bool operator==(const GroupList&) const = default;

 private:
  std::vector<Rank, detail::UninitializedAllocator<Rank>> members_;
  std::vector<std::size_t> offsets_;  ///< empty while all groups have uniform_size_
  std::size_t uniform_size_ = 0;
  std::size_t count_ = 0;
};

}  // namespace commgrid
