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

// ---- pictures (svg, html) and the node-topology report ------------------------------

#include <string>

#include "commgrid/topology.hpp"

namespace commgrid::cli {

/// What a picture (`--format svg|html`) shows.
struct PictureOptions {
  std::int64_t gpus_per_node = kDefaultGpusPerNode;  ///< columns of the grid; rows are nodes
  std::vector<GroupKind> kinds;  ///< existing kinds, reference order; a panel each (hcp: per level)
};

/// The largest world a picture draws: beyond it a picture is neither readable nor small
/// (an SVG of 16384 ranks and 5 kinds is about 21 MB).
inline constexpr std::int64_t kMaxPictureRanks = 16384;

/// Up to this many ranks, each cell prints the rank's coordinates under the rank; larger
/// worlds print the rank only, in smaller cells, and keep the coordinates in the tooltip.
inline constexpr std::int64_t kMaxRanksWithCoordinates = 256;

/// One panel of a picture: one kind (one hcp level), each rank's group and each group's
/// colour.
struct PicturePanel {
  GroupKind kind = GroupKind::tp;
  int level = 0;
  std::string title;                   ///< "tp", "hcp0", ...
  GroupList groups;                    ///< in the kind's order
  std::vector<std::int64_t> group_of;  ///< per rank: its group's index, -1 when none
  std::vector<std::string> colours;    ///< per group: "#rrggbb"
};

/// Sizes, in pixels, shared by every panel of a picture.
struct PictureGeometry {
  bool coordinates = false;  ///< whether cells print coordinates
  int columns = 0, rows = 0, cell_w = 0, cell_h = 0, label_w = 0;
  int legend_h = 0;          ///< the tallest legend (legends stand right of the grids)
  int panel_w = 0, panel_h = 0;
};

/// The fill of a rank that is in no group of the panel's kind.
inline constexpr const char* kNoGroupColour = "#f2f2f2";

/// n fill colours, all distinct and never kNoGroupColour: hues a golden angle apart
/// (consecutive groups contrast), lightness and saturation cycling through three and two
/// steps; a colour that would repeat is nudged in lightness until it is new. Deterministic.
std::vector<std::string> group_colours(std::size_t n);

/// The panels of a picture. Throws ConfigError when the world exceeds kMaxPictureRanks.
std::vector<PicturePanel> picture_panels(const Layout& layout, const PictureOptions& opt);

/// The geometry of a picture of these panels.
PictureGeometry picture_geometry(const Layout& layout, const PictureOptions& opt,
                                 const std::vector<PicturePanel>& panels);

/// One panel as an SVG <g> at (x, y): title, legend, node rows of device cells. Every cell
/// is `<g class="c" data-rank="r">` holding a <rect> filled with its group's colour; with
/// `tooltips`, a <title> gives the rank's node, device, coordinates and group.
void write_svg_panel(std::ostream& out, const Layout& layout, const PictureGeometry& geo,
                     const PicturePanel& panel, int x, int y, bool tooltips);

/// The CSS classes the panels use (without the <style> element).
const char* svg_panel_css();

/// The SVG picture: a header, then the panels side by side.
void write_plan_svg(std::ostream& out, const Layout& layout, const PictureOptions& opt);

/// The HTML page: one self-contained file (inline CSS, SVG, data and script; nothing
/// fetched) with a kind selector and hover details.
void write_plan_html(std::ostream& out, const Layout& layout, const PictureOptions& opt);

/// The topology report as a table: one row per kind, then nothing else (warnings are the
/// caller's, on stderr).
void write_topology_table(std::ostream& out, const TopologyReport& report);

/// The topology report as JSON: {"world_size", "gpus_per_node", "nodes", "order",
/// "kinds": [...], "warnings": [{"kind", "message", "order"}]}.
nlohmann::ordered_json topology_json(const TopologyReport& report);

/// Escapes &, <, > and " for XML and HTML text and attribute values (the config is user
/// input, and "</" must never end an inline script).
std::string xml_escape(std::string_view s);

}  // namespace commgrid::cli
