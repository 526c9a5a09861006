// ProcessGroups under compat head on Gloo rank-threads: HEAD's new kinds (gtp_remat,
// hybrid_dp_cp levels, all-gather groups, rank offsets) created with every strategy and
// proven on the wire against the layout.
#include <gtest/gtest.h>

#include <algorithm>

#include "commgrid/process_groups.hpp"
#include "gloo_test_util.hpp"

namespace commgrid::test {
namespace {

// Every created kind and level: an allgather of world ranks over the communicator returns
// the layout's members (sorted); a rank the layout leaves out has no group. Returns the
// number of (kind, level) pairs this rank checked on the wire.
int check_every_level(const ProcessGroups& pg, int world_rank) {
  int checked = 0;
  for (GroupKind k : pg.kinds()) {
    for (int l = 0; l < pg.layout().levels(k); ++l) {
      const auto ref = pg.layout().group_of(k, world_rank, l);
      EXPECT_EQ(pg.has_group(k, l), ref.has_value()) << kind_name(k) << " level " << l;
      if (!ref || !pg.has_group(k, l)) continue;
      Communicator& c = pg.group(k, l);
      std::vector<std::int64_t> got(ref->members.size());
      std::int64_t mine = world_rank;
      c.allgather(&mine, got.data(), 1, DataType::int64)->wait();
      std::vector<std::int64_t> want(ref->members.begin(), ref->members.end());
      std::sort(want.begin(), want.end());
      EXPECT_EQ(got, want) << pg.layout().level_name(k, l) << " on rank " << world_rank;
      ++checked;
    }
  }
  return checked;
}

class GlooHeadProcessGroups : public ::testing::TestWithParam<CreationStrategy> {};

TEST_P(GlooHeadProcessGroups, GtpAndHybridOnSixteenRankThreads) {
  ParallelConfig cfg;
  cfg.world_size = 16;
  cfg.compat = Compat::head;
  cfg.tp = 2;
  cfg.gtp_remat = 2;
  cfg.ep = 2;
  cfg.etp = 1;
  cfg.expert_gtp_remat = 2;
  cfg.hybrid_context_parallel = true;  // dp_cp groups of 4: hybrid_dp_cp_2
  run_ranks(16, [&](Communicator& w) {
    ProcessGroups pg;
    InitOptions opts;
    opts.strategy = GetParam();
    pg.initialize(w, cfg, opts);
    for (GroupKind k : {GroupKind::gtp_remat, GroupKind::expt_gtp_remat, GroupKind::dp_gtp_remat,
                        GroupKind::dp_cp_gtp_remat, GroupKind::expt_dp_gtp_remat,
                        GroupKind::tp_ep_pp_with_egtp_remat, GroupKind::hybrid_dp_cp})
      EXPECT_TRUE(pg.has_group(k)) << kind_name(k);
    // pp = 1, so every rank is in every group: the 19 seed kinds (no hcp, one dist-opt
    // instance), the 6 gtp kinds and the one hybrid level (n = 2).
    EXPECT_EQ(check_every_level(pg, w.rank()), 26);
  });
}

TEST_P(GlooHeadProcessGroups, RankOffsetAndAllGatherGroups) {
  ParallelConfig cfg;
  cfg.world_size = 8;
  cfg.compat = Compat::head;
  cfg.tp = 2;
  cfg.ep = 2;
  cfg.etp = 1;
  cfg.rank_offset = 4;
  cfg.local_world_size = 4;
  cfg.all_gather_groups = true;  // built from rank 0 whatever the offset (HEAD's behaviour)
  run_ranks(8, [&](Communicator& w) {
    ProcessGroups pg;
    InitOptions opts;
    opts.strategy = GetParam();
    pg.initialize(w, cfg, opts);
    EXPECT_EQ(pg.has_group(GroupKind::tp), w.rank() >= 4);
    EXPECT_EQ(pg.has_group(GroupKind::dp_cp_ag), w.rank() < 4);
    check_every_level(pg, w.rank());
  });
}

INSTANTIATE_TEST_SUITE_P(Strategies, GlooHeadProcessGroups,
                         ::testing::Values(CreationStrategy::split, CreationStrategy::member,
                                           CreationStrategy::per_group),
                         [](const auto& info) {
                           std::string s(strategy_name(info.param));
                           std::replace(s.begin(), s.end(), '-', '_');
                           return s;
                         });

}  // namespace
}  // namespace commgrid::test
