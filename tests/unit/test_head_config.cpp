// ParallelConfig::compat: the HEAD options, their bad-input cases, and that seed configs
// are untouched (no HEAD kind, same canonical text).
#include <gtest/gtest.h>

#include "commgrid/error.hpp"
#include "commgrid/layout.hpp"

namespace commgrid {
namespace {

ParallelConfig head(std::int64_t world) {
  ParallelConfig c;
  c.world_size = world;
  c.compat = Compat::head;
  return c;
}

template <class E>
void expect_error(const ParallelConfig& c, const std::string& param, const std::string& text) {
  try {
    c.validate();
    FAIL() << "no error for " << c.canonical();
  } catch (const E& e) {
    EXPECT_EQ(e.parameter(), param) << e.what();
    EXPECT_NE(std::string(e.what()).find(text), std::string::npos) << e.what();
  }
}

TEST(HeadConfig, SeedRefusesHeadOptions) {
  ParallelConfig c;
  c.world_size = 8;
  c.gtp_remat = 2;
  expect_error<IncompatibleError>(c, "gtp_remat", "requires compat head");
  c.gtp_remat = 1;
  c.expert_gtp_remat = 2;
  expect_error<IncompatibleError>(c, "expert_gtp_remat", "requires compat head");
  c.expert_gtp_remat = 1;
  c.hybrid_context_parallel = true;
  expect_error<IncompatibleError>(c, "hybrid_context_parallel", "requires compat head");
  c.hybrid_context_parallel = false;
  c.all_gather_groups = true;
  expect_error<IncompatibleError>(c, "all_gather_groups", "requires compat head");
  c.all_gather_groups = false;
  c.rank_offset = 1;
  expect_error<IncompatibleError>(c, "rank_offset", "requires compat head");
  c.rank_offset = 0;
  c.local_world_size = 4;
  expect_error<IncompatibleError>(c, "local_world_size", "requires compat head");
}

TEST(HeadConfig, SeedHasNoHeadKindsAndSameCanonicalText) {
  ParallelConfig c;
  c.world_size = 8;
  c.tp = 2;
  const Layout l(c);
  for (GroupKind k : all_kinds()) {
    EXPECT_EQ(l.has_kind(k),
              !is_head_kind(k) && k != GroupKind::hcp && k != GroupKind::inter_dist_opt)
        << kind_name(k);
    if (is_head_kind(k)) { EXPECT_THROW((void)l.groups(k), UnknownKindError); }
  }
  EXPECT_EQ(c.canonical(),
            "world_size=8 tp=2 pp=1 cp=1 ep=1 etp=none hcp=[] dist_opt_instances=1 vpp=none "
            "order=tp-cp-ep-dp-pp");
  ParallelConfig h = c;
  h.compat = Compat::head;
  EXPECT_NE(h.canonical(), c.canonical());
  EXPECT_FALSE(h == c);
}

TEST(HeadConfig, OrderWithoutTpIsAClearError) {
  ParallelConfig c = head(8);
  c.order = "cp-ep-dp-pp";
  expect_error<OrderError>(c, "order", "has no \"tp\"");
  c.compat = Compat::seed;  // the seed accepted it
  EXPECT_NO_THROW(c.validate());
}

TEST(HeadConfig, OrderTokens) {
  ParallelConfig c = head(8);
  c.order = "tp-gtp_remat-cp-ep-dp-pp";
  c.gtp_remat = 2;
  EXPECT_NO_THROW(c.validate());
  c.order = "tp-gtp-dp";
  expect_error<OrderError>(c, "order", "unknown token \"gtp\"");
  c.order = "tp-gtp_remat-gtp_remat";
  expect_error<OrderError>(c, "order", "appears twice");
  c.order = "";
  expect_error<OrderError>(c, "order", "empty");
  EXPECT_EQ(head(8).head_order(false),
            (std::vector<std::string>{"tp", "gtp_remat", "cp", "ep", "dp", "pp"}));
  EXPECT_EQ(head(8).head_order(true),
            (std::vector<std::string>{"tp", "cp", "ep", "gtp_remat", "dp", "pp"}));
}

TEST(HeadConfig, BadValues) {
  ParallelConfig c = head(8);
  c.gtp_remat = 0;
  expect_error<InvalidValueError>(c, "gtp_remat", ">= 1");
  c = head(8);
  c.expert_gtp_remat = -1;
  expect_error<InvalidValueError>(c, "expert_gtp_remat", ">= 1");
  c = head(8);
  c.gtp_remat = 3;
  expect_error<DivisibilityError>(c, "world_size", "tp*pp*cp*gtp_remat");
  c = head(8);
  c.expert_gtp_remat = 3;
  expect_error<DivisibilityError>(c, "world_size", "etp*ep*pp*expert_gtp_remat");
  c = head(8);
  c.rank_offset = -1;
  expect_error<InvalidValueError>(c, "rank_offset", ">= 0");
  c = head(8);
  c.rank_offset = 1;
  expect_error<IncompatibleError>(c, "rank_offset", "exceeds world_size 8");
  c = head(8);
  c.local_world_size = 0;
  expect_error<InvalidValueError>(c, "local_world_size", ">= 1");
  c = head(8);
  c.local_world_size = 16;
  expect_error<InvalidValueError>(c, "local_world_size", "exceeds world_size 8");
  c = head(16);
  c.gtp_remat = 2;
  c.dist_opt_instances = 2;
  expect_error<IncompatibleError>(c, "gtp_remat", "dist_opt_instances = 2");
  c = head(6);
  c.tp = 2;
  c.hybrid_context_parallel = true;
  expect_error<IncompatibleError>(c, "hybrid_context_parallel", "even");
  c = head(8);
  c.tp = 2;
  c.gtp_remat = 2;
  c.all_gather_groups = true;
  expect_error<IncompatibleError>(c, "all_gather_groups", "more than world_size 8");
}

TEST(HeadConfig, RankOffsetLeavesOtherRanksOut) {
  ParallelConfig c = head(16);
  c.tp = 2;
  c.rank_offset = 8;
  c.local_world_size = 8;
  const Layout l(c);
  EXPECT_EQ(l.dp(), 4);
  EXPECT_FALSE(l.group_of(GroupKind::tp, 3).has_value());
  EXPECT_EQ(l.group_of(GroupKind::tp, 9)->members, (std::vector<Rank>{8, 9}));
  EXPECT_EQ(l.coordinates(3).tp, -1);
  EXPECT_EQ(l.coordinates(9).tp, 1);
  EXPECT_EQ(l.coordinates(10).dp, 1);
}

TEST(HeadConfig, HybridLevelsAreNamedBySize) {
  ParallelConfig c = head(32);
  c.tp = 2;
  c.cp = 8;
  c.hybrid_context_parallel = true;
  const Layout l(c);
  // dp_cp groups of 16: n = 2, 4, 8 (below 2^floor(log2 16)).
  ASSERT_EQ(l.levels(GroupKind::hybrid_dp_cp), 3);
  EXPECT_EQ(l.level_name(GroupKind::hybrid_dp_cp, 0), "hybrid_dp_cp_2");
  EXPECT_EQ(l.level_name(GroupKind::hybrid_dp_cp, 1), "hybrid_dp_cp_4");
  EXPECT_EQ(l.level_name(GroupKind::hybrid_dp_cp, 2), "hybrid_dp_cp_8");
  EXPECT_EQ(l.hybrid_sizes(), (std::vector<std::int64_t>{2, 4, 8}));
  EXPECT_EQ(l.group_size(GroupKind::hybrid_dp_cp, 1), 4);
  // dp_cp of 2 ranks: no hybrid level at all.
  ParallelConfig small = head(4);
  small.tp = 2;
  small.hybrid_context_parallel = true;
  EXPECT_FALSE(Layout(small).has_kind(GroupKind::hybrid_dp_cp));
}

}  // namespace
}  // namespace commgrid
