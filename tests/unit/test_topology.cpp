// Node topology: spans of known layouts, the warnings, and the order search.
#include <gtest/gtest.h>

#include "make_config.hpp"

#include "commgrid/error.hpp"
#include "commgrid/topology.hpp"

namespace commgrid {
namespace {

using test::make_config;

KindSpan span_of(const TopologyReport& r, GroupKind k, int level = 0) {
  for (const KindSpan& s : r.kinds)
    if (s.kind == k && s.level == level) return s;
  ADD_FAILURE() << "no row for " << kind_name(k);
  return {};
}

TEST(NodeMap, RejectsZeroAndCountsPartialNodes) {
  EXPECT_THROW(NodeMap(0), InvalidValueError);
  EXPECT_THROW(NodeMap(-8), InvalidValueError);
  const NodeMap m(8);
  EXPECT_EQ(m.nodes(64), 8);
  EXPECT_EQ(m.nodes(12), 2);  // the last node holds 4 ranks
  EXPECT_EQ(m.nodes(4), 1);
  EXPECT_EQ(m.node(15), 1);
  EXPECT_EQ(m.device(15), 7);
}

TEST(NodeMap, NodesSpannedIgnoresMemberOrder) {
  const NodeMap m(4);
  const std::vector<Rank> sorted = {0, 1, 5, 9}, unsorted = {9, 1, 8, 2};
  EXPECT_EQ(m.nodes_spanned(sorted), 3);
  EXPECT_EQ(m.nodes_spanned(unsorted), 2);
  EXPECT_EQ(m.nodes_spanned({}), 0);
}

// tp 8 on 8-GPU nodes with the default order: each tp group is one node; dp strides over
// all of them.
TEST(Topology, DefaultOrderKeepsTpInsideNodes) {
  const Layout l(make_config(64, 8));
  const std::vector<GroupKind> kinds = {GroupKind::tp, GroupKind::dp, GroupKind::pp};
  const TopologyReport r = check_topology(l, kinds, NodeMap(8));
  EXPECT_EQ(r.nodes, 8);
  EXPECT_EQ(span_of(r, GroupKind::tp), (KindSpan{GroupKind::tp, 0, 8, 8, 8, 0, 1}));
  EXPECT_EQ(span_of(r, GroupKind::dp), (KindSpan{GroupKind::dp, 0, 8, 8, 8, 8, 8}));
  EXPECT_EQ(span_of(r, GroupKind::pp), (KindSpan{GroupKind::pp, 0, 64, 1, 1, 0, 1}));
  EXPECT_TRUE(r.warnings.empty());
  EXPECT_FALSE(crosses_nodes(l, GroupKind::tp, NodeMap(8)));
  EXPECT_EQ(suggest_order(l.config(), GroupKind::tp, NodeMap(8)), l.config().order);
}

// dp innermost: every tp group strides over all 8 nodes; moving tp in front of dp (one
// swap, the smallest change) fixes it, and expt_tp (etp = tp) with it.
TEST(Topology, DpInnermostSplitsTpAcrossNodes) {
  const Layout l(make_config(64, 8, 1, 1, 1, "dp-tp-cp-ep-pp"));
  const NodeMap nodes(8);
  const std::vector<GroupKind> kinds = {GroupKind::tp};
  const TopologyReport r = check_topology(l, kinds, nodes);
  EXPECT_EQ(span_of(r, GroupKind::tp), (KindSpan{GroupKind::tp, 0, 8, 8, 8, 8, 8}));
  ASSERT_EQ(r.warnings.size(), 2u);  // tp and expt_tp, even though only tp was asked for
  EXPECT_EQ(r.warnings[0].kind, GroupKind::tp);
  EXPECT_EQ(r.warnings[1].kind, GroupKind::expt_tp);
  EXPECT_EQ(r.warnings[0].order, "tp-dp-cp-ep-pp");
  EXPECT_EQ(r.warnings[0].message(),
            "tp groups cross nodes (8 of 8 groups span up to 8 nodes); order \"tp-dp-cp-ep-pp\" "
            "keeps them inside");
  // The suggestion really does keep them inside.
  ParallelConfig fixed = l.config();
  fixed.order = *r.warnings[0].order;
  const Layout lf(fixed);
  EXPECT_TRUE(check_topology(lf, kinds, nodes).warnings.empty());
  EXPECT_EQ(span_of(check_topology(lf, kinds, nodes), GroupKind::tp).crossing_groups, 0);
}

// The suggestion keeps the user's tokens (an order that omits size-1 axes stays short).
TEST(Topology, SuggestionPermutesTheGivenTokens) {
  const ParallelConfig c = make_config(64, 8, 1, 1, 1, "dp-tp");
  EXPECT_EQ(suggest_order(c, GroupKind::tp, NodeMap(8)), "tp-dp");
}

// ep groups on the expert grid: dp before ep spreads them; swapping the two fixes it.
TEST(Topology, ExpertParallelAcrossNodes) {
  const Layout l(make_config(16, 1, 1, 1, 4, "tp-cp-dp-ep-pp"));
  const NodeMap nodes(4);
  const TopologyReport r = check_topology(l, std::vector<GroupKind>{GroupKind::ep}, nodes);
  EXPECT_EQ(span_of(r, GroupKind::ep), (KindSpan{GroupKind::ep, 0, 4, 4, 4, 4, 4}));
  ASSERT_EQ(r.warnings.size(), 1u);
  EXPECT_EQ(r.warnings[0].kind, GroupKind::ep);
  EXPECT_EQ(r.warnings[0].order, "tp-cp-ep-dp-pp");
}

// cp 2 x tp 8 cannot both fit an 8-GPU node: tp, the more important kind, stays inside,
// and the cp warning says why instead of suggesting an order that would push tp out.
TEST(Topology, ContextParallelYieldsToTp) {
  const Layout l(make_config(32, 8, 1, 2));
  const NodeMap nodes(8);
  const TopologyReport r = check_topology(l, std::vector<GroupKind>{GroupKind::cp}, nodes);
  EXPECT_EQ(span_of(r, GroupKind::cp), (KindSpan{GroupKind::cp, 0, 16, 2, 2, 16, 2}));
  ASSERT_EQ(r.warnings.size(), 1u);
  EXPECT_EQ(r.warnings[0].kind, GroupKind::cp);
  EXPECT_FALSE(r.warnings[0].order.has_value());
  EXPECT_FALSE(r.warnings[0].avoidable);
  EXPECT_FALSE(r.avoidable());
  EXPECT_EQ(r.best_order, l.config().order);
  // cp alone could be kept inside, at tp's expense.
  ParallelConfig alone = l.config();
  alone.order = *suggest_order(l.config(), GroupKind::cp, nodes);
  EXPECT_EQ(alone.order, "cp-tp-ep-dp-pp");
  EXPECT_TRUE(crosses_nodes(Layout(alone), GroupKind::tp, nodes));
  EXPECT_FALSE(crosses_nodes(Layout(alone), GroupKind::cp, nodes));
}

TEST(Topology, GroupLargerThanANodeHasNoFix) {
  const Layout l(make_config(32, 16));
  const TopologyReport r = check_topology(l, std::vector<GroupKind>{GroupKind::tp}, NodeMap(8));
  ASSERT_EQ(r.warnings.size(), 2u);  // tp and expt_tp
  EXPECT_FALSE(r.warnings[0].order.has_value());
  EXPECT_EQ(r.warnings[0].message(),
            "tp groups cross nodes (2 of 2 groups span up to 2 nodes); no order keeps them "
            "inside: a group has 16 ranks, a node 8 GPUs");
}

// A partial last node: 12 ranks on 8-GPU nodes. tp 3 groups [6,7,8] straddle the
// boundary and no order avoids that.
TEST(Topology, PartialLastNode) {
  const Layout l(make_config(12, 3));
  const NodeMap nodes(8);
  const TopologyReport r = check_topology(l, std::vector<GroupKind>{GroupKind::tp}, nodes);
  EXPECT_EQ(r.nodes, 2);
  EXPECT_EQ(span_of(r, GroupKind::tp), (KindSpan{GroupKind::tp, 0, 4, 3, 3, 1, 2}));
  ASSERT_EQ(r.warnings.size(), 2u);
  EXPECT_FALSE(r.warnings[0].order.has_value());
  EXPECT_NE(r.warnings[0].message().find("no valid order keeps them inside"), std::string::npos);
  // tp 4 on the same nodes fits.
  EXPECT_TRUE(check_topology(Layout(make_config(12, 4)), {}, nodes).warnings.empty());
}

TEST(Topology, HcpLevelsAndUnsortedKinds) {
  ParallelConfig c = make_config(16, 2, 1, 4);
  c.hcp = {2, 2};
  const Layout l(c);
  const std::vector<GroupKind> kinds = {GroupKind::hcp, GroupKind::intra_dist_opt};
  const TopologyReport r = check_topology(l, kinds, NodeMap(4));
  ASSERT_EQ(r.kinds.size(), 3u);
  // hcp level 0 pairs cp neighbours [0,2]: inside a 4-GPU node; level 1 [0,4]: across.
  EXPECT_EQ(span_of(r, GroupKind::hcp, 0).crossing_groups, 0);
  EXPECT_EQ(span_of(r, GroupKind::hcp, 1).crossing_groups, 8);
  EXPECT_EQ(span_of(r, GroupKind::intra_dist_opt).max_nodes_spanned, 4);
}

TEST(Topology, Errors) {
  const Layout l(make_config(16, 2));
  EXPECT_THROW((void)check_topology(l, std::vector<GroupKind>{GroupKind::hcp}, NodeMap(8)),
               UnknownKindError);
  EXPECT_THROW((void)suggest_order(l.config(), GroupKind::dp, NodeMap(8)), ConfigError);
  EXPECT_THROW((void)crosses_nodes(l, GroupKind::pp, NodeMap(8)), ConfigError);
  EXPECT_FALSE(wants_node_local(GroupKind::dp));
  EXPECT_TRUE(wants_node_local(GroupKind::expt_tp));
}

}  // namespace
}  // namespace commgrid
