#include "commgrid/process_group_collection.hpp"

#include "commgrid/process_groups.hpp"

namespace commgrid {
namespace {

// A one-field collection per kind whose field is none: what an unset field reads as.
class NoneField : public GroupCollection {
 public:
  explicit NoneField(std::size_t i)
      : GroupCollection("ProcessGroupCollection",
                        std::span<const GroupKind>(&ProcessGroupCollection::kFields[i], 1)) {
    set(kind_name(ProcessGroupCollection::kFields[i]),
        NoGroup{"not set (reads as None, as in Megatron-core HEAD)"});
  }
  [[nodiscard]] const GroupField& value() const { return get(field_kinds()[0]); }
};

const GroupField& none_field(std::size_t i) {
  static const std::vector<NoneField> fields = [] {
    std::vector<NoneField> v;
    for (std::size_t k = 0; k < ProcessGroupCollection::kFields.size(); ++k) v.emplace_back(k);
    return v;
  }();
  return fields[i].value();
}

}  // namespace

ProcessGroupCollection::ProcessGroupCollection()
    : GroupCollection("ProcessGroupCollection", kFields) {}

ProcessGroupCollection::ProcessGroupCollection(
    std::initializer_list<std::pair<std::string_view, GroupValue>> pairs)
    : ProcessGroupCollection() {
  set_pairs(pairs);
}

ProcessGroupCollection ProcessGroupCollection::from_state(
    const ProcessGroups& state, const std::optional<std::vector<std::string>>& required) {
  ProcessGroupCollection c;
  c.fill_from_state(state, required);
  // HEAD's use_mpu_process_groups maps both all-gather fields to None.
  for (GroupKind k : {GroupKind::dp_cp_ag, GroupKind::expt_dp_ag})
    if (c.is_set(kind_name(k)))
      c.set(kind_name(k), NoGroup{"use_mpu_process_groups leaves it None; set it from the "
                                  "all-gather groups"});
  return c;
}

const GroupField& ProcessGroupCollection::of(GroupKind k) const {
  for (std::size_t i = 0; i < kFields.size(); ++i)
    if (kFields[i] == k) return is_set(kind_name(k)) ? field(kind_name(k)) : none_field(i);
  return field(kind_name(k));  // throws UnknownKindError naming the valid fields
}

GroupHandle ProcessGroupCollection::handle(GroupKind k) const {
  const GroupField& f = of(k);
  return f.has_group() ? f.handles()[0] : nullptr;
}

namespace {

GroupHandle from(const ProcessGroups& state, GroupKind k) {
  return state.has_group(k, 0) ? state.group_handle(k, 0) : nullptr;
}

void require_fields(const ProcessGroupCollection& pgc, std::initializer_list<GroupKind> kinds,
                    const std::string& why) {
  std::string missing;
  for (GroupKind k : kinds)
    if (!pgc.is_set(kind_name(k)))
      missing += (missing.empty() ? "" : ", ") + std::string(kind_name(k));
  if (!missing.empty())
    throw ConfigError("pg_collection", "pg_collection: " + missing + " required " + why +
                                           " but not set (set it to a group or to none)");
}

void require_state(const ProcessGroups& state, const char* what) {
  if (!state.is_initialized())
    throw StateError(std::string(what) +
                     ": parallel state is not initialized; call initialize() first");
}

}  // namespace

OptimizerProcessGroups setup_process_groups_for_optimizer(const ProcessGroups& state,
                                                          const std::optional<DdpSettings>& ddp) {
  require_state(state, "setup_process_groups_for_optimizer");
  OptimizerProcessGroups g;
  g.dp = from(state, GroupKind::dp);
  g.dp_cp = from(state, GroupKind::dp_cp);
  g.intra_dp_cp = from(state, GroupKind::intra_dp_cp);
  g.expt_dp = from(state, GroupKind::expt_dp);
  g.intra_expt_dp = from(state, GroupKind::intra_expt_dp);
  g.gtp_remat = from(state, GroupKind::gtp_remat);
  g.expt_gtp_remat = from(state, GroupKind::expt_gtp_remat);
  g.intra_dist_opt = from(state, GroupKind::intra_dist_opt);
  g.mp = from(state, GroupKind::mp);
  g.expt_tp_pp = from(state, GroupKind::tp_ep_pp);
  g.expt_tp_pp_with_egtp_remat = from(state, GroupKind::tp_ep_pp_with_egtp_remat);
  if (ddp && ddp->num_distributed_optimizer_instances > 1)
    g.inter_dist_opt = from(state, GroupKind::inter_dist_opt);
  return g;
}

OptimizerProcessGroups setup_process_groups_for_optimizer(const ProcessGroupCollection& pgc,
                                                          const std::optional<DdpSettings>& ddp,
                                                          std::int64_t cp_size) {
  OptimizerProcessGroups g;
  require_fields(pgc, {GroupKind::dp}, "always");
  g.dp = pgc.handle(GroupKind::dp);
  if (pgc.is_set("dp_cp")) {
    g.dp_cp = pgc.handle(GroupKind::dp_cp);
  } else {
    if (cp_size != 1) require_fields(pgc, {GroupKind::dp_cp}, "when context_parallel_size > 1");
    g.dp_cp = g.dp;
  }
  require_fields(pgc, {GroupKind::expt_dp}, "always");
  g.expt_dp = pgc.handle(GroupKind::expt_dp);
  if (ddp) {
    if (ddp->num_distributed_optimizer_instances == 1) {
      g.intra_dp_cp = g.dp_cp;
      g.intra_expt_dp = g.expt_dp;
    } else {
      require_fields(pgc,
                     {GroupKind::intra_dp_cp, GroupKind::intra_expt_dp, GroupKind::inter_dist_opt,
                      GroupKind::intra_dist_opt},
                     "with several distributed-optimizer instances");
      g.intra_dp_cp = pgc.handle(GroupKind::intra_dp_cp);
      g.intra_expt_dp = pgc.handle(GroupKind::intra_expt_dp);
      g.inter_dist_opt = pgc.handle(GroupKind::inter_dist_opt);
    }
    if (ddp->use_distributed_optimizer) {
      require_fields(pgc, {GroupKind::intra_dist_opt}, "with the distributed optimizer");
      g.intra_dist_opt = pgc.handle(GroupKind::intra_dist_opt);
    }
  } else {
    g.intra_dp_cp = g.dp_cp;
    g.intra_expt_dp = g.expt_dp;
  }
  require_fields(pgc, {GroupKind::mp, GroupKind::tp_ep_pp}, "always");
  g.mp = pgc.handle(GroupKind::mp);
  g.expt_tp_pp = pgc.handle(GroupKind::tp_ep_pp);
  g.expt_tp_pp_with_egtp_remat = pgc.is_set("tp_ep_pp_with_egtp_remat")
                                     ? pgc.handle(GroupKind::tp_ep_pp_with_egtp_remat)
                                     : g.expt_tp_pp;
  g.gtp_remat = pgc.handle(GroupKind::gtp_remat);
  g.expt_gtp_remat = pgc.handle(GroupKind::expt_gtp_remat);
  return g;
}

DdpProcessGroups setup_process_groups_for_ddp(const ProcessGroups& state, const DdpSettings& ddp) {
  require_state(state, "setup_process_groups_for_ddp");
  DdpProcessGroups g;
  g.dp = from(state, GroupKind::dp);
  g.dp_cp = from(state, GroupKind::dp_cp);
  g.intra_dp_cp = from(state, GroupKind::intra_dp_cp);
  g.expt_dp = from(state, GroupKind::expt_dp);
  g.intra_expt_dp = from(state, GroupKind::intra_expt_dp);
  g.tp = from(state, GroupKind::tp);
  g.gtp_remat = from(state, GroupKind::gtp_remat);
  g.pp = from(state, GroupKind::pp);
  g.ep = from(state, GroupKind::ep);
  g.expt_gtp_remat = from(state, GroupKind::expt_gtp_remat);
  if (ddp.num_distributed_optimizer_instances > 1)
    g.inter_dist_opt = from(state, GroupKind::inter_dist_opt);
  if (ddp.use_distributed_optimizer) g.intra_dist_opt = from(state, GroupKind::intra_dist_opt);
  return g;
}

DdpProcessGroups setup_process_groups_for_ddp(const ProcessGroupCollection& pgc,
                                              std::int64_t cp_size, const DdpSettings& ddp,
                                              GroupHandle expt_dp_fallback) {
  DdpProcessGroups g;
  require_fields(pgc, {GroupKind::dp}, "always");
  g.dp = pgc.handle(GroupKind::dp);
  if (pgc.is_set("dp_cp")) {
    g.dp_cp = pgc.handle(GroupKind::dp_cp);
  } else {
    if (cp_size != 1) require_fields(pgc, {GroupKind::dp_cp}, "when context_parallel_size > 1");
    g.dp_cp = g.dp;
  }
  g.expt_dp = pgc.handle(GroupKind::expt_dp);
  if (!g.expt_dp) g.expt_dp = std::move(expt_dp_fallback);
  if (ddp.num_distributed_optimizer_instances == 1) {
    g.intra_dp_cp = g.dp_cp;
    g.intra_expt_dp = g.expt_dp;
  } else {
    require_fields(pgc,
                   {GroupKind::intra_dp_cp, GroupKind::intra_expt_dp, GroupKind::inter_dist_opt},
                   "with several distributed-optimizer instances");
    g.intra_dp_cp = pgc.handle(GroupKind::intra_dp_cp);
    g.intra_expt_dp = pgc.handle(GroupKind::intra_expt_dp);
    g.inter_dist_opt = pgc.handle(GroupKind::inter_dist_opt);
  }
  require_fields(pgc, {GroupKind::tp, GroupKind::pp, GroupKind::ep}, "always");
  g.tp = pgc.handle(GroupKind::tp);
  g.pp = pgc.handle(GroupKind::pp);
  g.ep = pgc.handle(GroupKind::ep);
  g.gtp_remat = pgc.handle(GroupKind::gtp_remat);
  g.expt_gtp_remat = pgc.handle(GroupKind::expt_gtp_remat);
  return g;
}

std::string ProcessGroupCollection::describe() const {
  std::string s;
  for (GroupKind k : kFields) {
    const GroupField& f = of(k);
    if (!f.has_group()) continue;
    s += (s.empty() ? "" : ", ") + std::string(kind_name(k)) + "(";
    if (k == GroupKind::hcp) {
      s += "[";
      for (std::size_t i = 0; i < f.handles().size(); ++i)
        s += (i ? ", " : "") + std::to_string(f.handles()[i]->size());
      s += "]";
    } else {
      s += std::to_string(f->size());
    }
    s += ")";
  }
  return "ProcessGroupCollection(" + (s.empty() ? std::string("empty") : s) + ")";
}

MultiModuleProcessGroupCollection::MultiModuleProcessGroupCollection(
    std::vector<std::pair<std::string, ProcessGroupCollection>> modules,
    std::optional<std::string> language_model)
    : modules_(std::move(modules)), language_model_(std::move(language_model)) {
  if (modules_.empty()) throw ConfigError("module_pgs", "module_pgs: no modules given");
  for (std::size_t i = 0; i < modules_.size(); ++i)
    for (std::size_t j = 0; j < i; ++j)
      if (modules_[i].first == modules_[j].first)
        throw ConfigError("module_pgs",
                          "module_pgs: module \"" + modules_[i].first + "\" is given twice");
  if (language_model_) (void)module(*language_model_);
}

const ProcessGroupCollection& MultiModuleProcessGroupCollection::language_model_collection() const {
  if (!language_model_)
    throw ConfigError(
        "language_model_module_name",
        "language_model_module_name: no language model specified for this collection");
  return module(*language_model_);
}

Rank MultiModuleProcessGroupCollection::language_model_cp_size() const {
  return (*language_model_collection().of(GroupKind::cp)).size();
}

const ProcessGroupCollection& MultiModuleProcessGroupCollection::module(
    std::string_view name) const {
  for (const auto& [n, c] : modules_)
    if (n == name) return c;
  std::string valid;
  for (const auto& [n, c] : modules_) valid += (valid.empty() ? "" : ", ") + n;
  throw ConfigError("module_pgs", "module_pgs: module \"" + std::string(name) +
                                      "\" not found; available: " + valid);
}

std::vector<std::string> MultiModuleProcessGroupCollection::names() const {
  std::vector<std::string> out;
  for (const auto& [n, c] : modules_) out.push_back(n);
  return out;
}

std::string MultiModuleProcessGroupCollection::describe() const {
  std::string s = "MultiModuleProcessGroupCollection(modules=[";
  for (std::size_t i = 0; i < modules_.size(); ++i) s += (i ? ", " : "") + modules_[i].first;
  s += "]";
  if (language_model_) s += ", language_model_module_name='" + *language_model_ + "'";
  return s + ")";
}

}  // namespace commgrid
