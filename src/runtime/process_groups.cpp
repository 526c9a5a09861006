// ProcessGroups' queries (Megatron's parallel_state getters): groups, ranks and sizes by
// kind, pipeline stages and virtual pipeline ranks, each refusing before initialize.
#include "commgrid/process_groups.hpp"

#include <string>

#include "group_label.hpp"

namespace commgrid {

using detail::label_of;

// ---- getters -----------------------------------------------------------------------

void ProcessGroups::require(const char* call) const {
  if (!initialized_)
    throw StateError(std::string("ProcessGroups::") + call +
                     ": parallel state is not initialized; call initialize() first");
}

const ProcessGroups::Slot& ProcessGroups::slot(GroupKind k, int level, const char* call) const {
  require(call);
  const auto& levels = slots_[static_cast<int>(k)];
  if (levels.empty())
    throw NoGroupError(std::string("ProcessGroups::") + call + "(" + std::string(kind_name(k)) +
                       "): " + not_created_[static_cast<int>(k)]);
  if (level < 0 || level >= static_cast<int>(levels.size()))
    throw ConfigError("level", std::string("ProcessGroups::") + call + "(" +
                                   std::string(kind_name(k)) + "): level " + std::to_string(level) +
                                   " out of range [0, " + std::to_string(levels.size()) + ")");
  return levels[static_cast<std::size_t>(level)];
}

const ProcessGroups::Slot& ProcessGroups::member_slot(GroupKind k, int level,
                                                      const char* call) const {
  const Slot& s = slot(k, level, call);
  if (!s.ref)
    throw NoGroupError(std::string("ProcessGroups::") + call + "(" + label_of(k, level) +
                       "): " + s.no_group_reason);
  return s;
}

const Layout& ProcessGroups::layout() const {
  require("layout");
  return *layout_;
}
const ParallelConfig& ProcessGroups::config() const {
  require("config");
  return layout_->config();
}
CreationStrategy ProcessGroups::strategy() const {
  require("strategy");
  return strategy_;
}
Rank ProcessGroups::world_rank() const {
  require("world_rank");
  return world_rank_;
}
Rank ProcessGroups::world_size() const {
  require("world_size");
  return world_size_;
}
const std::vector<GroupKind>& ProcessGroups::kinds() const {
  require("kinds");
  return kinds_;
}

bool ProcessGroups::has_group(GroupKind k, int level) const {
  require("has_group");
  const auto& levels = slots_[static_cast<int>(k)];
  if (level < 0 || level >= static_cast<int>(levels.size())) return false;
  return levels[static_cast<std::size_t>(level)].ref.has_value();
}

std::string ProcessGroups::no_group_reason(GroupKind k, int level) const {
  require("no_group_reason");
  const auto& levels = slots_[static_cast<int>(k)];
  if (levels.empty()) return not_created_[static_cast<int>(k)];
  if (level < 0 || level >= static_cast<int>(levels.size()))
    return label_of(k, level) + " does not exist (hcp has " + std::to_string(levels.size()) +
           " levels)";
  return levels[static_cast<std::size_t>(level)].no_group_reason;
}

Communicator& ProcessGroups::group(GroupKind k, int level) const {
  return *member_slot(k, level, "group").comm;
}

std::shared_ptr<Communicator> ProcessGroups::group_handle(GroupKind k, int level) const {
  require("group_handle");
  const auto& levels = slots_[static_cast<int>(k)];
  if (level < 0 || level >= static_cast<int>(levels.size())) return nullptr;
  return levels[static_cast<std::size_t>(level)].comm;
}

Rank ProcessGroups::size(GroupKind k, int level) const {
  return static_cast<Rank>(member_slot(k, level, "size").ref->members.size());
}

Rank ProcessGroups::rank(GroupKind k, int level) const {
  return member_slot(k, level, "rank").ref->comm_rank;
}

const std::vector<Rank>& ProcessGroups::global_ranks(GroupKind k, int level) const {
  return member_slot(k, level, "global_ranks").ref->members;
}

std::int64_t ProcessGroups::group_index(GroupKind k, int level) const {
  return member_slot(k, level, "group_index").ref->index;
}

Rank ProcessGroups::tensor_model_parallel_src_rank() const {
  return member_slot(GroupKind::tp, 0, "tensor_model_parallel_src_rank").ref->members.front();
}

Rank ProcessGroups::model_parallel_src_rank() const {
  return member_slot(GroupKind::mp, 0, "model_parallel_src_rank").ref->members.front();
}

Rank ProcessGroups::data_parallel_src_rank(bool with_cp) const {
  return member_slot(with_cp ? GroupKind::dp_cp : GroupKind::dp, 0, "data_parallel_src_rank")
      .ref->members.front();
}

namespace {
GroupKind dp_kind(bool with_cp, bool partial, const char* call) {
  if (partial && !with_cp)
    throw InvalidValueError("partial_data_parallel",
                            std::string("ProcessGroups::") + call +
                                ": partial data parallel needs with_context_parallel (the "
                                "distributed optimizer's partial groups include cp)");
  return partial ? GroupKind::intra_dp_cp : with_cp ? GroupKind::dp_cp : GroupKind::dp;
}
}  // namespace

Rank ProcessGroups::data_parallel_rank(bool with_cp, bool partial) const {
  const GroupKind k = dp_kind(with_cp, partial, "data_parallel_rank");
  return member_slot(k, 0, "data_parallel_rank").ref->comm_rank;
}

Rank ProcessGroups::data_parallel_size(bool with_cp, bool partial) const {
  const GroupKind k = dp_kind(with_cp, partial, "data_parallel_size");
  return static_cast<Rank>(member_slot(k, 0, "data_parallel_size").ref->members.size());
}

Rank ProcessGroups::expert_data_parallel_rank(bool partial) const {
  const GroupKind k = partial ? GroupKind::intra_expt_dp : GroupKind::expt_dp;
  return member_slot(k, 0, "expert_data_parallel_rank").ref->comm_rank;
}

Rank ProcessGroups::expert_data_parallel_size(bool partial) const {
  const GroupKind k = partial ? GroupKind::intra_expt_dp : GroupKind::expt_dp;
  return static_cast<Rank>(member_slot(k, 0, "expert_data_parallel_size").ref->members.size());
}

Rank ProcessGroups::pipeline_first_rank() const {
  return member_slot(GroupKind::pp, 0, "pipeline_first_rank").ref->members.front();
}

Rank ProcessGroups::pipeline_last_rank() const {
  return member_slot(GroupKind::pp, 0, "pipeline_last_rank").ref->members.back();
}

Rank ProcessGroups::pipeline_next_rank() const {
  const GroupRef& g = *member_slot(GroupKind::pp, 0, "pipeline_next_rank").ref;
  const auto n = static_cast<std::int64_t>(g.members.size());
  return g.members[static_cast<std::size_t>((g.position + 1) % n)];
}

Rank ProcessGroups::pipeline_prev_rank() const {
  const GroupRef& g = *member_slot(GroupKind::pp, 0, "pipeline_prev_rank").ref;
  const auto n = static_cast<std::int64_t>(g.members.size());
  return g.members[static_cast<std::size_t>((g.position + n - 1) % n)];
}

void ProcessGroups::check_stage(std::optional<Rank> vstage, const char* call) const {
  if (!vstage) return;
  const auto& vpp = layout_->config().vpp;
  if (!vpp)
    throw InvalidValueError("vstage", std::string("ProcessGroups::") + call + ": virtual stage " +
                                          std::to_string(*vstage) + " given but vpp is not set");
  if (*vstage < 0 || *vstage >= *vpp)
    throw InvalidValueError("vstage", std::string("ProcessGroups::") + call + ": virtual stage " +
                                          std::to_string(*vstage) + " out of range [0, " +
                                          std::to_string(*vpp) + ")");
}

bool ProcessGroups::is_pipeline_first_stage(std::optional<Rank> vstage) const {
  require("is_pipeline_first_stage");
  check_stage(vstage, "is_pipeline_first_stage");
  // The pp coordinate comes from the layout, so this works without the pp kind created.
  if (layout_->coordinates(world_rank_).pp != 0) return false;
  return !vstage || *vstage == 0;
}

bool ProcessGroups::is_pipeline_last_stage(std::optional<Rank> vstage) const {
  require("is_pipeline_last_stage");
  check_stage(vstage, "is_pipeline_last_stage");
  if (layout_->coordinates(world_rank_).pp != layout_->config().pp - 1) return false;
  return !vstage || *vstage == *layout_->config().vpp - 1;
}

bool ProcessGroups::is_rank_in_embedding_group(std::optional<Rank> vstage) const {
  require("is_rank_in_embedding_group");
  check_stage(vstage, "is_rank_in_embedding_group");
  const auto g = layout_->group_of(GroupKind::embd, world_rank_);
  if (!g) return false;
  if (!vstage) return true;
  if (world_rank_ == g->members.front()) return is_pipeline_first_stage(vstage);
  if (world_rank_ == g->members.back()) return is_pipeline_last_stage(vstage);
  return true;
}

bool ProcessGroups::is_rank_in_position_embedding_group() const {
  require("is_rank_in_position_embedding_group");
  return layout_->group_of(GroupKind::pos_embd, world_rank_).has_value();
}

std::optional<Rank> ProcessGroups::virtual_pipeline_rank() const {
  require("virtual_pipeline_rank");
  return virtual_rank_;
}

void ProcessGroups::set_virtual_pipeline_rank(Rank vrank) {
  require("set_virtual_pipeline_rank");
  const auto& vpp = layout_->config().vpp;
  if (!vpp)
    throw InvalidValueError("vrank",
                            "ProcessGroups::set_virtual_pipeline_rank: vpp is not set, "
                            "so there is no virtual pipeline rank");
  if (vrank < 0 || vrank >= *vpp)
    throw InvalidValueError("vrank",
                            "ProcessGroups::set_virtual_pipeline_rank: " + std::to_string(vrank) +
                                " out of range [0, " + std::to_string(*vpp) + ")");
  virtual_rank_ = vrank;
}

std::optional<Rank> ProcessGroups::virtual_pipeline_size() const {
  require("virtual_pipeline_size");
  const auto& vpp = layout_->config().vpp;
  return vpp ? std::optional<Rank>(*vpp) : std::nullopt;
}

Communicator& ProcessGroups::amax_reduction_group(bool with_cp, bool tp_only) const {
  const GroupKind k = with_cp ? (tp_only ? GroupKind::tp_cp : GroupKind::tp_dp_cp)
                              : (tp_only ? GroupKind::tp : GroupKind::tp_dp);
  return *member_slot(k, 0, "amax_reduction_group").comm;
}

std::string ProcessGroups::all_ranks() const {
  require("all_ranks");
  // From the layout, so that it answers whichever kinds were created.
  std::string s;
  for (GroupKind k : {GroupKind::tp, GroupKind::dp, GroupKind::cp, GroupKind::pp, GroupKind::ep})
    s += (s.empty() ? "" : "_") + std::to_string(layout_->group_of(k, world_rank_)->comm_rank);
  return s;
}

const std::vector<KindCreation>& ProcessGroups::creation_stats() const {
  require("creation_stats");
  return stats_;
}

std::chrono::nanoseconds ProcessGroups::creation_time() const {
  require("creation_time");
  return creation_time_;
}

std::chrono::nanoseconds ProcessGroups::fingerprint_time() const {
  require("fingerprint_time");
  return fingerprint_time_;
}

}  // namespace commgrid
