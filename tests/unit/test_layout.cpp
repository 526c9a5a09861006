// Layout: the spec's worked examples, per-rank quantities, policies, errors, scale.
#include <gtest/gtest.h>

#include "make_config.hpp"

#include <algorithm>

#include "commgrid/error.hpp"
#include "commgrid/layout.hpp"

namespace commgrid {
namespace {

using Groups = std::vector<std::vector<Rank>>;

using test::make_config;

// Spec §8 (b): world 16, tp 2, pp 2, ep 2, etp 1, N = 2.
TEST(Layout, ExampleBDistributedOptimizer) {
  ParallelConfig c = make_config(16, 2, 2, 1, 2);
  c.etp = 1;
  c.dist_opt_instances = 2;
  const Layout l(c);
  EXPECT_EQ(l.dp(), 4);
  EXPECT_EQ(l.expert_dp(), 4);
  EXPECT_EQ(l.groups(GroupKind::intra_dp_cp).to_vectors(),
            (Groups{{0, 2}, {4, 6}, {1, 3}, {5, 7}, {8, 10}, {12, 14}, {9, 11}, {13, 15}}));
  EXPECT_EQ(l.groups(GroupKind::inter_dist_opt).to_vectors(),
            (Groups{{0, 4}, {2, 6}, {1, 5}, {3, 7}, {8, 12}, {10, 14}, {9, 13}, {11, 15}}));
  EXPECT_EQ(l.groups(GroupKind::intra_dist_opt).to_vectors(),
            (Groups{{0, 1, 8, 9, 2, 3, 10, 11}, {4, 5, 12, 13, 6, 7, 14, 15}}));
  EXPECT_EQ(l.groups(GroupKind::ep).to_vectors(),
            (Groups{{0, 1}, {2, 3}, {4, 5}, {6, 7}, {8, 9}, {10, 11}, {12, 13}, {14, 15}}));
  EXPECT_EQ(l.groups(GroupKind::tp_dp).to_vectors(),
            (Groups{{0, 1, 2, 3, 4, 5, 6, 7}, {8, 9, 10, 11, 12, 13, 14, 15}}));
  EXPECT_TRUE(l.has_kind(GroupKind::inter_dist_opt));
  EXPECT_FALSE(l.has_kind(GroupKind::hcp));
}

// Spec §8 (c): order tp-pp-dp puts pp inside dp.
TEST(Layout, ExampleCOrderTpPpDp) {
  ParallelConfig c = make_config(8, 2, 2);
  c.order = "tp-pp-dp";
  const Layout l(c);
  EXPECT_EQ(l.groups(GroupKind::pp).to_vectors(), (Groups{{0, 2}, {1, 3}, {4, 6}, {5, 7}}));
  EXPECT_EQ(l.groups(GroupKind::pos_embd).to_vectors(), (Groups{{0}, {1}, {4}, {5}}));
  EXPECT_EQ(l.groups(GroupKind::dp).to_vectors(), (Groups{{0, 4}, {1, 5}, {2, 6}, {3, 7}}));
  EXPECT_EQ(l.groups(GroupKind::mp).to_vectors(), (Groups{{0, 1, 2, 3}, {4, 5, 6, 7}}));
}

// Spec §7: hcp example, world 16, tp 2, cp 4, hcp [2,2].
TEST(Layout, HierarchicalCp) {
  ParallelConfig c = make_config(16, 2, 1, 4);
  c.hcp = {2, 2};
  const Layout l(c);
  EXPECT_EQ(l.levels(GroupKind::hcp), 2);
  EXPECT_EQ(l.groups(GroupKind::hcp, 0).to_vectors(),
            (Groups{{0, 2}, {4, 6}, {1, 3}, {5, 7}, {8, 10}, {12, 14}, {9, 11}, {13, 15}}));
  EXPECT_EQ(l.groups(GroupKind::hcp, 1).to_vectors(),
            (Groups{{0, 4}, {2, 6}, {1, 5}, {3, 7}, {8, 12}, {10, 14}, {9, 13}, {11, 15}}));
  const auto g = l.group_of(GroupKind::hcp, 6, 1);
  ASSERT_TRUE(g);
  EXPECT_EQ(g->members, (std::vector<Rank>{2, 6}));
  EXPECT_EQ(g->index, 1);
  EXPECT_EQ(g->position, 1);
  EXPECT_THROW((void)l.groups(GroupKind::hcp, 2), ConfigError);
}

// Spec §9: rank 5 of example (a).
TEST(Layout, RankFiveOfExampleA) {
  const Layout l(make_config(16, 2, 2, 2));
  const RankCoordinates x = l.coordinates(5);
  EXPECT_EQ(x, (RankCoordinates{1, 0, 1, 0, 1, 0, 2}));
  const auto tp = l.group_of(GroupKind::tp, 5);
  EXPECT_EQ(tp->members, (std::vector<Rank>{4, 5}));
  EXPECT_EQ(tp->comm_rank, 1);
  const auto pp = l.group_of(GroupKind::pp, 5);
  EXPECT_EQ(pp->members, (std::vector<Rank>{5, 13}));
  EXPECT_EQ(l.group_of(GroupKind::embd, 5)->members, (std::vector<Rank>{5, 13}));
  EXPECT_EQ(l.group_of(GroupKind::pos_embd, 5)->members, (std::vector<Rank>{5}));
  EXPECT_FALSE(l.group_of(GroupKind::pos_embd, 13).has_value());
  EXPECT_EQ(l.group_of(GroupKind::dp_cp, 5)->comm_rank, 2);
  EXPECT_EQ(l.group_of(GroupKind::mp, 5)->members, (std::vector<Rank>{4, 5, 12, 13}));
  EXPECT_EQ(l.group_of(GroupKind::expt_dp, 5)->comm_rank, 2);
  const auto ido = l.group_of(GroupKind::intra_dist_opt, 5);
  EXPECT_EQ(ido->position, 9);   // list index in the unsorted list
  EXPECT_EQ(ido->comm_rank, 5);  // rank in a communicator: sorted position
}

TEST(Layout, MiddleStagesAreInNoEmbeddingGroup) {
  const Layout l(make_config(8, 1, 4));
  EXPECT_TRUE(l.group_of(GroupKind::embd, 0));
  EXPECT_FALSE(l.group_of(GroupKind::embd, 2));
  EXPECT_FALSE(l.group_of(GroupKind::embd, 5));
  EXPECT_TRUE(l.group_of(GroupKind::embd, 7));
  EXPECT_EQ(l.groups(GroupKind::embd).to_vectors(), (Groups{{0, 6}, {1, 7}}));
}

TEST(Layout, CustomPolicies) {
  EmbeddingPolicies p;
  // Last stage first: an unsorted list; the communicator rank is the sorted position.
  p.embedding = [](std::span<const Rank> g) { return std::vector<Rank>{g.back(), g.front()}; };
  p.position_embedding = [](std::span<const Rank> g) { return std::vector<Rank>{g[1]}; };
  const Layout l(make_config(8, 1, 4), p);
  EXPECT_EQ(l.groups(GroupKind::embd).to_vectors(), (Groups{{6, 0}, {7, 1}}));
  EXPECT_EQ(l.groups(GroupKind::pos_embd).to_vectors(), (Groups{{2}, {3}}));
  const auto g = l.group_of(GroupKind::embd, 6);
  EXPECT_EQ(g->position, 0);
  EXPECT_EQ(g->comm_rank, 1);
  EXPECT_FALSE(l.group_of(GroupKind::pos_embd, 0));
}

TEST(Layout, BadPoliciesAreRejectedAtConstruction) {
  EmbeddingPolicies p;
  p.embedding = [](std::span<const Rank> g) { return std::vector<Rank>{g.front(), 3}; };
  try {
    Layout l(make_config(16, 1, 2), p);
    FAIL() << "accepted a policy returning a foreign rank";
  } catch (const PolicyError& e) {
    EXPECT_STREQ(e.what(),
                 "embedding policy returned [0,3] for pipeline group [0,8]: rank 3 is not in "
                 "that group");
  }
  p.embedding = [](std::span<const Rank>) { return std::vector<Rank>{}; };
  EXPECT_THROW(Layout(make_config(16, 1, 2), p), PolicyError);
  p.embedding = {};
  p.position_embedding = [](std::span<const Rank> g) {
    return std::vector<Rank>{g.front(), g.front()};
  };
  EXPECT_THROW(Layout(make_config(16, 1, 2), p), PolicyError);
}

TEST(Layout, Errors) {
  const Layout l(make_config(8, 2, 2));
  try {
    (void)l.group_of(GroupKind::tp, 8);
    FAIL();
  } catch (const RankOutOfRangeError& e) { EXPECT_STREQ(e.what(), "rank 8 out of range [0, 8)"); }
  EXPECT_THROW((void)l.group_of(GroupKind::tp, -1), RankOutOfRangeError);
  EXPECT_THROW((void)l.groups(GroupKind::inter_dist_opt), UnknownKindError);
  EXPECT_THROW((void)l.groups(GroupKind::hcp), UnknownKindError);
  EXPECT_THROW((void)l.coordinates(100), RankOutOfRangeError);
  EXPECT_THROW(Layout(make_config(8, 3, 1)), DivisibilityError);
  EXPECT_THROW(parse_kind("foo"), UnknownKindError);
  EXPECT_EQ(parse_kinds("tp,dp"), (std::vector<GroupKind>{GroupKind::tp, GroupKind::dp}));
  try {
    (void)parse_kinds("tp,foo,bar");
    FAIL();
  } catch (const UnknownKindError& e) {
    EXPECT_NE(std::string(e.what()).find("\"foo\", \"bar\""), std::string::npos) << e.what();
    EXPECT_NE(std::string(e.what()).find("valid: dp_cp, intra_dp_cp"), std::string::npos);
  }
  EXPECT_THROW((void)parse_kinds("tp,tp"), ConfigError);
  EXPECT_THROW((void)parse_kinds(""), UnknownKindError);
}

TEST(Layout, KindNamesRoundTrip) {
  for (GroupKind k : all_kinds()) EXPECT_EQ(parse_kind(kind_name(k)), k);
  EXPECT_EQ(kind_name(GroupKind::intra_dist_opt), "intra_dist_opt");
}

// A 2^30-rank world: one rank's small groups, computed without enumerating the world.
TEST(Layout, BillionRankWorldAnswersOneRank) {
  ParallelConfig c = make_config(std::int64_t{1} << 30, 8, 8, 2, 8);
  c.etp = 1;
  const Layout l(c);
  const Rank r = (std::int64_t{1} << 30) - 3;
  const RankCoordinates x = l.coordinates(r);
  const auto tp = l.group_of(GroupKind::tp, r);
  ASSERT_EQ(tp->members.size(), 8u);
  EXPECT_EQ(tp->members[static_cast<std::size_t>(x.tp)], r);
  for (std::size_t i = 1; i < 8; ++i) EXPECT_EQ(tp->members[i] - tp->members[i - 1], 1);
  const auto pp = l.group_of(GroupKind::pp, r);
  ASSERT_EQ(pp->members.size(), 8u);
  EXPECT_EQ(pp->members[1] - pp->members[0], (std::int64_t{1} << 30) / 8);
  EXPECT_EQ(pp->position, x.pp);
  const auto cp = l.group_of(GroupKind::cp, r);
  EXPECT_EQ(cp->members[1] - cp->members[0], 8);  // cp stride = tp
  const auto ep = l.group_of(GroupKind::ep, r);
  ASSERT_EQ(ep->members.size(), 8u);
  EXPECT_EQ(ep->members[1] - ep->members[0], 1);  // etp = 1: ep is innermost on the expert grid
  const auto mp = l.group_of(GroupKind::mp, r);
  EXPECT_EQ(mp->members.size(), 64u);
  EXPECT_TRUE(std::is_sorted(mp->members.begin(), mp->members.end()));
  EXPECT_NE(std::find(mp->members.begin(), mp->members.end(), r), mp->members.end());
  EXPECT_EQ(l.group_of(GroupKind::tp_cp, r)->members.size(), 16u);
  EXPECT_EQ(l.group_of(GroupKind::expt_tp, r)->members, (std::vector<Rank>{r}));
  EXPECT_EQ(l.num_groups(GroupKind::tp), (std::int64_t{1} << 30) / 8);
}

}  // namespace
}  // namespace commgrid
