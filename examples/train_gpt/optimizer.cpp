#include "optimizer.hpp"

#include <cmath>

namespace train_gpt {

using commgrid::ReduceOp;

namespace {

// Sums the gradients of `selected` parameters over `group` in one call.
void allreduce_grads(const std::vector<Param*>& selected, commgrid::Communicator& group) {
  std::size_t n = 0;
  for (const Param* p : selected) n += static_cast<std::size_t>(p->grad.size());
  if (n == 0) return;
  std::vector<double> flat;
  flat.reserve(n);
  for (const Param* p : selected)
    flat.insert(flat.end(), p->grad.data(), p->grad.data() + p->grad.size());
  group.allreduce(std::span<double>(flat), ReduceOp::sum)->wait();
  std::size_t at = 0;
  for (Param* p : selected) {
    std::copy_n(flat.data() + at, p->grad.size(), p->grad.data());
    at += static_cast<std::size_t>(p->grad.size());
  }
}

std::vector<Param*> select(const std::vector<Param*>& params, bool (*pred)(const Param&)) {
  std::vector<Param*> out;
  for (Param* p : params)
    if (pred(*p)) out.push_back(p);
  return out;
}

}  // namespace

void finalize_model_grads(const std::vector<Param*>& params, const ModelParallel& mp,
                          bool skip_embd_sum) {
  if (mp.sequence_parallel() && mp.tp_size() > 1)
    allreduce_grads(select(params, [](const Param& p) { return p.sequence_parallel; }), mp.tp());
  if (commgrid::Communicator* embd = mp.embd(); embd && embd->size() > 1 && !skip_embd_sum) {
    const auto words = select(params, [](const Param& p) { return p.word_embedding; });
    // Every member must take part, or the others wait: a member without the embedding is
    // a model/layout disagreement, reported before any communication.
    if (words.size() != 1)
      throw commgrid::InternalError("embd: rank in " + embd->name() + " holds " +
                                    std::to_string(words.size()) + " word embeddings, expected 1");
    allreduce_grads(words, *embd);
  }
  if (commgrid::Communicator* pos = mp.pos_embd(); pos && pos->size() > 1)
    allreduce_grads(select(params, [](const Param& p) { return p.position_embedding; }), *pos);
}

Optimizer::Optimizer(std::vector<Param*> params, const commgrid::GradCommProcessGroups& grads,
                     const ModelParallel& mp, OptimizerConfig config, ParamDomain domain,
                     commgrid::Communicator* expert_norm_group)
    : params_(std::move(params)), config_(config),
      reduce_group_(domain == ParamDomain::dense ? &*grads.dp_cp() : &*grads.expt_dp()),
      norm_group_(domain == ParamDomain::dense ? &mp.mp() : expert_norm_group),
      grad_scale_(1.0 / static_cast<double>(grads.dp_cp()->size())) {
  if (norm_group_ == nullptr)
    throw commgrid::InternalError("optimizer: expert parameters need the tp_ep_pp group");
  for (const Param* p : params_) {
    // Expert parameters are reduced over the expert data-parallel groups, not dp_cp.
    if (p->domain != domain)
      throw commgrid::InternalError("optimizer: " + p->name + " is " +
                                    (p->domain == ParamDomain::expert ? "an expert" : "a dense") +
                                    " parameter; this " +
                                    (domain == ParamDomain::expert ? "expert" : "dense") +
                                    " optimizer reduces the other kind");
    // Expert shards (over expt_tp) are distinct: each counts once in tp_ep_pp.
    const bool counted = domain == ParamDomain::expert ||
                         (!(p->tp_duplicate && mp.tp_rank() != 0) && !p->shared_embedding_copy);
    norm_weight_.insert(norm_weight_.end(), static_cast<std::size_t>(p->value.size()),
                        counted ? 1.0 : 0.0);
  }
  numel_ = norm_weight_.size();
  if (config_.dist_opt) {
    intra_ = domain == ParamDomain::dense ? &*grads.intra_dp_cp() : &*grads.intra_expt_dp();
    inter_ = grads.inter_dist_opt().get();  // none with one instance
    const auto shards = static_cast<std::size_t>(intra_->size());
    padded_ = (numel_ + shards - 1) / shards * shards;
    shard_ = padded_ / shards;
    shard_begin_ = shard_ * static_cast<std::size_t>(intra_->rank());
    norm_weight_.resize(padded_, 0.0);
    std::vector<double> values;
    pack_values(values);
    master_.assign(values.begin() + static_cast<std::ptrdiff_t>(shard_begin_),
                   values.begin() + static_cast<std::ptrdiff_t>(shard_begin_ + shard_));
  } else {
    padded_ = shard_ = numel_;
  }
  m_.assign(shard_, 0.0);
  v_.assign(shard_, 0.0);
}

void Optimizer::pack_grads(std::vector<double>& flat) const {
  flat.assign(padded_, 0.0);
  std::size_t at = 0;
  for (const Param* p : params_) {
    std::copy_n(p->grad.data(), p->grad.size(), flat.data() + at);
    at += static_cast<std::size_t>(p->grad.size());
  }
}

void Optimizer::pack_values(std::vector<double>& flat) const {
  flat.assign(padded_, 0.0);
  std::size_t at = 0;
  for (const Param* p : params_) {
    std::copy_n(p->value.data(), p->value.size(), flat.data() + at);
    at += static_cast<std::size_t>(p->value.size());
  }
}

void Optimizer::unpack_values(const std::vector<double>& flat) {
  std::size_t at = 0;
  for (Param* p : params_) {
    std::copy_n(flat.data() + at, p->value.size(), p->value.data());
    at += static_cast<std::size_t>(p->value.size());
  }
}

double Optimizer::clip_coefficient(double norm) const {
  if (config_.clip_grad <= 0) return 1.0;
  const double c = config_.clip_grad / (norm + 1e-6);
  return c < 1.0 ? c : 1.0;
}

void Optimizer::adam(std::span<double> value, std::span<const double> grad, std::span<double> m,
                     std::span<double> v, double clip) const {
  const double b1 = config_.beta1, b2 = config_.beta2;
  const double c1 = 1.0 - std::pow(b1, steps_), c2 = 1.0 - std::pow(b2, steps_);
  for (std::size_t i = 0; i < value.size(); ++i) {
    const double g = grad[i] * clip;
    m[i] = b1 * m[i] + (1 - b1) * g;
    v[i] = b2 * v[i] + (1 - b2) * g * g;
    value[i] -= config_.lr * ((m[i] / c1) / (std::sqrt(v[i] / c2) + config_.eps) +
                              config_.weight_decay * value[i]);
  }
}

double Optimizer::step() {
  const double norm = std::sqrt(reduce());
  apply(clip_coefficient(norm));
  return norm;
}

double Optimizer::reduce() {
  ++steps_;
  double sq = 0;
  // Every member of these groups holds the same parameters: all skip, or none.
  if (numel_ > 0) {
    std::vector<double> flat;
    pack_grads(flat);
    if (!config_.dist_opt) {
      if (reduce_group_->size() > 1)
        reduce_group_->allreduce(std::span<double>(flat), ReduceOp::sum)->wait();
      grad_ = std::move(flat);
    } else {
      grad_.assign(shard_, 0.0);
      intra_->reduce_scatter(std::span<const double>(flat), std::span<double>(grad_), ReduceOp::sum)
          ->wait();
      if (inter_ != nullptr) inter_->allreduce(std::span<double>(grad_), ReduceOp::sum)->wait();
    }
    for (double& g : grad_) g *= grad_scale_;
    for (std::size_t i = 0; i < grad_.size(); ++i)
      sq += norm_weight_[shard_begin_ + i] * grad_[i] * grad_[i];
    // The shards of one instance together hold the whole (tp, pp) part of the model.
    if (intra_ != nullptr && intra_->size() > 1)
      intra_->allreduce(std::span<double>(&sq, 1), ReduceOp::sum)->wait();
  }
  if (norm_group_->size() > 1)
    norm_group_->allreduce(std::span<double>(&sq, 1), ReduceOp::sum)->wait();
  return sq;
}

void Optimizer::apply(double clip) {
  if (numel_ == 0) return;
  if (!config_.dist_opt) {
    std::vector<double> values;
    pack_values(values);
    adam(values, grad_, m_, v_, clip);
    unpack_values(values);
  } else {
    adam(master_, grad_, m_, v_, clip);
    std::vector<double> values(padded_);
    intra_->allgather(std::span<const double>(master_), std::span<double>(values))->wait();
    unpack_values(values);
  }
}

void Optimizer::save_state(std::vector<double>& out) const {
  out.push_back(static_cast<double>(m_.size() + v_.size() + master_.size() + 1));
  for (const auto* v : {&m_, &v_, &master_}) out.insert(out.end(), v->begin(), v->end());
  out.push_back(static_cast<double>(steps_));
}

void Optimizer::load_state(std::span<const double> in, std::size_t& at) {
  const std::size_t want = m_.size() + v_.size() + master_.size() + 1;
  if (at >= in.size() || in[at] != static_cast<double>(want))
    throw commgrid::InternalError("optimizer state: expected " + std::to_string(want) +
                                  " values, " +
                                  (at >= in.size() ? std::string("none are left")
                                                   : "the state says " + std::to_string(in[at])));
  ++at;
  if (at + want > in.size())
    throw commgrid::InternalError("optimizer state: " + std::to_string(in.size()) +
                                  " values are too few for this rank's shapes");
  for (auto* v : {&m_, &v_, &master_}) {
    std::copy_n(in.begin() + static_cast<std::ptrdiff_t>(at), v->size(), v->begin());
    at += v->size();
  }
  steps_ = static_cast<int>(in[at++]);
}

void Optimizer::load_resharded(std::span<const std::span<const double>> saved) {
  if (saved.empty()) throw commgrid::InternalError("optimizer reshard: no saved state");
  // Each saved entry: m, v (its shard, or everything without dist_opt), the master shard
  // (dist_opt), the step count; the shard length follows from the entry's length.
  const std::size_t parts = config_.dist_opt ? 3 : 2;
  std::vector<double> m, v;
  for (const auto& entry : saved) {
    if (entry.empty() || (entry.size() - 1) % parts != 0)
      throw commgrid::InternalError("optimizer reshard: a saved state of " +
                                    std::to_string(entry.size()) + " values is not " +
                                    std::to_string(parts) + " shards and a step count");
    const std::size_t shard = (entry.size() - 1) / parts;
    m.insert(m.end(), entry.begin(), entry.begin() + static_cast<std::ptrdiff_t>(shard));
    v.insert(v.end(), entry.begin() + static_cast<std::ptrdiff_t>(shard),
             entry.begin() + static_cast<std::ptrdiff_t>(2 * shard));
  }
  if (m.size() < numel_)
    throw commgrid::InternalError("optimizer reshard: the saved shards hold " +
                                  std::to_string(m.size()) + " moments for " +
                                  std::to_string(numel_) + " parameters");
  // This rank's shard (the padding past numel_ is zero, as in a run that had this sharding).
  auto slice = [&](std::span<const double> whole, std::vector<double>& out) {
    out.assign(shard_, 0.0);
    for (std::size_t i = 0; i < shard_ && shard_begin_ + i < numel_; ++i)
      out[i] = whole[shard_begin_ + i];
  };
  slice(m, m_);
  slice(v, v_);
  if (config_.dist_opt) {
    std::vector<double> values;
    pack_values(values);
    slice(values, master_);
  }
  steps_ = static_cast<int>(saved.front().back());
}

}  // namespace train_gpt
