// The node-topology report of `commgrid plan --check-topology`, as a table or JSON.
#include <algorithm>
#include <iomanip>
#include <string>

#include "plan/plan_output.hpp"

namespace commgrid::cli {
namespace {

std::string row_title(const KindSpan& s) {
  return std::string(kind_name(s.kind)) + (s.kind == GroupKind::hcp ? std::to_string(s.level) : "");
}

std::string size_text(const KindSpan& s) {
  if (s.min_group_size == s.max_group_size) return std::to_string(s.max_group_size);
  return std::to_string(s.min_group_size) + "-" + std::to_string(s.max_group_size);
}

}  // namespace

void write_topology_table(std::ostream& out, const TopologyReport& r) {
  out << "topology: " << r.world_size << " ranks on " << r.nodes
      << (r.nodes == 1 ? " node" : " nodes") << " of " << r.gpus_per_node << " GPUs";
  if (r.world_size % r.gpus_per_node != 0)
    out << " (the last node holds " << r.world_size % r.gpus_per_node << ")";
  out << ", order " << r.order << "\n\n";
  // Columns as wide as the world's numbers (a 2^24-rank world has 8-digit counts).
  const int wide = static_cast<int>(std::to_string(r.world_size).size()) + 2;
  const int w8 = std::max(8, wide), w10 = std::max(10, wide), w11 = std::max(11, wide);
  out << std::left << std::setw(16) << "kind" << std::right << std::setw(w8) << "groups"
      << std::setw(w8) << "size" << std::setw(w10) << "crossing" << std::setw(w11) << "max nodes"
      << "\n";
  for (const KindSpan& s : r.kinds)
    out << std::left << std::setw(16) << row_title(s) << std::right << std::setw(w8) << s.groups
        << std::setw(w8) << size_text(s) << std::setw(w10) << s.crossing_groups << std::setw(w11)
        << s.max_nodes_spanned << "\n";
}

nlohmann::ordered_json topology_json(const TopologyReport& r) {
  nlohmann::ordered_json j;
  j["world_size"] = r.world_size;
  j["gpus_per_node"] = r.gpus_per_node;
  j["nodes"] = r.nodes;
  j["order"] = r.order;
  j["kinds"] = nlohmann::ordered_json::array();
  for (const KindSpan& s : r.kinds)
    j["kinds"].push_back({{"kind", row_title(s)},
                          {"groups", s.groups},
                          {"min_group_size", s.min_group_size},
                          {"max_group_size", s.max_group_size},
                          {"crossing_groups", s.crossing_groups},
                          {"max_nodes_spanned", s.max_nodes_spanned}});
  j["best_order"] = r.best_order;
  j["warnings"] = nlohmann::ordered_json::array();
  for (const TopologyWarning& w : r.warnings)
    j["warnings"].push_back(
        {{"kind", std::string(kind_name(w.kind))},
         {"message", w.message()},
         {"order", w.order ? nlohmann::ordered_json(*w.order) : nlohmann::ordered_json(nullptr)},
         {"avoidable", w.avoidable}});
  return j;
}

}  // namespace commgrid::cli
