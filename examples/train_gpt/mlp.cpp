#include "mlp.hpp"

#include <cmath>
#include <numbers>

namespace train_gpt {

double gelu(double x) { return 0.5 * x * (1.0 + std::erf(x / std::numbers::sqrt2)); }

double gelu_grad(double x) {
  return 0.5 * (1.0 + std::erf(x / std::numbers::sqrt2)) +
         x * std::exp(-0.5 * x * x) / std::sqrt(2.0 * std::numbers::pi);
}

namespace {

struct DenseCache final : Mlp::Cache {
  Mat x;    ///< input, full rows
  Mat pre;  ///< fc1 output before GeLU
  Mat act;  ///< after GeLU
};

}  // namespace

DenseMlp::DenseMlp(const std::string& name, const ModelConfig& config, const ModelParallel& mp)
    : mp_(mp) {
  const int h = config.hidden;
  const int f = config.ffn();
  const int fl = f / mp.tp_size();
  const int c0 = mp.tp_rank() * fl;
  w1_ = make_param(name + ".fc1.weight", h, f, 0, c0, h, fl, Init::normal(config.init_std),
                   config.seed);
  b1_ = make_param(name + ".fc1.bias", 1, f, 0, c0, 1, fl, Init::fill(0.0), config.seed);
  w2_ = make_param(name + ".fc2.weight", f, h, c0, 0, fl, h,
                   Init::normal(config.init_std / std::sqrt(2.0 * config.layers)), config.seed);
  b2_ = make_param(name + ".fc2.bias", 1, h, 0, 0, 1, h, Init::fill(0.0), config.seed);
  b2_.tp_duplicate = true;
  b2_.sequence_parallel = mp.sequence_parallel();
}

void DenseMlp::collect(std::vector<Param*>& out) {
  for (Param* p : {&w1_, &b1_, &w2_, &b2_}) out.push_back(p);
}

Mat DenseMlp::forward(const Mat& x, std::unique_ptr<Cache>& cache) const {
  auto c = std::make_unique<DenseCache>();
  c->x = mp_.copy_to_tp(x);
  c->pre = c->x * w1_.value;
  c->pre.rowwise() += b1_.value.row(0);
  c->act = c->pre.unaryExpr([](double v) { return gelu(v); });
  Mat y = mp_.reduce_from_tp(c->act * w2_.value);
  y.rowwise() += b2_.value.row(0);
  cache = std::move(c);
  return y;
}

Mat DenseMlp::backward(const Mat& dy, const Cache& cache) {
  const auto& c = static_cast<const DenseCache&>(cache);
  b2_.grad.row(0) += dy.colwise().sum();
  const Mat dyf = mp_.reduce_from_tp_backward(dy);
  w2_.grad.noalias() += c.act.transpose() * dyf;
  const Mat dact = dyf * w2_.value.transpose();
  const Mat dpre = dact.array() * c.pre.unaryExpr([](double v) { return gelu_grad(v); }).array();
  w1_.grad.noalias() += c.x.transpose() * dpre;
  b1_.grad.row(0) += dpre.colwise().sum();
  return mp_.copy_to_tp_backward(dpre * w1_.value.transpose());
}

}  // namespace train_gpt
