// Groups made from a Gloo world: split (with and without color, keys reordering ranks),
// member-only create_group, collective create_group_collective, and creation counts.
#include <gtest/gtest.h>

#include <numeric>

#include "gloo_test_util.hpp"

namespace commgrid::test {
namespace {

// The sum of the world ranks of a group, computed over the group itself.
std::int64_t sum_of_world_ranks(Communicator& group, int world_rank) {
  std::int64_t v = world_rank, out = 0;
  group.allreduce(&v, &out, 1, DataType::int64, ReduceOp::sum)->wait();
  return out;
}

TEST(GlooGroups, SplitByColorOrdersByKeyAndLeavesNoColorOut) {
  for (int n : {1, 5, 8}) {
    run_ranks(n, [n](Communicator& w) {
      const Rank me = w.rank();
      // The last rank passes no color (when there are others); key = -rank reverses order.
      const bool out = n > 1 && me == n - 1;
      std::optional<std::int64_t> color;
      if (!out) color = me % 3;
      auto g = w.split(color, -me, "mod3#" + std::to_string(me % 3));
      EXPECT_EQ(w.creation_calls(), 1);
      if (out) {
        EXPECT_EQ(g, nullptr);
        return;
      }
      ASSERT_NE(g, nullptr);
      std::vector<Rank> members;
      for (int r = 0; r < n; ++r)
        if (r % 3 == me % 3 && !(n > 1 && r == n - 1)) members.push_back(r);
      EXPECT_EQ(g->size(), static_cast<int>(members.size()));
      // Descending world rank by key: the highest member is rank 0.
      const auto pos = std::find(members.rbegin(), members.rend(), me) - members.rbegin();
      EXPECT_EQ(g->rank(), pos);
      EXPECT_EQ(g->name(), "mod3#" + std::to_string(me % 3));
      EXPECT_EQ(sum_of_world_ranks(*g, me),
                std::accumulate(members.begin(), members.end(), Rank{0}));
      // A group splits further, and tied keys order by rank.
      auto half = g->split(g->rank() % 2, 0, "half");
      ASSERT_NE(half, nullptr);
      EXPECT_EQ(half->rank(), g->rank() / 2);
    });
  }
}

TEST(GlooGroups, CreateGroupIsMemberOnlyAndCanBeRecreated) {
  run_ranks(6, [](Communicator& w) {
    const Rank me = w.rank();
    if (me % 2 == 0) {  // only the even ranks take part; odd ranks go straight on
      const std::vector<Rank> evens{0, 2, 4};
      for (int round = 0; round < 2; ++round) {  // the same name twice: destroy, recreate
        auto g = w.create_group(evens, "evens");
        ASSERT_NE(g, nullptr);
        EXPECT_EQ(g->size(), 3);
        EXPECT_EQ(g->rank(), me / 2);
        EXPECT_EQ(sum_of_world_ranks(*g, me), 6);
      }
      EXPECT_EQ(w.creation_calls(), 2);
    } else {
      EXPECT_EQ(w.creation_calls(), 0);
    }
    w.barrier()->wait();
    std::vector<Rank> not_me{(me + 1) % 6};
    EXPECT_THROW((void)w.create_group(not_me, "x"), ConfigError);
    std::vector<Rank> unsorted{3, 1};
    EXPECT_THROW((void)w.create_group(unsorted, "x"), ConfigError);
  });
}

TEST(GlooGroups, CreateGroupCollectiveGivesNonMembersNullptr) {
  run_ranks(5, [](Communicator& w) {
    const std::vector<Rank> first{0, 1, 2};
    auto g = w.create_group_collective(first, "first");
    EXPECT_EQ(w.creation_calls(), 1);
    if (w.rank() < 3) {
      ASSERT_NE(g, nullptr);
      EXPECT_EQ(g->size(), 3);
      EXPECT_EQ(sum_of_world_ranks(*g, w.rank()), 3);
    } else {
      EXPECT_EQ(g, nullptr);
    }
    // Megatron creates every group on every rank in order; many in a row must not mix.
    for (int k = 0; k < 4; ++k) {
      std::vector<Rank> pair{k, k + 1};
      auto p = w.create_group_collective(pair, "pair" + std::to_string(k));
      if (w.rank() == k || w.rank() == k + 1) {
        ASSERT_NE(p, nullptr);
        EXPECT_EQ(sum_of_world_ranks(*p, w.rank()), 2 * k + 1);
      }
    }
  });
}

TEST(GlooGroups, CreateGroupCollectiveWithDifferentArgumentsFailsOnEveryRank) {
  auto r = run_local_ranks_collect(
      3,
      [](Communicator& w) {
        std::vector<Rank> members{0, 1};
        if (w.rank() == 2) members = {0, 2};
        try {
          (void)w.create_group_collective(members, "g");
          ADD_FAILURE() << "rank " << w.rank() << ": no error";
        } catch (const BackendError& e) {
          EXPECT_NE(std::string(e.what()).find("ranks 2 passed different members"),
                    std::string::npos)
              << e.what();
        }
      },
      test_options());
  EXPECT_EQ(r.first_failed_rank, -1) << r.first_failure;
}

// A rank's groups of several partitions, as ProcessGroups' member strategy lists them:
// pairs, halves, evens or odds, the whole world, the rank alone.
std::vector<GroupSpec> groups_of(Rank me, Rank n) {
  std::vector<GroupSpec> out;
  out.push_back({{me - me % 2, me - me % 2 + 1}, "pair#" + std::to_string(me / 2)});
  std::vector<Rank> half, parity, world;
  for (Rank r = 0; r < n; ++r) {
    if (r / (n / 2) == me / (n / 2)) half.push_back(r);
    if (r % 2 == me % 2) parity.push_back(r);
    world.push_back(r);
  }
  out.push_back({half, "half#" + std::to_string(me / (n / 2))});
  out.push_back({parity, "parity#" + std::to_string(me % 2)});
  out.push_back({world, "world#0"});
  out.push_back({{me}, "self#" + std::to_string(me)});
  return out;
}

TEST(GlooGroups, CreateGroupsMakesEveryGroupOfARankInOneCall) {
  constexpr Rank n = 8;
  run_ranks(n, [](Communicator& w) {
    const Rank me = w.rank();
    const std::vector<GroupSpec> specs = groups_of(me, n);
    std::vector<std::size_t> usable;
    auto groups = w.create_groups(specs, [&](std::size_t i) { usable.push_back(i); });
    ASSERT_EQ(groups.size(), specs.size());
    EXPECT_EQ(usable, (std::vector<std::size_t>{0, 1, 2, 3, 4}));
    EXPECT_EQ(w.creation_calls(), static_cast<std::int64_t>(specs.size()));
    for (std::size_t i = 0; i < specs.size(); ++i) {
      const std::vector<Rank>& m = specs[i].members;
      ASSERT_NE(groups[i], nullptr);
      EXPECT_EQ(groups[i]->name(), specs[i].name);
      EXPECT_EQ(groups[i]->size(), static_cast<Rank>(m.size()));
      EXPECT_EQ(groups[i]->rank(), std::find(m.begin(), m.end(), me) - m.begin());
      EXPECT_EQ(sum_of_world_ranks(*groups[i], me), std::accumulate(m.begin(), m.end(), Rank{0}))
          << specs[i].name;
    }
    // Again under a name used before (a new generation of it), and the even ranks, in no
    // group this time, still take part in the call (its barrier).
    std::vector<GroupSpec> odd;
    if (me % 2 == 1) odd.push_back(specs[2]);
    auto again = w.create_groups(odd);
    ASSERT_EQ(again.size(), odd.size());
    if (me % 2 == 1) { EXPECT_EQ(sum_of_world_ranks(*again[0], me), 1 + 3 + 5 + 7); }
  });
}

TEST(GlooGroups, CreateGroupsRefusesAGroupWithoutTheCallerBeforeAnyWait) {
  run_ranks(2, [](Communicator& w) {
    const std::vector<GroupSpec> other{{{1 - w.rank()}, "other"}};
    try {
      (void)w.create_groups(other);
      ADD_FAILURE() << "no error";
    } catch (const ConfigError& e) {
      EXPECT_NE(std::string(e.what()).find("a rank lists only its own groups"), std::string::npos)
          << e.what();
    }
    EXPECT_EQ(w.creation_calls(), 0);
  });
}

}  // namespace
}  // namespace commgrid::test
