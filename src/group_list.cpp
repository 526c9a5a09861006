#include "commgrid/group_list.hpp"

namespace commgrid {

void GroupList::push_back(std::span<const Rank> members) {
  members_.insert(members_.end(), members.begin(), members.end());
  offsets_.push_back(members_.size());
}

void GroupList::reserve(std::size_t n, std::size_t m) {
  offsets_.reserve(offsets_.size() + n);
  members_.reserve(members_.size() + m);
}

void GroupList::append(const GroupList& other) {
  reserve(other.size(), other.members_.size());
  for (std::size_t i = 0; i < other.size(); ++i) push_back(other[i]);
}

std::span<Rank> GroupList::assign_uniform(std::size_t n, std::size_t g) {
  members_.assign(n * g, 0);
  offsets_.resize(n + 1);
  for (std::size_t i = 0; i <= n; ++i) offsets_[i] = i * g;
  return members_;
}

std::vector<std::vector<Rank>> GroupList::to_vectors() const {
  std::vector<std::vector<Rank>> out;
  out.reserve(size());
  for (std::size_t i = 0; i < size(); ++i) out.emplace_back(operator[](i).begin(), operator[](i).end());
  return out;
}

}  // namespace commgrid
