// When several rules fail, validate() reports the one Megatron-core raises first: rules in
// the order 1, 2, 3, 12, 4, 5, 10 (dense grid), 6, 10 (expert grid), 7, 11, 8a, 9, 8b.
// Each case below fails two rules that the old numbering order reported the other way.
#include <gtest/gtest.h>

#include <random>

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
  } catch (const ConfigError& e) { return e.what(); }
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
  EXPECT_EQ(first_error(c),
            "vpp = 2147483648 exceeds 2147483647, the largest virtual pipeline size");
  c.vpp = 2147483647LL;
  EXPECT_EQ(first_error(c), "valid");
}

// Thousands of random configs that break several rules at once: the error reported is the
// first failing rule in Megatron's order, with each rule's condition written out here
// independently of validate().
TEST(ValidationOrder, FirstFailingRuleOfRandomConfigs) {
  std::mt19937 rng(2189);
  const std::vector<std::string> orders = {
      "tp-cp-ep-dp-pp", "tp-cp-pp-ep-dp", "tp-pp-ep-dp",    "tp-cp-dp-pp",    "tp-ep-dp-pp",
      "cp-ep-dp-pp",    "tp-cp-ep-pp",    "tp-dp-cp-ep-pp", "pp-tp-cp-ep-dp", "tp-ep"};
  const std::int64_t sizes[] = {1, 2, 3, 4, 8};
  int invalid = 0;
  for (int trial = 0; trial < 20000; ++trial) {
    ParallelConfig c;
    c.world_size = std::int64_t{1} << (rng() % 6);
    c.tp = sizes[rng() % 5];
    c.pp = sizes[rng() % 5];
    c.cp = sizes[rng() % 5];
    c.ep = sizes[rng() % 5];
    if (rng() % 2) c.etp = sizes[rng() % 5];
    c.dist_opt_instances = sizes[rng() % 4];
    if (rng() % 4 == 0) c.vpp = 2;
    if (rng() % 4 == 0) c.hcp = {sizes[rng() % 4], sizes[rng() % 3]};
    c.order = orders[rng() % orders.size()];
    const std::int64_t W = c.world_size, e = c.expert_tp();
    auto in = [&](const char* t) {
      return ("-" + c.order + "-").find(std::string("-") + t + "-") != std::string::npos;
    };
    const bool dense_ok = W % (c.tp * c.pp * c.cp) == 0;
    const std::int64_t dp = dense_ok ? W / (c.tp * c.pp * c.cp) : 0;
    const bool expert_ok = W % (e * c.ep * c.pp) == 0;
    const std::int64_t edp = expert_ok ? W / (e * c.ep * c.pp) : 0;
    // pp stride of each grid: the product of the sizes before pp in the order.
    auto stride = [&](bool expert) {
      std::int64_t s = 1;
      std::size_t start = 0;
      const std::string o = c.order + "-";
      for (std::size_t dash; (dash = o.find('-', start)) != std::string::npos; start = dash + 1) {
        const std::string t = o.substr(start, dash - start);
        if (t == "pp") break;
        if (t == "tp") s *= expert ? e : c.tp;
        if (t == "cp") s *= expert ? 1 : c.cp;
        if (t == "ep") s *= expert ? c.ep : 1;
        if (t == "dp") s *= expert ? edp : dp;
      }
      return s;
    };
    std::int64_t hcp_product = 1;
    for (std::int64_t h : c.hcp) hcp_product *= h;
    // (rule, failed?) in Megatron's order; the text identifies the rule in the message.
    const std::vector<std::pair<std::string, bool>> rules = {
        {"is not divisible by tp*pp*cp", !dense_ok},
        {"requires pp > 1", c.vpp && c.pp <= 1},
        {"omits \"tp\", but tp", !in("tp") && c.tp != 1},
        {"omits \"pp\"", !in("pp") && c.pp != 1},
        {"omits \"dp\", but dp", !in("dp") && dp != 1},
        {"omits \"cp\"", !in("cp") && c.cp != 1},
        {"is not divisible by etp*ep*pp", !expert_ok},
        {"omits \"tp\", but etp", !in("tp") && e != 1},
        {"omits \"dp\", but expert_dp", !in("dp") && edp != 1},
        {"omits \"ep\"", !in("ep") && c.ep != 1},
        {"does not end with pp",
         c.order.substr(c.order.size() - 2) != "pp" && c.pp != 1 && edp != dp},
        {"pipeline groups differ", c.pp != 1 && stride(false) != stride(true)},
        {"must divide dp*cp", (dp * c.cp) % c.dist_opt_instances != 0},
        {"hcp sizes", !c.hcp.empty() && hcp_product != c.cp},
        {"must divide expert_dp", edp % c.dist_opt_instances != 0},
    };
    std::string want = "valid";
    for (const auto& [text, failed] : rules)
      if (failed) {
        want = text;
        break;
      }
    const std::string got = first_error(c);
    if (want == "valid") {
      EXPECT_EQ(got, "valid") << c.canonical();
      continue;
    }
    ++invalid;
    ASSERT_NE(got.find(want), std::string::npos)
        << c.canonical() << "\n want rule \"" << want << "\"\n got " << got;
  }
  EXPECT_GT(invalid, 10000);
}

}  // namespace
}  // namespace commgrid
