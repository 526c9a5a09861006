// `commgrid verify --backend nccl` and `commgrid bench init|collectives --backend nccl` end to
// end: on a machine without a GPU they fail on every rank alike (exit 1, "no CUDA device"),
// never hang; with GPUs they verify and measure. Bad input is exit 2 either way.
#include <gtest/gtest.h>

#include <string>

#include "cli_runner.hpp"
#include "commgrid/nccl.hpp"

#ifdef COMMGRID_CLI
namespace commgrid {
namespace {

using test::run_cli;

TEST(NcclCli, VerifyOnRankThreads) {
  const int ranks = cuda_device_count() >= 2 ? 2 : 1;
  const auto r = run_cli(COMMGRID_CLI,
                         {"verify", "--backend", "nccl", "--local", std::to_string(ranks), "--tp",
                          std::to_string(ranks), "--timeout", "60"},
                         120);
  if (cuda_device_count() == 0) {
    EXPECT_EQ(r.code, 1) << r.err;
    EXPECT_NE(r.err.find("error: rank 0: nccl world: rank 0 (host "), std::string::npos) << r.err;
    EXPECT_NE(r.err.find("): no CUDA device"), std::string::npos) << r.err;
    EXPECT_EQ(r.out, "");
  } else {
    EXPECT_EQ(r.code, 0) << r.err;
    EXPECT_NE(r.out.find("on " + std::to_string(ranks) + (ranks == 1 ? " rank" : " ranks")),
              std::string::npos)
        << r.out;
  }
}

TEST(NcclCli, BenchInitOnRankThreads) {
  const auto r = run_cli(
      COMMGRID_CLI,
      {"bench", "init", "--backend", "nccl", "--local", "1", "--repeats", "1", "--timeout", "60"},
      120);
  if (cuda_device_count() == 0) {
    EXPECT_EQ(r.code, 1) << r.err;
    EXPECT_NE(r.err.find("no CUDA device"), std::string::npos) << r.err;
  } else {
    EXPECT_EQ(r.code, 0) << r.err;
    EXPECT_NE(r.out.find("init benchmark: nccl, 1 ranks"), std::string::npos) << r.out;
  }
}

TEST(NcclCli, BadInputIsExitTwoBeforeAnyDeviceIsTouched) {
  auto r = run_cli(COMMGRID_CLI, {"verify", "--backend", "nccl", "--local", "0"});
  EXPECT_EQ(r.code, 2) << r.err;
  EXPECT_NE(r.err.find("error: local"), std::string::npos) << r.err;
  r = run_cli(COMMGRID_CLI, {"verify", "--backend", "nccl", "--local", "2", "--tp", "3"});
  EXPECT_EQ(r.code, 2) << r.err;
  EXPECT_NE(r.err.find("error: world_size 2 is not divisible"), std::string::npos) << r.err;
  r = run_cli(COMMGRID_CLI,
              {"bench", "collectives", "--backend", "nccl", "--local", "2", "--sizes", "3B"});
  EXPECT_EQ(r.code, 2) << r.err;
  EXPECT_NE(r.err.find("error: sizes"), std::string::npos) << r.err;
}

TEST(NcclCli, BenchCollectivesAgainstRawNccl) {
  const int ranks = cuda_device_count() >= 2 ? 2 : 1;  // one rank: no pairs for point to point
  const auto r =
      run_cli(COMMGRID_CLI,
              {"bench", "collectives", "--backend", "nccl", "--local", std::to_string(ranks),
               "--sizes", "4KiB", "--iterations", "5", "--timeout", "60"},
              120);
  if (cuda_device_count() == 0) {
    EXPECT_EQ(r.code, 1) << r.err;
    EXPECT_NE(r.err.find("no CUDA device"), std::string::npos) << r.err;
  } else {
    EXPECT_EQ(r.code, 0) << r.err;
    EXPECT_NE(r.out.find("ncclAllReduce"), std::string::npos) << r.out;
  }
}

}  // namespace
}  // namespace commgrid
#endif
