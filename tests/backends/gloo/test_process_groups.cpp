// ProcessGroups (parallel_state) on Gloo rank-threads, in both editions (the seed, and
// --compat head with HEAD's own kinds: gtp_remat, hybrid_dp_cp levels, all-gather groups,
// rank offsets): every kind and level created with every strategy and proven on the wire
// against the layout.
#include <gtest/gtest.h>

#include <algorithm>
#include <atomic>
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

// ---- share_identical_groups ------------------------------------------------------------

// The backend creation calls a rank made for every kind.
int creation_calls(const ProcessGroups& pg) {
  std::int64_t n = 0;
  for (const KindCreation& k : pg.creation_stats()) n += k.creation_calls;
  return static_cast<int>(n);
}

// tp 2 x dp 4 (pp 1, cp 1) on 8 rank threads: dp and dp_cp have the same members, so do tp,
// mp and tp_cp, and tp_dp, tp_dp_cp and intra_dist_opt span the world. With sharing each
// such set is one communicator (the first kind's in reference order), every kind still
// proves its members on the wire, and the kinds that reuse one make no creation call.
TEST(GlooShareIdenticalGroups, KindsWithTheSameMembersShareOneCommunicator) {
  ParallelConfig cfg;
  cfg.world_size = 8;
  cfg.tp = 2;
  std::atomic<int> made_without{0}, made_with{0};
  run_ranks(8, [&](Communicator& w) {
    ProcessGroups plain;
    plain.initialize(w, cfg);
    ProcessGroups shared;
    InitOptions o;
    o.share_identical_groups = true;
    shared.initialize(w, cfg, o);
    EXPECT_EQ(check_every_level(shared, w.rank()), check_every_level(plain, w.rank()));
    EXPECT_EQ(&shared.group(GroupKind::dp), &shared.group(GroupKind::dp_cp));
    EXPECT_EQ(&shared.group(GroupKind::tp), &shared.group(GroupKind::mp));
    EXPECT_EQ(&shared.group(GroupKind::tp_dp), &shared.group(GroupKind::tp_dp_cp));
    EXPECT_NE(&shared.group(GroupKind::dp), &shared.group(GroupKind::tp));
    EXPECT_NE(&plain.group(GroupKind::dp), &plain.group(GroupKind::dp_cp));
    if (w.rank() == 0) {
      made_without = creation_calls(plain);
      made_with = creation_calls(shared);
    }
  });
  EXPECT_LT(made_with.load(), made_without.load());
  EXPECT_GT(made_with.load(), 0);
}

// The same layout given the world with shared ownership: tp_dp, tp_dp_cp and
// intra_dist_opt (the whole world) reuse the world itself, one creation call fewer; every
// kind still proves its members, and the world works on after the groups are gone. With a
// groups' timeout other than the world's, the world is not reused.
TEST(GlooShareIdenticalGroups, AKindSpanningTheWorldReusesTheWorldGivenShared) {
  ParallelConfig cfg;
  cfg.world_size = 8;
  cfg.tp = 2;
  std::atomic<int> calls_shared{0}, calls_world{0};
  run_ranks(8, [&](Communicator& w) {
    const std::shared_ptr<Communicator> world(std::shared_ptr<void>(), &w);  // w outlives all
    InitOptions o;
    o.share_identical_groups = true;
    {
      ProcessGroups shared;
      shared.initialize(w, cfg, o);
      ProcessGroups reusing;
      reusing.initialize(world, cfg, o);
      EXPECT_EQ(check_every_level(reusing, w.rank()), check_every_level(shared, w.rank()));
      EXPECT_EQ(&reusing.group(GroupKind::tp_dp), &w);
      EXPECT_EQ(&reusing.group(GroupKind::tp_dp_cp), &w);
      EXPECT_NE(&shared.group(GroupKind::tp_dp), &w);
      EXPECT_NE(&reusing.group(GroupKind::dp), &w);
      if (w.rank() == 0) {
        calls_shared = creation_calls(shared);
        calls_world = creation_calls(reusing);
      }
      InitOptions other = o;
      other.timeout = w.timeout() + std::chrono::seconds(1);
      ProcessGroups own_timeout;
      own_timeout.initialize(world, cfg, other);
      EXPECT_NE(&own_timeout.group(GroupKind::tp_dp), &w);
    }
    std::int64_t one = 1, sum = 0;
    w.allreduce(&one, &sum, 1, DataType::int64, ReduceOp::sum)->wait();
    EXPECT_EQ(sum, 8);
  });
  EXPECT_EQ(calls_world.load(), calls_shared.load() - 1);
}

// Ranks that call different overloads would create different sets of groups: the
// fingerprint names the difference before any group is made.
TEST(GlooShareIdenticalGroups, RanksGivenTheWorldDifferentlyAreToldBeforeAnyGroup) {
  ParallelConfig cfg;
  cfg.world_size = 2;
  run_ranks(2, [&](Communicator& w) {
    InitOptions o;
    o.share_identical_groups = true;
    ProcessGroups pg;
    try {
      if (w.rank() == 0)
        pg.initialize(std::shared_ptr<Communicator>(std::shared_ptr<void>(), &w), cfg, o);
      else pg.initialize(w, cfg, o);
      ADD_FAILURE() << "ranks given the world differently were not told";
    } catch (const ConfigMismatchError& e) {
      EXPECT_NE(std::string(e.what()).find("world ownership (initialize overload) = shared on "
                                           "rank 0; world ownership (initialize overload) = "
                                           "borrowed on rank 1"),
                std::string::npos)
          << e.what();
    }
    EXPECT_FALSE(pg.is_initialized());
    EXPECT_THROW(pg.initialize(std::shared_ptr<Communicator>(), cfg, o), InvalidValueError);
  });
}

TEST(GlooShareIdenticalGroups, AnotherStrategyIsRefusedNamingTheOption) {
  ParallelConfig cfg;
  cfg.world_size = 2;
  run_ranks(2, [&](Communicator& w) {
    ProcessGroups pg;
    InitOptions o;
    o.share_identical_groups = true;
    o.strategy = CreationStrategy::split;
    try {
      pg.initialize(w, cfg, o);
      ADD_FAILURE() << "initialize accepted share_identical_groups with the split strategy";
    } catch (const InvalidValueError& e) {
      EXPECT_EQ(e.parameter(), "share_identical_groups");
      EXPECT_NE(std::string(e.what()).find("needs the member strategy (strategy is split)"),
                std::string::npos)
          << e.what();
    }
    EXPECT_FALSE(pg.is_initialized());
  });
}

}  // namespace
}  // namespace commgrid::test
