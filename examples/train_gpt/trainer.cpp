#include "trainer.hpp"

#include <algorithm>
#include <cmath>
#include <memory>
#include <string>

#include "data.hpp"
#include "model.hpp"
#include "moe.hpp"
#include "parallel.hpp"
#include "schedule.hpp"

namespace train_gpt {

using commgrid::DivisibilityError;
using commgrid::IncompatibleError;
using commgrid::ReduceOp;

namespace {

// The checks shared by check_train_config (sizes from the layout) and train (sizes from
// the groups).
void check_sizes(const TrainConfig& c, std::int64_t tp, std::int64_t pp, std::int64_t cp,
                 std::int64_t dp) {
  const ModelConfig& m = c.model;
  auto s = [](auto v) { return std::to_string(v); };
  if (m.hidden % m.heads != 0)
    throw DivisibilityError("hidden",
                            "hidden " + s(m.hidden) + " is not divisible by heads " + s(m.heads));
  if (m.layers % (pp * c.vpp) != 0)
    throw DivisibilityError("layers", "layers " + s(m.layers) + " is not divisible by pp(" + s(pp) +
                                          ") x vpp(" + s(c.vpp) + ") = " + s(pp * c.vpp));
  if (m.heads % tp != 0)
    throw DivisibilityError("heads", "heads " + s(m.heads) + " is not divisible by tp " + s(tp));
  if (m.vocab % tp != 0)
    throw DivisibilityError("vocab", "vocab " + s(m.vocab) + " is not divisible by tp " + s(tp));
  if (cp > 1 && m.seq % (2 * cp) != 0)
    throw DivisibilityError("seq",
                            "seq " + s(m.seq) + " is not divisible by 2 x cp = " + s(2 * cp));
  if (c.sequence_parallel && (m.seq / cp) % tp != 0)
    throw DivisibilityError("seq", "seq / cp = " + s(m.seq / cp) + " is not divisible by tp " +
                                       s(tp) + " (sequence parallel)");
  if (c.global_batch % (dp * c.micro_batches) != 0)
    throw DivisibilityError("global_batch", "global_batch " + s(c.global_batch) +
                                                " is not divisible by dp(" + s(dp) +
                                                ") x micro_batches(" + s(c.micro_batches) +
                                                ") = " + s(dp * c.micro_batches));
  if (c.vpp > 1 && c.micro_batches % pp != 0)
    throw DivisibilityError("micro_batches",
                            "micro_batches " + s(c.micro_batches) + " is not divisible by pp " +
                                s(pp) + " (interleaved schedule with vpp " + s(c.vpp) + ")");
}

// The MoE checks (sizes from the layout or from the groups).
void check_moe(const TrainConfig& c, std::int64_t tp, std::int64_t ep, std::int64_t etp) {
  if (!c.moe) return;
  auto s = [](auto v) { return std::to_string(v); };
  if (c.experts < 1 || c.experts % ep != 0)
    throw DivisibilityError(
        "experts", "experts " + s(c.experts) + " is not a positive multiple of ep " + s(ep));
  if (c.topk < 1 || c.topk > c.experts)
    throw IncompatibleError("topk",
                            "topk " + s(c.topk) + " is not in 1..experts (" + s(c.experts) + ")");
  if (c.moe_every < 1)
    throw IncompatibleError("moe_every", "moe_every " + s(c.moe_every) + " is not positive");
  if (tp > 1 && !c.sequence_parallel)
    throw IncompatibleError(
        "sequence_parallel",
        "MoE with tp " + s(tp) + " > 1 requires sequence parallelism (--sequence-parallel)");
  if (c.model.ffn() % etp != 0)
    throw DivisibilityError("etp",
                            "MoE: ffn " + s(c.model.ffn()) + " is not divisible by etp " + s(etp));
}

}  // namespace

void check_train_config(const TrainConfig& c, const commgrid::ParallelConfig& layout) {
  const std::int64_t vpp = layout.vpp.value_or(1);
  if (vpp != c.vpp)
    throw IncompatibleError(
        "vpp", "vpp: the layout has " + std::to_string(vpp) + ", the run " + std::to_string(c.vpp));
  if (layout.dist_opt_instances > 1 && !c.optimizer.dist_opt)
    throw IncompatibleError("dist_opt_instances",
                            "dist_opt_instances " + std::to_string(layout.dist_opt_instances) +
                                " needs the distributed optimizer (--dist-opt)");
  check_sizes(c, layout.tp, layout.pp, layout.cp, layout.dp());
  check_moe(c, layout.tp, layout.ep, layout.expert_tp());
}

struct Trainer::Impl {
  Impl(const commgrid::ModelCommProcessGroups& model_groups,
       const commgrid::GradCommProcessGroups& grad_groups, const TrainConfig& c)
      : config(c), dp(*grad_groups.dp()), dp_cp(*grad_groups.dp_cp()),
        mp(model_groups, c.sequence_parallel), model(c.model, mp, c.vpp, mlp_factory(model_groups)),
        params(model.params()), data(c.model, c.global_batch, c.micro_batches, dp.rank(), dp.size(),
                                     mp.positions_of(mp.cp_rank(), c.model.seq)) {
    std::vector<Param*> dense_params, expert_params;
    for (Param* p : params)
      (p->domain == ParamDomain::expert ? expert_params : dense_params).push_back(p);
    optimizer = std::make_unique<Optimizer>(dense_params, grad_groups, mp, config.optimizer);
    if (config.moe)
      expert_optimizer =
          std::make_unique<Optimizer>(expert_params, grad_groups, mp, config.optimizer,
                                      ParamDomain::expert, &*model_groups.tp_ep_pp());
    total_tokens = static_cast<double>(config.global_batch) * config.model.seq;
    // Each rank's gradient is that of the mean over its own tokens; averaging over dp_cp
    // (which has as many ranks as there are token shards) gives the global mean's.
    local_tokens = total_tokens / static_cast<double>(dp_cp.size());
    last_stage = mp.pp_rank() == mp.pp_size() - 1;
  }

  MlpFactory mlp_factory(const commgrid::ModelCommProcessGroups& model_groups) {
    if (!config.moe) return {};
    MoeConfig moe;
    moe.experts = config.experts;
    moe.topk = config.topk;
    moe.aux_loss_coeff = config.aux_loss_coeff;
    moe.samples = config.global_batch / (dp.size() * config.micro_batches);
    moe.global_batch = config.global_batch;
    moe.dp_cp_size = dp_cp.size();
    moe.sequence_parallel = config.sequence_parallel && mp.tp_size() > 1;
    moe.skip_tp_cp_sum = config.fault_skip_tp_cp_sum;
    moe.allgather_dispatcher = config.allgather_dispatcher;
    const ExpertGroups expert_groups{&*model_groups.ep(), &*model_groups.tp_cp(),
                                     &*model_groups.tp_ep(), &*model_groups.expt_tp()};
    return [dense = dense_mlp_factory(config.model, mp), moe, expert_groups, aux = aux_sum, this](
               int layer, const std::string& name) -> std::unique_ptr<Mlp> {
      if (layer % config.moe_every != 0) return dense(layer, name);
      return std::make_unique<MoeMlp>(name, config.model, moe, expert_groups, aux);
    };
  }

  const TrainConfig& config;
  commgrid::Communicator& dp;
  commgrid::Communicator& dp_cp;
  const ModelParallel mp;
  // Each MoE layer adds its share of the auxiliary loss here during forward.
  const std::shared_ptr<double> aux_sum = std::make_shared<double>(0.0);
  GptModel model;
  const std::vector<Param*> params;
  std::unique_ptr<Optimizer> optimizer, expert_optimizer;
  const DataLoader data;
  double total_tokens = 0, local_tokens = 0;
  bool last_stage = false;
};

Trainer::Trainer(const commgrid::ModelCommProcessGroups& model_groups,
                 const commgrid::GradCommProcessGroups& grad_groups, const TrainConfig& config) {
  check_sizes(config, model_groups.tp()->size(), model_groups.pp()->size(),
              model_groups.cp()->size(), grad_groups.dp()->size());
  if (config.moe)
    check_moe(config, model_groups.tp()->size(), model_groups.ep()->size(),
              model_groups.expt_tp()->size());
  impl_ = std::make_unique<Impl>(model_groups, grad_groups, config);
}

Trainer::~Trainer() = default;

StepResult Trainer::step(int step) {
  Impl& t = *impl_;
  const TrainConfig& config = t.config;
  const ModelParallel& mp = t.mp;
  t.model.zero_grad();
  *t.aux_sum = 0.0;
  double loss = run_pipeline(t.model, mp, t.data, step, config.micro_batches, config.vpp,
                             1.0 / t.local_tokens);
  finalize_model_grads(t.params, mp, config.fault_skip_embd_sum);
  double norm = 0;
  if (t.expert_optimizer) {
    // One global norm over both domains: dense squares summed over mp, expert squares
    // over tp_ep_pp; both sets clipped by the same coefficient.
    norm = std::sqrt(t.optimizer->reduce() + t.expert_optimizer->reduce());
    const double clip = t.optimizer->clip_coefficient(norm);
    t.optimizer->apply(clip);
    t.expert_optimizer->apply(clip);
  } else {
    norm = t.optimizer->step();
  }
  // The loss lives on the last stage: summed over its data-parallel ranks, then sent to
  // every stage.
  if (t.last_stage && t.dp_cp.size() > 1)
    t.dp_cp.allreduce(std::span<double>(&loss, 1), ReduceOp::sum)->wait();
  if (mp.pp_size() > 1) mp.pp().broadcast(std::span<double>(&loss, 1), mp.pp_size() - 1)->wait();
  // Every rank holds a share of the aux loss (its tokens, its layers): summed over
  // dp_cp and mp (tp x pp), that is over every rank.
  double aux = *t.aux_sum;
  if (config.moe) {
    if (t.dp_cp.size() > 1) t.dp_cp.allreduce(std::span<double>(&aux, 1), ReduceOp::sum)->wait();
    if (mp.mp().size() > 1) mp.mp().allreduce(std::span<double>(&aux, 1), ReduceOp::sum)->wait();
    aux /= config.global_batch;
  }
  return {step + 1, loss / t.total_tokens + aux, norm, aux};
}

std::vector<double> Trainer::state() const {
  std::vector<double> out;
  for (const Param* p : impl_->params) {
    const auto v = elements(p->value);
    out.insert(out.end(), v.begin(), v.end());
  }
  impl_->optimizer->save_state(out);
  if (impl_->expert_optimizer) impl_->expert_optimizer->save_state(out);
  return out;
}

void Trainer::set_state(std::span<const double> state) {
  std::size_t at = 0;
  for (Param* p : impl_->params) {
    const auto v = elements(p->value);
    if (at + v.size() > state.size())
      throw commgrid::InternalError("train state: " + std::to_string(state.size()) +
                                    " values are too few for this rank's parameters");
    std::copy_n(state.begin() + static_cast<std::ptrdiff_t>(at), v.size(), v.begin());
    at += v.size();
  }
  impl_->optimizer->load_state(state, at);
  if (impl_->expert_optimizer) impl_->expert_optimizer->load_state(state, at);
  if (at != state.size())
    throw commgrid::InternalError("train state: " + std::to_string(state.size() - at) +
                                  " values left over for this rank's shapes");
}

namespace {

// The parts of what Trainer::state() wrote: the values of every parameter (`numel`), then
// each optimizer's state after its length.
std::vector<std::span<const double>> state_parts(std::span<const double> state, std::size_t numel,
                                                 std::size_t optimizers) {
  std::vector<std::span<const double>> parts{state.first(std::min(numel, state.size()))};
  std::size_t at = numel;
  for (std::size_t k = 0; k < optimizers; ++k) {
    if (at >= state.size() || at + 1 + static_cast<std::size_t>(state[at]) > state.size())
      throw commgrid::InternalError("train state: " + std::to_string(state.size()) +
                                    " values do not hold optimizer " + std::to_string(k) +
                                    "'s state");
    const auto n = static_cast<std::size_t>(state[at]);
    parts.push_back(state.subspan(at + 1, n));
    at += 1 + n;
  }
  if (parts.front().size() != numel || at != state.size())
    throw commgrid::InternalError("train state: " + std::to_string(state.size()) +
                                  " values do not fit " + std::to_string(numel) +
                                  " parameters and " + std::to_string(optimizers) + " optimizers");
  return parts;
}

}  // namespace

void Trainer::set_state_resharded(std::span<const std::span<const double>> dense,
                                  std::span<const std::span<const double>> expert) {
  const bool moe = impl_->expert_optimizer != nullptr;
  if (dense.empty() || (moe && expert.empty()))
    throw commgrid::InternalError("train state: no saved state to reshard from");
  std::size_t numel = 0;
  for (const Param* p : impl_->params) numel += static_cast<std::size_t>(p->value.size());
  const std::size_t optimizers = moe ? 2 : 1;
  auto parts_of = [&](std::span<const std::span<const double>> saved, std::size_t which) {
    std::vector<std::span<const double>> out;
    for (const auto& state : saved) out.push_back(state_parts(state, numel, optimizers)[which]);
    return out;
  };
  // The values: dense parameters from a dense source, experts from an expert source (a
  // stage's parameters have the same shapes on every rank of it).
  const std::span<const double> dense_values = parts_of(dense.first(1), 0).front();
  const std::span<const double> expert_values =
      moe ? parts_of(expert.first(1), 0).front() : dense_values;
  std::size_t at = 0;
  for (Param* p : impl_->params) {
    const auto v = elements(p->value);
    const auto& from = p->domain == ParamDomain::expert ? expert_values : dense_values;
    std::copy_n(from.begin() + static_cast<std::ptrdiff_t>(at), v.size(), v.begin());
    at += v.size();
  }
  impl_->optimizer->load_resharded(parts_of(dense, 1));
  if (moe) impl_->expert_optimizer->load_resharded(parts_of(expert, 2));
}

std::vector<StepResult> train(const commgrid::ModelCommProcessGroups& model_groups,
                              const commgrid::GradCommProcessGroups& grad_groups,
                              const TrainConfig& config) {
  Trainer trainer(model_groups, grad_groups, config);
  std::vector<StepResult> results;
  for (int step = 0; step < config.steps; ++step) {
    if (config.on_step) config.on_step(step);
    results.push_back(trainer.step(step));
  }
  return results;
}

}  // namespace train_gpt
