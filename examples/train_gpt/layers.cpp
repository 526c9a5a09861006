#include "layers.hpp"

#include <cmath>
#include <limits>

namespace train_gpt {

using commgrid::ReduceOp;

namespace {

constexpr double kNormEps = 1e-5;

// Adds a row vector to every row.
void add_bias(Mat& y, const Mat& bias) { y.rowwise() += bias.row(0); }

}  // namespace

// ---- LayerNorm -------------------------------------------------------------------

LayerNorm::LayerNorm(const std::string& name, int hidden, const ModelConfig& config,
                     bool sequence_parallel)
    : weight_(
          make_param(name + ".weight", 1, hidden, 0, 0, 1, hidden, Init::fill(1.0), config.seed)),
      bias_(make_param(name + ".bias", 1, hidden, 0, 0, 1, hidden, Init::fill(0.0), config.seed)) {
  for (Param* p : {&weight_, &bias_}) {
    p->tp_duplicate = true;
    p->sequence_parallel = sequence_parallel;
  }
}

Mat LayerNorm::forward(const Mat& x, Cache& cache) const {
  const auto n = x.rows();
  const double h = static_cast<double>(x.cols());
  cache.xhat.resize(n, x.cols());
  cache.rstd.resize(n);
  for (Eigen::Index r = 0; r < n; ++r) {
    const double mean = x.row(r).sum() / h;
    const double var = (x.row(r).array() - mean).square().sum() / h;
    cache.rstd(r) = 1.0 / std::sqrt(var + kNormEps);
    cache.xhat.row(r) = (x.row(r).array() - mean) * cache.rstd(r);
  }
  Mat y = cache.xhat.array().rowwise() * weight_.value.row(0).array();
  add_bias(y, bias_.value);
  return y;
}

Mat LayerNorm::backward(const Mat& dy, const Cache& cache) {
  weight_.grad.row(0) += (dy.array() * cache.xhat.array()).colwise().sum().matrix();
  bias_.grad.row(0) += dy.colwise().sum();
  const Mat dxhat = dy.array().rowwise() * weight_.value.row(0).array();
  const double h = static_cast<double>(dy.cols());
  Mat dx(dy.rows(), dy.cols());
  for (Eigen::Index r = 0; r < dy.rows(); ++r) {
    const double mean_d = dxhat.row(r).sum() / h;
    const double mean_dx = dxhat.row(r).dot(cache.xhat.row(r)) / h;
    dx.row(r) = cache.rstd(r) *
                (dxhat.row(r).array() - mean_d - cache.xhat.row(r).array() * mean_dx).matrix();
  }
  return dx;
}

// ---- Attention -------------------------------------------------------------------

Attention::Attention(const std::string& name, const ModelConfig& config, const ModelParallel& mp)
    : config_(config), mp_(mp), local_heads_(config.heads / mp.tp_size()) {
  const int h = config.hidden;
  const int hl = h / mp.tp_size();
  const int c0 = mp.tp_rank() * hl;  // first column (head-major) of this rank's heads
  const std::uint64_t seed = config.seed;
  const Init w = Init::normal(config.init_std);
  auto column = [&](const std::string& n) { return make_param(n, h, h, 0, c0, h, hl, w, seed); };
  auto column_bias = [&](const std::string& n) {
    return make_param(n, 1, h, 0, c0, 1, hl, Init::fill(0.0), seed);
  };
  wq_ = column(name + ".q.weight");
  bq_ = column_bias(name + ".q.bias");
  wk_ = column(name + ".k.weight");
  bk_ = column_bias(name + ".k.bias");
  wv_ = column(name + ".v.weight");
  bv_ = column_bias(name + ".v.bias");
  // Residual projections start smaller with depth, as GPT-2.
  wo_ = make_param(name + ".proj.weight", h, h, c0, 0, hl, h,
                   Init::normal(config.init_std / std::sqrt(2.0 * config.layers)), seed);
  bo_ = make_param(name + ".proj.bias", 1, h, 0, 0, 1, h, Init::fill(0.0), seed);
  bo_.tp_duplicate = true;
  bo_.sequence_parallel = mp.sequence_parallel();
}

void Attention::collect(std::vector<Param*>& out) {
  for (Param* p : {&wq_, &bq_, &wk_, &bk_, &wv_, &bv_, &wo_, &bo_}) out.push_back(p);
}

Mat Attention::forward(const Mat& x, const TokenRows& rows, Cache& c) const {
  c.x = mp_.copy_to_tp(x);
  const int b = rows.samples;
  const int sl = static_cast<int>(rows.positions.size());
  const int n = rows.rows();
  const int dh = config_.head_dim();
  const double inv = 1.0 / std::sqrt(static_cast<double>(dh));
  c.q = c.x * wq_.value;
  add_bias(c.q, bq_.value);
  Mat k = c.x * wk_.value;
  add_bias(k, bk_.value);
  Mat v = c.x * wv_.value;
  add_bias(v, bv_.value);
  c.k_all = mp_.gather_cp(k);
  c.v_all = mp_.gather_cp(v);
  const auto& owners = mp_.cp_block_owner();
  c.key_positions.clear();
  for (int owner : owners)
    for (int p : mp_.positions_of(owner, config_.seq)) c.key_positions.push_back(p);
  const int sk = static_cast<int>(c.key_positions.size());

  c.out = Mat::Zero(n, c.q.cols());
  c.probs.assign(static_cast<std::size_t>(b * local_heads_), Mat());
  Mat qs(sl, dh), ks(sk, dh), vs(sk, dh);
  for (int i = 0; i < b; ++i)
    for (int hd = 0; hd < local_heads_; ++hd) {
      for (int j = 0; j < sl; ++j) qs.row(j) = c.q.block(j * b + i, hd * dh, 1, dh);
      for (int t = 0; t < static_cast<int>(owners.size()); ++t)
        for (int j = 0; j < sl; ++j) {
          ks.row(t * sl + j) = c.k_all.block(t * n + j * b + i, hd * dh, 1, dh);
          vs.row(t * sl + j) = c.v_all.block(t * n + j * b + i, hd * dh, 1, dh);
        }
      Mat s = (qs * ks.transpose()) * inv;
      for (int j = 0; j < sl; ++j) {
        double mx = -std::numeric_limits<double>::infinity();
        for (int m = 0; m < sk; ++m)
          if (c.key_positions[m] <= rows.positions[j]) mx = std::max(mx, s(j, m));
        double sum = 0;
        for (int m = 0; m < sk; ++m) {
          s(j, m) = c.key_positions[m] <= rows.positions[j] ? std::exp(s(j, m) - mx) : 0.0;
          sum += s(j, m);
        }
        s.row(j) /= sum;
      }
      const Mat o = s * vs;
      for (int j = 0; j < sl; ++j) c.out.block(j * b + i, hd * dh, 1, dh) = o.row(j);
      c.probs[static_cast<std::size_t>(i * local_heads_ + hd)] = std::move(s);
    }
  Mat y = mp_.reduce_from_tp(c.out * wo_.value);
  add_bias(y, bo_.value);
  return y;
}

Mat Attention::backward(const Mat& dy, const TokenRows& rows, const Cache& c) {
  const int b = rows.samples;
  const int sl = static_cast<int>(rows.positions.size());
  const int n = rows.rows();
  const int dh = config_.head_dim();
  const double inv = 1.0 / std::sqrt(static_cast<double>(dh));
  const int blocks = static_cast<int>(mp_.cp_block_owner().size());
  const int sk = static_cast<int>(c.key_positions.size());

  bo_.grad.row(0) += dy.colwise().sum();
  const Mat dyf = mp_.reduce_from_tp_backward(dy);
  wo_.grad.noalias() += c.out.transpose() * dyf;
  const Mat dout = dyf * wo_.value.transpose();

  Mat dq = Mat::Zero(n, c.q.cols());
  Mat dk_all = Mat::Zero(c.k_all.rows(), c.k_all.cols());
  Mat dv_all = Mat::Zero(c.v_all.rows(), c.v_all.cols());
  Mat qs(sl, dh), ks(sk, dh), vs(sk, dh), dos(sl, dh);
  for (int i = 0; i < b; ++i)
    for (int hd = 0; hd < local_heads_; ++hd) {
      for (int j = 0; j < sl; ++j) {
        qs.row(j) = c.q.block(j * b + i, hd * dh, 1, dh);
        dos.row(j) = dout.block(j * b + i, hd * dh, 1, dh);
      }
      for (int t = 0; t < blocks; ++t)
        for (int j = 0; j < sl; ++j) {
          ks.row(t * sl + j) = c.k_all.block(t * n + j * b + i, hd * dh, 1, dh);
          vs.row(t * sl + j) = c.v_all.block(t * n + j * b + i, hd * dh, 1, dh);
        }
      const Mat& p = c.probs[static_cast<std::size_t>(i * local_heads_ + hd)];
      const Mat dvs = p.transpose() * dos;
      const Mat dp = dos * vs.transpose();
      Mat ds = p.array() * (dp.array().colwise() - (dp.array() * p.array()).rowwise().sum());
      ds *= inv;
      const Mat dqs = ds * ks;
      const Mat dks = ds.transpose() * qs;
      for (int j = 0; j < sl; ++j) dq.block(j * b + i, hd * dh, 1, dh) = dqs.row(j);
      for (int t = 0; t < blocks; ++t)
        for (int j = 0; j < sl; ++j) {
          dk_all.block(t * n + j * b + i, hd * dh, 1, dh) += dks.row(t * sl + j);
          dv_all.block(t * n + j * b + i, hd * dh, 1, dh) += dvs.row(t * sl + j);
        }
    }
  // Every cp rank's queries saw every rank's keys: the owners sum the gradients.
  const Mat dk = mp_.reduce_scatter_cp(dk_all);
  const Mat dv = mp_.reduce_scatter_cp(dv_all);
  wq_.grad.noalias() += c.x.transpose() * dq;
  bq_.grad.row(0) += dq.colwise().sum();
  wk_.grad.noalias() += c.x.transpose() * dk;
  bk_.grad.row(0) += dk.colwise().sum();
  wv_.grad.noalias() += c.x.transpose() * dv;
  bv_.grad.row(0) += dv.colwise().sum();
  Mat dx = dq * wq_.value.transpose();
  dx.noalias() += dk * wk_.value.transpose();
  dx.noalias() += dv * wv_.value.transpose();
  return mp_.copy_to_tp_backward(dx);
}

// ---- Embedding -------------------------------------------------------------------

Embedding::Embedding(const ModelConfig& config, const ModelParallel& mp) : mp_(mp) {
  const int vl = config.vocab / mp.tp_size();
  word_ = make_param("embedding.word", config.vocab, config.hidden, mp.tp_rank() * vl, 0, vl,
                     config.hidden, Init::normal(config.init_std), config.seed);
  word_.word_embedding = true;
  position_ = make_param("embedding.position", config.seq, config.hidden, 0, 0, config.seq,
                         config.hidden, Init::normal(config.init_std), config.seed);
  position_.position_embedding = true;
  position_.tp_duplicate = true;
  position_.sequence_parallel = mp.sequence_parallel();
}

Mat Embedding::forward(const std::vector<int>& tokens, const TokenRows& rows, Cache& c) const {
  c.tokens = tokens;
  const auto vstart = word_.row_offset;
  const auto vl = word_.value.rows();
  Mat partial = Mat::Zero(rows.rows(), word_.value.cols());
  for (int r = 0; r < rows.rows(); ++r) {
    const auto local = tokens[static_cast<std::size_t>(r)] - vstart;
    if (local >= 0 && local < vl) partial.row(r) = word_.value.row(local);
  }
  Mat emb = mp_.reduce_from_tp(partial);
  // With sequence parallelism this rank holds rows [tp_rank * n_sp, (tp_rank+1) * n_sp).
  const int offset = mp_.sequence_parallel() ? mp_.tp_rank() * static_cast<int>(emb.rows()) : 0;
  for (int r = 0; r < emb.rows(); ++r)
    emb.row(r) +=
        position_.value.row(rows.positions[static_cast<std::size_t>((offset + r) / rows.samples)]);
  return emb;
}

void Embedding::backward(const Mat& dy, const TokenRows& rows, const Cache& c) {
  const int offset = mp_.sequence_parallel() ? mp_.tp_rank() * static_cast<int>(dy.rows()) : 0;
  for (int r = 0; r < dy.rows(); ++r)
    position_.grad.row(rows.positions[static_cast<std::size_t>((offset + r) / rows.samples)]) +=
        dy.row(r);
  const Mat full = mp_.reduce_from_tp_backward(dy);
  const auto vstart = word_.row_offset;
  const auto vl = word_.value.rows();
  for (int r = 0; r < full.rows(); ++r) {
    const auto local = c.tokens[static_cast<std::size_t>(r)] - vstart;
    if (local >= 0 && local < vl) word_.grad.row(local) += full.row(r);
  }
}

// ---- LossHead --------------------------------------------------------------------

LossHead::LossHead(const ModelConfig& config, const ModelParallel& mp, Param* word)
    : mp_(mp), norm_("final_norm", config.hidden, config, mp.sequence_parallel()), word_(word) {
  if (word_ == nullptr) {
    // The last stage's copy of the tied embedding: the same name, so the same values.
    const int vl = config.vocab / mp.tp_size();
    own_word_ = make_param("embedding.word", config.vocab, config.hidden, mp.tp_rank() * vl, 0, vl,
                           config.hidden, Init::normal(config.init_std), config.seed);
    own_word_.word_embedding = true;
    own_word_.shared_embedding_copy = true;
    word_ = &own_word_;
  }
}

void LossHead::collect(std::vector<Param*>& out) {
  norm_.collect(out);
  if (word_ == &own_word_) out.push_back(&own_word_);
}

double LossHead::forward(const Mat& x, const std::vector<int>& labels, Cache& c) const {
  c.labels = labels;
  c.x = mp_.copy_to_tp(norm_.forward(x, c.norm));
  const Mat logits = c.x * word_->value.transpose();
  const auto n = logits.rows();
  const auto vstart = word_->row_offset;
  const auto vl = logits.cols();
  Eigen::VectorXd max = logits.rowwise().maxCoeff();
  if (mp_.tp_size() > 1)
    mp_.tp()
        .allreduce(std::span<double>(max.data(), static_cast<std::size_t>(n)), ReduceOp::max)
        ->wait();
  c.probs = (logits.colwise() - max).array().exp().matrix();
  // Sum of exponentials and the target's logit, in one allreduce over tp.
  std::vector<double> sums(static_cast<std::size_t>(2 * n), 0.0);
  for (Eigen::Index r = 0; r < n; ++r) {
    sums[static_cast<std::size_t>(r)] = c.probs.row(r).sum();
    const auto local = labels[static_cast<std::size_t>(r)] - vstart;
    if (local >= 0 && local < vl) sums[static_cast<std::size_t>(n + r)] = logits(r, local);
  }
  if (mp_.tp_size() > 1) mp_.tp().allreduce(std::span<double>(sums), ReduceOp::sum)->wait();
  double loss = 0;
  for (Eigen::Index r = 0; r < n; ++r) {
    const double sum = sums[static_cast<std::size_t>(r)];
    c.probs.row(r) /= sum;
    loss += std::log(sum) + max(r) - sums[static_cast<std::size_t>(n + r)];
  }
  return loss;
}

Mat LossHead::backward(const Cache& c, double scale) {
  Mat dlogits = c.probs;
  const auto vstart = word_->row_offset;
  for (Eigen::Index r = 0; r < dlogits.rows(); ++r) {
    const auto local = c.labels[static_cast<std::size_t>(r)] - vstart;
    if (local >= 0 && local < dlogits.cols()) dlogits(r, local) -= 1.0;
  }
  dlogits *= scale;
  word_->grad.noalias() += dlogits.transpose() * c.x;
  const Mat dx = mp_.copy_to_tp_backward(dlogits * word_->value);
  return norm_.backward(dx, c.norm);
}

}  // namespace train_gpt
