// GroupList: the groups of one kind, stored flat (one allocation for all members).
#pragma once

#include <cstdint>
#include <span>
#include <vector>

#include "commgrid/axis.hpp"

namespace commgrid {

/// A list of groups of ranks, in a kind's enumeration order. Members are stored
/// contiguously; group i is the span [offsets[i], offsets[i+1]).
class GroupList {
 public:
  GroupList() = default;

  /// Appends one group.
  void push_back(std::span<const Rank> members);
  /// Reserves room for n groups with m members in all.
  void reserve(std::size_t n, std::size_t m);
  /// Appends the groups of another list.
  void append(const GroupList& other);

  [[nodiscard]] std::size_t size() const noexcept { return offsets_.size() - 1; }
  [[nodiscard]] bool empty() const noexcept { return size() == 0; }
  [[nodiscard]] std::span<const Rank> operator[](std::size_t i) const noexcept {
    return {members_.data() + offsets_[i], members_.data() + offsets_[i + 1]};
  }
  /// All members of all groups, group after group.
  [[nodiscard]] std::span<const Rank> members() const noexcept { return members_; }
  /// Writable storage for a builder that fills groups of equal size directly: resizes to
  /// n groups of g members each and returns the member buffer.
  std::span<Rank> assign_uniform(std::size_t n, std::size_t g);

  /// The groups as nested vectors (for tests and printing).
  [[nodiscard]] std::vector<std::vector<Rank>> to_vectors() const;

  bool operator==(const GroupList&) const = default;

 private:
  std::vector<Rank> members_;
  std::vector<std::size_t> offsets_{0};
};

}  // namespace commgrid
