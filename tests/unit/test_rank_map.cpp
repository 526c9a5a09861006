// RankMap (logical ranks on physical processes with spares, epoch after epoch) and
// plan_shrink (the smaller layout when no spare is left).
#include <gtest/gtest.h>

#include <random>
#include <set>
#include <type_traits>

#include "commgrid/error.hpp"
#include "commgrid/layout.hpp"
#include "commgrid/rank_map.hpp"

namespace commgrid {
namespace {

// Every logical rank on exactly one active process, every active process holding exactly
// one rank, and the counts of spares consistent.
void expect_consistent(const RankMap& m) {
  std::set<std::int64_t> used;
  for (Rank r = 0; r < m.world_size(); ++r) {
    const std::int64_t p = m.process_of(r);
    ASSERT_EQ(m.role(p), ProcessRole::active) << m.canonical();
    ASSERT_EQ(m.logical_rank(p), std::optional<Rank>(r)) << m.canonical();
    ASSERT_TRUE(used.insert(p).second) << "process " << p << " holds two ranks";
  }
  std::int64_t spares = 0;
  for (std::int64_t p = 0; p < m.num_processes(); ++p) {
    if (m.role(p) == ProcessRole::spare) ++spares;
    if (m.role(p) != ProcessRole::active) { ASSERT_FALSE(m.logical_rank(p).has_value()); }
  }
  EXPECT_EQ(spares, m.spares_left());
  EXPECT_EQ(static_cast<std::int64_t>(m.spare_processes().size()), spares);
}

TEST(RankMap, EpochZeroIsTheIdentityWithSparesLast) {
  const RankMap m(8, {2, std::nullopt});
  EXPECT_EQ(m.world_size(), 8);
  EXPECT_EQ(m.num_processes(), 10);
  EXPECT_EQ(m.epoch(), 0);
  for (Rank r = 0; r < 8; ++r) EXPECT_EQ(m.process_of(r), r);
  EXPECT_EQ(m.spare_processes(), (std::vector<std::int64_t>{8, 9}));
  EXPECT_EQ(m.canonical(), "epoch=0 world=8 processes=10 map=0,1,2,3,4,5,6,7 spare=8,9 dead=");
  expect_consistent(m);
}

TEST(RankMap, SparesTakeFailedRanksLowestFirstAndEpochsCount) {
  const RankMap m(8, {2, std::nullopt});
  const std::int64_t failed[] = {5, 2, 5};
  const RankMap n = m.replace(failed);
  EXPECT_EQ(n.epoch(), 1);
  EXPECT_EQ(n.process_of(2), 8);
  EXPECT_EQ(n.process_of(5), 9);
  EXPECT_EQ(n.role(2), ProcessRole::dead);
  EXPECT_EQ(n.spares_left(), 0);
  expect_consistent(n);
  // A third failure finds no spare: the error names the rank and the map is unchanged.
  const std::int64_t third[] = {7};
  try {
    (void)n.replace(third);
    FAIL() << "no error";
  } catch (const NoSpareError& e) {
    EXPECT_EQ(e.ranks(), std::vector<Rank>{7});
    EXPECT_NE(std::string(e.what()).find("no spare left for logical rank [7]"), std::string::npos)
        << e.what();
    // A runtime event, not bad input (the CLI exits 1, not 2).
    static_assert(std::is_base_of_v<RecoveryError, NoSpareError> &&
                  !std::is_base_of_v<ConfigError, NoSpareError>);
  }
  // A restarted process comes back as a spare and then takes the rank.
  const RankMap back = n.revive(2);
  EXPECT_EQ(back.epoch(), 2);
  EXPECT_EQ(back.role(2), ProcessRole::spare);
  const RankMap last = back.replace(third);
  EXPECT_EQ(last.process_of(7), 2);
  expect_consistent(last);
  EXPECT_THROW((void)last.revive(2), IncompatibleError);
}

TEST(RankMap, AFailedSpareIsNoLongerASpare) {
  const RankMap m(4, {2, std::nullopt});
  const std::int64_t failed[] = {4};
  const RankMap n = m.replace(failed);
  EXPECT_EQ(n.spares_left(), 1);
  EXPECT_EQ(n.role(4), ProcessRole::dead);
  EXPECT_EQ(n.spare_processes(), std::vector<std::int64_t>{5});
  expect_consistent(n);
}

TEST(RankMap, AFailedNodeMovesToOneSpareNodeInLocalOrder) {
  // 4 nodes of 4 GPUs: 3 active nodes, 1 spare node (processes 12-15).
  const RankMap m(12, {4, 4});
  const std::int64_t node1[] = {6, 4, 7, 5};
  const RankMap n = m.replace(node1);
  for (std::int64_t k = 0; k < 4; ++k) EXPECT_EQ(n.process_of(4 + k), 12 + k);
  EXPECT_EQ(n.node_of(n.process_of(5)), std::optional<std::int64_t>(3));
  expect_consistent(n);
  // Part of a node: the same local index on the spare node.
  const RankMap part = m.replace(std::vector<std::int64_t>{9});
  EXPECT_EQ(part.process_of(9), 13);
  expect_consistent(part);
}

TEST(RankMap, BadPlacementsAreClearErrors) {
  EXPECT_THROW((RankMap{8, {-1, std::nullopt}}), InvalidValueError);
  EXPECT_THROW((RankMap{0, {}}), InvalidValueError);
  try {
    RankMap m(16, {4, 8});
    FAIL() << "no error";
  } catch (const IncompatibleError& e) {
    // A runtime event, not bad input (the CLI exits 1, not 2).
    static_assert(std::is_base_of_v<RecoveryError, NoSpareError> &&
                  !std::is_base_of_v<ConfigError, NoSpareError>);
    EXPECT_NE(std::string(e.what()).find("spares = 4 is not a whole number of nodes of 8"),
              std::string::npos)
        << e.what();
  }
  EXPECT_THROW((RankMap{12, {8, 8}}), IncompatibleError);  // 12 ranks are not whole nodes
  EXPECT_THROW((RankMap{kMaxWorldSize, {1, std::nullopt}}), OverflowError);
  const RankMap m(4, {1, std::nullopt});
  EXPECT_THROW((void)m.role(5), RankOutOfRangeError);
  EXPECT_THROW((void)m.process_of(4), RankOutOfRangeError);
  EXPECT_THROW((void)m.replace(std::vector<std::int64_t>{9}), RankOutOfRangeError);
}

// Random failures, one or two at a time, until the spares run out: the map stays a
// bijection from logical ranks to live processes and never reuses a dead one.
TEST(RankMap, RandomFailureSequencesKeepTheMapABijection) {
  std::mt19937 rng(21);
  for (int trial = 0; trial < 200; ++trial) {
    const bool nodes = trial % 2 == 0;
    RankMap m(16, {nodes ? 8 : 5, nodes ? std::optional<std::int64_t>(4) : std::nullopt});
    std::set<std::int64_t> dead;
    while (true) {
      std::vector<std::int64_t> failed;
      const int k = 1 + static_cast<int>(rng() % 2);
      for (int i = 0; i < k; ++i)
        failed.push_back(
            static_cast<std::int64_t>(rng() % static_cast<unsigned>(m.num_processes())));
      try {
        m = m.replace(failed);
      } catch (const NoSpareError&) { break; }
      dead.insert(failed.begin(), failed.end());
      expect_consistent(m);
      for (std::int64_t p : dead) ASSERT_EQ(m.role(p), ProcessRole::dead);
    }
  }
}

ParallelConfig config(std::int64_t w, std::int64_t tp, std::int64_t pp) {
  ParallelConfig c;
  c.world_size = w;
  c.tp = tp;
  c.pp = pp;
  return c;
}

TEST(Shrink, DropsTheReplicasThatLostARankAndRenumbersDp) {
  // world 16, tp 2, pp 2: dp 4; replica d holds ranks with dp coordinate d (stride 2).
  const ParallelConfig c = config(16, 2, 2);
  const Layout l(c);
  const Rank dead[] = {l.dense_grid().member({Axis::tp, Axis::pp}, 1, 0)};  // a rank of replica 1
  const ShrinkPlan p = plan_shrink(c, dead);
  EXPECT_EQ(p.config.world_size, 12);
  EXPECT_EQ(p.kept_dp, (std::vector<std::int64_t>{0, 2, 3}));
  const Layout next(p.config);
  EXPECT_EQ(next.dp(), 3);
  for (Rank r = 0; r < 16; ++r) {
    const auto d = l.coordinates(r).dp;
    const auto& to = p.new_rank[static_cast<std::size_t>(r)];
    if (d == 1) {
      EXPECT_FALSE(to.has_value()) << r;
      continue;
    }
    ASSERT_TRUE(to.has_value()) << r;
    const RankCoordinates a = l.coordinates(r), b = next.coordinates(*to);
    EXPECT_EQ(a.tp, b.tp);
    EXPECT_EQ(a.pp, b.pp);
    EXPECT_EQ(b.dp, d == 0 ? 0 : d - 1);
  }
}

TEST(Shrink, TheLargestValidDpWinsAndTheBatchMustDivide) {
  // Two dist-opt instances need an even dp*cp: 3 survivors shrink to dp 2.
  ParallelConfig c = config(16, 2, 2);
  c.dist_opt_instances = 2;
  const Rank dead[] = {2};  // dp coordinate 1
  EXPECT_EQ(plan_shrink(c, dead).config.world_size, 8);
  // A global batch of 6: dp 3 divides it.
  EXPECT_EQ(plan_shrink(config(16, 2, 2), dead, 6).config.world_size, 12);
  // A global batch of 4: dp 3 does not, dp 2 does.
  EXPECT_EQ(plan_shrink(config(16, 2, 2), dead, 4).config.world_size, 8);
}

TEST(Shrink, NoValidSmallerLayoutIsAClearError) {
  const ParallelConfig c = config(4, 2, 2);  // dp 1
  const Rank dead[] = {3};
  try {
    (void)plan_shrink(c, dead);
    FAIL() << "no error";
  } catch (const IncompatibleError& e) {
    EXPECT_EQ(e.parameter(), "dp");
    EXPECT_NE(std::string(e.what()).find("logical rank [3]"), std::string::npos) << e.what();
    EXPECT_NE(std::string(e.what()).find("every one of the 1 data-parallel replicas"),
              std::string::npos)
        << e.what();
  }
  // The expert grid cannot shrink below ep: world 16, ep 8, etp 1 needs W' % 8 == 0.
  ParallelConfig moe = config(16, 1, 1);
  moe.ep = 8;
  moe.etp = 1;
  const Rank one[] = {0};
  const ShrinkPlan p = plan_shrink(moe, one);
  EXPECT_EQ(p.config.world_size, 8);  // 15 survivors, dp' = 8 is the largest valid
  EXPECT_THROW((void)plan_shrink(moe, std::vector<Rank>{16}), RankOutOfRangeError);
  ParallelConfig head = config(8, 2, 1);
  head.compat = Compat::head;
  EXPECT_THROW((void)plan_shrink(head, one), IncompatibleError);
}

using Processes = std::vector<std::int64_t>;

// A job without spares (S = 0), tp 2 x dp 2: replica 0 is ranks {0, 1}, replica 1 {2, 3}.
TEST(RankMapShrink, KeptRanksTakeTheirNewRanksAndTheDroppedSurvivorsBecomeSpares) {
  const ParallelConfig c = config(4, 2, 1);
  const RankMap m(4, SparePlacement{});
  EXPECT_EQ(m.spares_left(), 0);
  const std::int64_t third[] = {3};
  const ShrinkPlan p = plan_shrink(c, std::vector<Rank>{3});
  const RankMap n = m.shrink(p, third);
  EXPECT_EQ(n.canonical(), "epoch=1 world=2 processes=4 map=0,1 spare=2 dead=3");
  EXPECT_EQ(p.old_ranks(), (std::vector<Rank>{0, 1}));
  expect_consistent(n);
  // Replica 0 lost rank 1: replica 1's ranks 2 and 3 become 0 and 1.
  const std::int64_t first[] = {1};
  const RankMap k = m.shrink(plan_shrink(c, std::vector<Rank>{1}), first);
  EXPECT_EQ(k.canonical(), "epoch=1 world=2 processes=4 map=2,3 spare=0 dead=1");
  EXPECT_EQ(plan_shrink(c, std::vector<Rank>{1}).old_ranks(), (std::vector<Rank>{2, 3}));
  // The survivor of the dropped replica is a spare like any other: it takes the next dead rank.
  const RankMap later = n.replace(Processes{0});
  EXPECT_EQ(later.canonical(), "epoch=2 world=2 processes=4 map=2,1 spare= dead=0,3");
}

TEST(RankMapShrink, AKeptRankOfADeadProcessTakesASpareInTheSameEpoch) {
  // world 8, tp 2: dp 4; process 1 (replica 0) and process 2 (replica 1) die, one spare.
  const ParallelConfig c = config(8, 2, 1);
  const RankMap m(8, {1, std::nullopt});
  const ShrinkPlan p = plan_shrink(c, std::vector<Rank>{2});  // replica 1 dropped
  const RankMap n = m.shrink(p, Processes{2, 1});
  EXPECT_EQ(n.canonical(), "epoch=1 world=6 processes=9 map=0,8,4,5,6,7 spare=3 dead=1,2");
  expect_consistent(n);
}

TEST(RankMapShrink, BadPlansAndTooFewSparesAreClearErrors) {
  const ParallelConfig c = config(4, 2, 1);
  const RankMap m(4, SparePlacement{});
  const ShrinkPlan p = plan_shrink(c, std::vector<Rank>{3});
  try {
    (void)RankMap(8, SparePlacement{}).shrink(p, Processes{3});
    FAIL() << "no error";
  } catch (const IncompatibleError& e) {
    EXPECT_EQ(e.parameter(), "plan");
    EXPECT_NE(std::string(e.what()).find("a world of 4 ranks, the map's world has 8"),
              std::string::npos)
        << e.what();
  }
  ShrinkPlan twice = p;
  twice.new_rank[1] = 0;
  try {
    (void)m.shrink(twice, Processes{3});
    FAIL() << "no error";
  } catch (const IncompatibleError& e) {
    EXPECT_EQ(e.parameter(), "plan");
    EXPECT_NE(std::string(e.what()).find("old ranks 0 and 1 both become rank 0"), std::string::npos)
        << e.what();
  }
  ShrinkPlan outside = p;
  outside.new_rank[1] = 2;
  EXPECT_THROW((void)m.shrink(outside, Processes{3}), IncompatibleError);
  // The plan keeps rank 1, whose process died too, and there is no spare for it.
  try {
    (void)m.shrink(p, Processes{1, 3});
    FAIL() << "no error";
  } catch (const NoSpareError& e) { EXPECT_EQ(e.ranks(), std::vector<Rank>{1}); }
  EXPECT_THROW((void)m.shrink(p, Processes{4}), RankOutOfRangeError);
}

TEST(ReplaceOrShrink, SparesFirstThenTheReplicasWithFewestDeadRanks) {
  const ParallelConfig c = config(8, 2, 1);  // dp 4: replica d is ranks {2d, 2d+1}
  // Enough spares: a plain replace, no shrink.
  const RankMap m(8, {2, std::nullopt});
  const EpochChange plain = replace_or_shrink(m, Processes{1, 2}, c);
  EXPECT_FALSE(plain.shrink);
  EXPECT_EQ(plain.map, m.replace(Processes{1, 2}));
  // Three dead: replica 0 lost ranks 0 and 1, replica 1 lost rank 2. The two spares fill
  // replica 1 (fewest dead ranks) and replica 0 is dropped.
  const EpochChange three = replace_or_shrink(m, Processes{0, 1, 2}, c);
  ASSERT_TRUE(three.shrink);
  EXPECT_EQ(three.shrink->kept_dp, (Processes{1, 2, 3}));
  EXPECT_EQ(three.map.canonical(),
            "epoch=1 world=6 processes=10 map=8,3,4,5,6,7 spare=9 dead=0,1,2");
  expect_consistent(three.map);
  // One spare, two replicas with one dead rank each: the lower one is filled.
  const EpochChange two = replace_or_shrink(RankMap(8, {1, std::nullopt}), Processes{2, 1}, c);
  ASSERT_TRUE(two.shrink);
  EXPECT_EQ(two.map.canonical(), "epoch=1 world=6 processes=9 map=0,8,4,5,6,7 spare=3 dead=1,2");
  // Without spares (S = 0) the dropped replica's survivor is the spare.
  const EpochChange none =
      replace_or_shrink(RankMap(4, SparePlacement{}), Processes{3}, config(4, 2, 1));
  ASSERT_TRUE(none.shrink);
  EXPECT_EQ(none.shrink->config.world_size, 2);
  EXPECT_EQ(none.map.canonical(), "epoch=1 world=2 processes=4 map=0,1 spare=2 dead=3");
  EXPECT_THROW((void)replace_or_shrink(m, Processes{1}, config(4, 2, 1)), IncompatibleError);
}

TEST(ReplaceOrShrink, SparesThatFitByCountButNotByNodeFillFewerReplicas) {
  // Nodes of 2 GPUs, tp 2: each of the 4 active nodes is one replica; 2 spare nodes.
  RankMap m(8, {4, 2});
  m = m.replace(Processes{9, 11});  // one spare left on each spare node
  ASSERT_EQ(m.spare_processes(), (Processes{8, 10}));
  // Nodes 0 and 1 die: two spares for two dead ranks of replica 0, but not on one node.
  const EpochChange e = replace_or_shrink(m, Processes{0, 1, 2, 3}, config(8, 2, 1));
  ASSERT_TRUE(e.shrink);
  EXPECT_EQ(e.shrink->kept_dp, (Processes{2, 3}));
  EXPECT_EQ(e.map.canonical(),
            "epoch=2 world=4 processes=12 map=4,5,6,7 spare=8,10 dead=0,1,2,3,9,11");
  expect_consistent(e.map);
}

TEST(ReplaceOrShrink, NoValidSmallerLayoutNamesEveryDeadRank) {
  // dp 1: nothing to drop.
  try {
    (void)replace_or_shrink(RankMap(4, SparePlacement{}), Processes{3}, config(4, 2, 2));
    FAIL() << "no error";
  } catch (const IncompatibleError& e) {
    EXPECT_EQ(e.parameter(), "dp");
    EXPECT_NE(std::string(e.what()).find("cannot shrink after logical rank [3] failed"),
              std::string::npos)
        << e.what();
  }
  // Two distributed-optimizer instances need an even dp. Four replicas lose a rank each and
  // the one spare fills one: dp 1 is not valid, and the error names all four dead ranks.
  ParallelConfig c = config(8, 2, 1);
  c.dist_opt_instances = 2;
  try {
    (void)replace_or_shrink(RankMap(8, {1, std::nullopt}), Processes{6, 1, 2, 4}, c);
    FAIL() << "no error";
  } catch (const IncompatibleError& e) {
    EXPECT_EQ(e.parameter(), "dp");
    EXPECT_NE(std::string(e.what()).find("logical ranks [1,2,4,6]"), std::string::npos) << e.what();
  }
}

}  // namespace
}  // namespace commgrid
