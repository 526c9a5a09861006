// The golden layouts of shared/vectors/layout (copied to tests/vectors/layout), checked
// through the library: enumeration for whole layouts, the closed form for --rank vectors.
#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>

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
  const auto args = v.want["args"].get<std::vector<std::string>>();
  for (std::size_t i = 0; i + 1 < args.size(); i += 2) {
    const std::string& flag = args[i];
    const std::string& val = args[i + 1];
    if (flag == "--world-size") v.config.world_size = std::stoll(val);
    else if (flag == "--tp") v.config.tp = std::stoll(val);
    else if (flag == "--pp") v.config.pp = std::stoll(val);
    else if (flag == "--cp") v.config.cp = std::stoll(val);
    else if (flag == "--ep") v.config.ep = std::stoll(val);
    else if (flag == "--etp") v.config.etp = std::stoll(val);
    else if (flag == "--hcp") v.config.hcp = ints(val);
    else if (flag == "--dist-opt-instances") v.config.dist_opt_instances = std::stoll(val);
    else if (flag == "--vpp") v.config.vpp = std::stoll(val);
    else if (flag == "--order") v.config.order = val;
    else if (flag == "--rank") v.rank = std::stoll(val);
    else ADD_FAILURE() << p << ": flag " << flag << " not understood by this test";
  }
  return v;
}

Json to_json(std::span<const Rank> members) {
  Json a = Json::array();
  for (Rank r : members) a.push_back(r);
  return a;
}

class Golden : public ::testing::TestWithParam<std::string> {};

TEST_P(Golden, MatchesLibrary) {
  const Vector v = load(std::filesystem::path(COMMGRID_VECTOR_DIR) / GetParam());
  const Layout layout(v.config);
  const Json& want_groups = v.want["groups"];
  // Same set of kinds.
  std::set<std::string> want_kinds, got_kinds;
  for (auto it = want_groups.begin(); it != want_groups.end(); ++it) want_kinds.insert(it.key());
  for (GroupKind k : layout.kinds()) got_kinds.insert(std::string(kind_name(k)));
  EXPECT_EQ(want_kinds, got_kinds);
  for (GroupKind k : layout.kinds()) {
    const std::string name(kind_name(k));
    Json got = Json::array();
    for (int l = 0; l < layout.levels(k); ++l) {
      Json level;
      if (v.rank) {
        const auto g = layout.group_of(k, *v.rank, l);
        level = g ? to_json(g->members) : Json(nullptr);
      } else {
        level = Json::array();
        const GroupList groups = layout.groups(k, l);
        for (std::size_t i = 0; i < groups.size(); ++i) level.push_back(to_json(groups[i]));
        EXPECT_EQ(layout.num_groups(k, l), static_cast<std::int64_t>(groups.size())) << name;
      }
      got.push_back(level);
    }
    if (k != GroupKind::hcp) got = got[0];
    EXPECT_EQ(got, want_groups[name]) << GetParam() << " kind " << name;
  }
  if (!v.rank) {
    const Json& c = v.want["config"];
    EXPECT_EQ(c["dp"].get<std::int64_t>(), layout.dp());
    EXPECT_EQ(c["expert_dp"].get<std::int64_t>(), layout.expert_dp());
    EXPECT_EQ(c["etp"].get<std::int64_t>(), v.config.expert_tp());
  }
}

std::vector<std::string> vector_names() {
  std::vector<std::string> names;
  for (const auto& e : std::filesystem::directory_iterator(COMMGRID_VECTOR_DIR))
    if (e.path().extension() == ".json") names.push_back(e.path().filename().string());
  std::sort(names.begin(), names.end());
  return names;
}

INSTANTIATE_TEST_SUITE_P(Vectors, Golden, ::testing::ValuesIn(vector_names()),
                         [](const auto& info) {
                           std::string n = info.param.substr(0, info.param.size() - 5);
                           for (char& c : n)
                             if (!std::isalnum(static_cast<unsigned char>(c))) c = '_';
                           return n;
                         });

TEST(GoldenSet, HasEveryVector) { EXPECT_EQ(vector_names().size(), 15u); }

}  // namespace
}  // namespace commgrid
