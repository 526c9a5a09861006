// RankGrid: the spec's worked example (§5) and the closed forms against enumeration.
#include <gtest/gtest.h>

#include "commgrid/rank_grid.hpp"

namespace commgrid {
namespace {

// Dense grid of spec example (a): tp 2, cp 2, ep 1, dp 2, pp 2, default order.
RankGrid example_a() {
  return RankGrid({2, 2, 1, 2, 2, 1},
                  {Axis::tp, Axis::cp, Axis::ep, Axis::dp, Axis::pp, Axis::gtp_remat});
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

// Every mask of a grid against its enumeration: group index, position, member and
// group_of of every rank of every group.
void expect_closed_forms_match_enumeration(const RankGrid& g) {
  for (unsigned bits = 0; bits < (1u << kNumAxes); ++bits) {
    AxisSet mask;  // the set of the axes whose bit is on
    for (Axis a : kAllAxes)
      if (bits & (1u << static_cast<unsigned>(a))) mask = mask.with(a);
    const GroupList groups = g.groups(mask);
    ASSERT_EQ(static_cast<std::int64_t>(groups.size()), g.num_groups(mask));
    for (std::size_t q = 0; q < groups.size(); ++q) {
      ASSERT_EQ(static_cast<std::int64_t>(groups[q].size()), g.group_size(mask));
      for (std::size_t k = 0; k < groups[q].size(); ++k) {
        const Rank r = groups[q][k];
        ASSERT_TRUE(g.contains(r)) << r;
        EXPECT_EQ(g.group_index(mask, r), static_cast<std::int64_t>(q)) << "bits " << bits;
        EXPECT_EQ(g.position(mask, r), static_cast<std::int64_t>(k)) << "bits " << bits;
        EXPECT_EQ(g.member(mask, static_cast<std::int64_t>(q), static_cast<std::int64_t>(k)), r);
        const auto direct = g.group_of(mask, r);
        EXPECT_TRUE(std::equal(direct.begin(), direct.end(), groups[q].begin(), groups[q].end()));
      }
    }
  }
}

TEST(RankGrid, ClosedFormsMatchEnumerationForEveryMask) {
  expect_closed_forms_match_enumeration(RankGrid(
      {3, 2, 1, 2, 2, 1}, {Axis::dp, Axis::tp, Axis::pp, Axis::cp, Axis::ep, Axis::gtp_remat}));
}

// HEAD's sixth axis inside the order, and a rank offset: the grid covers [5, 5 + 48).
TEST(RankGrid, SixAxesAndAnOffset) {
  const RankGrid g({2, 2, 1, 3, 2, 2},
                   {Axis::tp, Axis::gtp_remat, Axis::cp, Axis::ep, Axis::dp, Axis::pp}, 5);
  EXPECT_EQ(g.world_size(), 48);
  EXPECT_EQ(g.offset(), 5);
  EXPECT_FALSE(g.contains(4));
  EXPECT_TRUE(g.contains(5));
  EXPECT_TRUE(g.contains(52));
  EXPECT_FALSE(g.contains(53));
  EXPECT_EQ(g.stride(Axis::gtp_remat), 2);
  EXPECT_EQ(g.stride(Axis::dp), 8);
  EXPECT_EQ(g.coordinate(5 + 2 + 8, Axis::gtp_remat), 1);
  EXPECT_EQ(g.coordinate(5 + 2 + 8, Axis::dp), 1);
  EXPECT_EQ(g.group_of({Axis::tp, Axis::gtp_remat}, 5 + 9), (std::vector<Rank>{13, 14, 15, 16}));
  expect_closed_forms_match_enumeration(g);
}

}  // namespace
}  // namespace commgrid
