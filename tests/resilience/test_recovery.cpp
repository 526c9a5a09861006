// The recovery protocol with real ranks as threads of one process: the agreement (exactly
// one decision per epoch however many detect at once, a decider that dies before writing,
// a process declared dead that comes back), and a Gloo world that loses a rank and
// regroups with a spare, its collectives then right again.
#include <gtest/gtest.h>

#include <atomic>
#include <limits>
#include <mutex>
#include <set>
#include <thread>

#include "commgrid/gloo.hpp"
#include "commgrid/recovery.hpp"

namespace commgrid {
namespace {

using namespace std::chrono_literals;

RecoveryOptions fast(std::chrono::milliseconds timeout = 20s) {
  RecoveryOptions o;
  o.timeout = timeout;
  o.decision_window = 0.1;
  return o;
}

std::span<const char> bytes(const std::string& s) { return {s.data(), s.size()}; }

SparePlacement spares(std::int64_t s) {
  SparePlacement p;
  p.spares = s;
  return p;
}

ParallelConfig tp_config(std::int64_t world, std::int64_t tp) {
  ParallelConfig c;
  c.world_size = world;
  c.tp = tp;
  return c;
}

// `live` processes of a W + S job agree at once; returns each one's decision text and map.
struct Agreed {
  std::vector<std::string> text, map, error;
};
Agreed agree_all(const std::shared_ptr<Store>& store, const RankMap& map,
                 const std::vector<std::int64_t>& live, RecoveryOptions options) {
  Agreed out;
  out.text.resize(live.size());
  out.map.resize(live.size());
  out.error.resize(live.size());
  std::vector<std::jthread> threads;
  for (std::size_t i = 0; i < live.size(); ++i)
    threads.emplace_back([&, i] {
      try {
        Recovery r(store, map, live[i], options);
        out.text[i] = r.agree().text;
        out.map[i] = r.map().canonical();
      } catch (const std::exception& e) {
        out.error[i] = e.what();
      }
    });
  threads.clear();
  return out;
}

TEST(Agreement, EveryLiveProcessAdoptsOneDecisionAndTheSpareTakesTheDeadRank) {
  auto store = make_memory_store();
  // Launch posts the death of process 2 (incarnation 0): nobody waits out the window for it.
  store->set(dead_process_key("resilience", 2, 0), bytes(std::string("SIGKILL")));
  const auto t0 = std::chrono::steady_clock::now();
  const Agreed a = agree_all(store, RankMap(4, spares(2)), {0, 1, 3, 4, 5}, fast(60s));
  for (const auto& e : a.error) ASSERT_EQ(e, "");
  for (std::size_t i = 1; i < a.text.size(); ++i) {
    EXPECT_EQ(a.text[i], a.text[0]);
    EXPECT_EQ(a.map[i], a.map[0]);
  }
  EXPECT_NE(a.text[0].find("dead=2\n"), std::string::npos) << a.text[0];
  EXPECT_EQ(a.map[0], "epoch=1 world=4 processes=6 map=0,1,4,3 spare=5 dead=2");
  // Posted deaths make the agreement quick: well within the 6 s window it would wait.
  EXPECT_LT(std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count(), 5.0);
}

TEST(Agreement, AnUnpostedDeathIsDeclaredAfterTheWindow) {
  auto store = make_memory_store();
  const Agreed a = agree_all(store, RankMap(4, spares(1)), {0, 2, 3, 4}, fast(20s));
  for (const auto& e : a.error) ASSERT_EQ(e, "");
  for (std::size_t i = 1; i < a.text.size(); ++i) EXPECT_EQ(a.text[i], a.text[0]);
  EXPECT_EQ(a.map[0], "epoch=1 world=4 processes=5 map=0,4,2,3 spare= dead=1");
}

TEST(Agreement, ADeciderThatDiesBeforeWritingIsDeclaredDeadByTheNext) {
  auto store = make_memory_store();
  // Process 0 registered (it is the first candidate) and then died without deciding.
  store->set("resilience/epoch/1/alive/0", bytes(std::string("0")));
  const Agreed a = agree_all(store, RankMap(4, spares(2)), {1, 2, 3, 4, 5}, fast(20s));
  for (const auto& e : a.error) ASSERT_EQ(e, "");
  for (std::size_t i = 1; i < a.text.size(); ++i) EXPECT_EQ(a.text[i], a.text[0]);
  EXPECT_NE(a.text[0].find("decider=1\ndead=0\n"), std::string::npos) << a.text[0];
  EXPECT_EQ(a.map[0], "epoch=1 world=4 processes=6 map=4,1,2,3 spare=5 dead=0");
}

TEST(Agreement, TwoFailuresInARowAndADeclaredDeadProcessIsFenced) {
  auto store = make_memory_store();
  store->set(dead_process_key("resilience", 1, 0), bytes(std::string("x")));
  const RankMap m0(3, spares(2));
  ASSERT_EQ(agree_all(store, m0, {0, 2, 3, 4}, fast()).error, std::vector<std::string>(4));
  // Epoch 1: process 3 holds rank 1; now it dies too.
  store->set(dead_process_key("resilience", 3, 0), bytes(std::string("x")));
  Agreed second;
  {
    std::vector<std::string> texts(3), errors(3);
    std::vector<std::jthread> threads;
    const std::vector<std::int64_t> live{0, 2, 4};
    for (std::size_t i = 0; i < live.size(); ++i)
      threads.emplace_back([&, i] {
        try {
          Recovery r(store, m0, live[i], fast());  // replays epoch 1's decision
          if (r.epoch() != 1) throw std::runtime_error("did not replay epoch 1");
          r.mark_failed("test");
          texts[i] = r.agree().text;
          texts[i] += r.map().canonical();
        } catch (const std::exception& e) {
          errors[i] = e.what();
        }
      });
    threads.clear();
    for (const auto& e : errors) ASSERT_EQ(e, "");
    EXPECT_EQ(texts[0], texts[1]);
    EXPECT_EQ(texts[0], texts[2]);
    EXPECT_NE(texts[0].find("map=0,4,2 spare= dead=1,3"), std::string::npos) << texts[0];
  }
  // Process 1 (only stopped, say) comes back: the decisions say it is dead, so it may not
  // rejoin, with the error that says so.
  try {
    Recovery back(store, m0, 1, fast());
    ADD_FAILURE() << "a declared dead process was let back";
  } catch (const FencedError& e) {
    EXPECT_NE(std::string(e.what()).find("process 1 was declared dead in epoch 1 and is fenced"),
              std::string::npos)
        << e.what();
  }
  // A third death finds no spare: every process throws the same NoSpareError.
  store->set(dead_process_key("resilience", 4, 0), bytes(std::string("x")));
  const Agreed third = agree_all(store, m0, {0, 2}, fast());
  for (const auto& e : third.error) EXPECT_NE(e.find("rank"), std::string::npos) << e;
  EXPECT_EQ(third.error[0], third.error[1]);
}

TEST(Agreement, ARestartedProcessComesBackAsASpareAtTheNextDecision) {
  auto store = make_memory_store();
  const RankMap m0(2, spares(1));
  store->set(dead_process_key("resilience", 0, 0), bytes(std::string("x")));
  ASSERT_EQ(agree_all(store, m0, {1, 2}, fast()).error, std::vector<std::string>(2));
  // Launch restarted process 0 (incarnation 1): it registers for the next epoch.
  RecoveryOptions again = fast();
  again.incarnation = 1;
  Recovery restarted(store, m0, 0, again);
  EXPECT_EQ(restarted.epoch(), 1);
  EXPECT_FALSE(restarted.logical_rank());
  // Process 2 (rank 0 now) dies: process 0 takes its rank back.
  store->set(dead_process_key("resilience", 2, 0), bytes(std::string("x")));
  std::string other;
  std::jthread t([&] {
    Recovery r(store, m0, 1, fast());
    other = r.agree().text;
  });
  const std::string mine = restarted.agree().text;
  t.join();
  EXPECT_EQ(mine, other);
  EXPECT_NE(mine.find("revived=0:1"), std::string::npos) << mine;
  EXPECT_EQ(restarted.logical_rank(), std::optional<Rank>(0));
}

// The step every rank of a new epoch resumes at: the least of the survivors' (-1: a spare).
int agreed_step(const EpochGroups& g, int mine) {
  std::int64_t v = mine < 0 ? std::numeric_limits<std::int64_t>::max() : mine;
  g.world->allreduce(std::span<std::int64_t>(&v, 1), ReduceOp::min)->wait();
  return static_cast<int>(v);
}

// Gloo ranks as threads: W = 4 (tp 2, dp 2) and one spare. Process 3 dies after step 1 (it
// closes every connection, as a killed process's kernel does); the others fail at their
// next collective, agree, regroup with process 4 as logical rank 3, and every later step's
// allreduce is right.
TEST(GlooRegroup, ARankDiesAndTheSpareTakesItsPlace) {
  auto store = make_memory_store();
  const ParallelConfig config = tp_config(4, 2);
  const RankMap m0(4, spares(1));
  constexpr int kSteps = 4;
  std::vector<std::string> errors(5);
  std::vector<std::vector<double>> sums(5);
  std::vector<std::int64_t> epochs(5, -1);
  {
    std::vector<std::jthread> threads;
    for (std::int64_t p = 0; p < 5; ++p)
      threads.emplace_back([&, p] {
        try {
          Recovery rec(store, m0, p, fast(30s));
          auto factory = [&](const std::string& prefix, int rank, int size) {
            GlooOptions o;
            o.timeout = 30s;
            o.prefix = prefix;
            return make_gloo_world(store, rank, size, o);
          };
          EpochGroups g = rec.build(factory, config);
          int step = 0;
          while (step < kSteps) {
            if (!g.world) {  // a spare
              if (!rec.wait_for_failure()) break;
              g = rec.recover(factory, config);
              if (g.world) step = agreed_step(g, -1);
              continue;
            }
            if (p == 3 && step == 1) return;  // dies: its groups close with it
            try {
              // dp allreduce of (step + 1) * (logical rank + 1): a value that shows which
              // ranks took part.
              const auto r = static_cast<double>(*rec.logical_rank());
              double v = (step + 1) * (r + 1);
              g.groups->group(GroupKind::dp).allreduce(std::span<double>(&v, 1), ReduceOp::sum)->wait();
              g.world->barrier()->wait();
              sums[static_cast<std::size_t>(p)].push_back(v);
              ++step;
            } catch (const BackendError& e) {
              rec.mark_failed(e.what());
              g = EpochGroups{};  // close this epoch's connections first
              g = rec.recover(factory, config);
              // Every rank goes back to the earliest step a survivor has not finished (the
              // spare, with no step of its own, learns it).
              step = agreed_step(g, step);
              sums[static_cast<std::size_t>(p)].resize(static_cast<std::size_t>(step));
            }
          }
          epochs[static_cast<std::size_t>(p)] = rec.epoch();
          if (*rec.logical_rank() == 0) rec.mark_done();
        } catch (const std::exception& e) {
          errors[static_cast<std::size_t>(p)] = e.what();
        }
      });
  }
  for (std::size_t p = 0; p < 5; ++p) EXPECT_EQ(errors[p], "") << "process " << p;
  // dp groups of tp 2, dp 2: {0, 2} and {1, 3}: sums (s+1)*(1+3) and (s+1)*(2+4).
  for (std::size_t p : {0u, 1u, 2u}) {
    ASSERT_EQ(sums[p].size(), std::size_t{kSteps}) << "process " << p;
    for (int s = 0; s < kSteps; ++s)
      EXPECT_EQ(sums[p][static_cast<std::size_t>(s)], (s + 1) * (p % 2 == 0 ? 4.0 : 6.0))
          << "process " << p << " step " << s;
    EXPECT_EQ(epochs[p], 1);
  }
  // The spare ran the steps after the failure as logical rank 3.
  ASSERT_FALSE(sums[4].empty());
  EXPECT_EQ(sums[4].back(), kSteps * 6.0);
}

}  // namespace
}  // namespace commgrid
