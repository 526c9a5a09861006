// The model on one rank: analytic gradients against finite differences, and the pipeline
// schedules (every pass once, in an order that completes).
#include <gtest/gtest.h>

#include <cmath>
#include <commgrid/commgrid.hpp>
#include <map>
#include <set>
#include <tuple>

#include "data.hpp"
#include "model.hpp"
#include "schedule.hpp"
#include "setup.hpp"

namespace train_gpt {
namespace {

// Runs fn with the collections of a one-rank world.
template <class Fn>
void on_one_rank(Fn fn) {
  commgrid::run_local_ranks(1, [&](commgrid::Communicator& world) {
    commgrid::ParallelConfig layout;
    layout.world_size = 1;
    commgrid::ProcessGroups groups;
    groups.initialize(world, layout);
    const Collections c = make_collections(groups);
    fn(c);
  });
}

// Every element; every third under the sanitizers, where Eigen runs unoptimized.
#ifdef TRAIN_GPT_SANITIZED
constexpr Eigen::Index kElementStride = 3;
#else
constexpr Eigen::Index kElementStride = 1;
#endif

TEST(TrainGptModel, GradientsMatchFiniteDifferences) {
  on_one_rank([](const Collections& c) {
    ModelConfig cfg;
    cfg.vocab = 16;
    cfg.hidden = 8;
    cfg.heads = 2;
    cfg.seq = 8;
    cfg.layers = 2;
    cfg.init_std = 0.5;  // large weights: every nonlinearity is exercised
    const ModelParallel mp(c.model, /*sequence_parallel=*/false);
    GptModel model(cfg, mp, 1);
    const DataLoader data(cfg, 2, 1, 0, 1, mp.positions_of(0, cfg.seq));
    const MicroBatch mb = data.get(0, 0);
    ModelChunk& chunk = model.chunk(0);
    auto loss = [&] {
      double l = 0;
      chunk.forward(0, mb, Mat(), l);
      return l;
    };
    model.zero_grad();
    loss();
    chunk.backward(0, Mat(), 1.0);

    const double eps = 1e-5;
    int checked = 0;
    double worst = 0;
    std::string worst_at;
    for (Param* p : model.params()) {
      for (Eigen::Index i = 0; i < p->value.size(); i += kElementStride) {
        double& x = p->value.data()[i];
        const double saved = x;
        x = saved + eps;
        const double up = loss();
        x = saved - eps;
        const double down = loss();
        x = saved;
        const double numeric = (up - down) / (2 * eps);
        const double analytic = p->grad.data()[i];
        const double err = std::abs(numeric - analytic) / std::max(1.0, std::abs(analytic));
        if (err > worst) {
          worst = err;
          worst_at = p->name + "[" + std::to_string(i) + "]: analytic " + std::to_string(analytic) +
                     ", numeric " + std::to_string(numeric);
        }
        ++checked;
      }
    }
    EXPECT_GT(checked, 1000 / kElementStride);
    EXPECT_LT(worst, 1e-7) << "worst element " << worst_at;
  });
}

TEST(TrainGptModel, SameParametersFromTheSameSeed) {
  // Two shards of one tensor hold exactly the full tensor's elements.
  const Param full = make_param("w", 4, 6, 0, 0, 4, 6, Init::normal(1.0), 7);
  const Param left = make_param("w", 4, 6, 0, 0, 4, 3, Init::normal(1.0), 7);
  const Param right = make_param("w", 4, 6, 0, 3, 4, 3, Init::normal(1.0), 7);
  EXPECT_EQ(full.value.leftCols(3), left.value);
  EXPECT_EQ(full.value.rightCols(3), right.value);
  const Param other = make_param("w", 4, 6, 0, 0, 4, 6, Init::normal(1.0), 8);
  EXPECT_NE(full.value, other.value);
}

// Simulates every stage of a pipeline with sends that never block and receives that wait:
// the schedules must complete, each pass running after the passes it needs.
void expect_schedule_completes(int pp, int vpp, int m) {
  std::vector<std::vector<ScheduleOp>> ops;
  for (int s = 0; s < pp; ++s) ops.push_back(pipeline_schedule(pp, s, vpp, m));
  const int chunks = pp * vpp;
  auto chunk_of = [&](int stage, int v) { return v * pp + stage; };
  std::set<std::tuple<bool, int, int>> done;  // (forward, chunk, micro-batch)
  std::vector<std::size_t> at(static_cast<std::size_t>(pp), 0);
  for (bool progress = true; progress;) {
    progress = false;
    for (int s = 0; s < pp; ++s) {
      auto& i = at[static_cast<std::size_t>(s)];
      while (i < ops[static_cast<std::size_t>(s)].size()) {
        const ScheduleOp& op = ops[static_cast<std::size_t>(s)][i];
        const int c = chunk_of(s, op.vstage);
        const bool ready = op.forward
                               ? (c == 0 || done.count({true, c - 1, op.micro_batch}))
                               : (done.count({true, c, op.micro_batch}) &&
                                  (c == chunks - 1 || done.count({false, c + 1, op.micro_batch})));
        if (!ready) break;
        EXPECT_TRUE(done.insert({op.forward, c, op.micro_batch}).second) << "pass repeated";
        ++i;
        progress = true;
      }
    }
  }
  EXPECT_EQ(done.size(), static_cast<std::size_t>(2 * chunks * m))
      << "pp " << pp << " vpp " << vpp << " micro-batches " << m << ": schedule deadlocks";
}

TEST(TrainGptSchedule, OneFOneBCompletes) {
  for (int pp : {1, 2, 3, 4})
    for (int m : {1, 2, 3, 4, 8}) expect_schedule_completes(pp, 1, m);
}

TEST(TrainGptSchedule, InterleavedCompletes) {
  for (int pp : {2, 4})
    for (int vpp : {2, 3})
      for (int groups : {1, 2, 3}) expect_schedule_completes(pp, vpp, pp * groups);
}

TEST(TrainGptSchedule, OneFOneBWarmup) {
  // Stage s of 4 runs 3 - s forwards before its first backward, then alternates.
  for (int s = 0; s < 4; ++s) {
    const auto ops = pipeline_schedule(4, s, 1, 6);
    ASSERT_EQ(ops.size(), 12u);
    const int warmup = 3 - s;
    for (int k = 0; k < warmup; ++k)
      EXPECT_EQ(ops[static_cast<std::size_t>(k)], (ScheduleOp{true, 0, k}));
    EXPECT_EQ(ops[static_cast<std::size_t>(warmup)], (ScheduleOp{true, 0, warmup}));
    EXPECT_EQ(ops[static_cast<std::size_t>(warmup + 1)], (ScheduleOp{false, 0, 0}));
  }
}

}  // namespace
}  // namespace train_gpt
