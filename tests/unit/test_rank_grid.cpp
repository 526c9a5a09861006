// RankGrid: the spec's worked example (§5) and the closed forms against enumeration.
#include <gtest/gtest.h>

#include "commgrid/rank_grid.hpp"

namespace commgrid {
namespace {

// Dense grid of spec example (a): tp 2, cp 2, ep 1, dp 2, pp 2, default order.
RankGrid example_a() {
  return RankGrid({2, 2, 1, 2, 2}, {Axis::tp, Axis::cp, Axis::ep, Axis::dp, Axis::pp});
}

TEST(RankGrid, StridesAndCoordinates) {
  const RankGrid g = example_a();
  EXPECT_EQ(g.world_size(), 16);
  EXPECT_EQ(g.stride(Axis::tp), 1);
  EXPECT_EQ(g.stride(Axis::cp), 2);
  EXPECT_EQ(g.stride(Axis::ep), 4);
  EXPECT_EQ(g.stride(Axis::dp), 4);
  EXPECT_EQ(g.stride(Axis::pp), 8);
  const auto c = g.coordinates(13);
  EXPECT_EQ(c[static_cast<int>(Axis::tp)], 1);
  EXPECT_EQ(c[static_cast<int>(Axis::cp)], 0);
  EXPECT_EQ(c[static_cast<int>(Axis::ep)], 0);
  EXPECT_EQ(c[static_cast<int>(Axis::dp)], 1);
  EXPECT_EQ(c[static_cast<int>(Axis::pp)], 1);
}

TEST(RankGrid, WorkedExampleDpCp) {
  const RankGrid g = example_a();
  const AxisSet dp_cp{Axis::dp, Axis::cp};
  EXPECT_EQ(g.group_of(dp_cp, 13), (std::vector<Rank>{9, 11, 13, 15}));
  EXPECT_EQ(g.position(dp_cp, 13), 2);
  EXPECT_EQ(g.group_index(dp_cp, 13), 3);
}

TEST(RankGrid, WorkedExampleTpPp) {
  const RankGrid g = example_a();
  const AxisSet tp_pp{Axis::tp, Axis::pp};
  EXPECT_EQ(g.group_of(tp_pp, 13), (std::vector<Rank>{4, 5, 12, 13}));
  EXPECT_EQ(g.group_index(tp_pp, 13), 2);
  EXPECT_EQ(g.position(tp_pp, 13), 3);
}

TEST(RankGrid, ClosedFormsMatchEnumerationForEveryMask) {
  const RankGrid g({3, 2, 1, 2, 2}, {Axis::dp, Axis::tp, Axis::pp, Axis::cp, Axis::ep});
  for (unsigned bits = 0; bits < 32; ++bits) {
    std::vector<Axis> axes;
    for (Axis a : kAllAxes)
      if (bits & (1u << static_cast<unsigned>(a))) axes.push_back(a);
    AxisSet mask;  // the set of the axes whose bit is on
    switch (axes.size()) {
      case 0: mask = AxisSet{}; break;
      case 1: mask = AxisSet{axes[0]}; break;
      case 2: mask = AxisSet{axes[0], axes[1]}; break;
      case 3: mask = AxisSet{axes[0], axes[1], axes[2]}; break;
      case 4: mask = AxisSet{axes[0], axes[1], axes[2], axes[3]}; break;
      default: mask = AxisSet{axes[0], axes[1], axes[2], axes[3], axes[4]}; break;
    }
    const GroupList groups = g.groups(mask);
    ASSERT_EQ(static_cast<std::int64_t>(groups.size()), g.num_groups(mask));
    for (std::size_t q = 0; q < groups.size(); ++q) {
      ASSERT_EQ(static_cast<std::int64_t>(groups[q].size()), g.group_size(mask));
      for (std::size_t k = 0; k < groups[q].size(); ++k) {
        const Rank r = groups[q][k];
        EXPECT_EQ(g.group_index(mask, r), static_cast<std::int64_t>(q)) << "bits " << bits;
        EXPECT_EQ(g.position(mask, r), static_cast<std::int64_t>(k)) << "bits " << bits;
        EXPECT_EQ(g.member(mask, static_cast<std::int64_t>(q), static_cast<std::int64_t>(k)), r);
        const auto direct = g.group_of(mask, r);
        EXPECT_TRUE(std::equal(direct.begin(), direct.end(), groups[q].begin(), groups[q].end()));
      }
    }
  }
}

}  // namespace
}  // namespace commgrid
