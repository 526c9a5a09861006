// The golden layouts of both editions, checked through the library: Megatron-core at the
// seed (shared/vectors/layout, copied to tests/vectors/layout) and HEAD under compat head
// (shared/vectors/head, copied to tests/vectors/head). Whole layouts by enumeration, with
// every member's closed-form query checked against it; --rank vectors by the closed form;
// invalid configs by the error's keyword.
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

struct Vector {
  ParallelConfig config;
  std::optional<Rank> rank;
  Json want;
};

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

Vector load(const std::filesystem::path& p) {
  std::ifstream in(p);
  Vector v;
  v.want = Json::parse(in);
  ParallelConfig& c = v.config;
  const auto args = v.want["args"].get<std::vector<std::string>>();
  for (std::size_t i = 0; i < args.size(); ++i) {
    const std::string& flag = args[i];
    if (flag == "--hybrid-context-parallel") {
      c.hybrid_context_parallel = true;
      continue;
    }
    if (flag == "--all-gather-groups") {
      c.all_gather_groups = true;
      continue;
    }
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
    else if (flag == "--rank") v.rank = std::stoll(val);
    else if (flag == "--compat") c.compat = val == "head" ? Compat::head : Compat::seed;
    else if (flag == "--gtp-remat") c.gtp_remat = std::stoll(val);
    else if (flag == "--expert-gtp-remat") c.expert_gtp_remat = std::stoll(val);
    else if (flag == "--rank-offset") c.rank_offset = std::stoll(val);
    else if (flag == "--local-world-size") c.local_world_size = std::stoll(val);
    else ADD_FAILURE() << p << ": flag " << flag << " not understood by this test";
  }
  return v;
}

Json to_json(std::span<const Rank> members) {
  Json a = Json::array();
  for (Rank r : members) a.push_back(r);
  return a;
}

std::string lower(std::string s) {
  for (char& ch : s) ch = static_cast<char>(std::tolower(static_cast<unsigned char>(ch)));
  return s;
}

// A golden file: its edition's folder and its name.
struct Case {
  std::string dir, file;
  [[nodiscard]] std::filesystem::path path() const { return std::filesystem::path(dir) / file; }
};

std::vector<std::string> names_in(const std::string& dir) {
  std::vector<std::string> names;
  for (const auto& e : std::filesystem::directory_iterator(dir))
    if (e.path().extension() == ".json") names.push_back(e.path().filename().string());
  std::sort(names.begin(), names.end());
  return names;
}

std::vector<Case> all_cases() {
  std::vector<Case> out;
  for (const char* dir : {COMMGRID_SEED_VECTOR_DIR, COMMGRID_HEAD_VECTOR_DIR})
    for (const std::string& n : names_in(dir)) out.push_back({dir, n});
  return out;
}

class Golden : public ::testing::TestWithParam<Case> {};

TEST_P(Golden, MatchesLibrary) {
  const Vector v = load(GetParam().path());
  const std::string file = GetParam().file;
  if (v.want.contains("error")) {
    const std::string key = v.want["error"].get<std::string>();
    try {
      const Layout layout(v.config);
      FAIL() << file << ": expected a ConfigError containing \"" << key << "\"";
    } catch (const ConfigError& e) {
      EXPECT_NE(lower(e.what()).find(lower(key)), std::string::npos) << e.what();
    }
    return;
  }
  const Layout layout(v.config);
  const Json& want_groups = v.want["groups"];
  std::set<std::string> want_kinds, got_kinds;
  for (auto it = want_groups.begin(); it != want_groups.end(); ++it) want_kinds.insert(it.key());
  for (GroupKind k : layout.kinds()) {
    Json got = Json::array();  // one entry per level
    for (int l = 0; l < layout.levels(k); ++l) {
      const std::string name = layout.level_name(k, l);
      got_kinds.insert(name);
      Json level;
      if (v.rank) {
        const auto g = layout.group_of(k, *v.rank, l);
        level = g ? to_json(g->members) : Json(nullptr);
      } else {
        level = Json::array();
        const GroupList groups = layout.groups(k, l);
        EXPECT_EQ(layout.num_groups(k, l), static_cast<std::int64_t>(groups.size())) << name;
        for (std::size_t i = 0; i < groups.size(); ++i) {
          level.push_back(to_json(groups[i]));
          // The per-rank queries agree with the enumeration.
          for (Rank r : groups[i]) {
            const auto ref = layout.group_of(k, r, l);
            ASSERT_TRUE(ref.has_value()) << name << " rank " << r;
            EXPECT_EQ(ref->index, static_cast<std::int64_t>(i)) << name << " rank " << r;
            EXPECT_TRUE(std::equal(ref->members.begin(), ref->members.end(), groups[i].begin(),
                                   groups[i].end()))
                << name << " rank " << r;
            EXPECT_EQ(layout.group_index(k, r, l), std::optional<std::int64_t>(i));
          }
        }
      }
      // hcp is one JSON list of levels; hybrid_dp_cp one JSON key per level.
      if (k == GroupKind::hcp) got.push_back(level);
      else EXPECT_EQ(level, want_groups[name]) << file << " kind " << name;
    }
    if (k == GroupKind::hcp) { EXPECT_EQ(got, want_groups["hcp"]) << file << " kind hcp"; }
  }
  EXPECT_EQ(want_kinds, got_kinds) << file;
  if (!v.rank) {
    const Json& c = v.want["config"];
    EXPECT_EQ(c["dp"].get<std::int64_t>(), layout.dp());
    EXPECT_EQ(c["expert_dp"].get<std::int64_t>(), layout.expert_dp());
    EXPECT_EQ(c["etp"].get<std::int64_t>(), v.config.expert_tp());
  }
}

INSTANTIATE_TEST_SUITE_P(Vectors, Golden, ::testing::ValuesIn(all_cases()), [](const auto& info) {
  const Case& c = info.param;
  std::string n =
      (c.dir == COMMGRID_HEAD_VECTOR_DIR ? "Head_" : "Seed_") + c.file.substr(0, c.file.size() - 5);
  for (char& ch : n)
    if (!std::isalnum(static_cast<unsigned char>(ch))) ch = '_';
  return n;
});

TEST(GoldenSet, HasEveryVector) {
  EXPECT_EQ(names_in(COMMGRID_SEED_VECTOR_DIR).size(), 15u);
  EXPECT_EQ(names_in(COMMGRID_HEAD_VECTOR_DIR).size(), 20u);
}

// The seed goldens hold under compat head too, on every seed kind (HEAD adds kinds and
// changes nothing else for these configs).
TEST(GoldenSet, SeedLayoutsHoldUnderHead) {
  int checked = 0;
  for (const std::string& name : names_in(COMMGRID_SEED_VECTOR_DIR)) {
    Vector v = load(std::filesystem::path(COMMGRID_SEED_VECTOR_DIR) / name);
    if (v.want.contains("error") || v.rank) continue;
    if (v.config.order.find("tp") == std::string::npos) continue;  // HEAD refuses orders without tp
    v.config.compat = Compat::head;
    const Layout layout(v.config);
    for (auto it = v.want["groups"].begin(); it != v.want["groups"].end(); ++it) {
      const GroupKind k = parse_kind(it.key());
      Json got = Json::array();
      for (int l = 0; l < layout.levels(k); ++l) {
        const GroupList groups = layout.groups(k, l);
        Json level = Json::array();
        for (std::size_t i = 0; i < groups.size(); ++i) level.push_back(to_json(groups[i]));
        got.push_back(level);
      }
      if (k != GroupKind::hcp) got = got[0];
      EXPECT_EQ(got, it.value()) << name << " kind " << it.key();
    }
    ++checked;
  }
  EXPECT_GT(checked, 5);
}

}  // namespace
}  // namespace commgrid
