// The MLP of a transformer block behind a small interface, so that a block can hold the
// dense MLP or (issue 11) a mixture of experts without knowing which.
#pragma once

#include <memory>
#include <string>
#include <vector>

#include "model_config.hpp"
#include "parallel.hpp"
#include "tensor.hpp"

namespace train_gpt {

/// What a block's MLP does. Input and output are [n_sp, h]: this rank's rows, a slice of
/// the sequence with sequence parallelism. An implementation does its own communication.
class Mlp {
 public:
  /// What forward keeps for backward; each implementation derives its own.
  struct Cache {
    virtual ~Cache() = default;
  };
  virtual ~Mlp() = default;
  virtual Mat forward(const Mat& x, std::unique_ptr<Cache>& cache) const = 0;
  /// Accumulates the parameters' gradients and returns the input's.
  virtual Mat backward(const Mat& dy, const Cache& cache) = 0;
  /// An auxiliary loss this micro-batch added (a router's load balancing); 0 for dense.
  virtual double aux_loss(const Cache& /*cache*/) const { return 0.0; }
  virtual void collect(std::vector<Param*>& out) = 0;
};

/// fc1 (column-parallel over tp), GeLU, fc2 (row-parallel over tp).
class DenseMlp final : public Mlp {
 public:
  DenseMlp(const std::string& name, const ModelConfig& config, const ModelParallel& mp);
  Mat forward(const Mat& x, std::unique_ptr<Cache>& cache) const override;
  Mat backward(const Mat& dy, const Cache& cache) override;
  void collect(std::vector<Param*>& out) override;

 private:
  const ModelParallel& mp_;
  Param w1_, b1_, w2_, b2_;
};

/// GeLU (the exact, erf form) and its derivative.
double gelu(double x);
double gelu_grad(double x);

}  // namespace train_gpt
