// The recovery protocol with real ranks as threads of one process: the agreement (exactly
// one decision per epoch however many detect at once, a decider that dies before writing,
// a process declared dead that comes back), and a Gloo world that loses a rank and
// regroups with a spare, its collectives then right again.
#include <gtest/gtest.h>

#include <atomic>
#include <functional>
#include <limits>
#include <mutex>
#include <set>
#include <thread>

#include "commgrid/gloo.hpp"
#include "commgrid/process_groups.hpp"
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

// With the world shrinking when no spare is left, over `layout` (epoch 0's). Every death in
// these tests is posted, so the window (10 s) is never waited out: it only keeps a live
// process that is slow to register on a loaded machine from being declared dead.
RecoveryOptions shrinking(const ParallelConfig& layout, std::chrono::milliseconds timeout = 20s) {
  RecoveryOptions o = fast(timeout);
  o.decision_window = 0.5;
  o.shrink = ShrinkOptions{layout, std::nullopt};
  return o;
}

// `live` processes of a W + S job agree at once; returns each one's decision text, map,
// current layout (with shrink) and the decision's shrink plan, or its error and its type.
struct Agreed {
  std::vector<std::string> text, map, error, kind;
  std::vector<std::optional<ParallelConfig>> config;
  std::vector<std::optional<ShrinkPlan>> shrink;
};
Agreed agree_all(const std::shared_ptr<Store>& store, const RankMap& map,
                 const std::vector<std::int64_t>& live, RecoveryOptions options,
                 const std::function<void(Recovery&)>& before = {}) {
  Agreed out;
  out.text.resize(live.size());
  out.map.resize(live.size());
  out.error.resize(live.size());
  out.kind.resize(live.size());
  out.config.resize(live.size());
  out.shrink.resize(live.size());
  std::vector<std::jthread> threads;
  for (std::size_t i = 0; i < live.size(); ++i)
    threads.emplace_back([&, i] {
      try {
        Recovery r(store, map, live[i], options);
        if (before) before(r);
        const EpochDecision& d = r.agree();
        out.text[i] = d.text;
        out.shrink[i] = d.shrink;
        out.map[i] = r.map().canonical();
        out.config[i] = r.config();
      } catch (const std::exception& e) {
        out.error[i] = e.what();
        out.kind[i] = dynamic_cast<const IncompatibleError*>(&e) ? "IncompatibleError"
                      : dynamic_cast<const NoSpareError*>(&e)    ? "NoSpareError"
                      : dynamic_cast<const ConfigError*>(&e)     ? "ConfigError"
                                                                 : "other";
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

// Process 0, the lowest, never registers and launch posts no death: every other process
// waits for it (one key) until the window ends, and the decider, process 1, decides then,
// within the same window: one window in all (4 s here), not one spent waiting for process 0
// and another for every registration.
TEST(Agreement, TheLowestProcessNeverRegisteringCostsOneWindowNotTwo) {
  auto store = make_memory_store();
  RecoveryOptions options = fast(40s);  // window 0.1 x 40 s = 4 s
  const auto t0 = std::chrono::steady_clock::now();
  const Agreed a = agree_all(store, RankMap(4, spares(1)), {1, 2, 3, 4}, options);
  const double took = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  for (const auto& e : a.error) ASSERT_EQ(e, "");
  for (std::size_t i = 1; i < a.text.size(); ++i) EXPECT_EQ(a.text[i], a.text[0]);
  EXPECT_EQ(a.map[0], "epoch=1 world=4 processes=5 map=4,1,2,3 spare= dead=0");
  EXPECT_GE(took, 3.9);  // the window was waited out for process 0
  EXPECT_LT(took, 7.0);  // but once
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
        } catch (const std::exception& e) { errors[i] = e.what(); }
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
  // One epoch counter: the decision revived a process and replaced one, two changes of
  // the map, and the job's epoch is 2 in both the Recovery and its map.
  EXPECT_EQ(restarted.epoch(), 2);
  EXPECT_EQ(restarted.map().epoch(), 2);
  EXPECT_EQ(restarted.map().canonical(), "epoch=2 world=2 processes=3 map=0,1 spare= dead=2");
  // The decision says which process holds each logical rank (what launch follows).
  const DecisionRecord d = parse_decision(mine);
  EXPECT_EQ(d.epoch, 2);
  EXPECT_EQ(d.process_of, (std::vector<std::int64_t>{0, 1}));
  EXPECT_EQ(d.dead, (std::vector<std::int64_t>{2}));
  ASSERT_EQ(d.revived.size(), 1u);
  EXPECT_EQ(d.revived[0], (std::pair<std::int64_t, int>{0, 1}));
  const std::vector<DecisionRecord> all = read_decisions(*store, kResiliencePrefix);
  ASSERT_EQ(all.size(), 2u);
  EXPECT_EQ(all[0].process_of, (std::vector<std::int64_t>{2, 1}));
  EXPECT_EQ(all[1].process_of, d.process_of);
  EXPECT_EQ(format_decision(d), mine);
}

TEST(Agreement, ARestartedProcessWhoseEveryPeerDiedDecidesAloneAndEndsTheJob) {
  // Process 0 died (process 2, the spare, took its rank) and was restarted; then processes 1
  // and 2 died too. The restarted process is the only one left: it registers for epoch 2
  // and, no process of epoch 1 being left to decide (an empty list of candidates but for
  // itself), decides: it comes back as a spare and takes logical rank 1 (process 1's, the
  // lower dead process), and logical rank 0 finds no spare.
  auto store = make_memory_store();
  const RankMap m0(2, spares(1));
  store->set(dead_process_key("resilience", 0, 0), bytes(std::string("x")));
  ASSERT_EQ(agree_all(store, m0, {1, 2}, fast()).error, std::vector<std::string>(2));
  store->set(dead_process_key("resilience", 1, 0), bytes(std::string("x")));
  store->set(dead_process_key("resilience", 2, 0), bytes(std::string("x")));
  RecoveryOptions again = fast();
  again.incarnation = 1;
  Recovery restarted(store, m0, 0, again);
  try {
    (void)restarted.agree();
    ADD_FAILURE() << "a job without processes for its ranks went on";
  } catch (const NoSpareError& e) {
    EXPECT_EQ(e.ranks(), (std::vector<Rank>{0}));
    EXPECT_NE(std::string(e.what()).find("recovery: cannot go on without a spare: no spare left "
                                         "for logical rank [0]"),
              std::string::npos)
        << e.what();
    EXPECT_EQ(job_end_reason(*store, kResiliencePrefix), std::optional<std::string>(e.what()));
  }
  const DecisionRecord d = parse_decision([&] {
    const auto v = store->get(epoch_decision_key(kResiliencePrefix, 2));
    return std::string(v.begin(), v.end());
  }());
  EXPECT_EQ(d.decider, 0);
  EXPECT_EQ(d.dead, (std::vector<std::int64_t>{1, 2}));
  EXPECT_TRUE(d.process_of.empty());  // no epoch 2
  // A process that asks later learns that the job ended, with the same line.
  EXPECT_THROW((void)Recovery(store, m0, 1, fast()).agree(), RecoveryError);
}

// Recovery::declare: a decision says which fingerprint every process it counts on
// registered with, and only then: one process that declares another layout, or none, leaves
// the decision without it (and its epoch exchanges the fingerprint as epoch 0 does).
TEST(Agreement, ADecisionCarriesTheNotesAndTheFingerprintOnlyWhenEveryProcessDeclaredIt) {
  {
    Recovery r(make_memory_store(), RankMap(2, spares(0)), 0, fast());
    try {
      r.set_note("1;2");
      ADD_FAILURE() << "a note with ';' was accepted";
    } catch (const InvalidValueError& e) { EXPECT_EQ(e.parameter(), "note"); }
  }
  const ParallelConfig layout = tp_config(4, 2), other = tp_config(4, 1);
  const std::string line =
      "fingerprint=" + fingerprint_text(ProcessGroups::fingerprint(layout, {}));
  for (const int odd : {-1, 4, 5}) {  // nobody; process 4 declares another; process 5 none
    auto store = make_memory_store();
    store->set(dead_process_key("resilience", 2, 0), bytes(std::string("SIGKILL")));
    const Agreed a =
        agree_all(store, RankMap(4, spares(2)), {0, 1, 3, 4, 5}, fast(60s), [&](Recovery& r) {
          r.set_note(std::to_string(10 + r.process()));
          if (r.process() == odd && odd == 5) return;
          r.declare(r.process() == odd ? other : layout, {});
        });
    for (const auto& e : a.error) ASSERT_EQ(e, "");
    // Every live process's note, gathered by the decision (Recovery::set_note).
    EXPECT_NE(a.text[0].find("notes=0/10 1/11 3/13 4/14 5/15\n"), std::string::npos) << a.text[0];
    EXPECT_EQ(a.text[0].find(line) != std::string::npos, odd == -1)
        << "odd process " << odd << ": " << a.text[0];
    EXPECT_EQ(a.text[0].find("fingerprint=") != std::string::npos, odd == -1) << a.text[0];
  }
}

TEST(Registration, TheTextRoundTripsAndMalformedPartsAreNamed) {
  // Only the incarnation: the short form older registrations used.
  RegistrationRecord only;
  only.incarnation = 2;
  EXPECT_EQ(format_registration(only), "2");
  RegistrationRecord r{.incarnation = 1, .renew = {3, 5}, .fingerprint = 0x9fULL, .note = "4,-1,0"};
  const std::string text = format_registration(r);
  EXPECT_EQ(text, "1;3,5;000000000000009f;4,-1,0");
  const RegistrationRecord back = parse_registration(text);
  EXPECT_EQ(back.incarnation, 1);
  EXPECT_EQ(back.renew, r.renew);
  EXPECT_EQ(back.fingerprint, r.fingerprint);
  EXPECT_EQ(back.note, r.note);
  const RegistrationRecord bare = parse_registration("0;;;");
  EXPECT_EQ(bare.incarnation, 0);
  EXPECT_TRUE(bare.renew.empty());
  EXPECT_FALSE(bare.fingerprint.has_value());
  EXPECT_EQ(bare.note, "");
  EXPECT_THROW((void)parse_registration("x"), BackendError);
  EXPECT_THROW((void)parse_registration("0;1,y"), BackendError);
  EXPECT_THROW((void)parse_registration("0;;nothex"), BackendError);
  // Number lists, as every stored list is written.
  EXPECT_EQ(join_numbers({3, -1, 5}), "3,-1,5");
  EXPECT_EQ(join_numbers({}), "");
  EXPECT_EQ(parse_numbers("3,-1,5", "row"), (std::vector<std::int64_t>{3, -1, 5}));
  EXPECT_TRUE(parse_numbers("", "row").empty());
  try {
    (void)parse_numbers("1,,2", "row");
    ADD_FAILURE() << "no error";
  } catch (const BackendError& e) {
    EXPECT_NE(std::string(e.what()).find("malformed row ''"), std::string::npos) << e.what();
  }
}

TEST(Decision, TheTextRoundTripsAndMalformedLinesAreNamed) {
  DecisionRecord d;
  d.epoch = 3;
  d.decider = 4;
  d.dead = {1, 6};
  d.revived = {{2, 1}};
  d.shrink_world = 4;
  d.process_of = {0, 5, 2, 3};
  d.fingerprint = 0x00ab00000000cd01ULL;
  d.notes = {{0, "3,-1,9223372036854775807"}, {5, ""}};
  const std::string text = format_decision(d);
  EXPECT_EQ(text,
            "epoch=3\ndecider=4\ndead=1,6\nrevived=2:1\nshrink=4\nranks=0,5,2,3\n"
            "fingerprint=00ab00000000cd01\nnotes=0/3,-1,9223372036854775807 5/\n");
  const DecisionRecord back = parse_decision(text + "later=ignored\n");
  EXPECT_EQ(back.epoch, 3);
  EXPECT_EQ(back.decider, 4);
  EXPECT_EQ(back.dead, d.dead);
  EXPECT_EQ(back.revived, d.revived);
  EXPECT_EQ(back.shrink_world, d.shrink_world);
  EXPECT_EQ(back.process_of, d.process_of);
  EXPECT_EQ(back.fingerprint, d.fingerprint);
  EXPECT_EQ(back.notes, d.notes);
  EXPECT_THROW((void)parse_decision("epoch=1\nnotes=0-1\n"), BackendError);
  EXPECT_THROW((void)parse_decision("epoch=1\nfingerprint=xyz\n"), BackendError);
  try {
    (void)parse_decision("epoch=1\ndead=1,x\n");
    ADD_FAILURE() << "no error";
  } catch (const BackendError& e) {
    EXPECT_NE(std::string(e.what()).find("malformed dead process 'x'"), std::string::npos)
        << e.what();
  }
  EXPECT_THROW((void)parse_decision("epoch 1\n"), BackendError);
  // The keys, spelled once.
  EXPECT_EQ(dead_process_key("resilience", 3, 1), "resilience/process/3/1/dead");
  EXPECT_EQ(epoch_failed_key("resilience", 2), "resilience/epoch/2/failed");
  EXPECT_EQ(epoch_decision_key("resilience", 2), "resilience/epoch/2/decision");
  EXPECT_EQ(epoch_alive_key("resilience", 2, 5), "resilience/epoch/2/alive/5");
  EXPECT_EQ(epoch_world_prefix("resilience", 2), "resilience/epoch/2/world");
  EXPECT_EQ(job_done_key("resilience"), "resilience/done");
  EXPECT_EQ(job_ended_key("resilience"), "resilience/ended");
  EXPECT_EQ(process_identity(3, 1), "process/3/1");
}

// The step every rank of a new epoch resumes at: the least of the survivors' (-1: a spare).
int agreed_step(const EpochGroups& g, int mine) {
  std::int64_t v = mine < 0 ? std::numeric_limits<std::int64_t>::max() : mine;
  g.world->allreduce(std::span<std::int64_t>(&v, 1), ReduceOp::min)->wait();
  return static_cast<int>(v);
}

// Each epoch's world: Gloo over the job's store, with the epoch's prefix.
WorldFactory gloo_worlds(const std::shared_ptr<Store>& store) {
  return [store](const std::string& prefix, int rank, int size) {
    GlooOptions o;
    o.timeout = 30s;
    o.prefix = prefix;
    o.store = store;
    o.rank = rank;
    o.size = size;
    return make_gloo_world(o);
  };
}

// Gloo ranks as threads: W = 4 (tp 2, dp 2) and one spare. Process 3 dies after step 1 (it
// closes every connection, as a killed process's kernel does); the others fail at their
// next collective, agree, regroup with process 4 as logical rank 3, and every later step's
// allreduce is right.
TEST(GlooRegroup, AWorldWhoseEpochIsMarkedFailedEndsAtOnceNotAtTheTimeout) {
  // Rank 1 of a world of 2 died before arriving: rank 0's world creation waits for it
  // under a 60 s timeout; once the epoch is marked failed (as launch does when it sees the
  // death) the build ends at once, naming the failure.
  auto store = make_memory_store();
  Recovery rec(store, RankMap(2, spares(0)), 0, fast(60s));
  std::jthread poster([&] {
    std::this_thread::sleep_for(300ms);
    (void)store->set_if_absent(epoch_failed_key("resilience", 0),
                               bytes("process 1: killed by signal 9"));
  });
  const auto t0 = std::chrono::steady_clock::now();
  try {
    (void)rec.build(gloo_worlds(store), tp_config(2, 1));
    ADD_FAILURE() << "the world was built without rank 1";
  } catch (const AbortedError& e) {
    EXPECT_NE(std::string(e.what()).find(
                  "resilience/epoch/0/failed is set to 'process 1: killed by signal 9'"),
              std::string::npos)
        << e.what();
  }
  // Ended by the key at 300 ms, not by the world's 30 s timeout; room for a loaded machine.
  EXPECT_LT(std::chrono::steady_clock::now() - t0, 20s);
}

TEST(GlooRegroup, ABatchOfGroupsWhoseEpochIsMarkedFailedEndsAtOnceNotAtTheTimeout) {
  // A world of 4 exists; rank 3 dies before it makes its groups. The others' batch
  // (create_groups, every group's connection on a thread of its own) waits for it under a
  // 60 s timeout, and ends at once when the epoch is marked failed: each connecting thread
  // watches the key as the calling thread does.
  auto store = make_memory_store();
  const auto factory = gloo_worlds(store);
  std::vector<std::string> errors(3);
  const auto t0 = std::chrono::steady_clock::now();
  {
    std::vector<std::jthread> ranks;
    for (int r = 0; r < 4; ++r)
      ranks.emplace_back([&, r] {
        auto world = factory("epoch/0/world", r, 4);
        world->set_timeout(60s);
        if (r == 3) return;  // dies here
        const WaitWatch watch(epoch_failed_key("resilience", 0));
        const std::vector<GroupSpec> specs{
            {{r - r % 2, r - r % 2 + 1}, "pair#" + std::to_string(r / 2)},
            {{0, 1, 2, 3}, "all"},
            {{r % 2, r % 2 + 2}, "parity#" + std::to_string(r % 2)}};
        try {
          (void)world->create_groups(specs);
          errors[static_cast<std::size_t>(r)] = "no error";
        } catch (const BackendError& e) { errors[static_cast<std::size_t>(r)] = e.what(); }
      });
    std::this_thread::sleep_for(300ms);
    (void)store->set_if_absent(epoch_failed_key("resilience", 0),
                               bytes("process 3: killed by signal 9"));
  }
  for (const std::string& e : errors)
    EXPECT_NE(e.find("resilience/epoch/0/failed is set to 'process 3: killed by signal 9'"),
              std::string::npos)
        << e;
  // Ended by the key at 300 ms, not by the 60 s timeout; room for a loaded machine.
  EXPECT_LT(std::chrono::steady_clock::now() - t0, 20s);
}

TEST(GlooRegroup, ARankDiesAndTheSpareTakesItsPlace) {
  auto store = make_memory_store();
  const ParallelConfig config = tp_config(4, 2);
  const RankMap m0(4, spares(1));
  constexpr int kSteps = 4;
  std::vector<std::string> errors(5);
  std::vector<std::vector<double>> sums(5);
  std::vector<std::int64_t> epochs(5, -1);
  std::vector<bool> proven(5, false);
  {
    std::vector<std::jthread> threads;
    for (std::int64_t p = 0; p < 5; ++p)
      threads.emplace_back([&, p] {
        try {
          Recovery rec(store, m0, p, fast(30s));
          rec.declare(config, {});
          const WorldFactory factory = gloo_worlds(store);
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
              g.groups->group(GroupKind::dp)
                  .allreduce(std::span<double>(&v, 1), ReduceOp::sum)
                  ->wait();
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
          // Every process declared the layout: epoch 1's decision proved it, and its groups
          // skipped the exchange.
          proven[static_cast<std::size_t>(p)] =
              rec.history().back().fingerprint == ProcessGroups::fingerprint(config, {});
          if (*rec.logical_rank() == 0) rec.mark_done();
        } catch (const std::exception& e) { errors[static_cast<std::size_t>(p)] = e.what(); }
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
  for (std::size_t p : {0u, 1u, 2u, 4u}) EXPECT_TRUE(proven[p]) << "process " << p;
}

// The same job, but the spare was given another layout (tp 1) than the others (tp 2): the
// decision that brings it in proves no fingerprint, so epoch 1's groups exchange it, and
// every rank of the epoch fails alike, naming tp, instead of making groups of two layouts.
TEST(GlooRegroup, ASpareGivenAnotherLayoutIsCaughtByTheExchangeNotTrusted) {
  auto store = make_memory_store();
  const ParallelConfig config = tp_config(4, 2), odd = tp_config(4, 1);
  const RankMap m0(4, spares(1));
  std::vector<std::string> errors(5);
  {
    std::vector<std::jthread> threads;
    for (std::int64_t p = 0; p < 5; ++p)
      threads.emplace_back([&, p] {
        try {
          Recovery rec(store, m0, p, fast(30s));
          const ParallelConfig& mine = p == 4 ? odd : config;
          rec.declare(mine, {});
          const WorldFactory factory = gloo_worlds(store);
          EpochGroups g = rec.build(factory, mine);
          if (!g.world) {
            if (rec.wait_for_failure()) g = rec.recover(factory, mine);
            return;
          }
          if (p == 3) return;  // dies: its groups close with it
          try {
            double v = 1;
            g.groups->group(GroupKind::dp)
                .allreduce(std::span<double>(&v, 1), ReduceOp::sum)
                ->wait();
            g.world->barrier()->wait();
            ADD_FAILURE() << "process " << p << ": the world outlived process 3";
          } catch (const BackendError& e) {
            rec.mark_failed(e.what());
            g = EpochGroups{};
            g = rec.recover(factory, mine);
          }
        } catch (const ConfigMismatchError& e) {
          errors[static_cast<std::size_t>(p)] = e.what();
        } catch (const std::exception& e) {
          errors[static_cast<std::size_t>(p)] = std::string("other: ") + e.what();
        }
      });
  }
  for (std::size_t p : {0u, 1u, 2u, 4u})
    EXPECT_NE(errors[p].find("ranks were given different tp"), std::string::npos)
        << "process " << p << ": " << errors[p];
}

// Shrink: tp 2 x dp 2 (replica 0 is ranks {0, 1}, replica 1 {2, 3}) without spares.
TEST(Shrink, WithoutSparesEverySurvivorAdoptsOneSmallerWorld) {
  auto store = make_memory_store();
  store->set(dead_process_key("resilience", 3, 0), bytes(std::string("SIGKILL")));
  const Agreed a = agree_all(store, RankMap(4, spares(0)), {0, 1, 2}, shrinking(tp_config(4, 2)));
  for (const auto& e : a.error) ASSERT_EQ(e, "");
  for (std::size_t i = 1; i < a.text.size(); ++i) {
    EXPECT_EQ(a.text[i], a.text[0]);
    EXPECT_EQ(a.map[i], a.map[0]);
  }
  EXPECT_NE(a.text[0].find("dead=3\n"), std::string::npos) << a.text[0];
  EXPECT_NE(a.text[0].find("shrink=2\n"), std::string::npos) << a.text[0];
  // Replica 1 lost rank 3: replica 0 goes on alone (dp 1); process 2 is a spare now.
  EXPECT_EQ(a.map[0], "epoch=1 world=2 processes=4 map=0,1 spare=2 dead=3");
  for (std::size_t i = 0; i < a.text.size(); ++i) {
    ASSERT_TRUE(a.config[i]) << i;
    EXPECT_EQ(a.config[i]->world_size, 2);
    EXPECT_EQ(a.config[i]->dp(), 1);
    ASSERT_TRUE(a.shrink[i]) << i;
    EXPECT_EQ(a.shrink[i]->old_ranks(), (std::vector<Rank>{0, 1}));
  }
  // A process that comes later (a restart, say) replays the decision to the same epoch.
  const Recovery late(store, RankMap(4, spares(0)), 2, shrinking(tp_config(4, 2)));
  EXPECT_EQ(late.map().canonical(), a.map[0]);
  ASSERT_TRUE(late.config());
  EXPECT_EQ(late.config()->world_size, 2);
}

TEST(Shrink, ProcessesWithDifferentShrinkOptionsFailRatherThanHang) {
  auto store = make_memory_store();
  store->set(dead_process_key("resilience", 3, 0), bytes(std::string("SIGKILL")));
  const RankMap m0(4, spares(0));
  std::vector<std::string> errors(3);
  {
    std::vector<std::jthread> threads;
    for (std::int64_t p = 0; p < 3; ++p)
      threads.emplace_back([&, p] {
        try {
          // Process 0, the decider, has no shrink: its decision keeps the world.
          RecoveryOptions o = shrinking(tp_config(4, 2));
          if (p == 0) o.shrink.reset();
          Recovery r(store, m0, p, o);
          (void)r.agree();
        } catch (const NoSpareError& e) {
          errors[static_cast<std::size_t>(p)] = std::string("NoSpareError: ") + e.what();
        } catch (const BackendError& e) {
          errors[static_cast<std::size_t>(p)] = std::string("BackendError: ") + e.what();
        } catch (const std::exception& e) {
          errors[static_cast<std::size_t>(p)] = std::string("other: ") + e.what();
        }
      });
  }
  EXPECT_NE(errors[0].find("NoSpareError: recovery: cannot go on without a spare: no spare left "
                           "for logical rank [3]"),
            std::string::npos)
      << errors[0];
  for (std::size_t p : {1u, 2u})
    EXPECT_NE(errors[p].find("BackendError: recovery: the decision for epoch 1 keeps the world, "
                             "this process's plan shrinks the world to 2"),
              std::string::npos)
        << errors[p];
}

TEST(Shrink, NoValidSmallerLayoutIsTheSameNoSpareErrorEverywhereAndEndsTheJob) {
  auto store = make_memory_store();
  ParallelConfig c = tp_config(4, 2);
  c.pp = 2;  // dp 1: no replica to drop
  store->set(dead_process_key("resilience", 3, 0), bytes(std::string("SIGKILL")));
  const Agreed a = agree_all(store, RankMap(4, spares(0)), {0, 1, 2}, shrinking(c));
  for (std::size_t i = 0; i < a.error.size(); ++i) {
    // A runtime event (RecoveryError), not bad input: not a ConfigError.
    EXPECT_EQ(a.kind[i], "NoSpareError") << a.error[i];
    EXPECT_EQ(a.error[i], a.error[0]);
  }
  EXPECT_NE(a.error[0].find("recovery: cannot go on without a spare: cannot shrink after logical "
                            "rank [3] failed"),
            std::string::npos)
      << a.error[0];
  // The job's end is posted once, with the same line, for launch to say.
  EXPECT_EQ(job_end_reason(*store, kResiliencePrefix), std::optional<std::string>(a.error[0]));
  // They agreed (one decision, no shrink in it) and then failed alike: no one timed out.
  ASSERT_TRUE(store->has(epoch_decision_key("resilience", 1)));
  const auto decision = store->get(epoch_decision_key("resilience", 1));
  EXPECT_EQ(std::string(decision.begin(), decision.end()).find("shrink="), std::string::npos);
}

TEST(Shrink, SparesAreUsedBeforeTheWorldShrinks) {
  auto store = make_memory_store();
  const RankMap m0(4, spares(1));
  const RecoveryOptions o = shrinking(tp_config(4, 2));
  store->set(dead_process_key("resilience", 3, 0), bytes(std::string("x")));
  const Agreed first = agree_all(store, m0, {0, 1, 2, 4}, o);
  for (const auto& e : first.error) ASSERT_EQ(e, "");
  EXPECT_EQ(first.map[0], "epoch=1 world=4 processes=5 map=0,1,2,4 spare= dead=3");
  EXPECT_FALSE(first.shrink[0]);
  EXPECT_EQ(first.text[0].find("shrink="), std::string::npos) << first.text[0];
  EXPECT_EQ(first.config[0]->world_size, 4);
  // No spare left: process 0 (rank 0, replica 0) dies; replica 1 (ranks 2 and 3, on
  // processes 2 and 4) goes on as ranks 0 and 1, process 1 becomes a spare.
  store->set(dead_process_key("resilience", 0, 0), bytes(std::string("x")));
  const Agreed second = agree_all(store, m0, {1, 2, 4}, o);  // each replays epoch 1 first
  for (const auto& e : second.error) ASSERT_EQ(e, "");
  for (std::size_t i = 1; i < second.text.size(); ++i) {
    EXPECT_EQ(second.text[i], second.text[0]);
    EXPECT_EQ(second.map[i], second.map[0]);
  }
  EXPECT_EQ(second.map[0], "epoch=2 world=2 processes=5 map=2,4 spare=1 dead=0,3");
  ASSERT_TRUE(second.shrink[0]);
  EXPECT_EQ(second.shrink[0]->old_ranks(), (std::vector<Rank>{2, 3}));
  EXPECT_EQ(second.config[0]->world_size, 2);
}

TEST(Shrink, OptionsThatDoNotFitTheJobAreRefusedAtTheStartAndZeroSparesWork) {
  SpareLaunch launch;
  launch.process = 1;
  launch.num_processes = 4;
  launch.spares = 0;
  launch.store = "memory";
  RecoveryOptions o;
  o.shrink = ShrinkOptions{tp_config(4, 2), 4};
  const auto rec = make_recovery(launch, o);
  EXPECT_EQ(rec->map().canonical(), "epoch=0 world=4 processes=4 map=0,1,2,3 spare= dead=");
  EXPECT_EQ(rec->logical_rank(), std::optional<Rank>(1));
  ASSERT_TRUE(rec->config());
  EXPECT_EQ(rec->config()->world_size, 4);
  o.shrink = ShrinkOptions{tp_config(8, 2), std::nullopt};
  try {
    (void)make_recovery(launch, o);
    ADD_FAILURE() << "no error";
  } catch (const IncompatibleError& e) {
    EXPECT_EQ(e.parameter(), "shrink");
    EXPECT_NE(std::string(e.what()).find("world_size 8 is not the map's world of 4"),
              std::string::npos)
        << e.what();
  }
  o.shrink = ShrinkOptions{tp_config(4, 2), 3};  // dp 2 does not divide 3
  EXPECT_THROW((void)make_recovery(launch, o), InvalidValueError);
  o.shrink = ShrinkOptions{tp_config(4, 2), std::nullopt};
  o.shrink->config.compat = Compat::head;
  EXPECT_THROW((void)make_recovery(launch, o), IncompatibleError);
}

// Gloo ranks as threads, tp 2 x dp 2 and no spare: process 3 dies before step 1; the others
// fail, agree on a world of 2 (replica 0, dp 1), and process 2 (replica 1's survivor) is a
// spare that waits for the end. Every step's world allreduce shows who took part.
TEST(GlooRegroup, WithoutASpareTheWorldShrinksToTheKeptReplica) {
  auto store = make_memory_store();
  const ParallelConfig config = tp_config(4, 2);
  const RecoveryOptions options = shrinking(config, 30s);
  const RankMap m0(4, spares(0));
  constexpr int kSteps = 4;
  std::vector<std::string> errors(4);
  std::vector<std::vector<double>> sums(4);
  std::vector<std::int64_t> epochs(4, -1), world(4, -1), tp(4, -1), dp(4, -1);
  std::vector<std::optional<Rank>> ranks(4);
  {
    std::vector<std::jthread> threads;
    for (std::int64_t p = 0; p < 4; ++p)
      threads.emplace_back([&, p] {
        const auto i = static_cast<std::size_t>(p);
        try {
          Recovery rec(store, m0, p, options);
          const WorldFactory factory = gloo_worlds(store);
          EpochGroups g = rec.build(factory, config);
          int step = 0;
          while (step < kSteps) {
            if (!g.world) {  // a spare: here, the dropped replica's survivor
              if (!rec.wait_for_failure()) break;
              g = rec.recover(factory, config);
              if (g.world) step = agreed_step(g, -1);
              continue;
            }
            if (p == 3 && step == 1) {
              // Dies (its groups close with it); launch would post its death.
              store->set(dead_process_key("resilience", 3, 0), bytes(std::string("SIGKILL")));
              return;
            }
            try {
              double v = (step + 1) * (static_cast<double>(*rec.logical_rank()) + 1);
              g.world->allreduce(std::span<double>(&v, 1), ReduceOp::sum)->wait();
              sums[i].push_back(v);
              ++step;
            } catch (const BackendError& e) {
              rec.mark_failed(e.what());
              g = EpochGroups{};
              g = rec.recover(factory, config);  // the caller's config: build follows config()
              if (!g.world) continue;
              world[i] = g.world->size();
              tp[i] = g.groups->group(GroupKind::tp).size();
              dp[i] = g.groups->group(GroupKind::dp).size();
              step = agreed_step(g, step);
              sums[i].resize(static_cast<std::size_t>(step));
            }
          }
          epochs[i] = rec.epoch();
          ranks[i] = rec.logical_rank();
          if (ranks[i] == std::optional<Rank>(0)) rec.mark_done();
        } catch (const std::exception& e) {
          errors[i] = e.what();
          // Let a waiting spare go: the test fails on the error, it does not hang.
          (void)store->set_if_absent("resilience/done", bytes(std::string("1")));
        }
      });
  }
  for (std::size_t p = 0; p < 4; ++p) EXPECT_EQ(errors[p], "") << "process " << p;
  // Epoch 0: ranks 0-3, sum (s+1)*10; epoch 1 from step 1: ranks 0 and 1, sum (s+1)*3.
  const std::vector<double> expected{10, 6, 9, 12};
  for (std::size_t p : {0u, 1u}) {
    EXPECT_EQ(sums[p], expected) << "process " << p;
    EXPECT_EQ(epochs[p], 1);
    EXPECT_EQ(ranks[p], std::optional<Rank>(static_cast<Rank>(p)));
    EXPECT_EQ(world[p], 2);
    EXPECT_EQ(tp[p], 2);
    EXPECT_EQ(dp[p], 1);
  }
  EXPECT_EQ(sums[2], std::vector<double>{10});
  EXPECT_EQ(epochs[2], 1);
  EXPECT_FALSE(ranks[2]);
}

}  // namespace
}  // namespace commgrid
