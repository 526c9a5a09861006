// The one world runner of `commgrid verify`, `commgrid bench` and train_gpt, end to end:
// the launcher each reads (none, --local N, torchrun's variables, commgrid launch's), the
// no-launcher error, and one mapping of errors to exit codes (2 bad input, 1 a failure).
#include <gtest/gtest.h>

#include <algorithm>
#include <filesystem>

#include "cli_runner.hpp"

namespace commgrid::test {
namespace {

// Every launcher variable the runner reads, unset: the command runs as if started by hand.
const std::string kNoLauncher =
    "env -u COMMGRID_RANK -u COMMGRID_WORLD_SIZE -u COMMGRID_STORE -u RANK -u WORLD_SIZE "
    "-u MASTER_ADDR -u MASTER_PORT -u SLURM_PROCID -u SLURM_NTASKS -u OMPI_COMM_WORLD_RANK "
    "-u OMPI_COMM_WORLD_SIZE -u PMI_RANK -u PMI_SIZE ";

CliResult run_with(const std::string& env, const std::string& exe,
                   const std::vector<std::string>& args, int time_limit_s = 120) {
  std::string cmd =
      kNoLauncher + env + " timeout " + std::to_string(time_limit_s) + " " + shell_quote(exe);
  for (const auto& a : args) cmd += " " + shell_quote(a);
  return run_shell(cmd);
}

std::string train_gpt() { return TRAIN_GPT_EXE; }

void expect_one_error_line(const CliResult& r, int code, const std::string& text) {
  EXPECT_EQ(r.code, code) << r.err;
  EXPECT_EQ(r.err.rfind("error: ", 0), 0u) << r.err;
  EXPECT_EQ(std::count(r.err.begin(), r.err.end(), '\n'), 1) << r.err;
  EXPECT_NE(r.err.find(text), std::string::npos) << r.err;
}

bool no_gloo(const CliResult& r) { return r.err.find("no Gloo backend") != std::string::npos; }

const std::string kNoLauncherText =
    "error: no launcher found (world size 1 from no launcher variables): use --local N, mpirun "
    "or commgrid launch";

// Issue 25: a layout that needs more ranks than a process started by hand has is a missing
// launcher, said as such by every program that runs on a world.
TEST(WorldRunnerCli, NoLauncherSaysHowToStartRanks) {
  const CliResult verify = run_with("", COMMGRID_EXE, {"verify", "--tp", "2"});
  expect_one_error_line(verify, 2, kNoLauncherText);
  EXPECT_NE(verify.err.find("world_size 1 is not divisible by tp*pp*cp = 2*1*1 = 2"),
            std::string::npos)
      << verify.err;  // and why
  EXPECT_EQ(verify.out, "");
  const CliResult bench = run_with("", COMMGRID_EXE, {"bench", "init", "--pp", "2"});
  expect_one_error_line(bench, 2, kNoLauncherText);
  const CliResult head = run_with("", COMMGRID_EXE, {"verify", "--tp", "2", "--compat", "head"});
  expect_one_error_line(head, 2, kNoLauncherText);
  if (train_gpt().empty()) GTEST_SKIP() << "train_gpt is not built (needs Eigen3)";
  const CliResult train = run_with("", train_gpt(), {"--tp", "2", "--steps", "1"});
  expect_one_error_line(train, 2, kNoLauncherText);
}

// Bad input that is not about the world size keeps its own message; a launched world that
// cannot hold the layout is not a missing launcher.
TEST(WorldRunnerCli, OtherBadInputKeepsItsMessage) {
  expect_one_error_line(run_with("", COMMGRID_EXE, {"verify", "--tp", "0"}), 2,
                        "tp must be >= 1, got 0");
  const CliResult threads = run_with("", COMMGRID_EXE, {"verify", "--local", "2", "--tp", "4"});
  if (no_gloo(threads)) GTEST_SKIP() << "this build has no Gloo backend";
  expect_one_error_line(threads, 2, "world_size 2 is not divisible by tp*pp*cp = 4*1*1 = 4");
  EXPECT_EQ(threads.err.find("no launcher"), std::string::npos) << threads.err;
}

// Flags the runner checks, the same in every program.
TEST(WorldRunnerCli, BackendAndLocalFlags) {
  expect_one_error_line(run_with("", COMMGRID_EXE, {"verify", "--backend", "tcp"}), 2,
                        "backend: expected mpi, gloo or nccl, got 'tcp'");
  expect_one_error_line(
      run_with("", COMMGRID_EXE, {"bench", "init", "--backend", "mpi", "--local", "2"}), 2,
      "local: --local runs ranks as threads");
  expect_one_error_line(run_with("", COMMGRID_EXE, {"verify", "--local", "x"}), 2,
                        "local: expected an integer");
  // commgrid launch's ranks are not one MPI job: --backend mpi there would be N singletons.
  expect_one_error_line(run_with("COMMGRID_RANK=0 COMMGRID_WORLD_SIZE=2", COMMGRID_EXE,
                                 {"verify", "--backend", "mpi"}),
                        2, "--backend mpi needs an MPI launcher");
  // torchrun's variables without a store: the runner names what is missing.
  const CliResult torchrun = run_with("RANK=0 WORLD_SIZE=2", COMMGRID_EXE, {"verify"});
  if (no_gloo(torchrun)) GTEST_SKIP() << "this build has no Gloo backend";
  expect_one_error_line(torchrun, 2, "no rendezvous store: torchrun started this process");
  expect_one_error_line(run_with("RANK=0 WORLD_SIZE=x", COMMGRID_EXE, {"verify"}), 2,
                        "WORLD_SIZE='x' is not a whole decimal number");
  if (train_gpt().empty()) GTEST_SKIP() << "train_gpt is not built (needs Eigen3)";
  expect_one_error_line(run_with("", train_gpt(), {"--backend", "nccl"}), 2,
                        "backend: expected gloo or mpi, got 'nccl'");
}

// Exit codes on rank-threads: 0 verified, 1 a check failed (one rank lies about itself).
TEST(WorldRunnerCli, RankThreadsExitCodes) {
  const CliResult ok =
      run_with("", COMMGRID_EXE, {"verify", "--local", "4", "--tp", "2", "--kinds", "tp,dp"});
  if (no_gloo(ok)) GTEST_SKIP() << "this build has no Gloo backend";
  EXPECT_EQ(ok.code, 0) << ok.err;
  EXPECT_NE(ok.out.find("on 4 ranks"), std::string::npos) << ok.out;
  const CliResult bad =
      run_with("", COMMGRID_EXE,
               {"verify", "--local", "4", "--tp", "2", "--kinds", "tp", "--fault-rank", "1"});
  EXPECT_EQ(bad.code, 1) << bad.err;
  EXPECT_NE(bad.err.find("error: verify failed: tp"), std::string::npos) << bad.err;
}

// Two processes started with torchrun's variables (RANK, WORLD_SIZE) and a store: verify
// and train_gpt both take the world from them (train_gpt used to read COMMGRID_* only).
TEST(WorldRunnerCli, TorchrunVariablesStartTheWorld) {
  const auto dir =
      std::filesystem::temp_directory_path() / ("commgrid-runner-" + std::to_string(::getpid()));
  std::filesystem::remove_all(dir);
  std::filesystem::create_directories(dir);
  auto two_ranks = [&](const std::string& exe, const std::string& args, const std::string& job) {
    std::string cmd;
    for (int r = 0; r < 2; ++r)
      cmd += kNoLauncher + "RANK=" + std::to_string(r) + " WORLD_SIZE=2 COMMGRID_JOB_ID=" + job +
             " COMMGRID_STORE=" + shell_quote("file://" + (dir / job).string()) + " timeout 120 " +
             shell_quote(exe) + " " + args +
             (r == 0 ? " > " + shell_quote((dir / "out0").string()) + " &" : "") + "\n";
    // Rank 0 in the background, rank 1 in the foreground; the worse of the two codes.
    cmd += "r1=$?; wait $!; r0=$?; [ $r0 -gt $r1 ] && exit $r0; exit $r1";
    const CliResult r = run_shell(cmd);
    return std::pair{r, slurp(dir / "out0")};
  };
  std::filesystem::create_directories(dir / "verify");
  const auto [verify, verify_out] =
      two_ranks(COMMGRID_EXE, "verify --tp 2 --kinds tp,dp", "verify");
  if (no_gloo(verify)) GTEST_SKIP() << "this build has no Gloo backend";
  EXPECT_EQ(verify.code, 0) << verify.err;
  EXPECT_NE(verify_out.find("on 2 ranks"), std::string::npos) << verify_out << verify.err;
  if (!train_gpt().empty()) {
    std::filesystem::create_directories(dir / "train");
    const auto [train, train_out] =
        two_ranks(train_gpt(), "--tp 2 --steps 1 --format json", "train");
    EXPECT_EQ(train.code, 0) << train.err;
    EXPECT_NE(train_out.find("\"world_size\": 2"), std::string::npos) << train_out << train.err;
  }
  std::filesystem::remove_all(dir);
}

// --share-identical-groups: with tp 2 on 8 rank threads, dp has dp_cp's members (cp 1) and
// tp has mp's (pp 1; mp comes first in reference order): those rows are aliases with no
// creation call, every kind still proven; with another strategy the flag is bad input.
TEST(VerifyCli, ShareIdenticalGroupsMakesEachMemberSetOnce) {
  const CliResult r = run_with("", COMMGRID_EXE,
                               {"verify", "--local", "8", "--tp", "2", "--share-identical-groups"});
  if (no_gloo(r)) GTEST_SKIP() << "this build has no Gloo backend";
  ASSERT_EQ(r.code, 0) << r.err;
  // The table row of a kind ("" when it has none).
  auto row = [](const std::string& out, const std::string& kind) {
    const auto at = out.find("\n" + kind + " ");
    return at == std::string::npos ? std::string()
                                   : out.substr(at + 1, out.find('\n', at + 1) - at - 1);
  };
  EXPECT_NE(row(r.out, "dp").find("ok (alias)"), std::string::npos) << r.out;
  EXPECT_NE(row(r.out, "tp").find("ok (alias)"), std::string::npos) << r.out;
  EXPECT_NE(row(r.out, "dp_cp").find("ok"), std::string::npos) << r.out;
  EXPECT_EQ(row(r.out, "dp_cp").find("alias"), std::string::npos) << r.out;
  EXPECT_EQ(row(r.out, "mp").find("alias"), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("verified "), std::string::npos) << r.out;
  // Without the flag each of them is made.
  const CliResult plain = run_with("", COMMGRID_EXE, {"verify", "--local", "8", "--tp", "2"});
  ASSERT_EQ(plain.code, 0) << plain.err;
  EXPECT_NE(row(plain.out, "dp").find("ok"), std::string::npos) << plain.out;
  EXPECT_EQ(row(plain.out, "dp").find("alias"), std::string::npos) << plain.out;
  const CliResult split =
      run_with("", COMMGRID_EXE,
               {"verify", "--local", "2", "--strategy", "split", "--share-identical-groups"});
  expect_one_error_line(split, 2, "--share-identical-groups needs the member strategy");
}

}  // namespace
}  // namespace commgrid::test
