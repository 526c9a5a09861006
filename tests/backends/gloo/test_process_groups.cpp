// ProcessGroups (parallel_state) on Gloo rank-threads, in both editions (the seed, and
// --compat head with HEAD's own kinds: gtp_remat, hybrid_dp_cp levels, all-gather groups,
// rank offsets): every kind and level created with every strategy and proven on the wire
// against the layout.
#include <gtest/gtest.h>

#include <algorithm>
#include <tuple>

#include "commgrid/process_groups.hpp"
#include "gloo_test_util.hpp"

namespace commgrid::test {
namespace {

// Every kind and level of the layout: this rank has a group exactly where the layout puts
// it in one; the communicator's size and rank match the members; an allgather of world
// ranks over it returns exactly the layout's members (sorted: communicator order). Returns
// the number of (kind, level) pairs this rank checked on the wire.
int check_every_level(const ProcessGroups& pg, int world_rank) {
  int checked = 0;
  for (GroupKind k : pg.kinds()) {
    for (int l = 0; l < pg.layout().levels(k); ++l) {
      const auto ref = pg.layout().group_of(k, world_rank, l);
      EXPECT_EQ(pg.has_group(k, l), ref.has_value()) << kind_name(k) << " level " << l;
      if (!ref || !pg.has_group(k, l)) continue;
      Communicator& c = pg.group(k, l);
      const auto& members = pg.global_ranks(k, l);  // the getter agrees with the layout
      EXPECT_EQ(std::vector<Rank>(members.begin(), members.end()),
                std::vector<Rank>(ref->members.begin(), ref->members.end()))
          << pg.layout().level_name(k, l);
      EXPECT_EQ(c.size(), static_cast<int>(members.size())) << pg.layout().level_name(k, l);
      std::vector<std::int64_t> got(ref->members.size());
      std::int64_t mine = world_rank;
      c.allgather(&mine, got.data(), 1, DataType::int64)->wait();
      std::vector<std::int64_t> want(ref->members.begin(), ref->members.end());
      std::sort(want.begin(), want.end());
      EXPECT_EQ(got, want) << pg.layout().level_name(k, l) << " on rank " << world_rank;
      EXPECT_EQ(got[static_cast<size_t>(c.rank())], world_rank) << pg.layout().level_name(k, l);
      ++checked;
    }
  }
  return checked;
}

std::string strategy_label(CreationStrategy s) {
  std::string label(strategy_name(s));
  std::replace(label.begin(), label.end(), '-', '_');
  return label;
}

// ---- both editions -------------------------------------------------------------------

class GlooProcessGroups : public ::testing::TestWithParam<std::tuple<Compat, CreationStrategy>> {
 protected:
  [[nodiscard]] ParallelConfig config() const {
    ParallelConfig cfg;
    cfg.compat = std::get<0>(GetParam());
    return cfg;
  }
  [[nodiscard]] InitOptions options() const {
    InitOptions opts;
    opts.strategy = std::get<1>(GetParam());
    return opts;
  }
};

TEST_P(GlooProcessGroups, MoeTp2Pp2Ep2OnEightRankThreads) {
  ParallelConfig cfg = config();
  cfg.world_size = 8;
  cfg.tp = 2;
  cfg.pp = 2;
  cfg.ep = 2;
  run_ranks(8, [&](Communicator& w) {
    ProcessGroups pg;
    pg.initialize(w, cfg, options());
    EXPECT_TRUE(pg.is_initialized());
    EXPECT_GE(pg.kinds().size(), 10u);
    EXPECT_GE(check_every_level(pg, w.rank()), 10);
    // Destroy and initialize again: the same group names meet under fresh keys.
    pg.destroy();
    pg.initialize(w, cfg, options());
    check_every_level(pg, w.rank());
  });
}

TEST_P(GlooProcessGroups, CpHcpAndDistOptOnSixteenRankThreads) {
  ParallelConfig cfg = config();
  cfg.world_size = 16;
  cfg.tp = 2;
  cfg.cp = 4;
  cfg.hcp = {2, 2};
  cfg.dist_opt_instances = 2;
  run_ranks(16, [&](Communicator& w) {
    ProcessGroups pg;
    pg.initialize(w, cfg, options());
    EXPECT_TRUE(pg.has_group(GroupKind::hcp, 1));
    check_every_level(pg, w.rank());
  });
}

TEST_P(GlooProcessGroups, ConfigMismatchFailsOnEveryRankWithoutHanging) {
  const ParallelConfig base = config();
  auto r = run_local_ranks_collect(
      4,
      [&](Communicator& w) {
        ParallelConfig cfg = base;
        cfg.world_size = 4;
        cfg.tp = w.rank() == 3 ? 4 : 2;
        ProcessGroups pg;
        EXPECT_THROW(pg.initialize(w, cfg, options()), ConfigMismatchError) << "rank " << w.rank();
      },
      test_options());
  EXPECT_EQ(r.first_failed_rank, -1) << r.first_failure;
}

INSTANTIATE_TEST_SUITE_P(Editions, GlooProcessGroups,
                         ::testing::Combine(::testing::Values(Compat::seed, Compat::head),
                                            ::testing::Values(CreationStrategy::split,
                                                              CreationStrategy::member,
                                                              CreationStrategy::per_group)),
                         [](const auto& info) {
                           return std::string(compat_name(std::get<0>(info.param))) + "_" +
                                  strategy_label(std::get<1>(info.param));
                         });

// ---- HEAD's own kinds ----------------------------------------------------------------

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
                         [](const auto& info) { return strategy_label(info.param); });

}  // namespace
}  // namespace commgrid::test
