#include "commgrid/group_list.hpp"

#include "commgrid/error.hpp"

namespace commgrid {

void GroupList::push_back(std::span<const Rank> members) {
  if (offsets_.empty()) {
    if (count_ == 0) uniform_size_ = members.size();
    if (members.size() != uniform_size_) {
      // The first group of another size: from now on, store offsets.
      offsets_.reserve(count_ + 2);
      for (std::size_t i = 0; i <= count_; ++i) offsets_.push_back(i * uniform_size_);
    }
  }
  members_.insert(members_.end(), members.begin(), members.end());
  if (!offsets_.empty()) offsets_.push_back(members_.size());
  ++count_;
}

void GroupList::reserve(std::size_t n, std::size_t m) {
  members_.reserve(members_.size() + m);
  if (!offsets_.empty()) offsets_.reserve(offsets_.size() + n);
}

std::span<Rank> GroupList::assign_uniform(std::size_t n, std::size_t g) {
  members_.resize(n * g);
  offsets_.clear();
  uniform_size_ = g;
  count_ = n;
  return members_;
}

void GroupList::regroup(std::size_t g) {
  COMMGRID_ENFORCE(
      g > 0 && members_.size() % g == 0,
      "regroup(" + std::to_string(g) + ") of " + std::to_string(members_.size()) + " members");
  offsets_.clear();
  uniform_size_ = g;
  count_ = members_.size() / g;
}

std::vector<std::vector<Rank>> GroupList::to_vectors() const {
  std::vector<std::vector<Rank>> out;
  out.reserve(size());
  for (std::size_t i = 0; i < size(); ++i) {
    const auto g = operator[](i);
    out.emplace_back(g.begin(), g.end());
  }
  return out;
}

}  // namespace commgrid
