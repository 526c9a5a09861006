// Renderers of `commgrid plan`: each writes one layout (or one rank's groups) to a stream.
#pragma once

#include <optional>
#include <ostream>
#include <vector>

#include <nlohmann/json.hpp>

#include "commgrid/layout.hpp"

namespace commgrid::cli {

/// What plan was asked to show.
struct PlanSelection {
  std::vector<GroupKind> kinds;  ///< existing kinds to show, in reference order
  std::optional<Rank> rank;      ///< only this rank's groups
};

/// The "config" object of the JSON output.
nlohmann::ordered_json config_json(const Layout& layout);
/// The whole JSON document: {"config", "groups"} or, with a rank, {"rank", "groups"}.
nlohmann::ordered_json plan_json(const Layout& layout, const PlanSelection& sel);
/// The table for people: config, per-kind summary, per-rank table.
void write_plan_table(std::ostream& out, const Layout& layout, const PlanSelection& sel);

}  // namespace commgrid::cli
