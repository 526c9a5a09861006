// HyperGrid (HEAD's HyperCommGrid) as a pure layout: groups equal the Megatron kinds for the
// same shape and order, views' shared dims are checked, bad input is a ConfigError.
#include <gtest/gtest.h>

#include "commgrid/error.hpp"
#include "commgrid/hyper_grid.hpp"
#include "commgrid/layout.hpp"

namespace commgrid {
namespace {

TEST(HyperGrid, GroupsEqualMegatronKinds) {
  for (const std::string order : {"tp-cp-dp-pp", "tp-dp-cp-pp", "cp-tp-dp-pp", "dp-cp-tp-pp"}) {
    ParallelConfig c;
    c.world_size = 32;
    c.tp = 2;
    c.cp = 2;
    c.pp = 4;
    c.order = order;
    const Layout layout(c);
    std::vector<std::string> names;
    std::vector<std::int64_t> shape;
    for (std::size_t s = 0; s < order.size(); s += 3) {
      const std::string d = order.substr(s, 2);
      names.push_back(d);
      shape.push_back(d == "tp" ? 2 : d == "cp" ? 2 : d == "dp" ? 2 : 4);
    }
    const HyperGrid g(shape, names, 32);
    EXPECT_EQ(g.groups({"tp"}), layout.groups(GroupKind::tp)) << order;
    EXPECT_EQ(g.groups({"pp"}), layout.groups(GroupKind::pp)) << order;
    EXPECT_EQ(g.groups({"dp", "cp"}), layout.groups(GroupKind::dp_cp)) << order;
    EXPECT_EQ(g.groups({"cp", "dp"}), layout.groups(GroupKind::dp_cp)) << order;  // a set
    EXPECT_EQ(g.groups({"tp", "pp"}), layout.groups(GroupKind::mp)) << order;
    EXPECT_EQ(g.groups({"tp", "cp", "dp"}), layout.groups(GroupKind::tp_dp_cp)) << order;
  }
}

TEST(HyperGrid, RankOffsetAndKeys) {
  const HyperGrid g({2, 4}, {"tp", "pp"}, 16, 8);
  EXPECT_EQ(g.groups({"tp"}).to_vectors(),
            (std::vector<std::vector<Rank>>{{8, 9}, {10, 11}, {12, 13}, {14, 15}}));
  EXPECT_EQ(g.group_of({"pp"}, 9), (std::vector<Rank>{9, 11, 13, 15}));
  EXPECT_FALSE(g.group_of({"pp"}, 3).has_value());
  EXPECT_EQ(g.key({"tp", "pp"}), "pp-tp");  // outermost first, as HEAD keys them
}

TEST(HyperGrid, ViewsCheckSharedDims) {
  HyperGrid g({2, 2, 4}, {"tp", "cp", "dp"}, 16);
  // Another factorization: tp and cp merged into one dim of 4; dp is shared and agrees.
  g.register_view("merged", {4, 4}, {"tpcp", "dp"}, {"dp"});
  EXPECT_EQ(g.groups({"tpcp"}, "merged"), g.groups({"tp", "cp"}));
  EXPECT_EQ(g.key({"dp"}, "merged"), g.key({"dp"}));  // a shared dim is the grid's group
  EXPECT_EQ(g.views(), (std::vector<std::string>{"merged"}));
  // dp placed innermost in the view: its dp groups differ.
  EXPECT_THROW(g.register_view("bad", {4, 4}, {"dp", "x"}, {"dp"}), ConfigError);
  EXPECT_THROW(g.register_view("merged", {4, 4}, {"tpcp", "dp"}), ConfigError);
  EXPECT_THROW(g.register_view("small", {2, 4}, {"a", "b"}), ConfigError);
  EXPECT_THROW(g.register_view("nodim", {4, 4}, {"a", "b"}, {"pp"}), ConfigError);
  EXPECT_THROW(g.register_view("notinview", {4, 4}, {"a", "b"}, {"dp"}), ConfigError);
  EXPECT_THROW((void)g.groups({"tp"}, "nope"), ConfigError);
}

TEST(HyperGrid, BadInput) {
  EXPECT_THROW(HyperGrid({2, 2}, {"tp"}, 4), InvalidValueError);
  EXPECT_THROW(HyperGrid({2, 0}, {"tp", "dp"}, 4), InvalidValueError);
  EXPECT_THROW(HyperGrid({2, 2}, {"tp", "tp"}, 4), InvalidValueError);
  EXPECT_THROW(HyperGrid({2, 2}, {"tp", "dp"}, 4, -1), InvalidValueError);
  EXPECT_THROW(HyperGrid({2, 2}, {"tp", "dp"}, 4, 1), IncompatibleError);
  const HyperGrid g({2, 2}, {"tp", "dp"}, 4);
  EXPECT_THROW((void)g.groups({"pp"}), ConfigError);
  EXPECT_THROW((void)g.groups({"tp", "tp"}), ConfigError);
  EXPECT_THROW((void)g.groups({}), ConfigError);
}

}  // namespace
}  // namespace commgrid
