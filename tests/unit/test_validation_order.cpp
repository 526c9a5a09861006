// When several rules fail, validate() reports the one Megatron-core raises first: rules in
// the order 1, 2, 3, 12, 4, 5, 10 (dense grid), 6, 10 (expert grid), 7, 11, 8a, 9, 8b.
// Each case below fails two rules that the old numbering order reported the other way.
#include <gtest/gtest.h>

#include "commgrid/config.hpp"
#include "commgrid/error.hpp"

namespace commgrid {
namespace {

ParallelConfig cfg(std::int64_t w, std::int64_t tp, std::int64_t pp, std::int64_t cp,
                   std::int64_t ep, const char* order) {
  ParallelConfig c;
  c.world_size = w;
  c.tp = tp;
  c.pp = pp;
  c.cp = cp;
  c.ep = ep;
  c.order = order;
  return c;
}

std::string first_error(const ParallelConfig& c) {
  try {
    c.validate();
  } catch (const ConfigError& e) {
    return e.what();
  }
  return "valid";
}

// 10 (dense: cp omitted) before 6 (etp*ep*pp = 16 does not divide 8).
TEST(ValidationOrder, DenseOmittedAxisBeforeExpertDivisibility) {
  EXPECT_EQ(first_error(cfg(8, 1, 1, 2, 16, "tp-ep-dp-pp")),
            "order \"tp-ep-dp-pp\" omits \"cp\", but cp = 2; add \"cp\" to the order");
}

// 5 (vpp without pp) before 10 (dense).
TEST(ValidationOrder, VppBeforeOmittedAxis) {
  ParallelConfig c = cfg(8, 1, 1, 2, 1, "tp-ep-dp-pp");
  c.vpp = 2;
  EXPECT_EQ(first_error(c), "vpp = 2 requires pp > 1, got pp = 1");
}

// 10 (expert: ep omitted) before 7 (order not ending in pp, expert_dp 2 != dp 4).
TEST(ValidationOrder, ExpertOmittedAxisBeforePpLast) {
  EXPECT_EQ(first_error(cfg(16, 2, 2, 1, 2, "tp-pp-cp-dp")),
            "order \"tp-pp-cp-dp\" omits \"ep\", but ep = 2; add \"ep\" to the order");
}

// 11 (pipeline groups differ) before 8a (3 instances do not divide dp*cp = 2).
TEST(ValidationOrder, PipelineGroupsBeforeDistOpt) {
  ParallelConfig c = cfg(8, 2, 2, 1, 2, "tp-pp-ep-dp");
  c.etp = 1;
  c.dist_opt_instances = 3;
  EXPECT_NE(first_error(c).find("pipeline groups differ"), std::string::npos) << first_error(c);
}

// 9 (hcp product) before 8b (2 instances do not divide expert_dp = 1).
TEST(ValidationOrder, HcpBeforeExpertDistOpt) {
  ParallelConfig c = cfg(16, 1, 1, 2, 16, "tp-cp-ep-dp-pp");
  c.etp = 1;
  c.hcp = {4};
  c.dist_opt_instances = 2;
  EXPECT_EQ(first_error(c), "hcp sizes [4] multiply to 4, but cp = 2");
}

// Inside rule 10, the dense grid's dp comes before the expert grid's tp (etp).
TEST(ValidationOrder, DenseGridBeforeExpertGridInsideRule10) {
  ParallelConfig c = cfg(8, 1, 1, 1, 1, "cp-ep-pp");
  c.etp = 2;
  EXPECT_EQ(first_error(c),
            "order \"cp-ep-pp\" omits \"dp\", but dp = 8/(1*1*1) = 8; add \"dp\" to the order");
}

// Megatron's generator looks at tp, pp, dp, ep, cp: pp is reported before dp and cp.
TEST(ValidationOrder, Rule10FollowsMegatronAxisSequence) {
  EXPECT_EQ(first_error(cfg(16, 1, 2, 2, 1, "tp-ep")),
            "order \"tp-ep\" omits \"pp\", but pp = 2; add \"pp\" to the order");
}

// Sizes the library reports as an int have an upper bound (rule 12).
TEST(ValidationOrder, VppAboveIntIsOverflow) {
  ParallelConfig c = cfg(8, 1, 2, 1, 1, "tp-cp-ep-dp-pp");
  c.vpp = 2147483648LL;
  EXPECT_THROW(c.validate(), OverflowError);
  EXPECT_EQ(first_error(c), "vpp = 2147483648 exceeds 2147483647, the largest virtual pipeline size");
  c.vpp = 2147483647LL;
  EXPECT_EQ(first_error(c), "valid");
}

}  // namespace
}  // namespace commgrid
