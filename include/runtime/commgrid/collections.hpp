// Megatron-core's two group collections, handed to model code instead of global state:
// ModelCommProcessGroups (13 fields) and GradCommProcessGroups (6 fields).
#pragma once

#include <array>
#include <cstdint>
#include <initializer_list>
#include <iosfwd>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <utility>
#include <variant>
#include <vector>

#include "commgrid/communicator.hpp"
#include "commgrid/error.hpp"
#include "commgrid/group_kind.hpp"

namespace commgrid {

class ProcessGroups;

/// A shared handle to a group: a collection keeps its groups alive.
using GroupHandle = std::shared_ptr<Communicator>;

/// The value "this rank has no group here", with the reason (a middle pipeline stage in
/// embd, inter_dist_opt with one dist-opt instance, ...).
struct NoGroup {
  std::string reason;
};

/// What a field can be set to: a group, one group per level (hcp), or no group. A null
/// handle means no group.
using GroupValue = std::variant<GroupHandle, std::vector<GroupHandle>, NoGroup>;

/// One field of a collection, in one of three states: unset (the collection's accessors
/// throw UnsetFieldError before handing it out), no group on this rank (with a reason), or
/// a group (hcp: one per level, level 0 first).
class GroupField {
 public:
  enum class State : std::uint8_t { unset, no_group, group };

  [[nodiscard]] State state() const noexcept { return state_; }
  [[nodiscard]] bool is_set() const noexcept { return state_ != State::unset; }
  [[nodiscard]] bool has_group() const noexcept { return state_ == State::group; }
  explicit operator bool() const noexcept { return has_group(); }

  /// The group (hcp: level 0); nullptr when this rank has none or the field is unset.
  [[nodiscard]] Communicator* get() const noexcept;
  /// The group (hcp: level 0). Throws NoGroupError with the reason when there is none.
  [[nodiscard]] Communicator& operator*() const;
  [[nodiscard]] Communicator* operator->() const { return &**this; }
  /// Level i of hcp (any field: level 0). Throws NoGroupError when there is none.
  [[nodiscard]] Communicator& level(std::size_t i) const;
  /// The handles: one per level for hcp, one for any other field with a group, none
  /// without.
  [[nodiscard]] const std::vector<GroupHandle>& handles() const noexcept { return groups_; }
  /// Why there is no group (state no_group); empty otherwise.
  [[nodiscard]] const std::string& reason() const noexcept { return reason_; }
  /// "tp#3 (2 ranks)", "[hcp[0]#1 (2 ranks), hcp[1]#1 (2 ranks)]", "none (reason)" or
  /// "unset".
  [[nodiscard]] std::string describe() const;

  /// Same state and the same groups (by identity).
  bool operator==(const GroupField& other) const noexcept {
    return state_ == other.state_ && groups_ == other.groups_;
  }

 private:
  friend class GroupCollection;
  State state_ = State::unset;
  std::vector<GroupHandle> groups_;
  std::string reason_;
  std::string where_;  ///< "ModelCommProcessGroups.tp", for messages
};

/// The common part of the two collections: named fields, each a group kind (GroupKind).
class GroupCollection {
 public:
  /// "ModelCommProcessGroups" or "GradCommProcessGroups".
  [[nodiscard]] std::string_view collection_name() const noexcept { return name_; }
  /// The field kinds, in declaration order.
  [[nodiscard]] std::span<const GroupKind> field_kinds() const noexcept { return kinds_; }
  /// "tp, pp, ...": the field names, for messages.
  [[nodiscard]] std::string field_names() const;

  /// Whether the field was set. Throws UnknownKindError for a name that is not a field.
  [[nodiscard]] bool is_set(std::string_view name) const;
  /// The field. Throws UnknownKindError (not a field, listing the valid names) or
  /// UnsetFieldError (never set).
  [[nodiscard]] const GroupField& field(std::string_view name) const;
  /// Sets a field. Throws UnknownKindError for a name that is not a field, InvalidValueError
  /// for several groups on a field other than hcp.
  void set(std::string_view name, GroupValue value);

  /// One line: each set field with its group and size, then the unset fields, e.g.
  /// `ModelCommProcessGroups{tp: tp#0 (2 ranks), embd: none (...); unset: cp}`.
  [[nodiscard]] std::string summary() const;

  bool operator==(const GroupCollection& other) const noexcept {
    return name_ == other.name_ && fields_ == other.fields_;
  }

 protected:
  GroupCollection(std::string_view name, std::span<const GroupKind> kinds);
  /// Sets every pair; reports every unknown name at once.
  void set_pairs(std::initializer_list<std::pair<std::string_view, GroupValue>> pairs);
  /// Sets the required fields (all when nullopt) from an initialized ProcessGroups.
  void fill_from_state(const ProcessGroups& state,
                       const std::optional<std::vector<std::string>>& required);
  /// The field of a kind; throws UnsetFieldError.
  [[nodiscard]] const GroupField& get(GroupKind k) const;

 private:
  [[nodiscard]] std::size_t index_of(std::string_view name) const;
  void set_index(std::size_t i, GroupValue value);

  std::string_view name_;
  std::span<const GroupKind> kinds_;
  std::vector<GroupField> fields_;
};

/// The groups a model's layers use (Megatron-core's ModelCommProcessGroups).
class ModelCommProcessGroups : public GroupCollection {
 public:
  /// The 13 fields, in Megatron-core's order.
  static constexpr std::array<GroupKind, 13> kFields = {
      GroupKind::tp,       GroupKind::pp,      GroupKind::mp,    GroupKind::embd,
      GroupKind::pos_embd, GroupKind::cp,      GroupKind::tp_cp, GroupKind::hcp,
      GroupKind::ep,       GroupKind::expt_tp, GroupKind::tp_ep, GroupKind::tp_ep_pp,
      GroupKind::expt_dp};

  /// Every field unset.
  ModelCommProcessGroups();
  /// From name/value pairs: {{"tp", tp_group}, {"embd", NoGroup{"not a stage with embeddings"}}}.
  /// Throws UnknownKindError listing every unknown name and the valid ones.
  ModelCommProcessGroups(std::initializer_list<std::pair<std::string_view, GroupValue>> pairs);
  /// From an initialized ProcessGroups: the required fields (all 13 when nullopt) get this
  /// rank's group, or NoGroup with the reason when it has none (a kind not created counts
  /// as none); the others stay unset. Throws UnknownKindError listing every invalid name
  /// before reading anything, StateError when `state` is not initialized.
  [[nodiscard]] static ModelCommProcessGroups from_state(
      const ProcessGroups& state,
      const std::optional<std::vector<std::string>>& required = std::nullopt);
  /// The same with the required fields as kinds: from_state(pg, {GroupKind::tp, GroupKind::pp}).
  /// A kind that is not a field of this collection is an UnknownKindError.
  [[nodiscard]] static ModelCommProcessGroups from_state(const ProcessGroups& state,
                                                         const std::vector<GroupKind>& required);

  [[nodiscard]] const GroupField& tp() const { return get(GroupKind::tp); }
  [[nodiscard]] const GroupField& pp() const { return get(GroupKind::pp); }
  [[nodiscard]] const GroupField& mp() const { return get(GroupKind::mp); }
  [[nodiscard]] const GroupField& embd() const { return get(GroupKind::embd); }
  [[nodiscard]] const GroupField& pos_embd() const { return get(GroupKind::pos_embd); }
  [[nodiscard]] const GroupField& cp() const { return get(GroupKind::cp); }
  [[nodiscard]] const GroupField& tp_cp() const { return get(GroupKind::tp_cp); }
  [[nodiscard]] const GroupField& hcp() const { return get(GroupKind::hcp); }
  [[nodiscard]] const GroupField& ep() const { return get(GroupKind::ep); }
  [[nodiscard]] const GroupField& expt_tp() const { return get(GroupKind::expt_tp); }
  [[nodiscard]] const GroupField& tp_ep() const { return get(GroupKind::tp_ep); }
  [[nodiscard]] const GroupField& tp_ep_pp() const { return get(GroupKind::tp_ep_pp); }
  [[nodiscard]] const GroupField& expt_dp() const { return get(GroupKind::expt_dp); }
};

/// The groups gradient reduction and the distributed optimizer use (Megatron-core's
/// GradCommProcessGroups), with the same API as ModelCommProcessGroups.
class GradCommProcessGroups : public GroupCollection {
 public:
  /// The 6 fields, in Megatron-core's order.
  static constexpr std::array<GroupKind, 6> kFields = {
      GroupKind::dp,          GroupKind::dp_cp,         GroupKind::expt_dp,
      GroupKind::intra_dp_cp, GroupKind::intra_expt_dp, GroupKind::inter_dist_opt};

  GradCommProcessGroups();
  GradCommProcessGroups(std::initializer_list<std::pair<std::string_view, GroupValue>> pairs);
  [[nodiscard]] static GradCommProcessGroups from_state(
      const ProcessGroups& state,
      const std::optional<std::vector<std::string>>& required = std::nullopt);
  /// The same with the required fields as kinds.
  [[nodiscard]] static GradCommProcessGroups from_state(const ProcessGroups& state,
                                                        const std::vector<GroupKind>& required);

  [[nodiscard]] const GroupField& dp() const { return get(GroupKind::dp); }
  [[nodiscard]] const GroupField& dp_cp() const { return get(GroupKind::dp_cp); }
  [[nodiscard]] const GroupField& expt_dp() const { return get(GroupKind::expt_dp); }
  [[nodiscard]] const GroupField& intra_dp_cp() const { return get(GroupKind::intra_dp_cp); }
  [[nodiscard]] const GroupField& intra_expt_dp() const { return get(GroupKind::intra_expt_dp); }
  [[nodiscard]] const GroupField& inter_dist_opt() const { return get(GroupKind::inter_dist_opt); }
};

/// Prints summary().
std::ostream& operator<<(std::ostream& os, const GroupCollection& c);

}  // namespace commgrid
