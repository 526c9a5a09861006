// Megatron-core HEAD's single collection of groups (ProcessGroupCollection, 27 fields) and
// its multi-module wrapper (MultiModuleProcessGroupCollection).
#pragma once

#include <array>
#include <optional>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "commgrid/collections.hpp"

namespace commgrid {

/// HEAD's ProcessGroupCollection: the seed's two collections in one, plus the HEAD kinds.
/// Unlike the seed's collections, a field never set reads as "none" through of() (HEAD
/// returns None); is_set() still tells a field set explicitly (to a group or to none) from
/// one never set, which setup_process_groups_for_optimizer / _for_ddp look at, as HEAD does.
class ProcessGroupCollection : public GroupCollection {
 public:
  /// The 27 fields, in Megatron-core HEAD's order.
  static constexpr std::array<GroupKind, 27> kFields = {GroupKind::tp,
                                                        GroupKind::pp,
                                                        GroupKind::mp,
                                                        GroupKind::embd,
                                                        GroupKind::pos_embd,
                                                        GroupKind::cp,
                                                        GroupKind::tp_cp,
                                                        GroupKind::hcp,
                                                        GroupKind::ep,
                                                        GroupKind::expt_tp,
                                                        GroupKind::tp_ep,
                                                        GroupKind::tp_ep_pp,
                                                        GroupKind::tp_ep_pp_with_egtp_remat,
                                                        GroupKind::tp_dp_cp,
                                                        GroupKind::dp,
                                                        GroupKind::dp_cp,
                                                        GroupKind::dp_cp_gtp_remat,
                                                        GroupKind::dp_cp_ag,
                                                        GroupKind::gtp_remat,
                                                        GroupKind::expt_gtp_remat,
                                                        GroupKind::expt_dp,
                                                        GroupKind::expt_dp_gtp_remat,
                                                        GroupKind::expt_dp_ag,
                                                        GroupKind::intra_dp_cp,
                                                        GroupKind::intra_expt_dp,
                                                        GroupKind::inter_dist_opt,
                                                        GroupKind::intra_dist_opt};

  /// Every field unset (reads as none).
  ProcessGroupCollection();
  /// From name/value pairs; the others unset (read as none). Throws UnknownKindError listing every
  /// unknown name and the valid ones.
  ProcessGroupCollection(std::initializer_list<std::pair<std::string_view, GroupValue>> pairs);
  /// HEAD's use_mpu_process_groups(required_pgs): the required fields (all when nullopt)
  /// get this rank's group or none, the others stay unset; dp_cp_ag and expt_dp_ag, when
  /// required, are none (HEAD leaves them to create_all_gather_groups and a later set()). Throws
  /// UnknownKindError listing every invalid name before reading anything, StateError when `state`
  /// is not initialized.
  [[nodiscard]] static ProcessGroupCollection from_state(
      const ProcessGroups& state,
      const std::optional<std::vector<std::string>>& required = std::nullopt);

  /// The field of a kind; a field never set reads as none. Throws UnknownKindError for a
  /// kind that is not one of the 27 fields.
  [[nodiscard]] const GroupField& of(GroupKind k) const;
  /// The group of a field, or nullptr (none or unset).
  [[nodiscard]] GroupHandle handle(GroupKind k) const;

  /// HEAD's repr: "ProcessGroupCollection(tp(2), hcp([2, 2]), ...)" listing the fields with
  /// a group and their sizes, or "ProcessGroupCollection(empty)".
  [[nodiscard]] std::string describe() const;
};

/// The DDP / optimizer settings HEAD's helpers read from the model's ddp_config.
struct DdpSettings {
  std::int64_t num_distributed_optimizer_instances = 1;
  bool use_distributed_optimizer = false;
};

/// What HEAD's setup_process_groups_for_optimizer returns (a null handle is None). The
/// Gloo twins (intra_dp_cp_group_gloo, intra_expt_dp_group_gloo) are not modelled: commgrid
/// creates no Gloo twins, so they are always None here.
struct OptimizerProcessGroups {
  GroupHandle dp, dp_cp, intra_dp_cp, expt_dp, intra_expt_dp, gtp_remat, expt_gtp_remat, mp,
      expt_tp_pp, expt_tp_pp_with_egtp_remat, inter_dist_opt, intra_dist_opt;
};

/// What HEAD's setup_process_groups_for_ddp returns (a null handle is None).
struct DdpProcessGroups {
  GroupHandle dp, dp_cp, intra_dp_cp, expt_dp, intra_expt_dp, tp, gtp_remat, pp, ep, expt_gtp_remat,
      inter_dist_opt, intra_dist_opt;
};

/// HEAD's choice without a collection (parallel_state's groups). `ddp`: the model's
/// ddp_config, nullopt when the model has none (inter_dist_opt is then None). Throws
/// StateError when `state` is not initialized.
[[nodiscard]] OptimizerProcessGroups setup_process_groups_for_optimizer(
    const ProcessGroups& state, const std::optional<DdpSettings>& ddp);
/// HEAD's choice from a collection: dp, expt_dp, mp, tp_ep_pp must be set (to a group or
/// none); dp_cp when cp_size > 1; the dist-opt fields with several instances; intra_dist_opt
/// with the distributed optimizer. Missing ones are a ConfigError naming them.
[[nodiscard]] OptimizerProcessGroups setup_process_groups_for_optimizer(
    const ProcessGroupCollection& pgc, const std::optional<DdpSettings>& ddp, std::int64_t cp_size);
/// HEAD's DDP choice without a collection.
[[nodiscard]] DdpProcessGroups setup_process_groups_for_ddp(const ProcessGroups& state,
                                                            const DdpSettings& ddp);
/// HEAD's DDP choice from a collection: dp, tp, pp, ep must be set; dp_cp when cp_size > 1;
/// the dist-opt fields with several instances. HEAD creates a one-rank expt_dp group when
/// the collection has none; here `expt_dp_fallback` (this rank alone) takes that place.
[[nodiscard]] DdpProcessGroups setup_process_groups_for_ddp(const ProcessGroupCollection& pgc,
                                                            std::int64_t cp_size,
                                                            const DdpSettings& ddp,
                                                            GroupHandle expt_dp_fallback);

/// HEAD's MultiModuleProcessGroupCollection: one collection per module (e.g. "encoder",
/// "llm") on ranks that take part in several, and which one is the language model.
class MultiModuleProcessGroupCollection {
 public:
  /// Throws ConfigError ("module_pgs") when `modules` is empty or names a module twice, and
  /// when `language_model` is given but not one of the modules.
  MultiModuleProcessGroupCollection(
      std::vector<std::pair<std::string, ProcessGroupCollection>> modules,
      std::optional<std::string> language_model = std::nullopt);

  [[nodiscard]] bool has_language_model() const noexcept { return language_model_.has_value(); }
  /// The language model's collection. Throws ConfigError when none is named.
  [[nodiscard]] const ProcessGroupCollection& language_model_collection() const;
  /// The size of the language model's cp group. Throws ConfigError when no language model
  /// is named, NoGroupError when its cp field is none.
  [[nodiscard]] Rank language_model_cp_size() const;
  /// The collection of a module. Throws ConfigError naming the module and the valid ones.
  [[nodiscard]] const ProcessGroupCollection& module(std::string_view name) const;
  /// Module names, in the order given.
  [[nodiscard]] std::vector<std::string> names() const;
  [[nodiscard]] std::size_t size() const noexcept { return modules_.size(); }
  /// "MultiModuleProcessGroupCollection(modules=[encoder, llm], language_model_module_name='llm')".
  [[nodiscard]] std::string describe() const;

 private:
  std::vector<std::pair<std::string, ProcessGroupCollection>> modules_;
  std::optional<std::string> language_model_;
};

}  // namespace commgrid
