#include "commgrid/process_group_collection.hpp"

#include "commgrid/process_groups.hpp"

namespace commgrid {
namespace {
const char* const kNoneReason = "not set (reads as None, as in Megatron-core HEAD)";
}  // namespace

ProcessGroupCollection::ProcessGroupCollection()
    : GroupCollection("ProcessGroupCollection", kFields) {
  for (GroupKind k : kFields) set(kind_name(k), NoGroup{kNoneReason});
}

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
    c.set(kind_name(k), NoGroup{"use_mpu_process_groups leaves it None; set it from the "
                                "all-gather groups"});
  return c;
}

const GroupField& ProcessGroupCollection::of(GroupKind k) const {
  return field(kind_name(k));
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
        throw ConfigError("module_pgs", "module_pgs: module \"" + modules_[i].first +
                                            "\" is given twice");
  if (language_model_) (void)module(*language_model_);
}

const ProcessGroupCollection& MultiModuleProcessGroupCollection::language_model_collection() const {
  if (!language_model_)
    throw ConfigError("language_model_module_name",
                      "language_model_module_name: no language model specified for this collection");
  return module(*language_model_);
}

int MultiModuleProcessGroupCollection::language_model_cp_size() const {
  return (*language_model_collection().of(GroupKind::cp)).size();
}

const ProcessGroupCollection& MultiModuleProcessGroupCollection::module(std::string_view name) const {
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
