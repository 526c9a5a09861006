// Every dense layout trains to the same losses and gradient norms as one rank (Gloo
// rank-threads), the loss goes down, and a wrong group is caught.
#include <gtest/gtest.h>

#include <cmath>
#include <commgrid/commgrid.hpp>
#include <mutex>
#include <ostream>
#include <string>
#include <vector>

#include "rank_threads.hpp"
#include "setup.hpp"

namespace train_gpt {
namespace {

struct LayoutCase {
  std::string name;
  int world = 1;
  int tp = 1, pp = 1, cp = 1, vpp = 1, micro_batches = 1, instances = 1, ep = 1;
  std::vector<std::int64_t> hcp;
  std::string order;
  bool sp = false, dist_opt = false;
};

// Test names and ctest names show the layout's name, not its bytes.
void PrintTo(const LayoutCase& l, std::ostream* os) { *os << l.name; }

constexpr double kRelTolerance = 1e-9;

// The acceptance runs: 10 steps of the default model. Under the sanitizers (Eigen
// unoptimized, about 15x slower) the same paths run 4 steps of a shorter sequence, to keep
// the asan preset affordable; the default build runs the full runs.
#ifdef TRAIN_GPT_SANITIZED
constexpr int kSteps = 4;
constexpr int kSeq = 16;
constexpr double kMinLossDrop = 0.05;
#else
constexpr int kSteps = 10;
constexpr int kSeq = 32;
constexpr double kMinLossDrop = 0.5;
#endif

TrainConfig train_config(const LayoutCase& l) {
  TrainConfig c;  // the command line's defaults: vocab 64, hidden 32, 4 heads, seq 32
  c.model.layers = 4;
  c.model.seq = kSeq;
  c.steps = kSteps;
  c.global_batch = 8;
  c.micro_batches = l.micro_batches;
  c.vpp = l.vpp;
  c.sequence_parallel = l.sp;
  c.optimizer.dist_opt = l.dist_opt;
  return c;
}

commgrid::ParallelConfig layout_of(const LayoutCase& l) {
  commgrid::ParallelConfig c;
  c.world_size = l.world;
  c.tp = l.tp;
  c.pp = l.pp;
  c.cp = l.cp;
  c.ep = l.ep;
  c.hcp = l.hcp;
  c.dist_opt_instances = l.instances;
  if (l.vpp > 1) c.vpp = l.vpp;
  if (!l.order.empty()) c.order = l.order;
  return c;
}

std::vector<StepResult> run(const LayoutCase& l, GroupFault fault = GroupFault::none,
                            bool skip_embd_sum = false) {
  const commgrid::ParallelConfig layout = layout_of(l);
  TrainConfig config = train_config(l);
  config.fault_skip_embd_sum = skip_embd_sum;
  const auto per_rank = test::run_on_rank_threads(layout, config, fault);
  // Every rank reports the same numbers (with a wrong group they need not).
  const bool faulty = fault != GroupFault::none || skip_embd_sum;
  for (const auto& r : per_rank) {
    if (faulty) break;
    EXPECT_EQ(r.size(), per_rank[0].size());
    for (std::size_t i = 0; i < r.size() && i < per_rank[0].size(); ++i) {
      EXPECT_EQ(r[i].loss, per_rank[0][i].loss);
      EXPECT_EQ(r[i].grad_norm, per_rank[0][i].grad_norm);
    }
  }
  return per_rank[0];
}

LayoutCase L(std::string name, int world) {
  LayoutCase l;
  l.name = std::move(name);
  l.world = world;
  return l;
}

const std::vector<StepResult>& reference() {
  static const std::vector<StepResult> r = run(L("one_rank", 1));
  return r;
}

using test::rel;

// The largest relative difference from one rank over every step's loss, and (with_norm)
// gradient norm.
double max_difference(const std::vector<StepResult>& got, bool with_norm = true) {
  const auto& ref = reference();
  EXPECT_EQ(got.size(), ref.size());
  double worst = 0;
  for (std::size_t i = 0; i < got.size() && i < ref.size(); ++i) {
    worst = std::max(worst, rel(got[i].loss, ref[i].loss));
    if (with_norm) worst = std::max(worst, rel(got[i].grad_norm, ref[i].grad_norm));
  }
  return worst;
}

TEST(TrainGptReference, LossGoesDown) {
  const auto& ref = reference();
  ASSERT_EQ(ref.size(), static_cast<std::size_t>(kSteps));
  EXPECT_NEAR(ref.front().loss, std::log(64.0), 0.05);  // about uniform at the start
  EXPECT_LT(ref.back().loss, ref.front().loss - kMinLossDrop);
  for (const StepResult& s : ref) EXPECT_GT(s.grad_norm, 0.0);
}

class TrainGptLayouts : public testing::TestWithParam<LayoutCase> {};

TEST_P(TrainGptLayouts, MatchesOneRank) {
  const auto got = run(GetParam());
  ASSERT_EQ(got.size(), static_cast<std::size_t>(kSteps));
  const auto& ref = reference();
  for (std::size_t i = 0; i < got.size(); ++i) {
    EXPECT_LE(rel(got[i].loss, ref[i].loss), kRelTolerance)
        << "step " << got[i].step << ": loss " << got[i].loss << ", one rank " << ref[i].loss;
    EXPECT_LE(rel(got[i].grad_norm, ref[i].grad_norm), kRelTolerance)
        << "step " << got[i].step << ": grad_norm " << got[i].grad_norm << ", one rank "
        << ref[i].grad_norm;
  }
  EXPECT_LT(got.back().loss, got.front().loss - kMinLossDrop);
}

std::vector<LayoutCase> layouts() {
  std::vector<LayoutCase> v;
  auto add = [&](LayoutCase l, auto&& set) {
    set(l);
    v.push_back(l);
  };
  add(L("tp2", 2), [](LayoutCase& l) { l.tp = 2; });
  add(L("tp4_sp", 4), [](LayoutCase& l) {
    l.tp = 4;
    l.sp = true;
  });
  add(L("cp2", 2), [](LayoutCase& l) { l.cp = 2; });
  add(L("cp4_hcp2x2", 4), [](LayoutCase& l) {
    l.cp = 4;
    l.hcp = {2, 2};
  });
  add(L("pp2_1f1b_m4", 2), [](LayoutCase& l) {
    l.pp = 2;
    l.micro_batches = 4;
  });
  add(L("pp4_1f1b_m2", 4), [](LayoutCase& l) {
    l.pp = 4;
    l.micro_batches = 2;
  });
  add(L("pp2_vpp2_m4", 2), [](LayoutCase& l) {
    l.pp = 2;
    l.vpp = 2;
    l.micro_batches = 4;
  });
  add(L("dp4_m2", 4), [](LayoutCase& l) { l.micro_batches = 2; });
  add(L("dp2_dist_opt", 2), [](LayoutCase& l) { l.dist_opt = true; });
  add(L("dp4_dist_opt_2inst", 4), [](LayoutCase& l) {
    l.dist_opt = true;
    l.instances = 2;
  });
  add(L("tp2_dp2_pp2_order_dp_tp_pp", 8), [](LayoutCase& l) {
    l.tp = 2;
    l.pp = 2;
    l.order = "dp-pp-tp-cp-ep";
    l.micro_batches = 2;
  });
  add(L("tp2_cp2_sp_pp2_dist_opt", 8), [](LayoutCase& l) {
    l.tp = 2;
    l.cp = 2;
    l.pp = 2;
    l.sp = true;
    l.dist_opt = true;
    l.micro_batches = 2;
  });
  add(L("tp2_cp2_pp2_dp2_sp_dist_opt_2inst", 16), [](LayoutCase& l) {
    l.tp = 2;
    l.cp = 2;
    l.pp = 2;
    l.sp = true;
    l.dist_opt = true;
    l.instances = 2;
  });
  add(L("tp2_pp2_vpp2_cp2_dp2_sp", 16), [](LayoutCase& l) {
    l.tp = 2;
    l.pp = 2;
    l.vpp = 2;
    l.cp = 2;
    l.sp = true;
    l.micro_batches = 2;
  });
  add(L("cp4_hcp_pp2_dp2_ep2", 16), [](LayoutCase& l) {
    l.cp = 4;
    l.hcp = {2, 2};
    l.pp = 2;
    l.ep = 2;
    l.micro_batches = 2;
  });
  return v;
}

INSTANTIATE_TEST_SUITE_P(Dense, TrainGptLayouts, testing::ValuesIn(layouts()),
                         [](const testing::TestParamInfo<LayoutCase>& i) { return i.param.name; });

// A wrong group must show up as a loss mismatch: the same layout is exact without the
// fault, and its losses are off with it.
TEST(TrainGptFaults, SwappedTpAndDpCpIsCaught) {
  LayoutCase l = L("tp2_dp2", 4);
  l.tp = 2;
  EXPECT_LE(max_difference(run(l)), kRelTolerance);
  EXPECT_GT(max_difference(run(l, GroupFault::swap_tp_dp_cp), /*with_norm=*/false), 1e-6);
}

TEST(TrainGptFaults, SkippedEmbdSumIsCaught) {
  LayoutCase l = L("pp2", 2);
  l.pp = 2;
  EXPECT_LE(max_difference(run(l)), kRelTolerance);
  EXPECT_GT(max_difference(run(l, GroupFault::none, /*skip_embd_sum=*/true), /*with_norm=*/false),
            1e-6);
}

}  // namespace
}  // namespace train_gpt
