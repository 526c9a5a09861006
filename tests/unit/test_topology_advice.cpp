// Topology advice that converges: following a suggested order never leads to a warning
// about a more important kind, the best order is its own best order, and a kind that must
// cross says why. Also the closed-form crosses_nodes and the streamed kind_span against
// brute force over whole group lists.
#include <gtest/gtest.h>

#include <random>
#include <set>

#include "commgrid/error.hpp"
#include "commgrid/topology.hpp"
#include "make_config.hpp"

namespace commgrid {
namespace {

using test::make_config;

// The issue's job: 4,096 GPUs, tp 8, pp 16, cp 2, ep 8, etp 1, vpp 4, 8 GPUs per node.
ParallelConfig big_job(const char* order) {
  ParallelConfig c = make_config(4096, 8, 16, 2, 8, order);
  c.etp = 1;
  c.vpp = 4;
  return c;
}

TEST(TopologyAdvice, TheLoopFromTheIssueConverges) {
  const NodeMap nodes(8);
  // Default order: tp inside, cp must cross (tp·cp = 16 > 8), no order suggested.
  const TopologyReport d = check_topology(Layout(big_job("tp-cp-ep-dp-pp")), {}, nodes);
  ASSERT_EQ(d.warnings.size(), 1u);
  EXPECT_EQ(d.warnings[0].kind, GroupKind::cp);
  EXPECT_FALSE(d.warnings[0].order.has_value());
  EXPECT_FALSE(d.avoidable());
  EXPECT_EQ(d.warnings[0].message(),
            "cp groups cross nodes (2048 of 2048 groups span up to 2 nodes); tp\u00b7cp = 16 > 8 "
            "GPUs per node: cp groups must cross nodes; keeping tp inside");
  // cp first: tp crosses; the advice is the default order back, and it says cp then
  // crosses. It is not the loop: that order draws no warning about tp.
  const TopologyReport c = check_topology(Layout(big_job("cp-tp-ep-dp-pp")), {}, nodes);
  ASSERT_FALSE(c.warnings.empty());
  EXPECT_EQ(c.warnings[0].kind, GroupKind::tp);
  EXPECT_EQ(c.warnings[0].order, "tp-cp-ep-dp-pp");
  EXPECT_TRUE(c.avoidable());
  EXPECT_EQ(c.warnings[0].message(),
            "tp groups cross nodes (512 of 512 groups span up to 2 nodes); order "
            "\"tp-cp-ep-dp-pp\" keeps them inside; cp groups then cross (tp\u00b7cp = 16 > 8 GPUs "
            "per node)");
}

// From any start, following the advice reaches an order with no avoidable warning in at
// most one step, and no suggestion is warned about for a kind more important than the
// one it was given for.
TEST(TopologyAdvice, FollowingAnyAdviceStopsAtOnce) {
  const std::vector<std::string> orders = {"tp-cp-ep-dp-pp", "cp-tp-ep-dp-pp", "dp-tp-cp-ep-pp",
                                           "ep-dp-tp-cp-pp", "dp-cp-ep-tp-pp", "cp-ep-dp-tp-pp"};
  const std::vector<ParallelConfig> jobs = {big_job("tp-cp-ep-dp-pp"), make_config(64, 4, 1, 2, 2),
                                            make_config(128, 2, 2, 4, 4),
                                            make_config(64, 8, 1, 1, 8)};
  const std::vector<GroupKind> priority = {GroupKind::tp, GroupKind::cp, GroupKind::ep,
                                           GroupKind::expt_tp};
  for (const ParallelConfig& job : jobs)
    for (const std::string& order : orders) {
      ParallelConfig c = job;
      c.order = order;
      std::optional<Layout> l;
      try {
        l.emplace(c);
      } catch (const ConfigError&) { continue; }
      const NodeMap nodes(8);
      const TopologyReport r = check_topology(*l, {}, nodes);
      ParallelConfig next = c;
      next.order = r.best_order;
      const TopologyReport r2 = check_topology(Layout(next), {}, nodes);
      EXPECT_FALSE(r2.avoidable()) << c.canonical() << " -> " << next.order;
      EXPECT_EQ(r2.best_order, next.order) << c.canonical();
      for (const TopologyWarning& w : r.warnings) {
        if (!w.order) continue;
        EXPECT_EQ(*w.order, r.best_order);
        const auto rank = [&](GroupKind k) {
          return std::find(priority.begin(), priority.end(), k) - priority.begin();
        };
        for (const TopologyWarning& w2 : r2.warnings) {
          if (rank(w2.kind) > rank(w.kind)) continue;  // a less important kind may pay
          // A more important kind warned about after the advice crossed before it too, and
          // no order could keep it inside: the advice made nothing more important worse.
          EXPECT_FALSE(w2.avoidable) << c.canonical() << " advice " << *w.order;
          bool before = false;
          for (const TopologyWarning& w0 : r.warnings) before = before || w0.kind == w2.kind;
          EXPECT_TRUE(before) << c.canonical() << " advice " << *w.order << " pushes out "
                              << kind_name(w2.kind);
        }
      }
    }
}

// The closed form agrees with looking at every group.
TEST(TopologyAdvice, CrossesNodesMatchesBruteForce) {
  std::mt19937 rng(7);
  const std::vector<std::string> orders = {"tp-cp-ep-dp-pp", "cp-tp-ep-dp-pp", "dp-tp-cp-ep-pp",
                                           "ep-dp-tp-cp-pp", "tp-dp-cp-ep-pp"};
  int checked = 0;
  while (checked < 400) {
    const std::int64_t s[] = {1, 2, 3, 4, 6, 8};
    ParallelConfig c = make_config(0, s[rng() % 6], s[rng() % 3], s[rng() % 6], s[rng() % 6],
                                   orders[rng() % orders.size()].c_str());
    c.world_size = c.tp * c.pp * c.cp * s[rng() % 6] * c.ep;
    if (rng() % 2) c.etp = s[rng() % 4];
    std::optional<Layout> l;
    try {
      l.emplace(c);
    } catch (const ConfigError&) { continue; }
    ++checked;
    for (std::int64_t g : {1, 2, 3, 4, 5, 8, 12, 16}) {
      const NodeMap nodes(g);
      for (GroupKind k : {GroupKind::tp, GroupKind::cp, GroupKind::ep, GroupKind::expt_tp}) {
        const GroupList groups = l->groups(k);
        bool brute = false;
        for (std::size_t i = 0; i < groups.size(); ++i)
          brute = brute || nodes.nodes_spanned(groups[i]) > 1;
        ASSERT_EQ(crosses_nodes(*l, k, nodes), brute)
            << c.canonical() << " kind " << kind_name(k) << " gpus_per_node " << g;
      }
    }
  }
}

// kind_span streams the members; it equals counting over the whole lists, including
// intra_dist_opt, whose groups are not ascending.
TEST(TopologyAdvice, StreamedSpansMatchWholeLists) {
  for (std::int64_t g : {1, 3, 8}) {
    ParallelConfig c = make_config(96, 2, 2, 2, 2);
    c.etp = 1;
    c.dist_opt_instances = 2;
    const Layout l(c);
    const NodeMap nodes(g);
    for (GroupKind k : l.kinds()) {
      const GroupList groups = l.groups(k);
      std::int64_t crossing = 0, most = 0;
      for (std::size_t i = 0; i < groups.size(); ++i) {
        const std::int64_t n = nodes.nodes_spanned(groups[i]);
        crossing += n > 1 ? 1 : 0;
        most = std::max(most, n);
      }
      const KindSpan s = kind_span(l, k, 0, nodes);
      EXPECT_EQ(s.crossing_groups, crossing) << kind_name(k) << " g " << g;
      EXPECT_EQ(s.max_nodes_spanned, most) << kind_name(k) << " g " << g;
      EXPECT_EQ(s.groups, static_cast<std::int64_t>(groups.size()));
    }
  }
}

// Kinds of large groups of consecutive ranks take a shortcut (first member only); it must
// agree with counting every member, whichever axes are large and wherever dp sits.
TEST(TopologyAdvice, RunShortcutMatchesWholeLists) {
  for (const char* order : {"tp-cp-ep-dp-pp", "dp-tp-cp-ep-pp", "tp-dp-cp-ep-pp"})
    for (std::int64_t n : {1, 2, 4}) {
      ParallelConfig c = make_config(8192, 2, 2, 1, 2, order);
      c.etp = 1;
      c.dist_opt_instances = n;
      std::optional<Layout> l;
      try {
        l.emplace(c);
      } catch (const ConfigError&) { continue; }
      for (std::int64_t g : {3, 8, 1000}) {
        const NodeMap nodes(g);
        for (GroupKind k : l->kinds()) {
          const GroupList groups = l->groups(k);
          std::int64_t crossing = 0, most = 0;
          for (std::size_t i = 0; i < groups.size(); ++i) {
            const std::int64_t spanned = nodes.nodes_spanned(groups[i]);
            crossing += spanned > 1 ? 1 : 0;
            most = std::max(most, spanned);
          }
          const KindSpan s = kind_span(*l, k, 0, nodes);
          EXPECT_EQ(s.crossing_groups, crossing)
              << c.canonical() << " " << kind_name(k) << " g " << g;
          EXPECT_EQ(s.max_nodes_spanned, most)
              << c.canonical() << " " << kind_name(k) << " g " << g;
        }
      }
    }
}

// A group larger than a node is no one's fault: a warning, not an avoidable one.
TEST(TopologyAdvice, OversizedGroupIsNotAvoidable) {
  const TopologyReport r = check_topology(Layout(make_config(32, 16)), {}, NodeMap(8));
  ASSERT_FALSE(r.warnings.empty());
  EXPECT_FALSE(r.avoidable());
}

// MoE with the default etp (= tp = 8) and ep 4: tp_ep groups of 32 ranks, so no order
// keeps both ep and expt_tp inside an 8-GPU node. The usual fix, expert tensor parallel 1,
// is offered beside the order, and following it leaves nothing to warn about.
TEST(TopologyAdvice, MoeWithTheDefaultEtpOffersEtpOne) {
  const NodeMap nodes(8);
  const ParallelConfig c = make_config(256, 8, 1, 1, 4);
  const TopologyReport r = check_topology(Layout(c), {}, nodes);
  ASSERT_EQ(r.warnings.size(), 1u);
  EXPECT_EQ(r.warnings[0].kind, GroupKind::ep);
  EXPECT_EQ(
      r.warnings[0].message(),
      "ep groups cross nodes (64 of 64 groups span up to 4 nodes); order \"cp-ep-tp-dp-pp\" "
      "keeps them inside; expt_tp groups then cross (ep\u00b7expt_tp = 32 > 8 GPUs per node); "
      "or --etp 1 keeps ep and expt_tp inside (expert dp 8 -> 64)");
  ParallelConfig fixed = c;
  fixed.etp = 1;
  EXPECT_TRUE(check_topology(Layout(fixed), {}, nodes).warnings.empty());

  // expt_tp larger than a node (etp 16): no order helps, etp 1 does.
  const TopologyReport big = check_topology(Layout(make_config(256, 16, 1, 1, 2)), {}, nodes);
  bool offered = false;
  for (const TopologyWarning& w : big.warnings)
    offered =
        offered || w.message().find("--etp 1 keeps ep and expt_tp inside") != std::string::npos;
  EXPECT_TRUE(offered) << big.warnings.size();

  // An ep group larger than a node: etp 1 cannot help, so it is not offered.
  for (const TopologyWarning& w :
       check_topology(Layout(make_config(256, 2, 1, 1, 16)), {}, nodes).warnings)
    EXPECT_EQ(w.message().find("--etp"), std::string::npos) << w.message();
}

// The largest world: the advice and the spans of the node-local kinds need no memory
// proportional to the world.
TEST(TopologyAdvice, LargestWorldAdviceIsCheap) {
  const ParallelConfig c = make_config(kMaxWorldSize, 1);
  const TopologyReport r =
      check_topology(Layout(c), std::vector<GroupKind>{GroupKind::tp}, NodeMap(8));
  EXPECT_TRUE(r.warnings.empty());
  EXPECT_EQ(r.kinds.at(0).max_nodes_spanned, 1);
  EXPECT_EQ(best_order(c, NodeMap(8)), c.order);
}

}  // namespace
}  // namespace commgrid
