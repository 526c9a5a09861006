// The layers of the GPT other than the MLP: layer norm, causal self-attention (tensor and
// context parallel), the vocab-parallel embedding and the loss head with vocab-parallel
// cross-entropy. Each layer's forward fills a cache that its backward reads; backward
// accumulates into the parameters' gradients.
#pragma once

#include <string>
#include <vector>

#include "model_config.hpp"
#include "parallel.hpp"
#include "tensor.hpp"

namespace train_gpt {

/// Layer norm over the hidden dimension; its parameters are replicated over tp.
class LayerNorm {
 public:
  struct Cache {
    Mat xhat;
    Eigen::VectorXd rstd;
  };
  LayerNorm(const std::string& name, int hidden, const ModelConfig& config, bool sequence_parallel);
  Mat forward(const Mat& x, Cache& cache) const;
  Mat backward(const Mat& dy, const Cache& cache);
  void collect(std::vector<Param*>& out) {
    out.push_back(&weight_);
    out.push_back(&bias_);
  }

 private:
  Param weight_, bias_;
};

/// The rows of one micro-batch on this rank: tokens in sequence-major order (row j*b + i
/// is local position j of sample i) and their global positions.
struct TokenRows {
  int samples = 0;             ///< b
  std::vector<int> positions;  ///< global position of each local position j (cp)
  int rows() const { return samples * static_cast<int>(positions.size()); }
};

/// Causal multi-head self-attention. Q, K and V are column-parallel (this tp rank's heads),
/// the output projection is row-parallel. With cp, K and V are gathered over cp (hcp)
/// and their gradients reduce-scattered back.
class Attention {
 public:
  struct Cache {
    Mat x;                     ///< input, full rows (after copy_to_tp)
    Mat q, k_all, v_all, out;  ///< q [n, h/tp]; k, v gathered over cp; out [n, h/tp]
    std::vector<Mat> probs;    ///< softmax per (sample, local head)
    std::vector<int> key_positions;
  };
  Attention(const std::string& name, const ModelConfig& config, const ModelParallel& mp);
  /// x: [n_sp, h] (this rank's sequence slice with sequence parallelism); returns the same.
  Mat forward(const Mat& x, const TokenRows& rows, Cache& cache) const;
  Mat backward(const Mat& dy, const TokenRows& rows, const Cache& cache);
  void collect(std::vector<Param*>& out);

 private:
  const ModelConfig& config_;
  const ModelParallel& mp_;
  int local_heads_;
  Param wq_, bq_, wk_, bk_, wv_, bv_, wo_, bo_;
};

/// The token embedding (vocab-parallel: tp rank r holds rows [r V/tp, (r+1) V/tp)) plus
/// the learned position embedding (replicated over tp).
class Embedding {
 public:
  struct Cache {
    std::vector<int> tokens;
  };
  Embedding(const ModelConfig& config, const ModelParallel& mp);
  /// Returns [n_sp, h]: this rank's sequence slice with sequence parallelism.
  Mat forward(const std::vector<int>& tokens, const TokenRows& rows, Cache& cache) const;
  void backward(const Mat& dy, const TokenRows& rows, const Cache& cache);
  void collect(std::vector<Param*>& out) {
    out.push_back(&word_);
    out.push_back(&position_);
  }
  Param& word() { return word_; }

 private:
  const ModelParallel& mp_;
  Param word_, position_;
};

/// Final layer norm, output layer tied to the word embedding, vocab-parallel
/// cross-entropy (max and sum over tp).
class LossHead {
 public:
  struct Cache {
    LayerNorm::Cache norm;
    Mat x;      ///< normed input, full rows
    Mat probs;  ///< softmax over this rank's vocab slice
    std::vector<int> labels;
  };
  /// `word`: the word embedding of this rank when it also holds the first chunk (one
  /// parameter, tied), or nullptr to create the last stage's own copy.
  LossHead(const ModelConfig& config, const ModelParallel& mp, Param* word);
  /// Returns the sum of the cross-entropy over this rank's rows (equal on every tp rank).
  double forward(const Mat& x, const std::vector<int>& labels, Cache& cache) const;
  /// Gradient of scale * (the sum forward returned) with respect to x.
  Mat backward(const Cache& cache, double scale);
  void collect(std::vector<Param*>& out);

 private:
  const ModelParallel& mp_;
  LayerNorm norm_;
  Param own_word_;
  Param* word_;
};

}  // namespace train_gpt
