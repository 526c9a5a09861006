#include "launch/epoch_view.hpp"

#include <algorithm>

#include "commgrid/error.hpp"

namespace commgrid::cli {

EpochView::EpochView(std::int64_t world_size, std::int64_t num_processes)
    : world0_(world_size), rank_of_(static_cast<std::size_t>(num_processes), -1),
      known_incarnation_(static_cast<std::size_t>(num_processes), 0),
      dead_incarnation_(static_cast<std::size_t>(num_processes), -1) {
  for (std::int64_t p = 0; p < world_size && p < num_processes; ++p)
    rank_of_[static_cast<std::size_t>(p)] = p;
}

void EpochView::adopt(std::int64_t epoch, std::span<const std::int64_t> dead,
                      std::span<const std::pair<std::int64_t, int>> revived,
                      std::span<const std::int64_t> process_of) {
  const auto P = static_cast<std::int64_t>(rank_of_.size());
  const auto check = [&](std::int64_t p) {
    if (p < 0 || p >= P)
      throw Error("launch: the decision of epoch " + std::to_string(epoch) + " names process " +
                  std::to_string(p) + ", outside the job's " + std::to_string(P));
    return static_cast<std::size_t>(p);
  };
  if (epoch != epoch_ + 1)
    throw Error("launch: a decision of epoch " + std::to_string(epoch) + " after epoch " +
                std::to_string(epoch_));
  for (auto [p, incarnation] : revived) known_incarnation_[check(p)] = incarnation;
  for (std::int64_t p : dead) dead_incarnation_[check(p)] = known_incarnation_[check(p)];
  epoch_ = epoch;
  if (process_of.empty()) {
    // No next world (the job ends): the dead hold nothing, the others keep what they held.
    for (std::int64_t p : dead) rank_of_[check(p)] = -1;
    return;
  }
  std::fill(rank_of_.begin(), rank_of_.end(), -1);
  for (std::size_t r = 0; r < process_of.size(); ++r)
    rank_of_[check(process_of[r])] = static_cast<std::int64_t>(r);
}

std::optional<std::int64_t> EpochView::logical_rank(std::int64_t process) const {
  if (process < 0 || process >= static_cast<std::int64_t>(rank_of_.size())) return std::nullopt;
  const std::int64_t r = rank_of_[static_cast<std::size_t>(process)];
  return r < 0 ? std::nullopt : std::optional<std::int64_t>(r);
}

std::string EpochView::label(std::int64_t process, int incarnation) const {
  const std::string p = std::to_string(process);
  if (process < 0 || process >= static_cast<std::int64_t>(rank_of_.size())) return "process " + p;
  const auto i = static_cast<std::size_t>(process);
  if (dead_incarnation_[i] >= incarnation) return "process " + p + ", dead";
  if (const auto r = logical_rank(process))
    return "rank " + std::to_string(*r) + (epoch_ > 0 ? ", epoch " + std::to_string(epoch_) : "");
  if (process >= world0_) return "spare " + std::to_string(process - world0_);
  return "process " + p + ", spare";
}

}  // namespace commgrid::cli
