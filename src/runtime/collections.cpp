#include "commgrid/collections.hpp"

#include <algorithm>
#include <ostream>

#include "commgrid/process_groups.hpp"

namespace commgrid {
namespace {

std::string group_text(const Communicator& c) {
  return c.name() + " (" + std::to_string(c.size()) + (c.size() == 1 ? " rank)" : " ranks)");
}

std::string quoted_list(const std::vector<std::string>& names) {
  std::string s;
  for (std::size_t i = 0; i < names.size(); ++i) s += (i ? ", " : "") + ("\"" + names[i] + "\"");
  return s;
}

}  // namespace

// ---- GroupField --------------------------------------------------------------------

Communicator* GroupField::get() const noexcept {
  return state_ == State::group ? groups_.front().get() : nullptr;
}

Communicator& GroupField::operator*() const { return level(0); }

Communicator& GroupField::level(std::size_t i) const {
  if (state_ == State::unset) throw UnsetFieldError(where_ + " is unset");
  if (state_ == State::no_group)
    throw NoGroupError(where_ + ": this rank has no group (" + reason_ + ")");
  if (i >= groups_.size())
    throw NoGroupError(where_ + ": level " + std::to_string(i) + " out of range [0, " +
                       std::to_string(groups_.size()) + ")");
  return *groups_[i];
}

std::string GroupField::describe() const {
  switch (state_) {
    case State::unset: return "unset";
    case State::no_group: return "none (" + reason_ + ")";
    case State::group: break;
  }
  if (groups_.size() == 1) return group_text(*groups_.front());
  std::string s = "[";
  for (std::size_t i = 0; i < groups_.size(); ++i) s += (i ? ", " : "") + group_text(*groups_[i]);
  return s + "]";
}

// ---- GroupCollection ---------------------------------------------------------------

GroupCollection::GroupCollection(std::string_view name, std::span<const GroupKind> kinds)
    : name_(name), kinds_(kinds), fields_(kinds.size()) {
  for (std::size_t i = 0; i < kinds.size(); ++i)
    fields_[i].where_ = std::string(name) + "." + std::string(kind_name(kinds[i]));
}

std::string GroupCollection::field_names() const {
  std::string s;
  for (std::size_t i = 0; i < kinds_.size(); ++i)
    s += (i ? ", " : "") + std::string(kind_name(kinds_[i]));
  return s;
}

std::size_t GroupCollection::index_of(std::string_view name) const {
  for (std::size_t i = 0; i < kinds_.size(); ++i)
    if (kind_name(kinds_[i]) == name) return i;
  throw UnknownKindError("kinds", "unknown group kind \"" + std::string(name) + "\" for " +
                                      std::string(name_) + "; valid: " + field_names());
}

bool GroupCollection::is_set(std::string_view name) const {
  return fields_[index_of(name)].is_set();
}

const GroupField& GroupCollection::get(GroupKind k) const {
  for (std::size_t i = 0; i < kinds_.size(); ++i)
    if (kinds_[i] == k) {
      const GroupField& f = fields_[i];
      if (!f.is_set())
        throw UnsetFieldError(f.where_ + " is unset; set it with set(\"" +
                              std::string(kind_name(k)) + "\", group), construct with {\"" +
                              std::string(kind_name(k)) + "\", group}, or take it from_state()");
      return f;
    }
  COMMGRID_ENFORCE(false, std::string(kind_name(k)) + " is not a field of " + std::string(name_));
}

const GroupField& GroupCollection::field(std::string_view name) const {
  return get(kinds_[index_of(name)]);
}

void GroupCollection::set(std::string_view name, GroupValue value) {
  set_index(index_of(name), std::move(value));
}

void GroupCollection::set_index(std::size_t i, GroupValue value) {
  GroupField& f = fields_[i];
  const bool hcp = kinds_[i] == GroupKind::hcp;
  GroupField next;
  next.where_ = f.where_;
  if (auto* none = std::get_if<NoGroup>(&value)) {
    next.state_ = GroupField::State::no_group;
    next.reason_ = none->reason.empty() ? "no reason given" : std::move(none->reason);
  } else if (auto* one = std::get_if<GroupHandle>(&value)) {
    if (*one) {
      next.state_ = GroupField::State::group;
      next.groups_.push_back(std::move(*one));
    } else {
      next.state_ = GroupField::State::no_group;
      next.reason_ = "set to a null handle";
    }
  } else {
    auto& levels = std::get<std::vector<GroupHandle>>(value);
    if (!hcp && levels.size() > 1)
      throw InvalidValueError(std::string(kind_name(kinds_[i])),
                              f.where_ + " holds one group, got " + std::to_string(levels.size()) +
                                  " (only hcp holds one group per level)");
    if (std::any_of(levels.begin(), levels.end(), [](const GroupHandle& g) { return !g; }))
      throw InvalidValueError(std::string(kind_name(kinds_[i])),
                              f.where_ + ": a level's handle is null");
    if (levels.empty()) {
      next.state_ = GroupField::State::no_group;
      next.reason_ = "set to an empty list";
    } else {
      next.state_ = GroupField::State::group;
      next.groups_ = std::move(levels);
    }
  }
  f = std::move(next);
}

void GroupCollection::set_pairs(
    std::initializer_list<std::pair<std::string_view, GroupValue>> pairs) {
  std::vector<std::string> unknown;
  for (const auto& pair : pairs) {
    const std::string_view name = pair.first;
    if (std::none_of(kinds_.begin(), kinds_.end(),
                     [&](GroupKind k) { return kind_name(k) == name; }))
      unknown.emplace_back(name);
  }
  if (!unknown.empty())
    throw UnknownKindError("kinds", std::string("unknown group kind") +
                                        (unknown.size() > 1 ? "s " : " ") + quoted_list(unknown) +
                                        " for " + std::string(name_) + "; valid: " + field_names());
  for (const auto& [name, value] : pairs) set_index(index_of(name), value);
}

void GroupCollection::fill_from_state(const ProcessGroups& state,
                                      const std::optional<std::vector<std::string>>& required) {
  // Check every name before reading anything.
  std::vector<std::size_t> wanted;
  if (required) {
    std::vector<std::string> invalid;
    for (const std::string& name : *required) {
      const auto it = std::find_if(kinds_.begin(), kinds_.end(),
                                   [&](GroupKind k) { return kind_name(k) == name; });
      if (it == kinds_.end()) {
        invalid.push_back(name);
        continue;
      }
      const auto i = static_cast<std::size_t>(it - kinds_.begin());
      if (std::find(wanted.begin(), wanted.end(), i) == wanted.end()) wanted.push_back(i);
    }
    if (!invalid.empty())
      throw UnknownKindError("kinds", "invalid process groups requested for " + std::string(name_) +
                                          ": " + quoted_list(invalid) +
                                          "; valid: " + field_names());
  } else {
    for (std::size_t i = 0; i < kinds_.size(); ++i) wanted.push_back(i);
  }
  if (!state.is_initialized())
    throw StateError(std::string(name_) +
                     "::from_state: parallel state is not initialized; call initialize() first");
  for (std::size_t i : wanted) {
    const GroupKind k = kinds_[i];
    if (!state.has_group(k, 0)) {
      set_index(i, NoGroup{state.no_group_reason(k, 0)});
    } else if (k == GroupKind::hcp) {
      std::vector<GroupHandle> levels;
      levels.reserve(static_cast<std::size_t>(state.layout().levels(k)));
      for (int l = 0; l < state.layout().levels(k); ++l) levels.push_back(state.group_handle(k, l));
      set_index(i, std::move(levels));
    } else {
      set_index(i, state.group_handle(k, 0));
    }
  }
}

std::string GroupCollection::summary() const {
  std::string s = std::string(name_) + "{";
  std::string unset;
  bool first = true;
  for (std::size_t i = 0; i < kinds_.size(); ++i) {
    const std::string name(kind_name(kinds_[i]));
    if (!fields_[i].is_set()) {
      unset += (unset.empty() ? "" : ", ") + name;
      continue;
    }
    s += (first ? "" : ", ") + name + ": " + fields_[i].describe();
    first = false;
  }
  if (!unset.empty()) s += std::string(first ? "" : "; ") + "unset: " + unset;
  return s + "}";
}

std::ostream& operator<<(std::ostream& os, const GroupCollection& c) { return os << c.summary(); }

// ---- the two collections -------------------------------------------------------------

ModelCommProcessGroups::ModelCommProcessGroups()
    : GroupCollection("ModelCommProcessGroups", kFields) {}

ModelCommProcessGroups::ModelCommProcessGroups(
    std::initializer_list<std::pair<std::string_view, GroupValue>> pairs)
    : ModelCommProcessGroups() {
  set_pairs(pairs);
}

namespace {
std::vector<std::string> names_of(const std::vector<GroupKind>& kinds) {
  std::vector<std::string> names;
  names.reserve(kinds.size());
  for (GroupKind k : kinds) names.emplace_back(kind_name(k));
  return names;
}
}  // namespace

ModelCommProcessGroups ModelCommProcessGroups::from_state(const ProcessGroups& state,
                                                          const std::vector<GroupKind>& required) {
  return from_state(state, std::optional<std::vector<std::string>>(names_of(required)));
}

GradCommProcessGroups GradCommProcessGroups::from_state(const ProcessGroups& state,
                                                        const std::vector<GroupKind>& required) {
  return from_state(state, std::optional<std::vector<std::string>>(names_of(required)));
}

ModelCommProcessGroups ModelCommProcessGroups::from_state(
    const ProcessGroups& state, const std::optional<std::vector<std::string>>& required) {
  ModelCommProcessGroups c;
  c.fill_from_state(state, required);
  return c;
}

GradCommProcessGroups::GradCommProcessGroups()
    : GroupCollection("GradCommProcessGroups", kFields) {}

GradCommProcessGroups::GradCommProcessGroups(
    std::initializer_list<std::pair<std::string_view, GroupValue>> pairs)
    : GradCommProcessGroups() {
  set_pairs(pairs);
}

GradCommProcessGroups GradCommProcessGroups::from_state(
    const ProcessGroups& state, const std::optional<std::vector<std::string>>& required) {
  GradCommProcessGroups c;
  c.fill_from_state(state, required);
  return c;
}

}  // namespace commgrid
