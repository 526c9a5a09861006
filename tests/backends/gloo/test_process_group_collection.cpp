// The collections on Gloo rank-threads: HEAD's ProcessGroupCollection from a head state
// (and its optimizer and DDP helpers), multi-module collections and hyper-grid modules.
#include <gtest/gtest.h>

#include <algorithm>

#include "commgrid/hyper_grid.hpp"
#include "commgrid/hyper_grid_groups.hpp"
#include "commgrid/process_group_collection.hpp"
#include "commgrid/process_groups.hpp"
#include "gloo_test_util.hpp"

namespace commgrid::test {
namespace {

// HEAD's ProcessGroupCollection from a head state: groups where this rank has them, none
// elsewhere (never an error), the all-gather fields none as in use_mpu_process_groups.
TEST(GlooProcessGroupCollection, FromHeadStateOnEightRankThreads) {
  ParallelConfig cfg;
  cfg.world_size = 8;
  cfg.compat = Compat::head;
  cfg.tp = 2;
  cfg.pp = 2;
  cfg.cp = 2;
  cfg.all_gather_groups = true;
  run_ranks(8, [&](Communicator& w) {
    ProcessGroups pg;
    pg.initialize(w, cfg, InitOptions{});
    const ProcessGroupCollection all = ProcessGroupCollection::from_state(pg);
    EXPECT_EQ(all.of(GroupKind::tp)->size(), 2);
    EXPECT_EQ(all.of(GroupKind::cp)->size(), 2);
    EXPECT_EQ(all.of(GroupKind::gtp_remat)->size(), 1);           // singletons with gtp_remat = 1
    EXPECT_FALSE(all.of(GroupKind::inter_dist_opt).has_group());  // one instance
    EXPECT_FALSE(all.of(GroupKind::dp_cp_ag).has_group());
    EXPECT_TRUE(pg.has_group(GroupKind::dp_cp_ag));  // created, but HEAD's collection skips it
    // The field is the state's communicator: a collective over it reaches the tp peer.
    std::int64_t mine = w.rank(), sum = 0;
    all.of(GroupKind::tp)->allreduce(&mine, &sum, 1, DataType::int64, ReduceOp::sum)->wait();
    const auto peers = pg.layout().group_of(GroupKind::tp, w.rank())->members;
    EXPECT_EQ(sum, peers[0] + peers[1]);
    EXPECT_NE(all.describe().find("tp(2)"), std::string::npos) << all.describe();
    EXPECT_EQ(all.describe().find("inter_dist_opt"), std::string::npos) << all.describe();

    const ProcessGroupCollection some = ProcessGroupCollection::from_state(pg, {{"tp", "pp"}});
    EXPECT_TRUE(some.of(GroupKind::pp).has_group());
    EXPECT_FALSE(some.of(GroupKind::cp).has_group());  // not required: none, not an error
    EXPECT_THROW((void)ProcessGroupCollection::from_state(pg, {{"tp", "bogus"}}), UnknownKindError);

    EXPECT_FALSE(some.is_set("cp"));

    // HEAD's helpers: from the state, and from a collection.
    const OptimizerProcessGroups from_state = setup_process_groups_for_optimizer(pg, DdpSettings{});
    EXPECT_EQ(from_state.dp_cp, pg.group_handle(GroupKind::dp_cp));
    EXPECT_EQ(from_state.expt_tp_pp, pg.group_handle(GroupKind::tp_ep_pp));
    EXPECT_EQ(from_state.inter_dist_opt, nullptr);
    const OptimizerProcessGroups from_pgc =
        setup_process_groups_for_optimizer(all, DdpSettings{1, true}, cfg.cp);
    EXPECT_EQ(from_pgc.intra_dp_cp, all.handle(GroupKind::dp_cp));  // one instance: dp_cp
    EXPECT_EQ(from_pgc.intra_dist_opt, pg.group_handle(GroupKind::intra_dist_opt));
    EXPECT_THROW((void)setup_process_groups_for_optimizer(some, DdpSettings{}, cfg.cp),
                 ConfigError);
    const DdpProcessGroups ddp = setup_process_groups_for_ddp(all, cfg.cp, DdpSettings{}, nullptr);
    EXPECT_EQ(ddp.tp, pg.group_handle(GroupKind::tp));
    EXPECT_EQ(ddp.intra_expt_dp, ddp.expt_dp);
    const DdpProcessGroups ddp_state = setup_process_groups_for_ddp(pg, DdpSettings{});
    EXPECT_EQ(ddp_state.gtp_remat, pg.group_handle(GroupKind::gtp_remat));
    EXPECT_EQ(ddp_state.intra_dist_opt, nullptr);  // no distributed optimizer

    const MultiModuleProcessGroupCollection multi({{"encoder", some}, {"llm", all}}, "llm");
    EXPECT_EQ(multi.language_model_cp_size(), 2);
    EXPECT_EQ(multi.size(), 2u);
    EXPECT_THROW((void)multi.module("vision"), ConfigError);
    const MultiModuleProcessGroupCollection no_lm({{"encoder", some}});
    EXPECT_FALSE(no_lm.has_language_model());
    EXPECT_THROW((void)no_lm.language_model_cp_size(), ConfigError);
  });
}

// Two modules on disjoint rank spans of one 16-rank world (an encoder on 0-7 with tp 2,
// a language model on 8-15 with tp 2 pp 2): every rank creates every module's groups
// collectively, gets its own module's groups only, and they carry real traffic.
TEST(GlooHyperGrid, TwoModulesOnSixteenRankThreads) {
  run_ranks(16, [&](Communicator& w) {
    HyperGridGroups encoder(HyperGrid({2, 4}, {"tp", "dp"}, 16, 0));
    HyperGridGroups llm(HyperGrid({2, 2, 2}, {"tp", "dp", "pp"}, 16, 8));
    for (HyperGridGroups* m : {&encoder, &llm}) {
      const std::vector<std::vector<std::string>> all_dims = {{"tp"}, {"dp"}, {"tp", "dp"}};
      for (const auto& dims : all_dims) {
        Communicator* c = m->create_group(w, dims);
        const auto want = m->grid().group_of(dims, w.rank());
        ASSERT_EQ(c != nullptr, want.has_value());
        if (!c) continue;
        std::vector<std::int64_t> got(want->size());
        std::int64_t mine = w.rank();
        c->allgather(&mine, got.data(), 1, DataType::int64)->wait();
        std::vector<std::int64_t> sorted(want->begin(), want->end());
        std::sort(sorted.begin(), sorted.end());
        EXPECT_EQ(got, sorted);
      }
    }
    (void)llm.create_group(w, {"pp"});
    EXPECT_EQ(llm.group({"pp"}) != nullptr, w.rank() >= 8);
    EXPECT_THROW((void)llm.create_group(w, {"dp", "tp"}), ConfigError);  // created once
    EXPECT_THROW((void)encoder.group({"pp"}), ConfigError);
  });
}

TEST(ProcessGroupCollectionPure, NoneByDefaultAndBadModules) {
  const ProcessGroupCollection c;
  EXPECT_EQ(c.describe(), "ProcessGroupCollection(empty)");
  EXPECT_FALSE(c.is_set("tp"));
  EXPECT_EQ(c.handle(GroupKind::tp), nullptr);
  EXPECT_THROW((void)*c.of(GroupKind::tp), NoGroupError);
  for (GroupKind k : ProcessGroupCollection::kFields) EXPECT_FALSE(c.of(k).has_group());
  EXPECT_THROW((void)c.of(GroupKind::hybrid_dp_cp), UnknownKindError);
  EXPECT_THROW(ProcessGroupCollection({{"tp", NoGroup{}}, {"bogus", NoGroup{}}}), UnknownKindError);
  EXPECT_THROW(MultiModuleProcessGroupCollection({}), ConfigError);
  EXPECT_THROW(MultiModuleProcessGroupCollection({{"a", c}, {"a", c}}), ConfigError);
  EXPECT_THROW(MultiModuleProcessGroupCollection({{"a", c}}, "llm"), ConfigError);
}

}  // namespace
}  // namespace commgrid::test
