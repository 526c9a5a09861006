// Training: the model, the pipeline schedule and the optimizer put together. train()
// receives only the two collections; what it needs to know about the layout it reads from
// their groups.
#pragma once

#include <commgrid/commgrid.hpp>
#include <functional>
#include <memory>
#include <span>
#include <vector>

#include "model_config.hpp"
#include "optimizer.hpp"

namespace train_gpt {

/// Everything a run needs besides the groups.
struct TrainConfig {
  ModelConfig model;
  int steps = 10;
  int global_batch = 8;   ///< samples per step, over all data-parallel ranks
  int micro_batches = 1;  ///< per data-parallel rank and step
  int vpp = 1;            ///< model chunks per pipeline stage (interleaved 1F1B when > 1)
  bool sequence_parallel = false;
  OptimizerConfig optimizer;
  /// Test-only fault: leave out the tied embedding's gradient sum over embd.
  bool fault_skip_embd_sum = false;
  /// Mixture of experts (issue 11): the MLP of every moe_every-th layer (layer % moe_every
  /// == 0) is an MoE layer with `experts` experts over ep, top-`topk` softmax routing and
  /// a load-balancing loss weighted by aux_loss_coeff. Needs sequence parallelism when
  /// tp > 1, and the ffn width divisible by etp.
  bool moe = false;
  int experts = 4;
  int topk = 2;
  int moe_every = 1;
  double aux_loss_coeff = 1e-2;
  /// The all-gather dispatcher over tp_ep instead of the all-to-all over ep.
  bool allgather_dispatcher = false;
  /// Test-only fault: leave out the router's token-count sum over tp_cp.
  bool fault_skip_tp_cp_sum = false;
  /// Test-only: called at the start of every step of train() (0-based), e.g. to kill this
  /// process at a chosen step (--fault-kill under mpirun).
  std::function<void(int step)> on_step;
};

/// One step's results, the same on every rank.
struct StepResult {
  int step = 0;          ///< 1-based
  double loss = 0;       ///< mean cross-entropy over the step's global batch, plus aux_loss
  double grad_norm = 0;  ///< global gradient norm before clipping
  double aux_loss = 0;   ///< MoE: the load-balancing loss (mean over the global batch's sequences)
};

/// Checks the run's sizes against the layout's, before any communication: layers by
/// pp * vpp, heads and vocab by tp, hidden by heads, the sequence by 2 * cp when cp > 1
/// (and seq / cp by tp with sequence parallelism), the global batch by dp * micro-batches,
/// micro-batches by pp with vpp, several dist-opt instances only with the distributed
/// optimizer. Throws a commgrid::ConfigError subclass naming the parameter and the values.
void check_train_config(const TrainConfig& config, const commgrid::ParallelConfig& layout);

/// One rank's model, optimizers and data over the two collections (which must outlive
/// it): train() is a loop of step(); the resilient loop (resilient.hpp) also saves and
/// restores the state.
class Trainer {
 public:
  /// Collective over the collections' groups (ModelParallel exchanges cp's members). Throws
  /// ConfigError when the groups' sizes do not fit the model.
  Trainer(const commgrid::ModelCommProcessGroups& model_groups,
          const commgrid::GradCommProcessGroups& grad_groups, const TrainConfig& config);
  ~Trainer();
  Trainer(const Trainer&) = delete;
  Trainer& operator=(const Trainer&) = delete;
  /// Step `step` (0-based; its data is a function of the step alone).
  StepResult step(int step);
  /// Every parameter value and the optimizers' state of this rank, flattened.
  [[nodiscard]] std::vector<double> state() const;
  /// Restores what state() returned on a rank with the same coordinates.
  void set_state(std::span<const double> state);
  /// Restores the state of a rank whose layout shrank (fewer data-parallel replicas; the
  /// same model slice): `dense` holds what state() returned, in the old layout, on every
  /// member of an old rank's dense optimizer shard group (intra_dp_cp, in its rank order; a
  /// rank with this rank's dense coordinates alone without the distributed optimizer);
  /// `expert` (MoE) the same for the expert optimizer (intra_expt_dp of an old rank with
  /// this rank's expert coordinates: pp, expert-tp, ep).
  void set_state_resharded(std::span<const std::span<const double>> dense,
                           std::span<const std::span<const double>> expert = {});

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

/// Trains for config.steps steps and returns every step's loss and gradient norm.
/// Collective over every group of both collections. Throws ConfigError when the groups'
/// sizes do not fit the model (the same check as check_train_config).
std::vector<StepResult> train(const commgrid::ModelCommProcessGroups& model_groups,
                              const commgrid::GradCommProcessGroups& grad_groups,
                              const TrainConfig& config);

}  // namespace train_gpt
