// Gradient reduction and the optimizer: the model-parallel gradient sums (sequence
// parallel over tp, tied embedding over embd, position embedding over pos_embd), the
// data-parallel reduction over the GradCommProcessGroups, the global gradient norm over mp,
// clipping, and Adam (plain, or with state sharded over intra_dp_cp: the distributed
// optimizer).
#pragma once

#include <commgrid/commgrid.hpp>
#include <span>
#include <vector>

#include "parallel.hpp"
#include "tensor.hpp"

namespace train_gpt {

/// Adam's settings and the gradient clip.
struct OptimizerConfig {
  double lr = 1e-2;
  double beta1 = 0.9;
  double beta2 = 0.95;
  double eps = 1e-8;
  double weight_decay = 0.0;
  /// Clip the global gradient norm to this (0: no clipping).
  double clip_grad = 1.0;
  /// Shard Adam's state and the gradient reduction over intra_dp_cp (Megatron's
  /// distributed optimizer), with one copy per dist-opt instance.
  bool dist_opt = false;
};

/// Megatron's finalize_model_grads without the data-parallel part: sums the gradients of
/// sequence-parallel parameters over tp, of the tied word embedding over embd (the first
/// stage's chunk 0 and the last stage's last chunk), and of the position embedding over
/// pos_embd. `skip_embd_sum` is a test-only fault: it leaves out the embd sum.
void finalize_model_grads(const std::vector<Param*>& params, const ModelParallel& mp,
                          bool skip_embd_sum = false);

/// Adam over this rank's parameters, reducing gradients over the data-parallel groups.
class Optimizer {
 public:
  /// Reads dp_cp, and with dist_opt intra_dp_cp and inter_dist_opt, from `grads`; the
  /// gradient norm is summed over mp (from `mp`).
  ///
  /// With `domain` expert (issue 11) the parameters are experts: gradients summed over
  /// expt_dp (dist_opt: reduce-scattered over intra_expt_dp, summed across inter_dist_opt)
  /// and divided by the dp_cp size (each rank's gradient is dp_cp times its tokens'
  /// share, as for dense ones), and their squared norm summed over `expert_norm_group`
  /// (tp_ep_pp) instead of mp.
  Optimizer(std::vector<Param*> params, const commgrid::GradCommProcessGroups& grads,
            const ModelParallel& mp, OptimizerConfig config,
            ParamDomain domain = ParamDomain::dense,
            commgrid::Communicator* expert_norm_group = nullptr);
  /// Averages the gradients over dp_cp (all-reduce, or reduce-scatter over intra_dp_cp
  /// and all-reduce over inter_dist_opt), computes the global gradient norm, clips, takes
  /// one Adam step (and with dist_opt all-gathers the parameters over intra_dp_cp).
  /// Returns the gradient norm before clipping; collective over every group it uses.
  double step();
  /// The first half of step, for a model with dense and expert parameters: reduces the
  /// gradients and returns this domain's share of the squared global gradient norm.
  double reduce();
  /// The second half: Adam with the gradients of reduce() times `clip`.
  void apply(double clip);
  /// min(1, clip_grad / norm) (1 without clipping).
  double clip_coefficient(double norm) const;
  /// Appends Adam's state on this rank to `out`: its length, then the moments, the
  /// dist_opt master shard and the step count: what a rank that takes this rank's place
  /// needs besides the values.
  void save_state(std::vector<double>& out) const;
  /// Reads what save_state wrote from `in` at `at` (advanced past it).
  void load_state(std::span<const double> in, std::size_t& at);
  /// Reads the state of the same parameters saved under another sharding (a shrunk
  /// layout's): `saved` holds what save_state wrote after its length on each member of the
  /// old shard group (intra_dp_cp, or intra_expt_dp for experts), in its rank order (one
  /// entry without dist_opt). Takes this rank's shard of the moments and, from the
  /// parameters' values (already restored), of the master copy.
  void load_resharded(std::span<const std::span<const double>> saved);

 private:
  void pack_grads(std::vector<double>& flat) const;
  void pack_values(std::vector<double>& flat) const;
  void unpack_values(const std::vector<double>& flat);
  void adam(std::span<double> value, std::span<const double> grad, std::span<double> m,
            std::span<double> v, double clip) const;

  std::vector<Param*> params_;
  OptimizerConfig config_;
  commgrid::Communicator* reduce_group_;  ///< dp_cp, or expt_dp for experts
  commgrid::Communicator* norm_group_;    ///< mp, or tp_ep_pp for experts
  double grad_scale_;                     ///< 1 / dp_cp size
  std::vector<double> grad_;              ///< reduce()'s result for apply()
  commgrid::Communicator* intra_ = nullptr;
  commgrid::Communicator* inter_ = nullptr;
  std::size_t numel_ = 0;   ///< elements of every parameter
  std::size_t padded_ = 0;  ///< numel_ rounded up to a multiple of the shard count
  std::size_t shard_ = 0;   ///< elements of this rank's optimizer shard
  std::size_t shard_begin_ = 0;
  std::vector<double> norm_weight_;  ///< 1 where an element counts in the norm, else 0
  std::vector<double> m_, v_;        ///< Adam's moments (this rank's shard with dist_opt)
  std::vector<double> master_;       ///< dist_opt: this rank's shard of the parameters
  int steps_ = 0;
};

}  // namespace train_gpt
