// What model code needs from a communicator, on MPI processes (np 1, 2, 4, 8): the same
// checks as the Gloo rank-threads (tests/backends/comm_suite.hpp).
#include <gtest/gtest.h>

#include "../comm_suite.hpp"
#include "commgrid/mpi.hpp"

namespace commgrid::test {
namespace {

using namespace std::chrono_literals;

TEST(MpiModelComm, PointToPointVariableRootedTypedAndMembers) {
  auto world = make_mpi_world({.timeout = 60s});
  EXPECT_NO_THROW({
    suite::world_members(*world);
    suite::symmetric_and_ring(*world);
    suite::alltoallv_random(*world, 11);
    suite::allgatherv_random(*world, 12);
    suite::typed_size_errors(*world);
    suite::argument_errors(*world);
    suite::every_type(*world);
  });
}

TEST(MpiModelComm, BlockingCollectivesPassTheSameSuiteAndGroupsInheritTheChoice) {
  auto world = make_mpi_world({.timeout = 60s, .collective_calls = MpiCollectiveCalls::blocking});
  EXPECT_EQ(world->collective_calls(), MpiCollectiveCalls::blocking);
  EXPECT_NO_THROW({
    suite::world_members(*world);
    suite::symmetric_and_ring(*world);
    suite::alltoallv_random(*world, 21);
    suite::allgatherv_random(*world, 22);
    suite::typed_size_errors(*world);
    suite::argument_errors(*world);
    suite::every_type(*world);
  });
  auto half = world->split(world->rank() % 2, world->rank(), "half#0");
  ASSERT_NE(half, nullptr);
  EXPECT_EQ(dynamic_cast<MpiCommunicator&>(*half).collective_calls(), MpiCollectiveCalls::blocking);
  ParallelConfig c;
  c.world_size = world->size();
  c.pp = world->size() >= 2 ? 2 : 1;
  EXPECT_NO_THROW(suite::members_match_layout(*world, c));
  world->set_collective_calls(MpiCollectiveCalls::nonblocking);
  EXPECT_EQ(world->collective_calls(), MpiCollectiveCalls::nonblocking);
  world->barrier()->wait();
}

TEST(MpiModelComm, TwoHundredRandomBatches) {
  auto world = make_mpi_world({.timeout = 60s});
  EXPECT_NO_THROW(suite::random_batches(*world, 200, 2024));
}

TEST(MpiModelComm, AReceiveNobodySendsTimesOutNamingThePeer) {
  auto world = make_mpi_world({.timeout = 60s});
  EXPECT_NO_THROW(suite::receive_times_out(*world, 500ms));
  // The receive was cancelled, so the communicator is still usable.
  world->barrier()->wait();
}

TEST(MpiModelComm, MembersOfEveryKindMatchTheLayout) {
  auto world = make_mpi_world({.timeout = 60s});
  const int n = world->size();
  std::vector<ParallelConfig> configs(2);
  configs[0].world_size = n;
  configs[0].pp = n >= 2 ? 2 : 1;
  configs[0].tp = n >= 4 ? 2 : 1;
  configs[0].ep = n >= 8 ? 2 : 1;
  configs[1].world_size = n;
  configs[1].cp = n >= 2 ? 2 : 1;
  configs[1].dist_opt_instances = n >= 4 ? 2 : 1;
  configs[1].order = "tp-cp-ep-pp-dp";
  for (const ParallelConfig& c : configs) EXPECT_NO_THROW(suite::members_match_layout(*world, c));
}

}  // namespace
}  // namespace commgrid::test
