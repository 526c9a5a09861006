#include "commgrid/rank_map.hpp"

#include <algorithm>
#include <map>

#include "commgrid/error.hpp"
#include "commgrid/layout.hpp"

namespace commgrid {
namespace {

std::string str(std::int64_t v) { return std::to_string(v); }

std::string list_text(std::span<const std::int64_t> v) {
  std::string s = "[";
  for (std::size_t i = 0; i < v.size(); ++i) s += (i ? "," : "") + str(v[i]);
  return s + "]";
}

}  // namespace

const char* role_name(ProcessRole r) noexcept {
  switch (r) {
    case ProcessRole::active: return "active";
    case ProcessRole::spare: return "spare";
    case ProcessRole::dead: return "dead";
  }
  return "?";
}

RankMap::RankMap(std::int64_t world_size, SparePlacement placement)
    : world_size_(world_size), placement_(placement) {
  const std::int64_t S = placement.spares;
  if (world_size < 1)
    throw InvalidValueError("world_size", "world_size must be >= 1, got " + str(world_size));
  if (S < 0) throw InvalidValueError("spares", "spares must be >= 0, got " + str(S));
  if (world_size > kMaxWorldSize - S)
    throw OverflowError("spares", "world_size " + str(world_size) + " + spares " + str(S) +
                                      " exceeds " + str(kMaxWorldSize) + " processes");
  if (const auto g = placement.gpus_per_node) {
    if (*g < 1)
      throw InvalidValueError("gpus_per_node", "gpus_per_node must be >= 1, got " + str(*g));
    if (world_size % *g != 0)
      throw IncompatibleError("gpus_per_node", "world_size " + str(world_size) +
                                                   " is not a whole number of nodes of " + str(*g) +
                                                   " GPUs");
    if (S % *g != 0)
      throw IncompatibleError("spares", "spares = " + str(S) +
                                            " is not a whole number of nodes of " + str(*g) +
                                            " GPUs (spares are whole nodes, so that a "
                                            "failed node is replaced by a node)");
  }
  process_of_.resize(static_cast<std::size_t>(world_size));
  logical_.assign(static_cast<std::size_t>(world_size + S), -1);
  for (std::int64_t r = 0; r < world_size; ++r)
    process_of_[static_cast<std::size_t>(r)] = logical_[static_cast<std::size_t>(r)] = r;
  role_.assign(static_cast<std::size_t>(world_size + S), ProcessRole::active);
  for (std::int64_t p = world_size; p < world_size + S; ++p)
    role_[static_cast<std::size_t>(p)] = ProcessRole::spare;
  spares_left_ = S;
}

ProcessRole RankMap::role(std::int64_t process) const {
  if (process < 0 || process >= num_processes())
    throw RankOutOfRangeError(
        "process", "process " + str(process) + " out of range [0, " + str(num_processes()) + ")");
  return role_[static_cast<std::size_t>(process)];
}

std::optional<Rank> RankMap::logical_rank(std::int64_t process) const {
  if (role(process) != ProcessRole::active) return std::nullopt;
  return logical_[static_cast<std::size_t>(process)];
}

std::int64_t RankMap::process_of(Rank logical) const {
  if (logical < 0 || logical >= world_size_)
    throw RankOutOfRangeError(
        "rank", "rank " + str(logical) + " out of range [0, " + str(world_size_) + ")");
  return process_of_[static_cast<std::size_t>(logical)];
}

std::vector<std::int64_t> RankMap::spare_processes() const {
  std::vector<std::int64_t> out;
  for (std::size_t p = 0; p < role_.size(); ++p)
    if (role_[p] == ProcessRole::spare) out.push_back(static_cast<std::int64_t>(p));
  return out;
}

std::optional<std::int64_t> RankMap::node_of(std::int64_t process) const noexcept {
  if (!placement_.gpus_per_node) return std::nullopt;
  return process / *placement_.gpus_per_node;
}

RankMap RankMap::replace(std::span<const std::int64_t> failed) const {
  for (std::int64_t p : failed) (void)role(p);  // RankOutOfRangeError
  RankMap next = *this;
  ++next.epoch_;
  // The logical ranks left without a process, by failed process (ascending).
  std::vector<std::int64_t> dead(failed.begin(), failed.end());
  std::sort(dead.begin(), dead.end());
  dead.erase(std::unique(dead.begin(), dead.end()), dead.end());
  std::vector<std::pair<std::int64_t, Rank>> orphans;  // (failed process, its logical rank)
  for (std::int64_t p : dead) {
    if (const auto r = logical_rank(p)) orphans.emplace_back(p, *r);
    if (next.role_[static_cast<std::size_t>(p)] == ProcessRole::spare) --next.spares_left_;
    next.role_[static_cast<std::size_t>(p)] = ProcessRole::dead;
    next.logical_[static_cast<std::size_t>(p)] = -1;
  }
  auto take = [&](std::int64_t spare, Rank r) {
    next.role_[static_cast<std::size_t>(spare)] = ProcessRole::active;
    next.process_of_[static_cast<std::size_t>(r)] = spare;
    next.logical_[static_cast<std::size_t>(spare)] = r;
    --next.spares_left_;
  };
  std::vector<Rank> homeless;
  if (const auto g = placement_.gpus_per_node) {
    // A failed node's ranks move together to one spare node, keeping local indices.
    std::size_t i = 0;
    while (i < orphans.size()) {
      const std::int64_t node = orphans[i].first / *g;
      std::size_t j = i;
      while (j < orphans.size() && orphans[j].first / *g == node) ++j;
      const auto n = static_cast<std::int64_t>(j - i);
      std::optional<std::int64_t> target;
      for (std::int64_t s = 0; s < next.num_processes() / *g && !target; ++s) {
        std::int64_t free = 0;
        for (std::int64_t k = 0; k < *g; ++k)
          free += next.role_[static_cast<std::size_t>(s * *g + k)] == ProcessRole::spare;
        if (free >= n) target = s;
      }
      for (std::size_t k = i; k < j; ++k) {
        const Rank r = orphans[k].second;
        if (!target) {
          homeless.push_back(r);
          continue;
        }
        // The spare with the same local index, else the node's first free one.
        std::int64_t spare = *target * *g + orphans[k].first % *g;
        if (next.role_[static_cast<std::size_t>(spare)] != ProcessRole::spare)
          for (spare = *target * *g;
               next.role_[static_cast<std::size_t>(spare)] != ProcessRole::spare; ++spare) {}
        take(spare, r);
      }
      i = j;
    }
  } else {
    std::size_t s = 0;
    for (const auto& [p, r] : orphans) {
      while (s < next.role_.size() && next.role_[s] != ProcessRole::spare) ++s;
      if (s == next.role_.size()) {
        homeless.push_back(r);
        continue;
      }
      take(static_cast<std::int64_t>(s), r);
    }
  }
  if (!homeless.empty()) {
    std::sort(homeless.begin(), homeless.end());
    throw NoSpareError("no spare left for logical rank" +
                           std::string(homeless.size() > 1 ? "s " : " ") + list_text(homeless) +
                           " (" + str(spares_left_) + " spare" + (spares_left_ == 1 ? "" : "s") +
                           " for " + str(static_cast<std::int64_t>(orphans.size())) +
                           " failed rank" + (orphans.size() == 1 ? "" : "s") +
                           (placement_.gpus_per_node ? ", whole nodes" : "") + ")",
                       homeless);
  }
  return next;
}

RankMap RankMap::revive(std::int64_t process) const {
  if (role(process) != ProcessRole::dead)
    throw IncompatibleError("process", "process " + str(process) + " is " +
                                           role_name(role(process)) +
                                           ", not dead: only a dead "
                                           "process can come back as a spare");
  RankMap next = *this;
  ++next.epoch_;
  next.role_[static_cast<std::size_t>(process)] = ProcessRole::spare;
  ++next.spares_left_;
  return next;
}

RankMap RankMap::at_epoch(std::int64_t epoch) const {
  RankMap next = *this;
  next.epoch_ = epoch;
  return next;
}

RankMap RankMap::shrink(const ShrinkPlan& plan, std::span<const std::int64_t> dead) const {
  for (std::int64_t p : dead) (void)role(p);  // RankOutOfRangeError
  if (static_cast<std::int64_t>(plan.new_rank.size()) != world_size_)
    throw IncompatibleError("plan", "shrink: the plan is for a world of " +
                                        str(static_cast<std::int64_t>(plan.new_rank.size())) +
                                        " ranks, the map's world has " + str(world_size_));
  const std::vector<Rank> old = plan.old_ranks();
  // The dead holding a rank the plan keeps get spares first, as in replace(); the others
  // die with their replicas.
  std::vector<std::int64_t> fill, drop;
  for (std::int64_t p : dead) {
    const auto r = logical_rank(p);
    (r && !plan.new_rank[static_cast<std::size_t>(*r)] ? drop : fill).push_back(p);
  }
  RankMap next = replace(fill);  // the next epoch; NoSpareError
  for (std::int64_t p : drop) {
    next.role_[static_cast<std::size_t>(p)] = ProcessRole::dead;
    next.logical_[static_cast<std::size_t>(p)] = -1;
  }
  const std::vector<std::int64_t> before = next.process_of_;
  next.world_size_ = static_cast<std::int64_t>(old.size());
  next.process_of_.assign(old.size(), -1);
  for (std::size_t r = 0; r < before.size(); ++r) {
    const auto p = static_cast<std::size_t>(before[r]);
    if (next.role_[p] == ProcessRole::dead) continue;
    if (const auto n = plan.new_rank[r]) {
      next.process_of_[static_cast<std::size_t>(*n)] = before[r];
      next.logical_[p] = *n;
    } else {
      next.role_[p] = ProcessRole::spare;
      next.logical_[p] = -1;
    }
  }
  next.spares_left_ = static_cast<std::int64_t>(next.spare_processes().size());
  return next;
}

std::string RankMap::canonical() const {
  std::string s = "epoch=" + str(epoch_) + " world=" + str(world_size_) +
                  " processes=" + str(num_processes()) + " map=";
  for (std::size_t r = 0; r < process_of_.size(); ++r) s += (r ? "," : "") + str(process_of_[r]);
  for (ProcessRole role : {ProcessRole::spare, ProcessRole::dead}) {
    s += std::string(" ") + role_name(role) + "=";
    bool first = true;
    for (std::size_t p = 0; p < role_.size(); ++p)
      if (role_[p] == role) {
        s += (first ? "" : ",") + str(static_cast<std::int64_t>(p));
        first = false;
      }
  }
  return s;
}

std::vector<Rank> ShrinkPlan::old_ranks() const {
  const auto old_world = static_cast<std::int64_t>(new_rank.size());
  if (config.world_size < 1 || config.world_size > old_world)
    throw IncompatibleError("plan", "shrink plan: world_size " + str(config.world_size) +
                                        " is not in [1, " + str(old_world) + "], the old world");
  std::vector<Rank> out(static_cast<std::size_t>(config.world_size), -1);
  for (Rank r = 0; r < old_world; ++r) {
    const auto& n = new_rank[static_cast<std::size_t>(r)];
    if (!n) continue;
    if (*n < 0 || *n >= config.world_size)
      throw IncompatibleError("plan", "shrink plan: old rank " + str(r) + " becomes rank " +
                                          str(*n) + ", outside the new world of " +
                                          str(config.world_size));
    Rank& slot = out[static_cast<std::size_t>(*n)];
    if (slot >= 0)
      throw IncompatibleError("plan", "shrink plan: old ranks " + str(slot) + " and " + str(r) +
                                          " both become rank " + str(*n));
    slot = r;
  }
  if (const auto hole = std::find(out.begin(), out.end(), -1); hole != out.end())
    throw IncompatibleError(
        "plan", "shrink plan: new rank " + str(hole - out.begin()) + " is no old rank's");
  return out;
}

ShrinkPlan plan_shrink(const ParallelConfig& config, std::span<const Rank> dead,
                       std::optional<std::int64_t> global_batch) {
  if (config.compat != Compat::seed)
    throw IncompatibleError("compat", "shrinking a layout is supported under compat seed only");
  const Layout old(config);
  for (Rank r : dead) old.check_rank(r);
  const RankGrid& grid = old.dense_grid();
  const std::int64_t dp = old.dp();
  std::vector<bool> lost(static_cast<std::size_t>(dp), false);
  for (Rank r : dead) lost[static_cast<std::size_t>(grid.coordinate(r, Axis::dp))] = true;
  std::vector<std::int64_t> kept;
  for (std::int64_t d = 0; d < dp; ++d)
    if (!lost[static_cast<std::size_t>(d)]) kept.push_back(d);
  std::vector<Rank> sorted(dead.begin(), dead.end());
  std::sort(sorted.begin(), sorted.end());
  sorted.erase(std::unique(sorted.begin(), sorted.end()), sorted.end());
  const std::string who =
      "logical rank" + std::string(sorted.size() > 1 ? "s " : " ") + list_text(sorted);
  if (kept.empty())
    throw IncompatibleError("dp", "cannot shrink after " + who + " failed: every one of the " +
                                      str(dp) + " data-parallel replicas lost a rank");
  // The largest dp' the kept replicas fill that gives a valid layout.
  const std::int64_t per_replica = config.world_size / dp;
  std::string last_reason;
  for (auto dp2 = static_cast<std::int64_t>(kept.size()); dp2 >= 1; --dp2) {
    if (global_batch && *global_batch % dp2 != 0) {
      last_reason = "dp " + str(dp2) + " does not divide the global batch " + str(*global_batch);
      continue;
    }
    ParallelConfig c = config;
    c.world_size = per_replica * dp2;
    try {
      c.validate();
    } catch (const ConfigError& e) {
      last_reason = "dp " + str(dp2) + ": " + e.what();
      continue;
    }
    ShrinkPlan plan;
    plan.config = c;
    plan.kept_dp.assign(kept.begin(), kept.begin() + dp2);
    const Layout next(c);
    const RankGrid& g2 = next.dense_grid();
    std::vector<std::int64_t> new_dp(static_cast<std::size_t>(dp), -1);
    for (std::int64_t i = 0; i < dp2; ++i)
      new_dp[static_cast<std::size_t>(plan.kept_dp[static_cast<std::size_t>(i)])] = i;
    plan.new_rank.resize(static_cast<std::size_t>(config.world_size));
    for (Rank r = 0; r < config.world_size; ++r) {
      const std::int64_t d = new_dp[static_cast<std::size_t>(grid.coordinate(r, Axis::dp))];
      if (d < 0 || std::binary_search(sorted.begin(), sorted.end(), r)) continue;
      Rank r2 = 0;
      for (Axis a : kAllAxes) r2 += (a == Axis::dp ? d : grid.coordinate(r, a)) * g2.stride(a);
      plan.new_rank[static_cast<std::size_t>(r)] = r2;
    }
    return plan;
  }
  throw IncompatibleError("dp", "cannot shrink after " + who + " failed: " +
                                    str(static_cast<std::int64_t>(kept.size())) + " of " + str(dp) +
                                    " data-parallel replicas survive, and no "
                                    "smaller dp gives a valid layout (" +
                                    last_reason + ")");
}

EpochChange replace_or_shrink(const RankMap& map, std::span<const std::int64_t> dead,
                              const ParallelConfig& config,
                              std::optional<std::int64_t> global_batch) {
  if (config.world_size != map.world_size())
    throw IncompatibleError("world_size",
                            "shrink: the layout's world_size " + str(config.world_size) +
                                " is not the map's world of " + str(map.world_size()));
  try {
    return {map.replace(dead), std::nullopt};
  } catch (const NoSpareError&) {
    // Some dead rank found no spare: shrink.
  }
  const Layout layout(config);
  const RankGrid& grid = layout.dense_grid();
  std::map<std::int64_t, std::vector<Rank>> by_replica;  // dp coordinate -> its dead ranks
  for (std::int64_t p : dead)
    if (const auto r = map.logical_rank(p)) by_replica[grid.coordinate(*r, Axis::dp)].push_back(*r);
  std::vector<std::vector<Rank>> lost;  // fewest dead ranks first, then lowest dp
  lost.reserve(by_replica.size());
  for (auto& [d, ranks] : by_replica) lost.push_back(std::move(ranks));
  std::stable_sort(lost.begin(), lost.end(),
                   [](const auto& a, const auto& b) { return a.size() < b.size(); });
  // The spares fill the first k replicas that lost ranks (k = all did not fit); the rest
  // are dropped. Fewer dropped replicas leave more dp sizes to choose from, so when no plan
  // exists for k, none exists for a smaller k either.
  for (std::size_t k = lost.size() - 1;; --k) {
    std::vector<Rank> dropped;
    for (std::size_t i = k; i < lost.size(); ++i)
      dropped.insert(dropped.end(), lost[i].begin(), lost[i].end());
    std::optional<ShrinkPlan> plan;
    try {
      plan = plan_shrink(config, dropped, global_batch);
    } catch (const IncompatibleError&) {
      // The same error on every process, naming every dead rank, not only the dropped.
      std::vector<Rank> all;
      for (const auto& l : lost) all.insert(all.end(), l.begin(), l.end());
      (void)plan_shrink(config, all, global_batch);
      throw;
    }
    try {
      return {map.shrink(*plan, dead), std::move(plan)};
    } catch (const NoSpareError&) {
      // With nodes the spares may not hold these k replicas' ranks: fill fewer (k = 0
      // fills none, so needs no spare).
      if (k == 0) throw;
    }
  }
}

}  // namespace commgrid
