// Validation: every rule of spec §4, its exception type and its message.
#include <gtest/gtest.h>

#include "commgrid/config.hpp"
#include "commgrid/error.hpp"

namespace commgrid {
namespace {

ParallelConfig cfg(std::int64_t w) {
  ParallelConfig c;
  c.world_size = w;
  return c;
}

// Expects validate() to throw exactly type E with exactly this message and parameter.
template <class E>
void expect_error(const ParallelConfig& c, const std::string& message, const std::string& param) {
  try {
    c.validate();
    FAIL() << "no error for " << c.canonical() << "; expected: " << message;
  } catch (const E& e) {
    EXPECT_EQ(e.what(), message);
    EXPECT_EQ(e.parameter(), param);
  } catch (const std::exception& e) {
    FAIL() << "wrong exception type for " << c.canonical() << ": " << e.what();
  }
}

TEST(Config, DefaultsAreValidAndDerived) {
  ParallelConfig c = cfg(16);
  c.tp = 2;
  c.pp = 2;
  c.cp = 2;
  EXPECT_NO_THROW(c.validate());
  EXPECT_EQ(c.dp(), 2);
  EXPECT_EQ(c.expert_tp(), 2);
  EXPECT_EQ(c.expert_dp(), 4);  // cp is not part of expert_dp
  EXPECT_EQ(c.order, "tp-cp-ep-dp-pp");
}

TEST(Config, Rule1WorldSize) {
  expect_error<InvalidValueError>(cfg(0), "world_size must be >= 1, got 0", "world_size");
  expect_error<InvalidValueError>(cfg(-5), "world_size must be >= 1, got -5", "world_size");
}

TEST(Config, Rule2Sizes) {
  ParallelConfig c = cfg(8);
  c.tp = 0;
  expect_error<InvalidValueError>(c, "tp must be >= 1, got 0", "tp");
  c = cfg(8);
  c.pp = -1;
  expect_error<InvalidValueError>(c, "pp must be >= 1, got -1", "pp");
  c = cfg(8);
  c.dist_opt_instances = -2;
  expect_error<InvalidValueError>(c, "dist_opt_instances must be >= 1, got -2",
                                  "dist_opt_instances");
  c = cfg(8);
  c.etp = 0;
  expect_error<InvalidValueError>(c, "etp must be >= 1, got 0", "etp");
  c = cfg(8);
  c.vpp = 0;
  expect_error<InvalidValueError>(c, "vpp must be >= 1, got 0", "vpp");
  c = cfg(8);
  c.cp = 4;
  c.hcp = {2, -2};
  expect_error<InvalidValueError>(c, "hcp[1] must be >= 1, got -2", "hcp");
}

TEST(Config, Rule3Order) {
  ParallelConfig c = cfg(8);
  c.order = "";
  expect_error<OrderError>(c,
                           "order is empty; expected tokens from tp, cp, ep, dp, pp joined by "
                           "'-', e.g. \"tp-cp-ep-dp-pp\"",
                           "order");
  c.order = "tp--dp";
  expect_error<OrderError>(c, "order \"tp--dp\": empty token at position 2", "order");
  c.order = "tp-xx-dp";
  expect_error<OrderError>(
      c, "order \"tp-xx-dp\": unknown token \"xx\" (valid: tp, cp, ep, dp, pp)", "order");
  c.order = "tp-dp-tp";
  expect_error<OrderError>(c, "order \"tp-dp-tp\": token \"tp\" appears twice", "order");
  c.order = "TP-dp";  // tokens are lower case only
  EXPECT_THROW(c.validate(), OrderError);
  c.order = "tp -dp";
  EXPECT_THROW(c.validate(), OrderError);
  c.order = "dp-";
  EXPECT_THROW(c.validate(), OrderError);
}

TEST(Config, Rule4DenseDivisibility) {
  ParallelConfig c = cfg(8);
  c.tp = 3;
  expect_error<DivisibilityError>(c, "world_size 8 is not divisible by tp*pp*cp = 3*1*1 = 3",
                                  "world_size");
}

TEST(Config, Rule5Vpp) {
  ParallelConfig c = cfg(8);
  c.vpp = 2;
  expect_error<IncompatibleError>(c, "vpp = 2 requires pp > 1, got pp = 1", "vpp");
}

TEST(Config, Rule6ExpertDivisibility) {
  ParallelConfig c = cfg(8);
  c.tp = 1;
  c.ep = 16;
  expect_error<DivisibilityError>(
      c, "world_size 8 is not divisible by etp*ep*pp = 1*16*1 = 16 (etp defaults to tp)",
      "world_size");
  c.etp = 1;
  expect_error<DivisibilityError>(c, "world_size 8 is not divisible by etp*ep*pp = 1*16*1 = 16",
                                  "world_size");
}

TEST(Config, Rule7PpLast) {
  ParallelConfig c = cfg(8);
  c.tp = 2;
  c.pp = 2;
  c.ep = 2;
  c.order = "tp-cp-pp-ep-dp";
  expect_error<IncompatibleError>(
      c,
      "order \"tp-cp-pp-ep-dp\" does not end with pp and pp = 2, so expert_dp must equal dp; "
      "got expert_dp = 8/(2*2*2) = 1, dp = 8/(2*2*1) = 2",
      "order");
}

TEST(Config, Rule8DistOpt) {
  ParallelConfig c = cfg(8);
  c.tp = 2;
  c.pp = 2;
  c.dist_opt_instances = 3;
  expect_error<DivisibilityError>(c, "dist_opt_instances = 3 must divide dp*cp = 2*1 = 2",
                                  "dist_opt_instances");
  c = cfg(8);
  c.tp = 1;
  c.ep = 8;
  c.dist_opt_instances = 2;
  expect_error<DivisibilityError>(c, "dist_opt_instances = 2 must divide expert_dp = 8/(1*8*1) = 1",
                                  "dist_opt_instances");
}

TEST(Config, Rule9Hcp) {
  ParallelConfig c = cfg(16);
  c.cp = 4;
  c.hcp = {2, 4};
  expect_error<IncompatibleError>(c, "hcp sizes [2,4] multiply to 8, but cp = 4", "hcp");
  c.hcp = {2, 2};
  EXPECT_NO_THROW(c.validate());
  c.hcp = {4611686018427387904, 4611686018427387904};  // product overflows int64
  expect_error<IncompatibleError>(
      c, "hcp sizes [4611686018427387904,4611686018427387904] multiply to more than cp = 4", "hcp");
}

TEST(Config, Rule10OmittedAxes) {
  ParallelConfig c = cfg(8);
  c.tp = 2;
  c.ep = 2;
  c.order = "tp-cp-dp-pp";
  expect_error<OrderError>(
      c, "order \"tp-cp-dp-pp\" omits \"ep\", but ep = 2; add \"ep\" to the order", "order");
  c = cfg(8);
  c.tp = 2;
  c.order = "tp-cp-ep-pp";
  expect_error<OrderError>(
      c, "order \"tp-cp-ep-pp\" omits \"dp\", but dp = 8/(2*1*1) = 4; add \"dp\" to the order",
      "order");
  c = cfg(2);
  c.etp = 2;
  c.order = "cp-ep-dp-pp";
  expect_error<OrderError>(
      c, "order \"cp-ep-dp-pp\" omits \"tp\", but etp = 2; add \"tp\" to the order", "order");
  // Omitting axes of size 1 is fine.
  c = cfg(4);
  c.tp = 4;
  c.order = "tp";
  EXPECT_NO_THROW(c.validate());
}

TEST(Config, Rule11PipelineGroupsAgree) {
  ParallelConfig c = cfg(8);
  c.tp = 2;
  c.pp = 2;
  c.ep = 2;
  c.etp = 1;
  c.order = "tp-pp-ep-dp";
  expect_error<IncompatibleError>(
      c,
      "order \"tp-pp-ep-dp\": pipeline groups differ between the dense and expert grids (pp "
      "stride 2 = tp vs 1 = etp; first groups [0,2] vs [0,1])",
      "order");
}

TEST(Config, Rule12Overflow) {
  ParallelConfig c = cfg(4096);
  c.tp = 65536;
  c.pp = 65536;
  expect_error<OverflowError>(
      c, "tp*pp*cp exceeds world_size 4096 (tp = 65536, pp = 65536, cp = 1)", "tp");
  c = cfg(3000000000);
  expect_error<OverflowError>(
      c, "world_size 3000000000 exceeds 2147483647, the largest rank count MPI/NCCL can address",
      "world_size");
  c = cfg(1 << 30);
  c.tp = INT64_MAX;
  c.pp = INT64_MAX;
  EXPECT_THROW(c.validate(), OverflowError);
  EXPECT_EQ(c.dp(), 0);  // no wrap-around on an invalid config
  c = cfg(8);
  c.tp = 1;
  c.ep = INT64_MAX;
  c.pp = 2;
  EXPECT_THROW(c.validate(), OverflowError);
}

TEST(Config, ResolvedOrderAppendsOmittedAxesInMegatronSequence) {
  ParallelConfig c = cfg(8);
  c.order = "dp";
  const auto o = c.resolved_order();
  EXPECT_EQ(o[0], Axis::dp);
  EXPECT_EQ(o[1], Axis::tp);
  EXPECT_EQ(o[2], Axis::pp);
  EXPECT_EQ(o[3], Axis::ep);
  EXPECT_EQ(o[4], Axis::cp);
}

TEST(Config, CanonicalDiffersInEveryField) {
  const ParallelConfig base = cfg(8);
  std::vector<ParallelConfig> variants(10, base);
  variants[0].world_size = 16;
  variants[1].tp = 2;
  variants[2].pp = 2;
  variants[3].cp = 2;
  variants[4].ep = 2;
  variants[5].etp = 1;
  variants[6].hcp = {1};
  variants[7].dist_opt_instances = 2;
  variants[8].vpp = 2;
  variants[9].order = "tp-cp-ep-pp-dp";
  for (const auto& v : variants) EXPECT_NE(v.canonical(), base.canonical()) << v.canonical();
  EXPECT_EQ(base.canonical(), cfg(8).canonical());
}

}  // namespace
}  // namespace commgrid
