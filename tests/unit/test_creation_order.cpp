// The per-group strategy's creation order (creation_order.hpp), pure:
// - compat head against the new_group sequences recorded from Megatron-core HEAD's own
//   parallel_state.py (tests/data/head_creation_order, made by tools/head_creation_order.py);
// - compat seed against the seed's sequence written out by hand from layout-semantics §11;
// - aliases, subsets of kinds and bad kinds.
#include <gtest/gtest.h>

#include <algorithm>
#include <cctype>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <set>
#include <tuple>

#include "commgrid/creation_order.hpp"
#include "commgrid/error.hpp"
#include "make_config.hpp"

namespace commgrid {
namespace {

using Json = nlohmann::json;

// The generator writes commgrid's own JSON names; an unknown key fails the test rather than
// being dropped silently.
ParallelConfig config_from_json(const Json& j) {
  ParallelConfig c;
  for (const auto& [key, v] : j.items()) {
    if (key == "compat") c.compat = v.get<std::string>() == "head" ? Compat::head : Compat::seed;
    else if (key == "world_size") c.world_size = v.get<std::int64_t>();
    else if (key == "tp") c.tp = v.get<std::int64_t>();
    else if (key == "pp") c.pp = v.get<std::int64_t>();
    else if (key == "cp") c.cp = v.get<std::int64_t>();
    else if (key == "ep") c.ep = v.get<std::int64_t>();
    else if (key == "etp") c.etp = v.get<std::int64_t>();
    else if (key == "hcp") c.hcp = v.get<std::vector<std::int64_t>>();
    else if (key == "dist_opt_instances") c.dist_opt_instances = v.get<std::int64_t>();
    else if (key == "vpp") c.vpp = v.get<std::int64_t>();
    else if (key == "order") c.order = v.get<std::string>();
    else if (key == "gtp_remat") c.gtp_remat = v.get<std::int64_t>();
    else if (key == "expert_gtp_remat") c.expert_gtp_remat = v.get<std::int64_t>();
    else if (key == "hybrid_context_parallel") c.hybrid_context_parallel = v.get<bool>();
    else if (key == "all_gather_groups") c.all_gather_groups = v.get<bool>();
    else if (key == "rank_offset") c.rank_offset = v.get<std::int64_t>();
    else if (key == "local_world_size") c.local_world_size = v.get<std::int64_t>();
    else ADD_FAILURE() << "config key " << key << " not understood by this test";
  }
  return c;
}

std::vector<std::string> data_files() {
  std::vector<std::string> names;
  for (const auto& e : std::filesystem::directory_iterator(COMMGRID_CREATION_ORDER_DIR))
    if (e.path().extension() == ".json") names.push_back(e.path().filename().string());
  std::sort(names.begin(), names.end());
  return names;
}

std::string text(std::span<const Rank> v) {
  std::string s = "[";
  for (std::size_t i = 0; i < v.size(); ++i) s += (i ? "," : "") + std::to_string(v[i]);
  return s + "]";
}

class HeadCreationOrder : public ::testing::TestWithParam<std::string> {};

// Every new_group call HEAD makes (less its Gloo twins, which commgrid does not create) is
// the step at the same position of creation_sequence: same kind, level and members in the
// same order; and each step's index names that group in Layout::groups.
TEST_P(HeadCreationOrder, MatchesRecordFromMegatronHead) {
  std::ifstream in(std::filesystem::path(COMMGRID_CREATION_ORDER_DIR) / GetParam());
  const Json rec = Json::parse(in);
  const Layout layout(config_from_json(rec["config"]));
  ASSERT_EQ(layout.config().compat, Compat::head);
  const std::vector<CreationStep> got = creation_sequence(layout);

  std::size_t pos = 0, gloo = 0;
  for (const Json& call : rec["calls"]) {
    if (!call["backend"].is_null()) {
      EXPECT_EQ(call["backend"], "gloo");
      ++gloo;
      continue;
    }
    ASSERT_LT(pos, got.size()) << GetParam() << ": commgrid stops after " << got.size()
                               << " calls; HEAD goes on with " << call.dump();
    const CreationStep& s = got[pos];
    const auto want_members = call["ranks"].get<std::vector<Rank>>();
    ASSERT_EQ(kind_name(s.kind), call["kind"].get<std::string>())
        << GetParam() << ": call " << pos << " (HEAD: " << call.dump() << ")";
    ASSERT_EQ(s.level, call["level"].get<int>()) << GetParam() << ": call " << pos;
    if (call.contains("n")) {
      ASSERT_EQ(layout.level_name(s.kind, s.level),
                "hybrid_dp_cp_" + std::to_string(call["n"].get<int>()));
    }
    ASSERT_EQ(s.members, want_members)
        << GetParam() << ": call " << pos << " " << kind_name(s.kind) << " got " << text(s.members)
        << " HEAD " << call["ranks"].dump();
    const GroupList groups = layout.groups(s.kind, s.level);
    ASSERT_LT(static_cast<std::size_t>(s.index), groups.size());
    const auto g = groups[static_cast<std::size_t>(s.index)];
    EXPECT_EQ(std::vector<Rank>(g.begin(), g.end()), s.members) << GetParam() << ": call " << pos;
    ++pos;
  }
  EXPECT_EQ(pos, got.size()) << GetParam() << ": commgrid makes more calls than HEAD";
  EXPECT_GT(pos, 0u);
  // HEAD's Gloo twins exist exactly when its create_gloo_process_groups stays on (no gtp).
  if (layout.config().gtp_remat == 1) { EXPECT_GT(gloo, 0u) << GetParam(); }
}

INSTANTIATE_TEST_SUITE_P(Records, HeadCreationOrder, ::testing::ValuesIn(data_files()),
                         [](const auto& info) {
                           std::string s = info.param.substr(0, info.param.size() - 5);
                           for (char& ch : s)
                             if (!std::isalnum(static_cast<unsigned char>(ch))) ch = '_';
                           return s;
                         });

// (kind, number of consecutive calls) of a sequence.
std::vector<std::pair<std::string, int>> runs(const std::vector<CreationStep>& steps) {
  std::vector<std::pair<std::string, int>> out;
  for (const CreationStep& s : steps) {
    const std::string k(kind_name(s.kind));
    if (!out.empty() && out.back().first == k) ++out.back().second;
    else out.emplace_back(k, 1);
  }
  return out;
}

// Spec §11's example (a): 107 calls on 16 ranks with tp 2, pp 2, cp 2, in the seed's order,
// counted by hand: dp 8, dp_cp 4 (intra_dp_cp is its alias), cp 8, mp 4, tp 8, then pp,
// embd, pos_embd for each of the 8 pipelines, tp_dp_cp 2, tp_dp 4, tp_cp 4, ep 16, expt_tp 8,
// tp_ep 8, tp_ep_pp 4, expt_dp 4, intra_dist_opt 1.
TEST(SeedCreationOrder, ExampleAIsTheSeedSequence) {
  const Layout layout(test::make_config(16, 2, 2, 2));
  const std::vector<CreationStep> steps = creation_sequence(layout);
  EXPECT_EQ(steps.size(), 107u);
  std::vector<std::pair<std::string, int>> want = {
      {"dp", 8}, {"dp_cp", 4}, {"cp", 8}, {"mp", 4}, {"tp", 8}};
  for (int i = 0; i < 8; ++i) {
    want.emplace_back("pp", 1);
    want.emplace_back("embd", 1);
    want.emplace_back("pos_embd", 1);
  }
  for (auto r : std::vector<std::pair<std::string, int>>{{"tp_dp_cp", 2},
                                                         {"tp_dp", 4},
                                                         {"tp_cp", 4},
                                                         {"ep", 16},
                                                         {"expt_tp", 8},
                                                         {"tp_ep", 8},
                                                         {"tp_ep_pp", 4},
                                                         {"expt_dp", 4},
                                                         {"intra_dist_opt", 1}})
    want.push_back(r);
  EXPECT_EQ(runs(steps), want);
  EXPECT_EQ(creation_aliases(layout),
            (std::vector<CreationAlias>{{GroupKind::intra_dp_cp, GroupKind::dp_cp},
                                        {GroupKind::intra_expt_dp, GroupKind::expt_dp}}));
}

// Example (b): tp 2, pp 2, ep 2, etp 1, two dist-opt instances on 16 ranks: 138 calls; each
// dp_cp group is followed by its two intra_dp_cp halves, each expt_dp group by its intra and
// inter groups, and cp has hcp levels when asked.
TEST(SeedCreationOrder, ExampleBInterleavesThePartialGroups) {
  ParallelConfig c = test::make_config(16, 2, 2, 1, 2);
  c.etp = 1;
  c.dist_opt_instances = 2;
  const Layout layout(c);
  const std::vector<CreationStep> steps = creation_sequence(layout);
  EXPECT_EQ(steps.size(), 138u);
  EXPECT_TRUE(creation_aliases(layout).empty());
  const auto r = runs(steps);
  // dp 4 groups of 4, then (dp_cp, intra_dp_cp x2) x4.
  ASSERT_GE(r.size(), 9u);
  EXPECT_EQ(r[0], (std::pair<std::string, int>{"dp", 4}));
  for (int i = 0; i < 4; ++i) {
    EXPECT_EQ(r[1 + 2 * i], (std::pair<std::string, int>{"dp_cp", 1}));
    EXPECT_EQ(r[2 + 2 * i], (std::pair<std::string, int>{"intra_dp_cp", 2}));
  }
  // The expert data groups: expt_dp 4 groups of 4 (edp 4), each with 2 intra, 2 inter.
  const auto tail = std::vector<std::pair<std::string, int>>(r.end() - 13, r.end());
  for (int i = 0; i < 4; ++i) {
    EXPECT_EQ(tail[3 * static_cast<std::size_t>(i)], (std::pair<std::string, int>{"expt_dp", 1}));
    EXPECT_EQ(tail[3 * static_cast<std::size_t>(i) + 1],
              (std::pair<std::string, int>{"intra_expt_dp", 2}));
    EXPECT_EQ(tail[3 * static_cast<std::size_t>(i) + 2],
              (std::pair<std::string, int>{"inter_dist_opt", 2}));
  }
  EXPECT_EQ(tail.back(), (std::pair<std::string, int>{"intra_dist_opt", 2}));
}

// Every group of every created kind once, no group of an aliased kind, indices right: for
// seed and head configs alike.
TEST(CreationOrder, EveryGroupOnceAndIndicesName) {
  std::vector<ParallelConfig> configs;
  {
    ParallelConfig c = test::make_config(16, 1, 2, 4);
    c.hcp = {2, 2};
    c.ep = 2;
    c.dist_opt_instances = 2;
    configs.push_back(c);
    c.compat = Compat::head;
    c.hybrid_context_parallel = true;
    configs.push_back(c);
  }
  {
    ParallelConfig c = test::make_config(16, 2, 2, 1, 2);
    c.compat = Compat::head;
    c.gtp_remat = 2;
    c.expert_gtp_remat = 2;
    configs.push_back(c);
  }
  for (const ParallelConfig& c : configs) {
    const Layout layout(c);
    std::set<std::tuple<GroupKind, int, std::int64_t>> seen;
    for (const CreationStep& s : creation_sequence(layout)) {
      EXPECT_TRUE(seen.insert({s.kind, s.level, s.index}).second)
          << c.canonical() << ": " << kind_name(s.kind) << "#" << s.index << " twice";
      const GroupList groups = layout.groups(s.kind, s.level);
      const auto g = groups[static_cast<std::size_t>(s.index)];
      EXPECT_EQ(std::vector<Rank>(g.begin(), g.end()), s.members) << c.canonical();
    }
    std::set<GroupKind> aliased;
    for (const CreationAlias& a : creation_aliases(layout)) aliased.insert(a.kind);
    std::size_t want = 0;
    for (GroupKind k : layout.kinds()) {
      if (aliased.count(k)) continue;
      for (int l = 0; l < layout.levels(k); ++l)
        want += static_cast<std::size_t>(layout.num_groups(k, l));
    }
    EXPECT_EQ(seen.size(), want) << c.canonical();
  }
}

TEST(CreationOrder, AliasesFollowTheRequestedKinds) {
  ParallelConfig c = test::make_config(8, 2, 2);
  c.compat = Compat::head;
  const Layout layout(c);
  const std::vector<GroupKind> both = {GroupKind::dp_gtp_remat, GroupKind::dp};
  EXPECT_EQ(creation_aliases(layout, both),
            (std::vector<CreationAlias>{{GroupKind::dp_gtp_remat, GroupKind::dp}}));
  for (const CreationStep& s : creation_sequence(layout, both)) EXPECT_EQ(s.kind, GroupKind::dp);
  // Without its parent an alias is created, with the parent's groups.
  const std::vector<GroupKind> alone = {GroupKind::dp_cp_gtp_remat};
  EXPECT_TRUE(creation_aliases(layout, alone).empty());
  const auto steps = creation_sequence(layout, alone);
  ASSERT_EQ(steps.size(), static_cast<std::size_t>(layout.num_groups(GroupKind::dp_cp)));
  const GroupList dp_cp = layout.groups(GroupKind::dp_cp);
  for (std::size_t i = 0; i < steps.size(); ++i) {
    EXPECT_EQ(steps[i].kind, GroupKind::dp_cp_gtp_remat);
    EXPECT_EQ(steps[i].members, std::vector<Rank>(dp_cp[i].begin(), dp_cp[i].end()));
  }
  // With gtp_remat 2 HEAD builds the gtp variants: no alias, created right after dp.
  c.world_size = 16;
  c.gtp_remat = 2;
  const Layout gtp(c);
  EXPECT_TRUE(creation_aliases(gtp, both).empty());
  const auto r = runs(creation_sequence(gtp, both));
  ASSERT_EQ(r.size(), 2u);
  EXPECT_EQ(r[0].first, "dp");
  EXPECT_EQ(r[1].first, "dp_gtp_remat");
  // The order of the request does not matter.
  const std::vector<GroupKind> reversed = {GroupKind::dp, GroupKind::dp_gtp_remat};
  EXPECT_EQ(creation_sequence(gtp, reversed), creation_sequence(gtp, both));
}

TEST(CreationOrder, KindsTheLayoutLacksAreRefused) {
  const Layout seed(test::make_config(8, 2, 2));
  const std::vector<GroupKind> head_kind = {GroupKind::gtp_remat};
  EXPECT_THROW((void)creation_sequence(seed, head_kind), UnknownKindError);
  const std::vector<GroupKind> hcp = {GroupKind::tp, GroupKind::hcp};
  EXPECT_THROW((void)creation_sequence(seed, hcp), UnknownKindError);
  EXPECT_THROW((void)creation_aliases(seed, hcp), UnknownKindError);
  ParallelConfig c = test::make_config(8, 2, 2);
  c.compat = Compat::head;
  const Layout head(c);
  const std::vector<GroupKind> ag = {GroupKind::dp_cp_ag};  // needs --all-gather-groups
  EXPECT_THROW((void)creation_sequence(head, ag), UnknownKindError);
}

}  // namespace
}  // namespace commgrid
