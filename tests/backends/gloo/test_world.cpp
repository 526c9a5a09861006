// Starting a world from any launcher's variables, the TCP store (served by rank 0, proven
// by the job's token), job identity in the file store, and mismatched world sizes.
#include <gtest/gtest.h>
#include <netinet/in.h>
#include <signal.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cstddef>
#include <cstring>
#include <filesystem>
#include <map>
#include <mutex>
#include <thread>

#include "commgrid/gloo.hpp"
#include "free_port.hpp"
#include "gloo_test_util.hpp"
#include "store_test_util.hpp"

namespace commgrid::test {
namespace {

using namespace std::chrono_literals;
using Vars = std::map<std::string, std::string>;

EnvLookup lookup_in(const Vars& vars) {
  return [vars](const char* name) -> std::optional<std::string> {
    auto it = vars.find(name);
    if (it == vars.end()) return std::nullopt;
    return it->second;
  };
}

std::string launch_error(const Vars& vars) {
  try {
    (void)read_launch_info(lookup_in(vars));
  } catch (const ConfigError& e) { return e.parameter() + ": " + e.what(); }
  return "no error";
}

const Vars kStore = {{"COMMGRID_STORE", "memory"}};

Vars with_store(Vars v) {
  v.insert(kStore.begin(), kStore.end());
  return v;
}

TEST(LaunchInfo, EachLauncherIsReadWithItsLocalRank) {
  struct Case {
    Vars vars;
    std::string launcher;
    int rank, size, local_rank, local_size;
  };
  const std::vector<Case> cases = {
      {{{"COMMGRID_RANK", "3"},
        {"COMMGRID_WORLD_SIZE", "8"},
        {"COMMGRID_LOCAL_RANK", "1"},
        {"COMMGRID_LOCAL_WORLD_SIZE", "2"}},
       "commgrid launch (COMMGRID_RANK, COMMGRID_WORLD_SIZE)",
       3,
       8,
       1,
       2},
      {{{"RANK", "5"}, {"WORLD_SIZE", "6"}, {"LOCAL_RANK", "2"}, {"LOCAL_WORLD_SIZE", "3"}},
       "torchrun (RANK, WORLD_SIZE)",
       5,
       6,
       2,
       3},
      {{{"SLURM_PROCID", "1"},
        {"SLURM_NTASKS", "4"},
        {"SLURM_LOCALID", "1"},
        {"SLURM_NTASKS_PER_NODE", "2(x2)"}},
       "SLURM (SLURM_PROCID, SLURM_NTASKS)",
       1,
       4,
       1,
       0},
      {{{"OMPI_COMM_WORLD_RANK", "2"},
        {"OMPI_COMM_WORLD_SIZE", "4"},
        {"OMPI_COMM_WORLD_LOCAL_RANK", "0"},
        {"OMPI_COMM_WORLD_LOCAL_SIZE", "2"}},
       "Open MPI (OMPI_COMM_WORLD_RANK, OMPI_COMM_WORLD_SIZE)",
       2,
       4,
       0,
       2},
      {{{"PMI_RANK", "1"}, {"PMI_SIZE", "2"}}, "Hydra (PMI_RANK, PMI_SIZE)", 1, 2, 0, 0},
  };
  for (const auto& c : cases) {
    const LaunchInfo i = read_launch_info(lookup_in(with_store(c.vars)));
    EXPECT_EQ(i.launcher, c.launcher);
    EXPECT_EQ(i.rank, c.rank) << c.launcher;
    EXPECT_EQ(i.size, c.size) << c.launcher;
    EXPECT_EQ(i.local_rank, c.local_rank) << c.launcher;
    EXPECT_EQ(i.local_size, c.local_size) << c.launcher;
    EXPECT_EQ(i.store, "memory");
    EXPECT_EQ(i.job_id, "default");
    EXPECT_EQ(i.token, "");
  }
}

TEST(LaunchInfo, TorchrunsMasterAddressIsTheTcpStoreAndSchedulersNameTheJob) {
  const LaunchInfo t = read_launch_info(lookup_in({{"RANK", "0"},
                                                   {"WORLD_SIZE", "2"},
                                                   {"MASTER_ADDR", "10.1.2.3"},
                                                   {"MASTER_PORT", "29500"},
                                                   {"TORCHELASTIC_RUN_ID", "abc"},
                                                   {"COMMGRID_TOKEN", "s3cret"},
                                                   {"COMMGRID_TIMEOUT", "1.5"}}));
  EXPECT_EQ(t.store, "tcp://10.1.2.3:29500");
  EXPECT_EQ(t.job_id, "torchrun-abc");
  EXPECT_EQ(t.token, "s3cret");
  EXPECT_EQ(t.timeout, 1500ms);
  const LaunchInfo s = read_launch_info(lookup_in(with_store({{"SLURM_PROCID", "0"},
                                                              {"SLURM_NTASKS", "1"},
                                                              {"SLURM_JOB_ID", "77"},
                                                              {"SLURM_STEP_ID", "2"}})));
  EXPECT_EQ(s.job_id, "slurm-77.2");
  // The user's id wins over the scheduler's.
  EXPECT_EQ(read_launch_info(lookup_in(with_store({{"SLURM_PROCID", "0"},
                                                   {"SLURM_NTASKS", "1"},
                                                   {"SLURM_JOB_ID", "77"},
                                                   {"COMMGRID_JOB_ID", "mine"}})))
                .job_id,
            "mine");
}

TEST(LaunchInfo, DisagreeingLaunchersAreNamedBothAndNestedOnesAgree) {
  EXPECT_EQ(
      launch_error(with_store(
          {{"RANK", "3"}, {"WORLD_SIZE", "8"}, {"SLURM_PROCID", "3"}, {"SLURM_NTASKS", "4"}})),
      "launcher: launchers disagree: torchrun says rank 3 of 8 (RANK, WORLD_SIZE), SLURM "
      "says rank 3 of 4 (SLURM_PROCID, SLURM_NTASKS)");
  EXPECT_EQ(launch_error(with_store({{"COMMGRID_RANK", "1"},
                                     {"COMMGRID_WORLD_SIZE", "2"},
                                     {"OMPI_COMM_WORLD_RANK", "0"},
                                     {"OMPI_COMM_WORLD_SIZE", "2"}})),
            "launcher: launchers disagree: commgrid launch says rank 1 of 2 (COMMGRID_RANK, "
            "COMMGRID_WORLD_SIZE), Open MPI says rank 0 of 2 (OMPI_COMM_WORLD_RANK, "
            "OMPI_COMM_WORLD_SIZE)");
  // srun starting one torchrun per node: SLURM counts nodes (rank 5 of 8, 4 per node, is on
  // node 1 of 2), and srun's PMI variables for the same world agree too.
  const LaunchInfo i = read_launch_info(lookup_in(with_store({{"RANK", "5"},
                                                              {"WORLD_SIZE", "8"},
                                                              {"LOCAL_RANK", "1"},
                                                              {"LOCAL_WORLD_SIZE", "4"},
                                                              {"SLURM_PROCID", "1"},
                                                              {"SLURM_NTASKS", "2"},
                                                              {"PMI_RANK", "1"},
                                                              {"PMI_SIZE", "2"}})));
  EXPECT_EQ(i.rank, 5);
  EXPECT_EQ(i.local_rank, 1);
}

TEST(LaunchInfo, EmptyMissingAndMalformedValuesAreErrors) {
  EXPECT_EQ(launch_error({}).substr(0, 30), "launcher: no launcher found: n");
  EXPECT_EQ(launch_error(with_store({{"RANK", ""}, {"WORLD_SIZE", "2"}})),
            "RANK: RANK is set but empty");
  EXPECT_EQ(launch_error(with_store({{"RANK", "0"}})),
            "WORLD_SIZE: RANK is set but WORLD_SIZE is not (torchrun)");
  EXPECT_EQ(launch_error(with_store({{"RANK", "2"}, {"WORLD_SIZE", "2"}})),
            "RANK: RANK=2 is not below WORLD_SIZE=2");
  EXPECT_EQ(launch_error(with_store({{"RANK", "0"}, {"WORLD_SIZE", "2"}, {"LOCAL_RANK", "x"}})),
            "LOCAL_RANK: LOCAL_RANK='x' is not a whole decimal number");
  EXPECT_EQ(launch_error({{"RANK", "0"}, {"WORLD_SIZE", "2"}}).substr(0, 55),
            "COMMGRID_STORE: no rendezvous store: torchrun started t");
  EXPECT_EQ(launch_error({{"RANK", "0"}, {"WORLD_SIZE", "2"}, {"COMMGRID_STORE", ""}}),
            "COMMGRID_STORE: COMMGRID_STORE is set but empty");
  EXPECT_EQ(launch_error(with_store({{"RANK", "0"}, {"WORLD_SIZE", "1"}, {"COMMGRID_TOKEN", ""}})),
            "COMMGRID_TOKEN: COMMGRID_TOKEN is set but empty");
  EXPECT_EQ(
      launch_error(with_store({{"RANK", "0"}, {"WORLD_SIZE", "1"}, {"COMMGRID_TIMEOUT", ""}})),
      "COMMGRID_TIMEOUT: COMMGRID_TIMEOUT='' is not a positive number of seconds");
  EXPECT_EQ(
      launch_error(with_store({{"RANK", "0"}, {"WORLD_SIZE", "1"}, {"COMMGRID_JOB_ID", "a/b"}})),
      "COMMGRID_JOB_ID: job id 'a/b' may not contain '/', spaces or newlines");
}

// ---- world size mismatch -------------------------------------------------------------

// A world of `size` rank-threads over `store`, each running one barrier.
void run_with_store(const std::shared_ptr<Store>& store, int size) {
  std::vector<std::string> errs(static_cast<size_t>(size));
  {
    std::vector<std::jthread> ranks;
    for (int r = 0; r < size; ++r)
      ranks.emplace_back([&, r] {
        try {
          make_gloo_world(placed(store, r, size, test_options(10s)))->barrier()->wait();
        } catch (const std::exception& e) { errs[static_cast<size_t>(r)] = e.what(); }
      });
  }
  for (int r = 0; r < size; ++r) EXPECT_EQ(errs[static_cast<size_t>(r)], "") << "rank " << r;
}

TEST(GlooWorld, AMismatchedWorldSizeIsNamedNotAGlooAssertion) {
  // Rank 0 believes in 8 ranks, ranks 1-3 in 4.
  auto store = make_memory_store();
  std::vector<std::string> errors(4);
  {
    std::vector<std::jthread> ranks;
    for (int r = 0; r < 4; ++r)
      ranks.emplace_back([&, r] {
        try {
          (void)make_gloo_world(placed(store, r, r == 0 ? 8 : 4, test_options(3s)));
        } catch (const IncompatibleError& e) {
          errors[static_cast<size_t>(r)] = e.what();
        } catch (const std::exception& e) {
          errors[static_cast<size_t>(r)] = std::string("wrong type: ") + e.what();
        }
      });
  }
  EXPECT_NE(errors[3].find("rank 3 says world size 4, rank 0 says 8"), std::string::npos)
      << errors[3];
  EXPECT_NE(errors[0].find("says world size 4, rank 0 says 8"), std::string::npos) << errors[0];
}

TEST(GlooWorld, CreatingAWorldIgnoresSigpipeSoADeadPeerIsAnError) {
  struct sigaction before {};
  ::sigaction(SIGPIPE, nullptr, &before);
  struct sigaction dfl {};
  dfl.sa_handler = SIG_DFL;
  ::sigaction(SIGPIPE, &dfl, nullptr);
  auto w = make_gloo_world(placed(make_memory_store(), 0, 1, test_options(5s)));
  struct sigaction now {};
  ::sigaction(SIGPIPE, nullptr, &now);
  EXPECT_EQ(now.sa_handler, SIG_IGN);
  ::sigaction(SIGPIPE, &before, nullptr);
}

TEST(GlooWorld, PublishedAddressesCarryNoUninitialisedBytes) {
  // Keeps a copy of every value written, to inspect what ranks publish.
  std::mutex mutex;
  std::vector<std::vector<char>> values;
  auto store = std::make_shared<HookedMemoryStore>(
      StoreHooks{.on_set = [&](const std::string&, const std::vector<char>& value) {
        std::lock_guard lock(mutex);
        values.push_back(value);
        return true;
      }});
  run_with_store(store, 3);
  constexpr size_t kRecord = sizeof(sockaddr_storage) + sizeof(std::int64_t);
  int records = 0;
  for (auto v : values) {
    // An address value ends with one byte saying whether the rank gates its connections.
    if (v.size() % kRecord == 1) v.pop_back();
    if (v.empty() || v.size() % kRecord != 0) continue;
    for (size_t at = 0; at < v.size(); at += kRecord) {
      sa_family_t family = 0;
      std::memcpy(&family, v.data() + at + offsetof(sockaddr_storage, ss_family), sizeof(family));
      if (family != AF_INET) continue;
      ++records;
      for (size_t b = offsetof(sockaddr_in, sin_zero); b < sizeof(sockaddr_storage); ++b)
        ASSERT_EQ(v[at + b], 0) << "byte " << b << " of an address record";
    }
  }
  EXPECT_GT(records, 0) << "no Gloo address record was found in the store";
}

// ---- the pair proof ------------------------------------------------------------------

TEST(GlooWorld, APeerThatCannotProveTheTokenIsAnUnauthenticatedPeer) {
  // Rank 1 reaches the store (as an attacker who can write it would) but has no token: both
  // ends of the pair refuse it, within the timeout, and no process aborts.
  auto store = make_memory_store();
  std::vector<std::string> errors(2);
  const auto t0 = std::chrono::steady_clock::now();
  {
    std::vector<std::jthread> ranks;
    for (int r = 0; r < 2; ++r)
      ranks.emplace_back([&, r] {
        GlooOptions o = test_options(3s);
        o.token = r == 0 ? "the-job-token" : "a-guess";
        try {
          (void)make_gloo_world(placed(store, r, 2, o));
        } catch (const AuthenticationError& e) {
          errors[static_cast<size_t>(r)] = e.what();
        } catch (const std::exception& e) {
          errors[static_cast<size_t>(r)] = std::string("wrong type: ") + e.what();
        }
      });
  }
  for (int r = 0; r < 2; ++r) {
    EXPECT_NE(errors[static_cast<size_t>(r)].find("unauthenticated peer at "), std::string::npos)
        << errors[static_cast<size_t>(r)];
    EXPECT_EQ(errors[static_cast<size_t>(r)].find("token-"), std::string::npos) << "token shown";
  }
  EXPECT_LT(std::chrono::steady_clock::now() - t0, 3s + 30s) << "a rank was left waiting";
  // With the same token the world forms and works.
  GlooOptions same = test_options(10s);
  same.token = "the-job-token";
  run_local_ranks(
      3, [](Communicator& w) { w.barrier()->wait(); }, same);
}

// ---- the TCP store (job() and tcp_uri(): store_test_util.hpp; the store alone is tested
// in tests/bootstrap) -------------------------------------------------------------------

TEST(GlooTcpStore, RanksMeetThroughTheStoreRankZeroServes) {
  const std::string uri = tcp_uri(free_port());
  std::vector<std::string> errs(4);
  {
    std::vector<std::jthread> ranks;
    for (int r = 0; r < 4; ++r)
      ranks.emplace_back([&, r] {
        try {
          auto store = open_store(uri, job("j1", "t0ken", r == 0));
          EXPECT_EQ(store->local_address(), "127.0.0.1");
          auto w = make_gloo_world(placed(store, r, 4, test_options(20s)));
          std::int64_t v = w->rank(), out = 0;
          w->allreduce(&v, &out, 1, DataType::int64, ReduceOp::sum)->wait();
          EXPECT_EQ(out, 6);
          auto g = w->split(w->rank() % 2, w->rank(), "parity");
          g->barrier()->wait();
          w->barrier()->wait();  // rank 0's store serves until every rank is done with it
        } catch (const std::exception& e) { errs[static_cast<size_t>(r)] = e.what(); }
      });
  }
  for (int r = 0; r < 4; ++r) EXPECT_EQ(errs[static_cast<size_t>(r)], "") << "rank " << r;
}

// ---- the file store: one job per folder, private files -------------------------------

TEST(GlooFileStore, ASecondJobOnTheFolderFailsAtOnceAndFilesArePrivate) {
  std::string pattern = (std::filesystem::temp_directory_path() / "commgrid-job-XXXXXX").string();
  const std::string dir = ::mkdtemp(pattern.data());
  {
    auto first = open_store("file://" + dir, job("a", "ta", false));
    const std::string v = "1";
    first->set("key", std::span<const char>(v.data(), 1));
    EXPECT_NO_THROW(open_store("file://" + dir, job("a", "ta", false)));  // same job: a rank
    try {
      open_store("file://" + dir, job("b", "tb", false));
      ADD_FAILURE() << "a second job merged";
    } catch (const JobConflictError& e) {
      EXPECT_NE(std::string(e.what()).find("is in use by job 'a' (this is job 'b')"),
                std::string::npos)
          << e.what();
    }
    try {
      open_store("file://" + dir, job("a", "other", false));
      ADD_FAILURE() << "the same id with another token merged";
    } catch (const JobConflictError& e) {
      EXPECT_NE(std::string(e.what()).find("different token"), std::string::npos) << e.what();
    }
    for (const auto& f : std::filesystem::directory_iterator(dir)) {
      struct stat st {};
      ASSERT_EQ(::stat(f.path().c_str(), &st), 0);
      EXPECT_EQ(st.st_mode & 0777, 0600u) << f.path();
    }
  }
  std::filesystem::remove_all(dir);
}

}  // namespace
}  // namespace commgrid::test
