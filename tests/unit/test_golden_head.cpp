// The golden layouts of Megatron-core HEAD (shared/vectors/head, copied to
// tests/vectors/head), checked through the library under compat head, and the per-rank
// queries checked against the enumeration for each of them.
#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <set>

#include "commgrid/error.hpp"
#include "commgrid/layout.hpp"

namespace commgrid {
namespace {

using Json = nlohmann::json;

std::vector<std::int64_t> ints(const std::string& s) {
  std::vector<std::int64_t> out;
  std::size_t start = 0;
  while (true) {
    const std::size_t comma = s.find(',', start);
    out.push_back(std::stoll(s.substr(start, comma - start)));
    if (comma == std::string::npos) return out;
    start = comma + 1;
  }
}

ParallelConfig config_of(const std::vector<std::string>& args) {
  ParallelConfig c;
  for (std::size_t i = 0; i < args.size(); ++i) {
    const std::string& flag = args[i];
    if (flag == "--hybrid-context-parallel") { c.hybrid_context_parallel = true; continue; }
    if (flag == "--all-gather-groups") { c.all_gather_groups = true; continue; }
    const std::string val = i + 1 < args.size() ? args[++i] : "";
    if (flag == "--world-size") c.world_size = std::stoll(val);
    else if (flag == "--tp") c.tp = std::stoll(val);
    else if (flag == "--pp") c.pp = std::stoll(val);
    else if (flag == "--cp") c.cp = std::stoll(val);
    else if (flag == "--ep") c.ep = std::stoll(val);
    else if (flag == "--etp") c.etp = std::stoll(val);
    else if (flag == "--hcp") c.hcp = ints(val);
    else if (flag == "--dist-opt-instances") c.dist_opt_instances = std::stoll(val);
    else if (flag == "--vpp") c.vpp = std::stoll(val);
    else if (flag == "--order") c.order = val;
    else if (flag == "--compat") c.compat = val == "head" ? Compat::head : Compat::seed;
    else if (flag == "--gtp-remat") c.gtp_remat = std::stoll(val);
    else if (flag == "--expert-gtp-remat") c.expert_gtp_remat = std::stoll(val);
    else if (flag == "--rank-offset") c.rank_offset = std::stoll(val);
    else if (flag == "--local-world-size") c.local_world_size = std::stoll(val);
    else ADD_FAILURE() << "flag " << flag << " not understood by this test";
  }
  return c;
}

std::vector<std::string> vector_names() {
  std::vector<std::string> names;
  for (const auto& e : std::filesystem::directory_iterator(COMMGRID_HEAD_VECTOR_DIR))
    if (e.path().extension() == ".json") names.push_back(e.path().filename().string());
  std::sort(names.begin(), names.end());
  return names;
}

class GoldenHead : public ::testing::TestWithParam<std::string> {};

TEST_P(GoldenHead, MatchesLibrary) {
  std::ifstream in(std::filesystem::path(COMMGRID_HEAD_VECTOR_DIR) / GetParam());
  const Json want = Json::parse(in);
  const ParallelConfig c = config_of(want["args"].get<std::vector<std::string>>());
  ASSERT_EQ(c.compat, Compat::head);
  if (want.contains("error")) {
    const std::string key = want["error"].get<std::string>();
    try {
      const Layout layout(c);
      FAIL() << GetParam() << ": expected a ConfigError containing \"" << key << "\"";
    } catch (const ConfigError& e) {
      std::string what = e.what(), k = key;
      for (char& ch : what) ch = static_cast<char>(std::tolower(static_cast<unsigned char>(ch)));
      for (char& ch : k) ch = static_cast<char>(std::tolower(static_cast<unsigned char>(ch)));
      EXPECT_NE(what.find(k), std::string::npos) << e.what();
    }
    return;
  }
  const Layout layout(c);
  const Json& want_groups = want["groups"];
  std::set<std::string> want_kinds, got_kinds;
  for (auto it = want_groups.begin(); it != want_groups.end(); ++it) want_kinds.insert(it.key());
  for (GroupKind k : layout.kinds()) {
    for (int l = 0; l < layout.levels(k); ++l) {
      const std::string name = layout.level_name(k, l);
      got_kinds.insert(name);
      const GroupList groups = layout.groups(k, l);
      Json level = Json::array();
      for (std::size_t i = 0; i < groups.size(); ++i) {
        Json g = Json::array();
        for (Rank r : groups[i]) g.push_back(r);
        level.push_back(g);
        // The per-rank queries agree with the enumeration.
        for (Rank r : groups[i]) {
          const auto ref = layout.group_of(k, r, l);
          ASSERT_TRUE(ref.has_value()) << name << " rank " << r;
          EXPECT_EQ(ref->index, static_cast<std::int64_t>(i)) << name << " rank " << r;
          EXPECT_EQ(layout.group_index(k, r, l), std::optional<std::int64_t>(i));
        }
      }
      const Json& expected = k == GroupKind::hcp ? want_groups[name][static_cast<std::size_t>(l)]
                                                 : want_groups[name];
      EXPECT_EQ(level, expected) << GetParam() << " kind " << name;
    }
  }
  EXPECT_EQ(want_kinds, got_kinds) << GetParam();
  const Json& cfg = want["config"];
  EXPECT_EQ(cfg["dp"].get<std::int64_t>(), layout.dp());
  EXPECT_EQ(cfg["expert_dp"].get<std::int64_t>(), layout.expert_dp());
}

INSTANTIATE_TEST_SUITE_P(Vectors, GoldenHead, ::testing::ValuesIn(vector_names()),
                         [](const auto& info) {
                           std::string n = info.param.substr(0, info.param.size() - 5);
                           for (char& ch : n)
                             if (!std::isalnum(static_cast<unsigned char>(ch))) ch = '_';
                           return n;
                         });

// The seed goldens (tests/vectors/layout) hold under compat head too, on every seed kind
// (HEAD adds kinds and changes nothing else for these configs).
TEST(GoldenHead, SeedLayoutsHoldUnderHead) {
  int checked = 0;
  for (const auto& e : std::filesystem::directory_iterator(COMMGRID_SEED_VECTOR_DIR)) {
    if (e.path().extension() != ".json") continue;
    std::ifstream in(e.path());
    const Json want = Json::parse(in);
    if (want.contains("error") || want.contains("rank")) continue;
    ParallelConfig c = config_of(want["args"].get<std::vector<std::string>>());
    if (c.order.find("tp") == std::string::npos) continue;  // HEAD refuses orders without tp
    c.compat = Compat::head;
    const Layout layout(c);
    for (auto it = want["groups"].begin(); it != want["groups"].end(); ++it) {
      const GroupKind k = parse_kind(it.key());
      Json got = Json::array();
      for (int l = 0; l < layout.levels(k); ++l) {
        const GroupList groups = layout.groups(k, l);
        Json level = Json::array();
        for (std::size_t i = 0; i < groups.size(); ++i)
          level.push_back(Json(std::vector<Rank>(groups[i].begin(), groups[i].end())));
        got.push_back(level);
      }
      if (k != GroupKind::hcp) got = got[0];
      EXPECT_EQ(got, it.value()) << e.path().filename() << " kind " << it.key();
    }
    ++checked;
  }
  EXPECT_GT(checked, 5);
}

}  // namespace
}  // namespace commgrid
