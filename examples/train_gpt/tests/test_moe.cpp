// Mixture of experts (issue 11): every MoE layout trains to the same losses (with the
// load-balancing loss) and gradient norms as one rank (Gloo rank-threads), the loss goes
// down, and a wrong expert group is caught. A tiny model, to keep ctest (and the sanitizer
// build) fast.
#include <gtest/gtest.h>

#include <algorithm>
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

struct MoeCase {
  std::string name;
  int world = 1;
  int tp = 1, pp = 1, cp = 1, ep = 1, etp = 1, micro_batches = 1, instances = 1;
  std::string order;
  bool sp = false, dist_opt = false, allgather = false;
};

void PrintTo(const MoeCase& l, std::ostream* os) { *os << l.name; }

constexpr double kRelTolerance = 1e-9;
#ifdef TRAIN_GPT_SANITIZED
constexpr int kSteps = 4;
#else
constexpr int kSteps = 10;
#endif

TrainConfig moe_config(const MoeCase& l) {
  TrainConfig c;
  c.model.vocab = 32;
  c.model.hidden = 16;
  c.model.heads = 2;
  c.model.seq = 16;
  c.model.layers = 2;
  c.steps = kSteps;
  c.global_batch = 8;
  c.micro_batches = l.micro_batches;
  c.sequence_parallel = l.sp;
  c.optimizer.dist_opt = l.dist_opt;
  c.allgather_dispatcher = l.allgather;
  c.moe = true;
  c.experts = 4;
  c.topk = 2;
  c.aux_loss_coeff = 0.1;  // large enough that a wrong token count shows
  return c;
}

commgrid::ParallelConfig moe_layout(const MoeCase& l) {
  commgrid::ParallelConfig c;
  c.world_size = l.world;
  c.tp = l.tp;
  c.pp = l.pp;
  c.cp = l.cp;
  c.ep = l.ep;
  c.etp = l.etp;
  c.dist_opt_instances = l.instances;
  if (!l.order.empty()) c.order = l.order;
  return c;
}

std::vector<StepResult> run_moe(const MoeCase& l, GroupFault fault = GroupFault::none,
                                bool skip_tp_cp_sum = false) {
  const commgrid::ParallelConfig layout = moe_layout(l);
  TrainConfig config = moe_config(l);
  config.fault_skip_tp_cp_sum = skip_tp_cp_sum;
  return test::run_on_rank_threads(layout, config, fault)[0];
}

MoeCase M(std::string name, int world) {
  MoeCase l;
  l.name = std::move(name);
  l.world = world;
  return l;
}

const std::vector<StepResult>& moe_reference() {
  static const std::vector<StepResult> r = run_moe(M("one_rank", 1));
  return r;
}

using test::rel;

double worst_difference(const std::vector<StepResult>& got) {
  const auto& ref = moe_reference();
  EXPECT_EQ(got.size(), ref.size());
  double worst = 0;
  for (std::size_t i = 0; i < got.size() && i < ref.size(); ++i)
    worst = std::max({worst, rel(got[i].loss, ref[i].loss), rel(got[i].grad_norm, ref[i].grad_norm),
                      rel(got[i].aux_loss, ref[i].aux_loss)});
  return worst;
}

TEST(TrainGptMoeReference, LossGoesDownAndAuxLossCounts) {
  const auto& ref = moe_reference();
  ASSERT_EQ(ref.size(), static_cast<std::size_t>(kSteps));
  EXPECT_LT(ref.back().loss, ref.front().loss - 0.05);
  // Two MoE layers, each about balanced at the start (perfect balance gives exactly the
  // coefficient, 0.1, per layer; the most unbalanced routing coefficient x E / k).
  EXPECT_NEAR(ref.front().aux_loss, 2 * 0.1, 0.02);
  for (const StepResult& s : ref) EXPECT_GT(s.grad_norm, 0.0);
}

class TrainGptMoeLayouts : public testing::TestWithParam<MoeCase> {};

TEST_P(TrainGptMoeLayouts, MatchesOneRank) {
  const auto got = run_moe(GetParam());
  ASSERT_EQ(got.size(), static_cast<std::size_t>(kSteps));
  const auto& ref = moe_reference();
  for (std::size_t i = 0; i < got.size(); ++i) {
    EXPECT_LE(rel(got[i].loss, ref[i].loss), kRelTolerance)
        << "step " << got[i].step << ": loss " << got[i].loss << ", one rank " << ref[i].loss;
    EXPECT_LE(rel(got[i].aux_loss, ref[i].aux_loss), kRelTolerance)
        << "step " << got[i].step << ": aux " << got[i].aux_loss << ", one rank "
        << ref[i].aux_loss;
    EXPECT_LE(rel(got[i].grad_norm, ref[i].grad_norm), kRelTolerance)
        << "step " << got[i].step << ": grad_norm " << got[i].grad_norm << ", one rank "
        << ref[i].grad_norm;
  }
  EXPECT_LT(got.back().loss, got.front().loss - 0.05);
}

std::vector<MoeCase> moe_layouts() {
  std::vector<MoeCase> v;
  auto add = [&](MoeCase l, auto&& set) {
    set(l);
    v.push_back(l);
  };
  add(M("ep2", 2), [](MoeCase& l) { l.ep = 2; });
  add(M("ep4", 4), [](MoeCase& l) { l.ep = 4; });
  add(M("ep2_expert_dp2_dp4", 4), [](MoeCase& l) { l.ep = 2; });
  add(M("tp2_sp_etp1_ep2", 4), [](MoeCase& l) {
    l.tp = 2;
    l.sp = true;
    l.ep = 2;
  });
  add(M("cp2_ep2", 4), [](MoeCase& l) {
    l.cp = 2;
    l.ep = 2;
  });
  add(M("pp2_ep2_m2", 4), [](MoeCase& l) {
    l.pp = 2;
    l.ep = 2;
    l.micro_batches = 2;
  });
  add(M("ep2_dist_opt_2inst", 4), [](MoeCase& l) {
    l.ep = 2;
    l.dist_opt = true;
    l.instances = 2;
  });
  add(M("ep2_cp2_order_dp_pp_tp_cp_ep", 4), [](MoeCase& l) {
    l.ep = 2;
    l.cp = 2;
    l.order = "dp-pp-tp-cp-ep";
  });
  add(M("tp2_sp_etp1_ep2_pp2_dist_opt", 8), [](MoeCase& l) {
    l.tp = 2;
    l.sp = true;
    l.ep = 2;
    l.pp = 2;
    l.micro_batches = 2;
    l.dist_opt = true;
  });
  add(M("tp1_etp2_ep2", 4), [](MoeCase& l) {
    l.etp = 2;
    l.ep = 2;
  });
  add(M("tp2_sp_etp2_ep2", 4), [](MoeCase& l) {
    l.tp = 2;
    l.sp = true;
    l.etp = 2;
    l.ep = 2;
  });
  add(M("tp2_sp_etp2_ep2_pp2_allgather", 8), [](MoeCase& l) {
    l.tp = 2;
    l.sp = true;
    l.etp = 2;
    l.ep = 2;
    l.pp = 2;
    l.micro_batches = 2;
    l.allgather = true;
  });
  add(M("ep4_allgather", 4), [](MoeCase& l) {
    l.ep = 4;
    l.allgather = true;
  });
  add(M("tp2_sp_etp1_ep2_cp2_allgather", 8), [](MoeCase& l) {
    l.tp = 2;
    l.sp = true;
    l.ep = 2;
    l.cp = 2;
    l.allgather = true;
  });
  return v;
}

INSTANTIATE_TEST_SUITE_P(Moe, TrainGptMoeLayouts, testing::ValuesIn(moe_layouts()),
                         [](const testing::TestParamInfo<MoeCase>& info) {
                           return info.param.name;
                         });

// A wrong expert group is caught by the comparison with one rank; the same layout without
// the fault matches (TrainGptMoeLayouts).
TEST(TrainGptMoeFaults, DenseDpAsExpertDpIsCaught) {
  MoeCase l = M("ep2_expert_dp2_dp4", 4);
  l.ep = 2;
  EXPECT_GT(worst_difference(run_moe(l, GroupFault::dp_as_expt_dp)), 1e-6);
}

TEST(TrainGptMoeFaults, SkippedTpCpTokenCountSumIsCaught) {
  MoeCase l = M("cp2_ep2", 4);
  l.cp = 2;
  l.ep = 2;
  EXPECT_GT(worst_difference(run_moe(l, GroupFault::none, true)), 1e-6);
}

TEST(TrainGptMoeConfig, TpWithoutSequenceParallelIsRejected) {
  MoeCase l = M("tp2_ep2_no_sp", 4);
  l.tp = 2;
  l.ep = 2;
  EXPECT_THROW(check_train_config(moe_config(l), moe_layout(l)), commgrid::IncompatibleError);
  l.sp = true;
  EXPECT_NO_THROW(check_train_config(moe_config(l), moe_layout(l)));
  l.ep = 3;  // 4 experts over ep 3
  EXPECT_THROW(check_train_config(moe_config(l), moe_layout(l)), commgrid::DivisibilityError);
}

}  // namespace
}  // namespace train_gpt
