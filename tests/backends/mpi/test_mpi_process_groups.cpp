// ProcessGroups and the collections on real MPI processes. Every assertion holds for any
// world size: the configs tried are those valid for the launch's world size.
#include <gtest/gtest.h>

#include <algorithm>
#include <functional>
#include <numeric>

#include "commgrid/collections.hpp"
#include "commgrid/mpi.hpp"
#include "commgrid/process_groups.hpp"

namespace commgrid::test {
namespace {

using namespace std::chrono_literals;

constexpr CreationStrategy kStrategies[] = {CreationStrategy::split, CreationStrategy::member,
                                            CreationStrategy::per_group};

std::unique_ptr<MpiCommunicator> make_world() { return make_mpi_world({.timeout = 60s}); }

std::string contains_msg(const std::string& what, const std::string& part) {
  return "\"" + what + "\" should contain \"" + part + "\"";
}
#define EXPECT_CONTAINS(what, part) \
  EXPECT_NE(std::string(what).find(part), std::string::npos) << contains_msg(what, part)

// Configs worth trying, kept when valid for world size W.
std::vector<ParallelConfig> configs_for(std::int64_t W) {
  std::vector<ParallelConfig> all;
  auto add = [&](std::function<void(ParallelConfig&)> f) {
    ParallelConfig c;
    c.world_size = W;
    f(c);
    try {
      c.validate();
      all.push_back(c);
    } catch (const ConfigError&) {}
  };
  add([](ParallelConfig&) {});
  add([](ParallelConfig& c) {
    c.tp = 2;
    c.pp = 2;
    c.cp = 2;
  });
  add([](ParallelConfig& c) {
    c.tp = 2;
    c.pp = 2;
    c.ep = 2;
    c.etp = 1;
    c.dist_opt_instances = 2;
  });
  add([](ParallelConfig& c) {
    c.pp = 4;
    c.vpp = 2;
  });
  add([](ParallelConfig& c) {
    c.cp = 4;
    c.hcp = {2, 2};
  });
  add([](ParallelConfig& c) {
    c.tp = 2;
    c.pp = 2;
    c.order = "tp-pp-dp";
  });
  add([](ParallelConfig& c) {
    c.cp = 2;
    c.ep = 2;
    c.etp = 1;
  });
  add([](ParallelConfig& c) { c.dist_opt_instances = 2; });
  add([](ParallelConfig& c) {
    c.pp = 2;
    c.vpp = 3;
    c.tp = 2;
    c.dist_opt_instances = 2;
  });
  return all;
}

std::vector<std::int64_t> sorted_copy(std::vector<Rank> v) {
  std::sort(v.begin(), v.end());
  return v;
}

// Every created kind against the layout, and over the wire.
void check_groups(const ProcessGroups& pg, Communicator& world) {
  const Layout& layout = pg.layout();
  const Rank me = world.rank();
  for (GroupKind k : pg.kinds()) {
    for (int level = 0; level < layout.levels(k); ++level) {
      SCOPED_TRACE(std::string(kind_name(k)) + " level " + std::to_string(level));
      const auto ref = layout.group_of(k, me, level);
      ASSERT_EQ(pg.has_group(k, level), ref.has_value());
      if (!ref) {
        EXPECT_THROW((void)pg.group(k, level), NoGroupError);
        EXPECT_CONTAINS(pg.no_group_reason(k, level), "is in no");
        continue;
      }
      EXPECT_TRUE(pg.no_group_reason(k, level).empty());
      EXPECT_EQ(pg.size(k, level), static_cast<int>(ref->members.size()));
      EXPECT_EQ(pg.rank(k, level), ref->comm_rank);
      EXPECT_EQ(pg.global_ranks(k, level), ref->members);
      EXPECT_EQ(pg.group_index(k, level), ref->index);
      Communicator& c = pg.group(k, level);
      EXPECT_EQ(c.size(), pg.size(k, level));
      EXPECT_EQ(c.rank(), pg.rank(k, level));
      std::vector<std::int64_t> got(static_cast<std::size_t>(c.size()));
      c.allgather(&me, got.data(), 1, DataType::int64)->wait();
      EXPECT_EQ(got, sorted_copy(ref->members));
    }
  }
}

// The named getters of spec §9 against the layout.
void check_getters(ProcessGroups& pg, Communicator& world) {
  const Layout& L = pg.layout();
  const ParallelConfig& c = L.config();
  const Rank me = world.rank();
  auto g = [&](GroupKind k) { return *L.group_of(k, me); };
  EXPECT_EQ(pg.world_rank(), me);
  EXPECT_EQ(pg.world_size(), world.size());
  EXPECT_EQ(pg.tensor_model_parallel_src_rank(), g(GroupKind::tp).members.front());
  EXPECT_EQ(pg.model_parallel_src_rank(), g(GroupKind::mp).members.front());
  EXPECT_EQ(pg.data_parallel_src_rank(), g(GroupKind::dp).members.front());
  EXPECT_EQ(pg.data_parallel_src_rank(true), g(GroupKind::dp_cp).members.front());
  EXPECT_EQ(pg.data_parallel_rank(), g(GroupKind::dp).comm_rank);
  EXPECT_EQ(pg.data_parallel_size(true), static_cast<int>(g(GroupKind::dp_cp).members.size()));
  EXPECT_EQ(pg.data_parallel_rank(true, true), g(GroupKind::intra_dp_cp).comm_rank);
  EXPECT_EQ(pg.data_parallel_size(true, true),
            static_cast<int>(g(GroupKind::intra_dp_cp).members.size()));
  EXPECT_THROW((void)pg.data_parallel_rank(false, true), InvalidValueError);
  EXPECT_EQ(pg.expert_data_parallel_rank(), g(GroupKind::expt_dp).comm_rank);
  EXPECT_EQ(pg.expert_data_parallel_size(true),
            static_cast<int>(g(GroupKind::intra_expt_dp).members.size()));

  const GroupRef pp = g(GroupKind::pp);
  const auto n = static_cast<std::int64_t>(pp.members.size());
  EXPECT_EQ(pg.pipeline_first_rank(), pp.members.front());
  EXPECT_EQ(pg.pipeline_last_rank(), pp.members.back());
  EXPECT_EQ(pg.pipeline_next_rank(), pp.members[static_cast<std::size_t>((pp.position + 1) % n)]);
  EXPECT_EQ(pg.pipeline_prev_rank(),
            pp.members[static_cast<std::size_t>((pp.position + n - 1) % n)]);
  if (c.pp == 1) {
    EXPECT_EQ(pg.pipeline_next_rank(), me);
    EXPECT_EQ(pg.pipeline_prev_rank(), me);
  }
  const std::int64_t stage = L.coordinates(me).pp;
  EXPECT_EQ(pg.is_pipeline_first_stage(), stage == 0);
  EXPECT_EQ(pg.is_pipeline_last_stage(), stage == c.pp - 1);
  EXPECT_EQ(pg.is_rank_in_embedding_group(), L.group_of(GroupKind::embd, me).has_value());
  EXPECT_EQ(pg.is_rank_in_position_embedding_group(),
            L.group_of(GroupKind::pos_embd, me).has_value());
  if (c.vpp) {
    const int vpp = static_cast<int>(*c.vpp);
    EXPECT_EQ(pg.virtual_pipeline_rank(), 0);
    EXPECT_EQ(pg.virtual_pipeline_size(), vpp);
    EXPECT_EQ(pg.is_pipeline_first_stage(0), stage == 0);
    EXPECT_FALSE(pg.is_pipeline_first_stage(1));
    EXPECT_EQ(pg.is_pipeline_last_stage(vpp - 1), stage == c.pp - 1);
    EXPECT_FALSE(pg.is_pipeline_last_stage(0));
    // Virtual-aware embedding: the first stage only at vstage 0, the last only at vpp-1.
    if (L.group_of(GroupKind::embd, me)) {
      EXPECT_EQ(pg.is_rank_in_embedding_group(0), stage == 0);
      EXPECT_EQ(pg.is_rank_in_embedding_group(vpp - 1), stage == c.pp - 1);
    }
    EXPECT_THROW((void)pg.is_pipeline_first_stage(vpp), InvalidValueError);
    pg.set_virtual_pipeline_rank(vpp - 1);
    EXPECT_EQ(pg.virtual_pipeline_rank(), vpp - 1);
    EXPECT_THROW(pg.set_virtual_pipeline_rank(vpp), InvalidValueError);
    EXPECT_THROW(pg.set_virtual_pipeline_rank(-1), InvalidValueError);
  } else {
    EXPECT_EQ(pg.virtual_pipeline_rank(), std::nullopt);
    EXPECT_EQ(pg.virtual_pipeline_size(), std::nullopt);
    EXPECT_THROW((void)pg.is_pipeline_first_stage(0), InvalidValueError);
    EXPECT_THROW(pg.set_virtual_pipeline_rank(0), InvalidValueError);
  }
  EXPECT_EQ(&pg.amax_reduction_group(true, false), &pg.group(GroupKind::tp_dp_cp));
  EXPECT_EQ(&pg.amax_reduction_group(true, true), &pg.group(GroupKind::tp_cp));
  EXPECT_EQ(&pg.amax_reduction_group(false, false), &pg.group(GroupKind::tp_dp));
  EXPECT_EQ(&pg.amax_reduction_group(false, true), &pg.group(GroupKind::tp));
  EXPECT_EQ(pg.all_ranks(), std::to_string(g(GroupKind::tp).comm_rank) + "_" +
                                std::to_string(g(GroupKind::dp).comm_rank) + "_" +
                                std::to_string(g(GroupKind::cp).comm_rank) + "_" +
                                std::to_string(g(GroupKind::pp).comm_rank) + "_" +
                                std::to_string(g(GroupKind::ep).comm_rank));
  // With one instance the partial groups are their parents' communicators.
  if (c.dist_opt_instances == 1) {
    EXPECT_EQ(&pg.group(GroupKind::intra_dp_cp), &pg.group(GroupKind::dp_cp));
    EXPECT_EQ(&pg.group(GroupKind::intra_expt_dp), &pg.group(GroupKind::expt_dp));
    EXPECT_FALSE(pg.has_group(GroupKind::inter_dist_opt));
    EXPECT_CONTAINS(pg.no_group_reason(GroupKind::inter_dist_opt),
                    "does not exist for this config");
  }
}

// Creation calls per strategy (spec §11): split one per kind and level, member at most
// that, per-group one per group of every kind.
void check_creation_counts(const ProcessGroups& pg) {
  std::int64_t calls = 0, rows = 0, groups = 0;
  for (const KindCreation& s : pg.creation_stats()) {
    calls += s.creation_calls;
    if (s.alias) {
      EXPECT_EQ(s.creation_calls, 0) << s.label;
      continue;
    }
    ++rows;
    groups += pg.layout().num_groups(s.kind, s.level);
  }
  switch (pg.strategy()) {
    case CreationStrategy::split: EXPECT_EQ(calls, rows); break;
    case CreationStrategy::member: EXPECT_LE(calls, rows); break;
    case CreationStrategy::per_group: EXPECT_EQ(calls, groups); break;
  }
}

TEST(MpiProcessGroups, GettersBeforeInitializeNameTheCall) {
  ProcessGroups pg;
  EXPECT_FALSE(pg.is_initialized());
  const std::vector<std::pair<std::string, std::function<void()>>> calls = {
      {"size", [&] { (void)pg.size(GroupKind::tp); }},
      {"group", [&] { (void)pg.group(GroupKind::dp); }},
      {"pipeline_next_rank", [&] { (void)pg.pipeline_next_rank(); }},
      {"is_pipeline_first_stage", [&] { (void)pg.is_pipeline_first_stage(); }},
      {"virtual_pipeline_rank", [&] { (void)pg.virtual_pipeline_rank(); }},
      {"data_parallel_rank", [&] { (void)pg.data_parallel_rank(); }},
      {"all_ranks", [&] { (void)pg.all_ranks(); }},
      {"layout", [&] { (void)pg.layout(); }},
  };
  for (const auto& [name, call] : calls) {
    try {
      call();
      ADD_FAILURE() << name << " before initialize must throw";
    } catch (const StateError& e) {
      EXPECT_EQ(std::string(e.what()),
                "ProcessGroups::" + name +
                    ": parallel state is not initialized; call initialize() first");
    }
  }
  pg.destroy();  // harmless when not initialized
}

TEST(MpiProcessGroups, EveryConfigAndStrategyMatchesTheLayout) {
  auto world = make_world();
  const auto configs = configs_for(world->size());
  ASSERT_FALSE(configs.empty());
  for (const ParallelConfig& c : configs) {
    for (CreationStrategy s : kStrategies) {
      SCOPED_TRACE(c.canonical() + " strategy " + std::string(strategy_name(s)));
      ProcessGroups pg;
      InitOptions o;
      o.strategy = s;
      pg.initialize(*world, c, o);
      ASSERT_TRUE(pg.is_initialized());
      EXPECT_EQ(pg.kinds(), pg.layout().kinds());
      check_groups(pg, *world);
      check_getters(pg, *world);
      check_creation_counts(pg);
    }
  }
}

TEST(MpiProcessGroups, DestroyThenInitializeAgainAndDoubleInitialize) {
  auto world = make_world();
  ParallelConfig c = configs_for(world->size()).back();
  ProcessGroups pg;
  pg.initialize(*world, c);
  try {
    pg.initialize(*world, c);
    ADD_FAILURE() << "a second initialize must throw";
  } catch (const StateError& e) {
    EXPECT_STREQ(
        e.what(),
        "ProcessGroups::initialize: parallel state is already initialized; destroy it first");
  }
  EXPECT_TRUE(pg.is_initialized()) << "the failed second call must not undo the first";
  pg.destroy();
  EXPECT_FALSE(pg.is_initialized());
  EXPECT_THROW((void)pg.size(GroupKind::tp), StateError);
  EXPECT_THROW((void)pg.tensor_model_parallel_src_rank(), StateError);
  EXPECT_THROW((void)pg.is_rank_in_embedding_group(), StateError);
  // Again, with a different config and strategy: nothing of the old state is left.
  ParallelConfig d;
  d.world_size = world->size();
  InitOptions o;
  o.strategy = CreationStrategy::split;
  o.timeout = 7s;
  pg.initialize(*world, d, o);
  EXPECT_EQ(pg.size(GroupKind::tp), 1);
  EXPECT_EQ(pg.group(GroupKind::dp).timeout(), 7s);
  EXPECT_EQ(pg.virtual_pipeline_rank(), std::nullopt);
  check_groups(pg, *world);
}

TEST(MpiProcessGroups, KindSubsetAndKindsThatDoNotExist) {
  auto world = make_world();
  ParallelConfig c;
  c.world_size = world->size();
  for (CreationStrategy s : kStrategies) {
    ProcessGroups pg;
    InitOptions o;
    o.strategy = s;
    o.kinds = {GroupKind::pp, GroupKind::tp, GroupKind::intra_dp_cp};  // any order
    pg.initialize(*world, c, o);
    EXPECT_EQ(pg.kinds(),
              (std::vector<GroupKind>{GroupKind::intra_dp_cp, GroupKind::tp, GroupKind::pp}));
    check_groups(pg, *world);
    EXPECT_FALSE(pg.has_group(GroupKind::dp));
    try {
      (void)pg.group(GroupKind::dp);
      ADD_FAILURE() << "dp was not created";
    } catch (const NoGroupError& e) {
      EXPECT_STREQ(e.what(),
                   "ProcessGroups::group(dp): dp was not created (not in InitOptions::kinds)");
    }
    // Pipeline getters work from the created pp kind; all_ranks from the layout.
    EXPECT_EQ(pg.pipeline_next_rank(), world->rank());
    EXPECT_FALSE(pg.all_ranks().empty());
  }
  ProcessGroups pg;
  InitOptions o;
  o.kinds = {GroupKind::inter_dist_opt};
  try {
    pg.initialize(*world, c, o);
    ADD_FAILURE() << "inter_dist_opt does not exist with one instance";
  } catch (const UnknownKindError& e) {
    EXPECT_CONTAINS(e.what(),
                    "\"inter_dist_opt\" does not exist for this config (dist_opt_instances = 1)");
  }
  EXPECT_FALSE(pg.is_initialized());
}

TEST(MpiProcessGroups, ConfigMismatchFailsOnEveryRankNamingFieldAndRanks) {
  auto world = make_world();
  const int W = world->size(), me = world->rank();
  if (W < 2) GTEST_SKIP() << "needs two ranks";
  const int half = W / 2;
  auto ranges = [](int lo, int hi) {
    return (hi - lo > 1 ? "ranks " + std::to_string(lo) + "-" : "rank ") + std::to_string(hi - 1);
  };
  ParallelConfig c;
  c.world_size = W;
  c.tp = me < half ? 1 : 2;  // the upper half's config may not even be valid: no matter
  ProcessGroups pg;
  try {
    pg.initialize(*world, c);
    ADD_FAILURE() << "ranks disagree: initialize must throw";
  } catch (const ConfigMismatchError& e) {
    EXPECT_EQ(e.parameter(), "tp");
    EXPECT_EQ(std::string(e.what()), "config mismatch: ranks were given different tp: tp = 1 on " +
                                         ranges(0, half) + "; tp = 2 on " + ranges(half, W) +
                                         " (every rank must get the same config and options)");
  }
  EXPECT_FALSE(pg.is_initialized());

  // Options are compared too: ranks using different strategies would wait for each other.
  c.tp = 1;
  InitOptions o;
  o.strategy = me == W - 1 ? CreationStrategy::split : CreationStrategy::member;
  try {
    pg.initialize(*world, c, o);
    ADD_FAILURE() << "strategies differ: initialize must throw";
  } catch (const ConfigMismatchError& e) {
    EXPECT_EQ(e.parameter(), "strategy");
    EXPECT_CONTAINS(e.what(), "strategy = split on rank " + std::to_string(W - 1));
  }

  // Custom embedding policies are compared by what they return.
  if (W % 2 == 0) {
    c.pp = 2;
    InitOptions p;
    p.policies.embedding = [me](std::span<const Rank> g) {
      return me == 0 ? std::vector<Rank>{g.front()} : std::vector<Rank>{g.back()};
    };
    try {
      pg.initialize(*world, c, p);
      ADD_FAILURE() << "policies differ: initialize must throw";
    } catch (const ConfigMismatchError& e) { EXPECT_EQ(e.parameter(), "embedding policy"); }
    // The same custom policy everywhere: accepted, and followed.
    p.policies.embedding = [](std::span<const Rank> g) { return std::vector<Rank>{g.back()}; };
    pg.initialize(*world, c, p);
    EXPECT_EQ(pg.is_rank_in_embedding_group(), pg.is_pipeline_last_stage());
    check_groups(pg, *world);
    pg.destroy();
  }

  // Agreement again: works.
  c.pp = 1;
  pg.initialize(*world, c);
  EXPECT_TRUE(pg.is_initialized());
}

TEST(MpiProcessGroups, BadConfigOrWorldSizeFailsOnEveryRank) {
  auto world = make_world();
  const int W = world->size();
  ProcessGroups pg;
  ParallelConfig c;
  c.world_size = W;
  c.tp = W + 1;
  EXPECT_THROW(pg.initialize(*world, c), DivisibilityError);
  c.tp = 1;
  c.world_size = 2 * W;
  try {
    pg.initialize(*world, c);
    ADD_FAILURE() << "world size differs from the communicator's";
  } catch (const InvalidValueError& e) {
    EXPECT_EQ(std::string(e.what()), "world_size: the config says " + std::to_string(2 * W) +
                                         " ranks but the world communicator has " +
                                         std::to_string(W));
  }
  EXPECT_FALSE(pg.is_initialized());
}

// ---- collections ------------------------------------------------------------------

TEST(MpiCollections, FromStateFillsEveryFieldWithAGroupOrAReason) {
  auto world = make_world();
  const int W = world->size(), me = world->rank();
  ParallelConfig c;
  c.world_size = W;
  if (W % 4 == 0) {
    c.pp = 4;  // the middle stages have no embd group, later stages no pos_embd group
    c.vpp = 2;
  }
  ProcessGroups pg;
  EXPECT_THROW((void)ModelCommProcessGroups::from_state(pg), StateError);
  pg.initialize(*world, c);

  const auto model = ModelCommProcessGroups::from_state(pg);
  for (GroupKind k : ModelCommProcessGroups::kFields) {
    const std::string name(kind_name(k));
    ASSERT_TRUE(model.is_set(name)) << name;
    const GroupField& f = model.field(name);
    if (k == GroupKind::hcp) {
      EXPECT_FALSE(f.has_group());
      EXPECT_EQ(f.reason(), "hcp does not exist for this config (no hcp sizes given)");
      continue;
    }
    EXPECT_EQ(f.has_group(), pg.has_group(k)) << name;
    if (f.has_group()) {
      EXPECT_EQ(f.get(), &pg.group(k)) << name;
      EXPECT_EQ(&*f, &pg.group(k));
    } else {
      EXPECT_EQ(f.get(), nullptr);
      EXPECT_CONTAINS(f.reason(), "rank " + std::to_string(me) + " is in no " + name + " group");
      try {
        (void)*f;
        ADD_FAILURE() << "no group: dereferencing must throw";
      } catch (const NoGroupError& e) {
        EXPECT_CONTAINS(e.what(), "ModelCommProcessGroups." + name + ": this rank has no group");
      }
    }
  }
  EXPECT_EQ(model.tp().get(), &pg.group(GroupKind::tp));
  EXPECT_CONTAINS(model.summary(), "ModelCommProcessGroups{tp: tp#" +
                                       std::to_string(pg.group_index(GroupKind::tp)) + " (1 rank)");
  EXPECT_EQ(model, ModelCommProcessGroups::from_state(pg));

  const auto grad = GradCommProcessGroups::from_state(pg);
  EXPECT_EQ(grad.dp().get(), &pg.group(GroupKind::dp));
  EXPECT_EQ(grad.intra_dp_cp().get(), grad.dp_cp().get()) << "one instance: the same communicator";
  EXPECT_FALSE(grad.inter_dist_opt().has_group());
  EXPECT_EQ(grad.inter_dist_opt().reason(),
            "inter_dist_opt does not exist for this config (dist_opt_instances = 1)");

  // The collection keeps its groups alive after destroy().
  pg.destroy();
  std::int64_t x = 1;
  grad.dp()->allreduce(&x, &x, 1, DataType::int64, ReduceOp::sum)->wait();
  EXPECT_EQ(x, grad.dp()->size());
}

TEST(MpiCollections, HcpAndDistOptFields) {
  auto world = make_world();
  const int W = world->size();
  ParallelConfig c;
  c.world_size = W;
  if (W % 4 == 0) {
    c.cp = 4;
    c.hcp = {2, 2};
  }
  if (W % 2 == 0) c.dist_opt_instances = 2;
  ProcessGroups pg;
  pg.initialize(*world, c);
  const auto model =
      ModelCommProcessGroups::from_state(pg, std::vector<std::string>{"hcp", "tp", "hcp"});
  if (!c.hcp.empty()) {
    ASSERT_TRUE(model.hcp().has_group());
    ASSERT_EQ(model.hcp().handles().size(), 2u);
    EXPECT_EQ(&model.hcp().level(1), &pg.group(GroupKind::hcp, 1));
    EXPECT_CONTAINS(model.summary(), "hcp: [hcp[0]#");
  }
  EXPECT_FALSE(model.is_set("cp"));
  try {
    (void)model.cp();
    ADD_FAILURE() << "cp was not required: reading it must throw";
  } catch (const UnsetFieldError& e) {
    EXPECT_CONTAINS(e.what(), "ModelCommProcessGroups.cp is unset; set it with set(\"cp\", group)");
  }
  EXPECT_CONTAINS(
      model.summary(),
      "; unset: pp, mp, embd, pos_embd, cp, tp_cp, ep, expt_tp, tp_ep, tp_ep_pp, expt_dp}");
  const auto grad = GradCommProcessGroups::from_state(pg);
  if (c.dist_opt_instances == 2) {
    ASSERT_TRUE(grad.inter_dist_opt().has_group());
    EXPECT_EQ(grad.inter_dist_opt()->size(), 2);
    EXPECT_NE(grad.intra_dp_cp().get(), grad.dp_cp().get());
  }
}

TEST(MpiCollections, NamesAreCheckedAndListed) {
  auto world = make_world();
  ParallelConfig c;
  c.world_size = world->size();
  ProcessGroups pg;
  pg.initialize(*world, c);
  const std::string model_valid =
      "valid: tp, pp, mp, embd, pos_embd, cp, tp_cp, hcp, ep, expt_tp, tp_ep, tp_ep_pp, expt_dp";
  try {
    (void)ModelCommProcessGroups::from_state(pg,
                                             std::vector<std::string>{"tp", "foo", "dp", "bar"});
    ADD_FAILURE() << "invalid names must throw";
  } catch (const UnknownKindError& e) {
    EXPECT_EQ(std::string(e.what()),
              "invalid process groups requested for ModelCommProcessGroups: "
              "\"foo\", \"dp\", \"bar\"; " +
                  model_valid);
  }
  try {
    (void)GradCommProcessGroups::from_state(pg, std::vector<std::string>{"tp"});
    ADD_FAILURE() << "tp is not a field of GradCommProcessGroups";
  } catch (const UnknownKindError& e) {
    EXPECT_EQ(std::string(e.what()),
              "invalid process groups requested for GradCommProcessGroups: \"tp\"; valid: dp, "
              "dp_cp, expt_dp, intra_dp_cp, intra_expt_dp, inter_dist_opt");
  }
  const GroupHandle tp = pg.group_handle(GroupKind::tp);
  try {
    ModelCommProcessGroups m{{"tp", tp}, {"foo", tp}, {"dp", tp}};
    ADD_FAILURE() << "unknown names must throw";
  } catch (const UnknownKindError& e) {
    EXPECT_EQ(std::string(e.what()),
              "unknown group kinds \"foo\", \"dp\" for ModelCommProcessGroups; " + model_valid);
  }
  ModelCommProcessGroups m{
      {"tp", tp}, {"embd", NoGroup{"not on an embedding stage"}}, {"cp", GroupHandle()}};
  EXPECT_EQ(m.tp().get(), tp.get());
  EXPECT_EQ(m.embd().reason(), "not on an embedding stage");
  EXPECT_EQ(m.cp().reason(), "set to a null handle");
  EXPECT_THROW(m.set("pp", std::vector<GroupHandle>{tp, tp}), InvalidValueError);
  EXPECT_THROW((void)m.is_set("dp"), UnknownKindError);
  EXPECT_THROW((void)m.field("foo"), UnknownKindError);
  EXPECT_EQ(m.summary(),
            "ModelCommProcessGroups{tp: " + tp->name() +
                " (1 rank), embd: none (not on an embedding stage), cp: none (set to a "
                "null handle); unset: pp, mp, pos_embd, tp_cp, hcp, ep, expt_tp, tp_ep, "
                "tp_ep_pp, expt_dp}");
  GradCommProcessGroups grad;
  EXPECT_EQ(
      grad.summary(),
      "GradCommProcessGroups{unset: dp, dp_cp, expt_dp, intra_dp_cp, intra_expt_dp, inter_dist_opt}");
  grad.set("dp", pg.group_handle(GroupKind::dp));
  EXPECT_TRUE(grad.dp().has_group());
  EXPECT_THROW((void)grad.dp_cp(), UnsetFieldError);
}

}  // namespace
}  // namespace commgrid::test
