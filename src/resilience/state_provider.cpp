// StateProvider's defaults and the alternatives a Megatron-style model's reshard needs
// (state_provider.hpp).
#include "commgrid/state_provider.hpp"

#include <algorithm>

#include "commgrid/layout.hpp"

namespace commgrid {

std::vector<ReshardNeed> StateProvider::reshard_needs(const ReshardContext& context) {
  return {ReshardNeed{{{context.old_rank}}}};
}

void StateProvider::reshard(const ReshardContext& /*context*/, std::span<const ReshardPart> parts) {
  if (parts.empty() || parts.front().states.empty())
    throw InvalidValueError("parts", "StateProvider::reshard: no state given to load");
  load(parts.front().states.front());
}

std::vector<std::vector<Rank>> replica_alternatives(const ParallelConfig& old_layout,
                                                    Rank old_rank) {
  const Layout layout(old_layout);
  std::vector<std::vector<Rank>> out{{old_rank}};
  if (const auto dp = layout.group_of(GroupKind::dp, old_rank)) {
    std::vector<Rank> members = dp->members;
    std::sort(members.begin(), members.end());
    for (Rank r : members)
      if (r != old_rank) out.push_back({r});
  }
  return out;
}

std::vector<std::vector<Rank>> shard_group_alternatives(const ParallelConfig& old_layout,
                                                        Rank old_rank, GroupKind shard_group) {
  const Layout layout(old_layout);
  const auto group = layout.group_of(shard_group, old_rank);
  if (!group)
    throw NoGroupError("shard_group_alternatives: logical rank " + std::to_string(old_rank) +
                       " is in no " + std::string(kind_name(shard_group)) + " group");
  std::vector<Rank> members = group->members;
  std::sort(members.begin(), members.end());
  return {members};
}

std::vector<std::vector<Rank>> expert_alternatives(const ParallelConfig& old_layout,
                                                   const ParallelConfig& new_layout, Rank new_rank,
                                                   std::optional<GroupKind> shard_group) {
  const Layout before(old_layout);
  const Layout after(new_layout);
  const RankCoordinates want = after.coordinates(new_rank);
  std::vector<std::vector<Rank>> out;
  for (Rank r = 0; r < before.world_size(); ++r) {
    const RankCoordinates c = before.coordinates(r);
    if (c.pp != want.pp || c.etp != want.etp || c.ep != want.ep) continue;
    out.push_back(shard_group ? shard_group_alternatives(old_layout, r, *shard_group).front()
                              : std::vector<Rank>{r});
  }
  return out;
}

}  // namespace commgrid
