// How ProcessGroups names a (kind, level) in group names and messages: "tp", "hcp[1]".
// Private to the runtime.
#pragma once

#include <string>

#include "commgrid/process_groups.hpp"

namespace commgrid::detail {

inline std::string label_of(GroupKind k, int level) {
  std::string s(kind_name(k));
  if (k == GroupKind::hcp || k == GroupKind::hybrid_dp_cp) s += "[" + std::to_string(level) + "]";
  return s;
}

}  // namespace commgrid::detail
