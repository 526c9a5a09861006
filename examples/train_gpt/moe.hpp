// A mixture-of-experts MLP (issue 11): a softmax top-k router, E experts spread over ep
// (each expert a GeLU MLP, column/row-parallel over expt_tp), tokens dispatched to their
// experts' ranks with alltoallv over ep and back (or all-gathered over tp_ep), no token
// dropping, and Switch's load-balancing auxiliary loss with token counts summed over tp_cp.
#pragma once

#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "mlp.hpp"

namespace train_gpt {

/// What the MoE layers of a run share besides the model sizes.
struct MoeConfig {
  int experts = 4;               ///< E, a multiple of ep
  int topk = 2;                  ///< experts per token
  double aux_loss_coeff = 1e-2;  ///< weight of the load-balancing loss
  /// Samples per micro-batch on this rank (rows are position-major: local row r belongs
  /// to sample r % samples) and in the global batch, and the size of dp_cp: the aux
  /// loss is a mean over the global batch's sequences, and every local gradient is
  /// averaged over dp_cp afterwards.
  int samples = 1;
  int global_batch = 1;
  int dp_cp_size = 1;
  /// The router's gradient is partial over tp with sequence parallelism.
  bool sequence_parallel = false;
  /// `--dispatcher allgather`: tokens and picks all-gathered over tp_ep, outputs
  /// reduce-scattered back, instead of the all-to-all over ep.
  bool allgather_dispatcher = false;
  /// Test-only fault: leave out the sum of the router's token counts over tp_cp.
  bool skip_tp_cp_sum = false;
};

/// The expert groups an MoE layer uses, from ModelCommProcessGroups.
struct ExpertGroups {
  commgrid::Communicator* ep = nullptr;       ///< the all-to-all dispatcher's group
  commgrid::Communicator* tp_cp = nullptr;    ///< the router's token-count sum
  commgrid::Communicator* tp_ep = nullptr;    ///< the all-gather dispatcher's group
  commgrid::Communicator* expt_tp = nullptr;  ///< each expert's column/row parallel group
};

/// Router, dispatch, experts, combine. Input and output are this rank's rows [n, h].
class MoeMlp final : public Mlp {
 public:
  /// `aux_sum`: where forward adds this rank's share of the auxiliary loss (summed over
  /// every rank it is the global batch's aux loss times global_batch).
  MoeMlp(const std::string& name, const ModelConfig& config, const MoeConfig& moe,
         ExpertGroups groups, std::shared_ptr<double> aux_sum);
  Mat forward(const Mat& x, std::unique_ptr<Cache>& cache) const override;
  Mat backward(const Mat& dy, const Cache& cache) override;
  void collect(std::vector<Param*>& out) override;

 private:
  /// Sends `rows` (blocks per ep rank, counts in rows) over ep; returns the received rows.
  Mat exchange(const Mat& rows, const std::vector<std::size_t>& send_rows,
               const std::vector<std::size_t>& recv_rows) const;

  /// All-gather over tp_ep (rows of rank r at block r), and its reduce-scatter (sum).
  Mat gather_tp_ep(const Mat& local) const;
  Mat scatter_tp_ep(const Mat& full) const;
  /// expt_tp > 1: replaces recv by every expt_tp rank's received rows (allgatherv) and
  /// records their segments in the cache.
  void gather_etp(Mat& recv, const std::vector<std::pair<int, Eigen::Index>>& segments,
                  Cache& cache) const;
  /// Sums partial results over expt_tp and keeps this rank's rows.
  Mat sum_etp_own_rows(Mat partial, const Cache& cache) const;
  /// The experts on consecutive row blocks of x, block i for local expert segments[i].first.
  Mat run_experts(const Mat& x, const std::vector<std::pair<int, Eigen::Index>>& segments, Mat& pre,
                  Mat& act) const;
  /// Their backward: accumulates the experts' gradients, returns x's.
  Mat experts_backward(const Mat& dout, const Mat& x,
                       const std::vector<std::pair<int, Eigen::Index>>& segments, const Mat& pre,
                       const Mat& act);

  MoeConfig moe_;
  ExpertGroups groups_;
  std::shared_ptr<double> aux_sum_;
  int hidden_, local_experts_, first_expert_, seq_;
  Param router_;
  std::vector<Param> w1_, w2_;  ///< this rank's experts
};

}  // namespace train_gpt
