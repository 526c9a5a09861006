// Two token-less jobs with the same id on one store (issue 24, defect 4): the ranks are
// processes that build their world from the environment (make_gloo_world_from_env), as under mpirun
// or torchrun without COMMGRID_TOKEN. They used to merge (a rank of each job formed a world with
// the other); now the second job's ranks fail at once, naming the conflict, and the first job
// completes. On the file, Redis and tcp:// stores.
#include <fcntl.h>
#include <gtest/gtest.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <filesystem>
#include <string>
#include <thread>
#include <vector>

#include "cli_runner.hpp"
#include "commgrid/store.hpp"
#include "free_port.hpp"
#include "redis_server.hpp"

namespace commgrid::test {
namespace {

using namespace std::chrono_literals;

using Env = std::vector<std::pair<std::string, std::string>>;

// A rank process of the test worker: its output goes to a file. `extra` adds variables (a
// launcher's run id).
class Rank {
 public:
  Rank(const std::string& store, int rank, int size, const std::string& mode,
       const std::string& seconds, const Env& extra = {})
      : out_(std::filesystem::temp_directory_path() /
             ("commgrid-same-id-" + std::to_string(::getpid()) + "-" + std::to_string(serial_++))) {
    pid_ = ::fork();
    if (pid_ == 0) {
      for (const char* v :
           {"COMMGRID_TOKEN", "COMMGRID_JOB_ID", "TORCHELASTIC_RUN_ID", "SLURM_JOB_ID", "RANK",
            "SLURM_PROCID", "OMPI_COMM_WORLD_RANK", "PMI_RANK", "COMMGRID_LOCAL_RANK",
            "COMMGRID_LOCAL_WORLD_SIZE", "COMMGRID_JOB_NONCE", "PMIX_NAMESPACE",
            "OMPI_MCA_ess_base_jobid", "SLURM_STEP_ID", "TORCHELASTIC_RESTART_COUNT"})
        ::unsetenv(v);
      for (const auto& [name, value] : extra) ::setenv(name.c_str(), value.c_str(), 1);
      ::setenv("COMMGRID_STORE", store.c_str(), 1);
      ::setenv("COMMGRID_RANK", std::to_string(rank).c_str(), 1);
      ::setenv("COMMGRID_WORLD_SIZE", std::to_string(size).c_str(), 1);
      ::setenv("COMMGRID_TIMEOUT", "30", 1);
      const int fd = ::open(out_.c_str(), O_CREAT | O_TRUNC | O_WRONLY, 0600);
      ::dup2(fd, 1);
      ::dup2(fd, 2);
      ::execl(COMMGRID_GLOO_WORKER, COMMGRID_GLOO_WORKER, mode.c_str(), seconds.c_str(),
              static_cast<char*>(nullptr));
      ::_exit(127);
    }
  }
  ~Rank() {
    if (pid_ > 0 && code_ == -1) {
      ::kill(pid_, SIGKILL);
      ::waitpid(pid_, nullptr, 0);
    }
    std::filesystem::remove(out_);
  }
  Rank(const Rank&) = delete;
  Rank& operator=(const Rank&) = delete;

  /// Waits (at most `limit`) for the process to end: its exit code, or -1 (killed then).
  int wait(std::chrono::seconds limit) {
    const auto until = std::chrono::steady_clock::now() + limit;
    int status = 0;
    while (::waitpid(pid_, &status, WNOHANG) == 0) {
      if (std::chrono::steady_clock::now() > until) return -1;
      std::this_thread::sleep_for(20ms);
    }
    code_ = WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
    return code_;
  }
  [[nodiscard]] std::string output() const { return slurp(out_); }

 private:
  static inline int serial_ = 0;
  std::filesystem::path out_;
  pid_t pid_ = -1;
  int code_ = -1;
};

void second_job_fails_first_completes(const std::string& uri, bool served) {
  SCOPED_TRACE(uri);
  std::vector<std::unique_ptr<Rank>> first;
  for (int r = 0; r < 2; ++r) first.push_back(std::make_unique<Rank>(uri, r, 2, "hold", "3"));
  // Once the first job's ranks hold their places, start the second job.
  StoreOptions probe;
  probe.timeout = 30s;
  auto store = open_store(uri, probe);  // the same (default) id, no rank
  EXPECT_EQ(
      store->wait_for(std::vector<std::string>{"commgrid-job/rank/0", "commgrid-job/rank/1"}, 30s),
      std::vector<std::string>{});
  const auto t0 = std::chrono::steady_clock::now();
  std::vector<std::unique_ptr<Rank>> second;
  for (int r = 0; r < 2; ++r) second.push_back(std::make_unique<Rank>(uri, r, 2, "ok", ""));
  for (int r = 0; r < 2; ++r) {
    EXPECT_EQ(second[static_cast<size_t>(r)]->wait(60s), 1)
        << second[static_cast<size_t>(r)]->output();
    const std::string out = second[static_cast<size_t>(r)]->output();
    if (served && r == 0)  // its rank 0 cannot serve where the first job's does
      EXPECT_NE(out.find("is in use (another job"), std::string::npos) << out;
    else
      EXPECT_NE(out.find("is in use by another job with the same id 'default': its rank " +
                         std::to_string(r)),
                std::string::npos)
          << out;
  }
  EXPECT_LT(std::chrono::steady_clock::now() - t0, 20s) << "the second job must fail at once";
  for (int r = 0; r < 2; ++r) {
    EXPECT_EQ(first[static_cast<size_t>(r)]->wait(60s), 0)
        << first[static_cast<size_t>(r)]->output();
    EXPECT_NE(first[static_cast<size_t>(r)]->output().find("rank " + std::to_string(r) + " held"),
              std::string::npos);
  }
}

TEST(SameIdJobs, OnAFileStoreTheSecondFailsAndTheFirstCompletes) {
  std::string pattern = (std::filesystem::temp_directory_path() / "commgrid-same-XXXXXX").string();
  const std::string dir = ::mkdtemp(pattern.data());
  second_job_fails_first_completes("file://" + dir, false);
  std::filesystem::remove_all(dir);
}

TEST(SameIdJobs, OnARedisStoreTheSecondFailsAndTheFirstCompletes) {
  RedisServer redis;
  if (!redis.available()) GTEST_SKIP() << "redis-server not found or did not start";
  second_job_fails_first_completes(redis.uri("jobs"), false);
}

TEST(SameIdJobs, OnATcpStoreTheSecondFailsAndTheFirstCompletes) {
  second_job_fails_first_completes("tcp://127.0.0.1:" + std::to_string(free_port()), true);
}

// Job A's rank 0 starts; job B (the same id, no token, another run id from its launcher)
// starts its rank 1 before A's rank 1 has. B's rank 1 used to take the free place and form a
// world with A's rank 0 (the two jobs merged, and A's late rank 1 was refused). Now B's rank
// 1 is refused at once, naming the other run, and A completes when its rank 1 arrives.
void a_late_rank_is_not_replaced(const std::string& uri, const Env& run_a, const Env& run_b) {
  SCOPED_TRACE(uri);
  Rank a0(uri, 0, 2, "ok", "", run_a);
  // A's rank 0 has joined (its place is taken) before B's rank starts.
  StoreOptions probe;
  probe.timeout = 30s;
  probe.job_id = "shared";
  auto store = open_store(uri, probe);
  EXPECT_EQ(store->wait_for(std::vector<std::string>{"commgrid-job/rank/0"}, 30s),
            std::vector<std::string>{});
  const auto t0 = std::chrono::steady_clock::now();
  Rank b1(uri, 1, 2, "ok", "", run_b);
  EXPECT_EQ(b1.wait(60s), 1) << "job B's rank 1 joined job A's world:\n" << b1.output();
  const std::string out = b1.output();
  EXPECT_NE(out.find("is in use by another run of job 'shared' (rank 1 refused: its run is"),
            std::string::npos)
      << out;
  EXPECT_LT(std::chrono::steady_clock::now() - t0, 20s) << "B's rank must fail at once";
  // A's late rank 1 still finds its place, and A completes.
  Rank a1(uri, 1, 2, "ok", "", run_a);
  EXPECT_EQ(a0.wait(60s), 0) << a0.output();
  EXPECT_EQ(a1.wait(60s), 0) << a1.output();
  EXPECT_NE(a1.output().find("rank 1 of 2 ok sum=1"), std::string::npos) << a1.output();
}

Env run(const std::string& name, const std::string& value) {
  return {{"COMMGRID_JOB_ID", "shared"}, {name, value}};
}

TEST(SameIdJobs, OnAFileStoreALateRankIsNotReplacedByAnotherRunsRank) {
  std::string pattern = (std::filesystem::temp_directory_path() / "commgrid-late-XXXXXX").string();
  const std::string dir = ::mkdtemp(pattern.data());
  a_late_rank_is_not_replaced("file://" + dir, run("COMMGRID_JOB_NONCE", "run-a"),
                              run("COMMGRID_JOB_NONCE", "run-b"));
  std::filesystem::remove_all(dir);
}

TEST(SameIdJobs, OnARedisStoreALateRankIsNotReplacedByAnotherRunsRank) {
  RedisServer redis;
  if (!redis.available()) GTEST_SKIP() << "redis-server not found or did not start";
  // Open MPI's namespace: each mpirun has its own.
  a_late_rank_is_not_replaced(redis.uri("late"), run("PMIX_NAMESPACE", "1111"),
                              run("PMIX_NAMESPACE", "2222"));
}

TEST(SameIdJobs, OnATcpStoreALateRankIsNotReplacedByAnotherRunsRank) {
  // SLURM's job id: each sbatch has its own (the job id is the user's, the same for both).
  a_late_rank_is_not_replaced("tcp://127.0.0.1:" + std::to_string(free_port()),
                              run("SLURM_JOB_ID", "1001"), run("SLURM_JOB_ID", "1002"));
}

}  // namespace
}  // namespace commgrid::test
