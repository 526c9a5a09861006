#include "plan_output.hpp"

namespace commgrid::cli {
namespace {

using Json = nlohmann::ordered_json;

Json list_json(std::span<const Rank> members) {
  Json a = Json::array();
  for (Rank r : members) a.push_back(r);
  return a;
}

Json groups_json(const GroupList& groups) {
  Json a = Json::array();
  for (std::size_t i = 0; i < groups.size(); ++i) a.push_back(list_json(groups[i]));
  return a;
}

Json rank_group_json(const Layout& layout, GroupKind k, Rank r, int level) {
  auto g = layout.group_of(k, r, level);
  return g ? list_json(g->members) : Json(nullptr);
}

}  // namespace

Json config_json(const Layout& layout) {
  const ParallelConfig& c = layout.config();
  Json j;
  j["world_size"] = c.world_size;
  j["tp"] = c.tp;
  j["pp"] = c.pp;
  j["cp"] = c.cp;
  j["ep"] = c.ep;
  j["etp"] = c.expert_tp();
  j["dp"] = layout.dp();
  j["expert_dp"] = layout.expert_dp();
  j["dist_opt_instances"] = c.dist_opt_instances;
  j["hcp"] = c.hcp;
  j["vpp"] = c.vpp ? Json(*c.vpp) : Json(nullptr);
  j["order"] = c.order;
  return j;
}

Json plan_json(const Layout& layout, const PlanSelection& sel) {
  Json doc;
  Json groups = Json::object();
  for (GroupKind k : sel.kinds) {
    const std::string name(kind_name(k));
    const int levels = layout.levels(k);
    if (sel.rank) {
      if (k == GroupKind::hcp) {
        Json per_level = Json::array();
        for (int l = 0; l < levels; ++l) per_level.push_back(rank_group_json(layout, k, *sel.rank, l));
        groups[name] = per_level;
      } else {
        groups[name] = rank_group_json(layout, k, *sel.rank, 0);
      }
    } else if (k == GroupKind::hcp) {
      Json per_level = Json::array();
      for (int l = 0; l < levels; ++l) per_level.push_back(groups_json(layout.groups(k, l)));
      groups[name] = per_level;
    } else {
      groups[name] = groups_json(layout.groups(k));
    }
  }
  if (sel.rank) {
    doc["rank"] = *sel.rank;
  } else {
    doc["config"] = config_json(layout);
  }
  doc["groups"] = std::move(groups);
  return doc;
}

}  // namespace commgrid::cli
