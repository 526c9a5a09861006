// ProcessGroups (parallel_state) on Gloo rank-threads: every kind created with every
// strategy and proven on the wire against the layout.
#include <gtest/gtest.h>

#include <algorithm>

#include "commgrid/process_groups.hpp"
#include "gloo_test_util.hpp"

namespace commgrid::test {
namespace {

// Every created kind: the communicator's size and rank match the getters, and an allgather
// of world ranks over it returns exactly the layout's members (sorted: communicator order).
void check_every_kind(const ProcessGroups& pg, int world_rank) {
  for (GroupKind k : pg.kinds()) {
    if (!pg.has_group(k)) continue;
    Communicator& c = pg.group(k);
    const auto& members = pg.global_ranks(k);
    EXPECT_EQ(c.size(), static_cast<int>(members.size())) << kind_name(k);
    std::vector<std::int64_t> got(members.size());
    std::int64_t mine = world_rank;
    c.allgather(&mine, got.data(), 1, DataType::int64)->wait();
    std::vector<std::int64_t> want(members.begin(), members.end());
    std::sort(want.begin(), want.end());
    EXPECT_EQ(got, want) << kind_name(k) << " on rank " << world_rank;
    EXPECT_EQ(got[static_cast<size_t>(c.rank())], world_rank) << kind_name(k);
  }
}

class GlooProcessGroups : public ::testing::TestWithParam<CreationStrategy> {};

TEST_P(GlooProcessGroups, MoeTp2Pp2Ep2OnEightRankThreads) {
  ParallelConfig cfg;
  cfg.world_size = 8;
  cfg.tp = 2;
  cfg.pp = 2;
  cfg.ep = 2;
  run_ranks(8, [&](Communicator& w) {
    ProcessGroups pg;
    InitOptions opts;
    opts.strategy = GetParam();
    pg.initialize(w, cfg, opts);
    EXPECT_TRUE(pg.is_initialized());
    EXPECT_GE(pg.kinds().size(), 10u);
    check_every_kind(pg, w.rank());
    // Destroy and initialize again: the same group names meet under fresh keys.
    pg.destroy();
    pg.initialize(w, cfg, opts);
    check_every_kind(pg, w.rank());
  });
}

INSTANTIATE_TEST_SUITE_P(Strategies, GlooProcessGroups,
                         ::testing::Values(CreationStrategy::split, CreationStrategy::member,
                                           CreationStrategy::per_group),
                         [](const auto& info) {
                           std::string s(strategy_name(info.param));
                           std::replace(s.begin(), s.end(), '-', '_');
                           return s;
                         });

TEST(GlooProcessGroupsMore, CpHcpAndDistOptOnSixteenRankThreads) {
  ParallelConfig cfg;
  cfg.world_size = 16;
  cfg.tp = 2;
  cfg.cp = 4;
  cfg.hcp = {2, 2};
  cfg.dist_opt_instances = 2;
  run_ranks(16, [&](Communicator& w) {
    ProcessGroups pg;
    pg.initialize(w, cfg);
    check_every_kind(pg, w.rank());
  });
}

TEST(GlooProcessGroupsMore, ConfigMismatchFailsOnEveryRankWithoutHanging) {
  auto r = run_local_ranks_collect(4, [](Communicator& w) {
    ParallelConfig cfg;
    cfg.world_size = 4;
    cfg.tp = w.rank() == 3 ? 4 : 2;
    ProcessGroups pg;
    EXPECT_THROW(pg.initialize(w, cfg), ConfigMismatchError) << "rank " << w.rank();
  }, test_options());
  EXPECT_EQ(r.first_failed_rank, -1) << r.first_failure;
}

}  // namespace
}  // namespace commgrid::test
