#include "moe.hpp"

#include <algorithm>
#include <cmath>
#include <cstdint>

namespace train_gpt {

using commgrid::ReduceOp;

namespace {

struct MoeCache final : Mlp::Cache {
  Mat x;                       ///< input [n, h]
  Mat probs;                   ///< router softmax [n, E]
  std::vector<double> counts;  ///< top-k picks per (local sample, expert), summed over tp_cp
  // One entry per (token, expert) pick, in send order: by expert, then token.
  std::vector<int> token, expert;
  std::vector<double> gate;
  std::vector<std::size_t> send_rows, recv_rows;  ///< per ep rank
  std::vector<std::int64_t> recv_count;           ///< per (ep rank, local expert)
  /// Consecutive row blocks of `recv`: (local expert, rows).
  std::vector<std::pair<int, Eigen::Index>> segments;
  Mat recv;      ///< tokens received for this rank's experts
  Mat pre, act;  ///< the experts' fc1 output before / after GeLU
  Mat returned;  ///< the experts' outputs for this rank's picks, in send order
  /// The all-gather dispatcher: token indices are rows of the tokens gathered over tp_ep,
  /// the picks those of this rank's experts, and nothing is exchanged over ep.
  bool gathered = false;
  /// Expert-tensor parallelism (all-to-all dispatcher): the received rows of every
  /// expt_tp rank, their segments and row counts; pre/act/recv then hold these.
  std::vector<std::pair<int, Eigen::Index>> etp_segments;
  std::vector<std::size_t> etp_rows;
  std::size_t etp_offset = 0;  ///< where this rank's rows start in the gathered ones
};

}  // namespace

MoeMlp::MoeMlp(const std::string& name, const ModelConfig& config, const MoeConfig& moe,
               ExpertGroups groups, std::shared_ptr<double> aux_sum)
    : moe_(moe), groups_(groups), aux_sum_(std::move(aux_sum)), hidden_(config.hidden),
      local_experts_(moe.experts / groups.ep->size()),
      first_expert_(groups.ep->rank() * (moe.experts / groups.ep->size())), seq_(config.seq) {
  const int h = config.hidden, f = config.ffn(), e = moe.experts;
  // Expert-tensor parallelism: fc1 column-parallel, fc2 row-parallel over expt_tp.
  const int etp = groups.expt_tp->size();
  const int fl = f / etp, c0 = groups.expt_tp->rank() * fl;
  router_ = make_param(name + ".router.weight", h, e, 0, 0, h, e, Init::normal(config.init_std),
                       config.seed);
  // Replicated over tp; with sequence parallelism each tp rank routes only its slice.
  router_.tp_duplicate = true;
  router_.sequence_parallel = moe.sequence_parallel;
  for (int le = 0; le < local_experts_; ++le) {
    const std::string expert = name + ".experts." + std::to_string(first_expert_ + le);
    w1_.push_back(make_param(expert + ".fc1.weight", h, f, 0, c0, h, fl,
                             Init::normal(config.init_std), config.seed));
    w2_.push_back(make_param(expert + ".fc2.weight", f, h, c0, 0, fl, h,
                             Init::normal(config.init_std / std::sqrt(2.0 * config.layers)),
                             config.seed));
    w1_.back().domain = w2_.back().domain = ParamDomain::expert;
  }
}

void MoeMlp::collect(std::vector<Param*>& out) {
  out.push_back(&router_);
  for (int le = 0; le < local_experts_; ++le) {
    out.push_back(&w1_[static_cast<std::size_t>(le)]);
    out.push_back(&w2_[static_cast<std::size_t>(le)]);
  }
}

Mat MoeMlp::exchange(const Mat& rows, const std::vector<std::size_t>& send_rows,
                     const std::vector<std::size_t>& recv_rows) const {
  const auto cols = static_cast<std::size_t>(rows.cols());
  std::size_t total = 0;
  std::vector<std::size_t> send_counts, recv_counts;
  for (std::size_t r : send_rows) send_counts.push_back(r * cols);
  for (std::size_t r : recv_rows) {
    recv_counts.push_back(r * cols);
    total += r;
  }
  // One spare element each, so that no buffer is empty (a null data pointer).
  std::vector<double> send(static_cast<std::size_t>(rows.size()) + 1);
  std::copy_n(rows.data(), rows.size(), send.data());
  std::vector<double> recv(total * cols + 1);
  groups_.ep
      ->alltoallv(std::span<const double>(send.data(), send.size() - 1), send_counts,
                  std::span<double>(recv.data(), recv.size() - 1), recv_counts)
      ->wait();
  Mat out(static_cast<Eigen::Index>(total), rows.cols());
  std::copy_n(recv.data(), out.size(), out.data());
  return out;
}

Mat MoeMlp::gather_tp_ep(const Mat& local) const {
  if (groups_.tp_ep->size() == 1) return local;
  Mat full(local.rows() * groups_.tp_ep->size(), local.cols());
  groups_.tp_ep->allgather(elements(local), elements(full))->wait();
  return full;
}

Mat MoeMlp::scatter_tp_ep(const Mat& full) const {
  if (groups_.tp_ep->size() == 1) return full;
  Mat part(full.rows() / groups_.tp_ep->size(), full.cols());
  groups_.tp_ep->reduce_scatter(elements(full), elements(part), ReduceOp::sum)->wait();
  return part;
}

void MoeMlp::gather_etp(Mat& recv, const std::vector<std::pair<int, Eigen::Index>>& segments,
                        Cache& cache) const {
  auto& c = static_cast<MoeCache&>(cache);
  commgrid::Communicator& etp = *groups_.expt_tp;
  const auto n_seg = segments.size();
  std::vector<std::int64_t> mine, all(n_seg * static_cast<std::size_t>(etp.size()));
  for (const auto& sg : segments) mine.push_back(static_cast<std::int64_t>(sg.second));
  etp.allgather(std::span<const std::int64_t>(mine), std::span<std::int64_t>(all))->wait();
  std::size_t total = 0;
  for (int q = 0; q < etp.size(); ++q) {
    std::size_t rows = 0;
    for (std::size_t i = 0; i < n_seg; ++i) {
      const auto r = all[static_cast<std::size_t>(q) * n_seg + i];
      c.etp_segments.emplace_back(segments[i].first, static_cast<Eigen::Index>(r));
      rows += static_cast<std::size_t>(r);
    }
    if (q == etp.rank()) c.etp_offset = total;
    c.etp_rows.push_back(rows);
    total += rows;
  }
  std::vector<std::size_t> counts;
  for (std::size_t r : c.etp_rows) counts.push_back(r * static_cast<std::size_t>(hidden_));
  Mat gathered(static_cast<Eigen::Index>(total), hidden_);
  etp.allgatherv(elements(recv), elements(gathered), counts)->wait();
  recv = std::move(gathered);
}

Mat MoeMlp::sum_etp_own_rows(Mat partial, const Cache& cache) const {
  const auto& c = static_cast<const MoeCache&>(cache);
  groups_.expt_tp->allreduce(elements(partial), ReduceOp::sum)->wait();
  return partial.middleRows(
      static_cast<Eigen::Index>(c.etp_offset),
      static_cast<Eigen::Index>(c.etp_rows[static_cast<std::size_t>(groups_.expt_tp->rank())]));
}

Mat MoeMlp::run_experts(const Mat& x, const std::vector<std::pair<int, Eigen::Index>>& segments,
                        Mat& pre, Mat& act) const {
  pre.resize(x.rows(), w1_.empty() ? 0 : w1_[0].value.cols());
  act.resize(pre.rows(), pre.cols());
  Mat out(x.rows(), hidden_);
  Eigen::Index at = 0;
  for (const auto& [le, rows] : segments) {
    if (rows == 0) continue;
    const auto u = static_cast<std::size_t>(le);
    pre.middleRows(at, rows) = x.middleRows(at, rows) * w1_[u].value;
    act.middleRows(at, rows) = pre.middleRows(at, rows).unaryExpr([](double v) { return gelu(v); });
    out.middleRows(at, rows) = act.middleRows(at, rows) * w2_[u].value;
    at += rows;
  }
  return out;
}

Mat MoeMlp::experts_backward(const Mat& dout, const Mat& x,
                             const std::vector<std::pair<int, Eigen::Index>>& segments,
                             const Mat& pre, const Mat& act) {
  Mat dx(dout.rows(), hidden_);
  Eigen::Index at = 0;
  for (const auto& [le, rows] : segments) {
    if (rows == 0) continue;
    const auto u = static_cast<std::size_t>(le);
    const auto d = dout.middleRows(at, rows);
    w2_[u].grad.noalias() += act.middleRows(at, rows).transpose() * d;
    const Mat dpre =
        (d * w2_[u].value.transpose()).array() *
        pre.middleRows(at, rows).unaryExpr([](double v) { return gelu_grad(v); }).array();
    w1_[u].grad.noalias() += x.middleRows(at, rows).transpose() * dpre;
    dx.middleRows(at, rows) = dpre * w1_[u].value.transpose();
    at += rows;
  }
  return dx;
}

Mat MoeMlp::forward(const Mat& x, std::unique_ptr<Cache>& cache) const {
  auto c = std::make_unique<MoeCache>();
  const int n = static_cast<int>(x.rows()), e_count = moe_.experts, k = moe_.topk;
  const int ep = groups_.ep->size();
  c->x = x;
  // Router: softmax over the experts, the k most probable (ties to the lower index).
  Mat logits = x * router_.value;
  c->probs.resize(n, e_count);
  std::vector<std::vector<int>> picks(static_cast<std::size_t>(n));
  for (int t = 0; t < n; ++t) {
    const double mx = logits.row(t).maxCoeff();
    double sum = 0;
    for (int e = 0; e < e_count; ++e) sum += (c->probs(t, e) = std::exp(logits(t, e) - mx));
    c->probs.row(t) /= sum;
    std::vector<int> order(static_cast<std::size_t>(e_count));
    for (int e = 0; e < e_count; ++e) order[static_cast<std::size_t>(e)] = e;
    std::stable_sort(order.begin(), order.end(),
                     [&](int a, int b) { return c->probs(t, a) > c->probs(t, b); });
    picks[static_cast<std::size_t>(t)].assign(order.begin(), order.begin() + k);
  }
  // Load balancing (Switch): per sequence, E / (k S^2) * sum_e f_e P_e with f_e the
  // sequence's picks of expert e and P_e its summed probabilities. A sequence's tokens are
  // spread over tp (sequence parallelism) and cp: the counts are summed over tp_cp; each
  // rank adds the P_e of its own tokens, so the sum over ranks is the whole loss.
  const int b = moe_.samples;
  c->counts.assign(static_cast<std::size_t>(b * e_count), 0.0);
  for (int t = 0; t < n; ++t)
    for (int e : picks[static_cast<std::size_t>(t)])
      c->counts[static_cast<std::size_t>((t % b) * e_count + e)] += 1.0;
  if (!moe_.skip_tp_cp_sum && groups_.tp_cp->size() > 1)
    groups_.tp_cp->allreduce(std::span<double>(c->counts), ReduceOp::sum)->wait();
  const double aux_scale = moe_.aux_loss_coeff * e_count / (k * double(seq_) * seq_);
  double aux = 0;
  for (int t = 0; t < n; ++t)
    for (int e = 0; e < e_count; ++e)
      aux += c->counts[static_cast<std::size_t>((t % b) * e_count + e)] * c->probs(t, e);
  *aux_sum_ += aux_scale * aux;
  if (moe_.allgather_dispatcher) {
    // Every rank of tp_ep sees every token of the group and its picks, runs its own
    // experts on those that picked them, and the weighted outputs are reduce-scattered
    // back to the tokens' ranks.
    c->gathered = true;
    const Mat xg = gather_tp_ep(x);
    Mat local_picks(n, 2 * k);
    for (int t = 0; t < n; ++t)
      for (int j = 0; j < k; ++j) {
        const int e = picks[static_cast<std::size_t>(t)][static_cast<std::size_t>(j)];
        local_picks(t, 2 * j) = e;
        local_picks(t, 2 * j + 1) = c->probs(t, e);
      }
    const Mat all_picks = gather_tp_ep(local_picks);
    for (int le = 0; le < local_experts_; ++le) {
      Eigen::Index rows = 0;
      for (Eigen::Index r = 0; r < all_picks.rows(); ++r)
        for (int j = 0; j < k; ++j)
          if (static_cast<int>(all_picks(r, 2 * j)) == first_expert_ + le) {
            c->token.push_back(static_cast<int>(r));
            c->expert.push_back(first_expert_ + le);
            c->gate.push_back(all_picks(r, 2 * j + 1));
            ++rows;
          }
      c->segments.emplace_back(le, rows);
    }
    c->recv.resize(static_cast<Eigen::Index>(c->token.size()), hidden_);
    for (std::size_t i = 0; i < c->token.size(); ++i)
      c->recv.row(static_cast<Eigen::Index>(i)) = xg.row(c->token[i]);
    c->returned = run_experts(c->recv, c->segments, c->pre, c->act);
    Mat yg = Mat::Zero(xg.rows(), hidden_);
    for (std::size_t i = 0; i < c->token.size(); ++i)
      yg.row(c->token[i]) += c->gate[i] * c->returned.row(static_cast<Eigen::Index>(i));
    cache = std::move(c);
    return scatter_tp_ep(yg);
  }
  // Dispatch: picks ordered by expert (so by owning ep rank), then token.
  std::vector<std::int64_t> per_expert(static_cast<std::size_t>(e_count), 0);
  c->send_rows.assign(static_cast<std::size_t>(ep), 0);
  for (int e = 0; e < e_count; ++e)
    for (int t = 0; t < n; ++t)
      for (int j = 0; j < k; ++j)
        if (picks[static_cast<std::size_t>(t)][static_cast<std::size_t>(j)] == e) {
          c->token.push_back(t);
          c->expert.push_back(e);
          c->gate.push_back(c->probs(t, e));
          ++per_expert[static_cast<std::size_t>(e)];
          ++c->send_rows[static_cast<std::size_t>(e / local_experts_)];
        }
  const auto m = static_cast<Eigen::Index>(c->token.size());
  Mat send(m, hidden_);
  for (Eigen::Index i = 0; i < m; ++i) send.row(i) = x.row(c->token[static_cast<std::size_t>(i)]);
  // The counts per expert go to the experts' owners first, so that every rank knows how
  // many rows it receives from each peer.
  c->recv_count.assign(per_expert.size(), 0);
  if (ep > 1)
    groups_.ep
        ->alltoall(std::span<const std::int64_t>(per_expert),
                   std::span<std::int64_t>(c->recv_count))
        ->wait();
  else c->recv_count = per_expert;
  c->recv_rows.assign(static_cast<std::size_t>(ep), 0);
  for (int p = 0; p < ep; ++p)
    for (int le = 0; le < local_experts_; ++le)
      c->recv_rows[static_cast<std::size_t>(p)] += static_cast<std::size_t>(
          c->recv_count[static_cast<std::size_t>(p * local_experts_ + le)]);
  c->recv = ep > 1 ? exchange(send, c->send_rows, c->recv_rows) : send;
  for (int p = 0; p < ep; ++p)
    for (int le = 0; le < local_experts_; ++le)
      c->segments.emplace_back(
          le, static_cast<Eigen::Index>(
                  c->recv_count[static_cast<std::size_t>(p * local_experts_ + le)]));
  Mat out;
  if (groups_.expt_tp->size() > 1) {
    // Every expt_tp rank's received tokens, all-gathered; each computes its column /
    // row shard of the experts on all of them; the partial outputs are summed and each
    // keeps its own rows (a reduce-scatter with uneven blocks).
    gather_etp(c->recv, c->segments, *c);
    Mat partial = run_experts(c->recv, c->etp_segments, c->pre, c->act);
    out = sum_etp_own_rows(partial, *c);
  } else {
    out = run_experts(c->recv, c->segments, c->pre, c->act);
  }
  c->returned = ep > 1 ? exchange(out, c->recv_rows, c->send_rows) : out;
  // Combine: each token's outputs weighted by their router probabilities.
  Mat y = Mat::Zero(n, hidden_);
  for (Eigen::Index i = 0; i < m; ++i) {
    const auto u = static_cast<std::size_t>(i);
    y.row(c->token[u]) += c->gate[u] * c->returned.row(i);
  }
  cache = std::move(c);
  return y;
}

Mat MoeMlp::backward(const Mat& dy, const Cache& cache) {
  const auto& c = static_cast<const MoeCache&>(cache);
  const int n = static_cast<int>(dy.rows()), e_count = moe_.experts, k = moe_.topk;
  // Over ep with the all-to-all dispatcher; with the all-gather one the gradients of the
  // gathered tokens, reduce-scattered at the end.
  const bool over_ep = !c.gathered && groups_.ep->size() > 1;
  const Mat dyg = c.gathered ? gather_tp_ep(dy) : dy;
  const auto m = static_cast<Eigen::Index>(c.token.size());
  Mat dsend(m, hidden_);
  Mat dprobs = Mat::Zero(dyg.rows(), e_count);
  for (Eigen::Index i = 0; i < m; ++i) {
    const auto u = static_cast<std::size_t>(i);
    dsend.row(i) = c.gate[u] * dyg.row(c.token[u]);
    dprobs(c.token[u], c.expert[u]) += dyg.row(c.token[u]).dot(c.returned.row(i));
  }
  const Mat dout = over_ep ? exchange(dsend, c.send_rows, c.recv_rows) : dsend;
  Mat drecv;
  if (!c.etp_rows.empty()) {
    std::vector<std::size_t> counts;
    for (std::size_t r : c.etp_rows) counts.push_back(r * static_cast<std::size_t>(hidden_));
    Mat dall(static_cast<Eigen::Index>(c.recv.rows()), hidden_);
    groups_.expt_tp->allgatherv(elements(dout), elements(dall), counts)->wait();
    drecv = sum_etp_own_rows(experts_backward(dall, c.recv, c.etp_segments, c.pre, c.act), c);
  } else {
    drecv = experts_backward(dout, c.recv, c.segments, c.pre, c.act);
  }
  const Mat dback = over_ep ? exchange(drecv, c.recv_rows, c.send_rows) : drecv;
  Mat dx = Mat::Zero(dyg.rows(), hidden_);
  for (Eigen::Index i = 0; i < m; ++i) {
    const auto u = static_cast<std::size_t>(i);
    dx.row(c.token[u]) += c.gate[u] * dback.row(i);
  }
  if (c.gathered) {
    dx = scatter_tp_ep(dx);
    dprobs = scatter_tp_ep(dprobs);
  }
  // The aux loss's gradient (counts held constant). Its share of the global batch mean is
  // 1 / global_batch; every local gradient is averaged over dp_cp afterwards.
  const double aux_grad = moe_.aux_loss_coeff * e_count / (k * double(seq_) * seq_) *
                          moe_.dp_cp_size / moe_.global_batch;
  const int b = moe_.samples;
  for (int t = 0; t < n; ++t)
    for (int e = 0; e < e_count; ++e)
      dprobs(t, e) += aux_grad * c.counts[static_cast<std::size_t>((t % b) * e_count + e)];
  // Softmax backward.
  Mat dlogits(n, e_count);
  for (int t = 0; t < n; ++t) {
    const double dot = c.probs.row(t).dot(dprobs.row(t));
    for (int e = 0; e < e_count; ++e) dlogits(t, e) = c.probs(t, e) * (dprobs(t, e) - dot);
  }
  router_.grad.noalias() += c.x.transpose() * dlogits;
  dx.noalias() += dlogits * router_.value.transpose();
  return dx;
}

}  // namespace train_gpt
