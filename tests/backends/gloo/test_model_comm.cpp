// What model code needs from a communicator, on Gloo rank-threads: nonblocking and batched
// point to point, alltoallv, allgatherv, rooted collectives, avg, every element type,
// typed buffers and the member/global rank mapping (tests/backends/comm_suite.hpp, the
// same checks the MPI tests run on processes).
#include <gtest/gtest.h>

#include "../comm_suite.hpp"
#include "gloo_test_util.hpp"

namespace commgrid::test {
namespace {

using namespace std::chrono_literals;

class GlooModelComm : public ::testing::TestWithParam<int> {};

TEST_P(GlooModelComm, PointToPointVariableRootedTypedAndMembers) {
  const int n = GetParam();
  run_ranks(n, [](Communicator& world) {
    suite::world_members(world);
    suite::symmetric_and_ring(world);
    suite::alltoallv_random(world, 11);
    suite::allgatherv_random(world, 12);
    suite::typed_size_errors(world);
    suite::argument_errors(world);
    suite::every_type(world);
  });
}

INSTANTIATE_TEST_SUITE_P(Sizes, GlooModelComm, ::testing::Values(1, 2, 3, 4, 8, 16));

TEST(GlooModelCommMore, TwoHundredRandomBatchesOnEightRanks) {
  run_ranks(8, [](Communicator& world) { suite::random_batches(world, 200, 2024); });
}

TEST(GlooModelCommMore, RandomBatchesOnSubgroups) {
  // The same exchanges on the groups of a layout (tp and pp of tp 2 x pp 2 x dp 2).
  ParallelConfig c;
  c.world_size = 8;
  c.tp = 2;
  c.pp = 2;
  run_ranks(8, [&](Communicator& world) {
    ProcessGroups pg;
    InitOptions options;
    options.kinds = {GroupKind::tp, GroupKind::pp, GroupKind::dp};
    pg.initialize(world, c, options);
    suite::random_batches(pg.group(GroupKind::pp), 20, 7);
    suite::symmetric_and_ring(pg.group(GroupKind::dp));
    suite::alltoallv_random(pg.group(GroupKind::tp), 5);
  });
}

TEST(GlooModelCommMore, AReceiveNobodySendsTimesOutNamingThePeer) {
  run_ranks(2, [](Communicator& world) { suite::receive_times_out(world, 500ms); });
}

TEST(GlooModelCommMore, BlockingSendToItselfIsRefused) {
  run_ranks(2, [](Communicator& world) {
    double x = 1;
    EXPECT_THROW((void)world.send(&x, 1, DataType::float64, world.rank(), 0), ConfigError);
    // A self-message posted without its receive cannot complete: wait says so at once.
    auto w = world.isend(&x, 1, DataType::float64, world.rank(), 4);
    EXPECT_THROW(w->wait(), BackendError);
  });
}

TEST(GlooModelCommMore, MembersOfEveryKindMatchTheLayout) {
  std::vector<ParallelConfig> configs(3);
  configs[0].world_size = 8, configs[0].tp = 2, configs[0].pp = 2, configs[0].ep = 2;
  configs[1].world_size = 8, configs[1].cp = 2, configs[1].pp = 2,
  configs[1].dist_opt_instances = 2;
  configs[2].world_size = 8, configs[2].tp = 2, configs[2].pp = 4, configs[2].order = "tp-pp-dp";
  for (const ParallelConfig& c : configs)
    run_ranks(8, [&](Communicator& world) { suite::members_match_layout(world, c); });
}

TEST(GlooModelCommMore, CollectionsFromStateTakeKinds) {
  ParallelConfig c;
  c.world_size = 4;
  c.tp = 2;
  run_ranks(4, [&](Communicator& world) {
    ProcessGroups pg;
    pg.initialize(world, c);
    const auto m = ModelCommProcessGroups::from_state(pg, {GroupKind::tp, GroupKind::pp});
    EXPECT_TRUE(m.is_set("tp"));
    EXPECT_TRUE(m.is_set("pp"));
    EXPECT_FALSE(m.is_set("cp"));
    EXPECT_EQ(m.tp()->members(),
              (std::vector<std::int64_t>{world.rank() / 2 * 2, world.rank() / 2 * 2 + 1}));
    const auto g = GradCommProcessGroups::from_state(pg, {GroupKind::dp});
    EXPECT_EQ(g.dp()->members(),
              (std::vector<std::int64_t>{world.rank() % 2, world.rank() % 2 + 2}));
    EXPECT_THROW((void)ModelCommProcessGroups::from_state(pg, {GroupKind::dp}), UnknownKindError);
  });
}

}  // namespace
}  // namespace commgrid::test
