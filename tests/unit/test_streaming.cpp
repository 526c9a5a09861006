// Streaming a kind's members in pieces (Layout::members), the index-only query
// (Layout::group_index) and group sizes agree with the whole lists, for random configs and
// odd piece boundaries; hcp levels cost O(1) each.
#include <gtest/gtest.h>

#include <chrono>
#include <random>

#include "commgrid/error.hpp"
#include "commgrid/layout.hpp"
#include "make_config.hpp"

namespace commgrid {
namespace {

// Valid configs over small worlds with every axis, order and derived kind in play.
std::vector<ParallelConfig> configs() {
  std::vector<ParallelConfig> out;
  std::mt19937 rng(1301);
  const std::vector<std::string> orders = {"tp-cp-ep-dp-pp", "cp-tp-ep-dp-pp", "dp-tp-cp-ep-pp",
                                           "tp-dp-cp-ep-pp", "ep-tp-cp-dp-pp", "tp-pp-dp"};
  const std::int64_t sizes[] = {1, 2, 3, 4};
  while (out.size() < 150) {
    ParallelConfig c;
    c.tp = sizes[rng() % 4];
    c.pp = sizes[rng() % 4];
    c.cp = sizes[rng() % 4];
    c.world_size = c.tp * c.pp * c.cp * sizes[rng() % 4];
    c.ep = sizes[rng() % 4];
    if (rng() % 2) c.etp = sizes[rng() % 4];
    c.dist_opt_instances = sizes[rng() % 3];
    if (c.cp == 4 && rng() % 2) c.hcp = {2, 2};
    if (c.cp == 2 && rng() % 2) c.hcp = {1, 2, 1};
    c.order = orders[rng() % orders.size()];
    try {
      c.validate();
      out.push_back(c);
    } catch (const ConfigError&) {}
  }
  return out;
}

TEST(Streaming, PiecesEqualTheWholeList) {
  for (const ParallelConfig& c : configs()) {
    const Layout l(c);
    for (GroupKind k : l.kinds())
      for (int level = 0; level < l.levels(k); ++level) {
        const GroupList whole = l.groups(k, level);
        const auto all = whole.members();
        ASSERT_EQ(l.num_members(k, level), static_cast<std::int64_t>(all.size()));
        ASSERT_EQ(l.group_size(k, level), static_cast<std::int64_t>(whole[0].size()));
        // Pieces of 1, 3 and 7 entries start and end anywhere inside groups.
        for (std::size_t piece : {1u, 3u, 7u}) {
          std::vector<Rank> got(all.size());
          for (std::size_t i = 0; i < all.size(); i += piece) {
            const std::size_t n = std::min(piece, all.size() - i);
            l.members(k, level, static_cast<std::int64_t>(i), std::span<Rank>(got.data() + i, n));
          }
          ASSERT_TRUE(std::equal(got.begin(), got.end(), all.begin()))
              << c.canonical() << " kind " << kind_name(k) << " level " << level << " piece "
              << piece;
        }
      }
  }
}

TEST(Streaming, GroupIndexEqualsGroupOf) {
  for (const ParallelConfig& c : configs()) {
    const Layout l(c);
    for (GroupKind k : l.kinds())
      for (int level = 0; level < l.levels(k); ++level)
        for (Rank r = 0; r < l.world_size(); ++r) {
          const auto ref = l.group_of(k, r, level);
          const auto index = l.group_index(k, r, level);
          ASSERT_EQ(index.has_value(), ref.has_value()) << c.canonical() << " " << kind_name(k);
          if (ref) {
            ASSERT_EQ(*index, ref->index) << c.canonical() << " " << kind_name(k) << " r " << r;
          }
        }
  }
}

// Large axes (64, 128 ranks) take other paths through the enumeration than the small
// random configs: the lists must still hold, at every sampled rank, the group the closed
// form gives for that rank.
TEST(Streaming, LargeAxesMatchTheClosedForm) {
  std::vector<ParallelConfig> cs;
  for (const char* order : {"tp-cp-ep-dp-pp", "cp-dp-tp-ep-pp", "dp-tp-cp-ep-pp"}) {
    ParallelConfig c = test::make_config(65536, 64, 2, 128, 1, order);
    cs.push_back(c);
    ParallelConfig m = test::make_config(32768, 2, 4, 1, 64, order);
    m.etp = 1;
    m.dist_opt_instances = 2;
    cs.push_back(m);
  }
  for (const ParallelConfig& c : cs) {
    std::optional<Layout> l;
    try {
      l.emplace(c);
    } catch (const ConfigError&) { continue; }
    for (GroupKind k : l->kinds()) {
      const GroupList all = l->groups(k);
      for (Rank r = 0; r < l->world_size(); r += 4099) {
        const auto ref = l->group_of(k, r);
        if (!ref) continue;
        const auto g = all[static_cast<std::size_t>(ref->index)];
        ASSERT_TRUE(std::equal(g.begin(), g.end(), ref->members.begin(), ref->members.end()))
            << c.canonical() << " kind " << kind_name(k) << " rank " << r;
      }
    }
  }
}

TEST(Streaming, RangeOutsideTheListIsAnError) {
  const Layout l(test::make_config(8, 2));
  std::vector<Rank> buf(4);
  EXPECT_THROW(l.members(GroupKind::tp, 0, 6, buf), ConfigError);
  EXPECT_THROW(l.members(GroupKind::tp, 0, -1, buf), ConfigError);
  EXPECT_NO_THROW(l.members(GroupKind::tp, 0, 4, buf));
  EXPECT_EQ(buf, (std::vector<Rank>{4, 5, 6, 7}));
  EXPECT_THROW((void)l.group_index(GroupKind::tp, 8), RankOutOfRangeError);
}

// A custom embedding policy may return groups of different sizes: no uniform size, and
// the stream still lists the members group after group.
TEST(Streaming, CustomPolicyOfUnequalSizes) {
  EmbeddingPolicies p;
  p.embedding = [](std::span<const Rank> g) {
    return g.front() % 2 == 0 ? std::vector<Rank>{g.front()}
                              : std::vector<Rank>(g.begin(), g.end());
  };
  const Layout l(test::make_config(8, 1, 2), p);
  EXPECT_EQ(l.group_size(GroupKind::embd), std::nullopt);
  EXPECT_EQ(l.num_members(GroupKind::embd), 6);  // [0] [1,5] [2] [3,7]
  std::vector<Rank> got(6);
  l.members(GroupKind::embd, 0, 0, got);
  EXPECT_EQ(got, (std::vector<Rank>{0, 1, 5, 2, 3, 7}));
  EXPECT_EQ(l.group_index(GroupKind::embd, 5), 1);
  EXPECT_EQ(l.group_index(GroupKind::embd, 6), std::nullopt);
}

// A 2^31-1-rank world: pieces anywhere in it cost only their own size.
TEST(Streaming, LargestWorldInPieces) {
  ParallelConfig c = test::make_config(kMaxWorldSize, 1);
  const Layout l(c);
  std::vector<Rank> buf(3);
  l.members(GroupKind::dp, 0, kMaxWorldSize - 3, buf);
  EXPECT_EQ(buf, (std::vector<Rank>{kMaxWorldSize - 3, kMaxWorldSize - 2, kMaxWorldSize - 1}));
  EXPECT_EQ(l.group_size(GroupKind::intra_dist_opt), kMaxWorldSize);
  EXPECT_EQ(l.group_index(GroupKind::dp, kMaxWorldSize - 1), 0);
}

// Each hcp level is located in O(1): 200,000 levels (sizes 1, cp 1) stay well under a
// second, where a walk over the levels before each one took minutes (the bound leaves
// room for a loaded machine).
TEST(Streaming, ManyHcpLevelsAreLinear) {
  ParallelConfig c = test::make_config(2, 1);
  c.hcp.assign(200000, 1);
  const auto t0 = std::chrono::steady_clock::now();
  const Layout l(c);
  std::int64_t sum = 0;
  std::vector<Rank> buf(2);
  for (int level = 0; level < l.levels(GroupKind::hcp); ++level) {
    l.members(GroupKind::hcp, level, 0, buf);
    sum += buf[1] + *l.group_index(GroupKind::hcp, 1, level) +
           l.group_of(GroupKind::hcp, 1, level)->index;
  }
  const double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  EXPECT_EQ(sum, 200000 * 3);
  EXPECT_LT(s, 60.0) << "200,000 hcp levels took " << s << " s";
}

}  // namespace
}  // namespace commgrid
