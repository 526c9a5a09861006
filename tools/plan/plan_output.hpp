// Renderers of `commgrid plan`: each writes one layout (or one rank's groups) to a stream.
#pragma once

#include <charconv>
#include <optional>
#include <ostream>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include <nlohmann/json.hpp>

#include "commgrid/layout.hpp"
#include "commgrid/rank_map.hpp"

namespace commgrid::cli {

/// Member lists are enumerated this many ranks at a time: large enough that the per-piece
/// cost vanishes, small enough to stay in cache.
inline constexpr std::int64_t kPiece = 1 << 14;

/// The number of decimal digits of v >= 0 (the width of a rank in a column).
[[nodiscard]] inline std::int64_t digits(std::int64_t v) {
  std::int64_t d = 1;
  for (; v >= 10; v /= 10) ++d;
  return d;
}

/// What plan was asked to show.
struct PlanSelection {
  std::vector<GroupKind> kinds;  ///< existing kinds to show, in reference order
  std::optional<Rank> rank;      ///< only this rank's groups
  /// With --gpus-per-node: node and local-device columns in the rank views.
  std::optional<std::int64_t> gpus_per_node;
  /// With --num-layers: which layers each pipeline rank and virtual stage holds.
  std::optional<std::int64_t> num_layers;
  /// With --spares: the job's processes in epoch 0 (logical rank r on process r, the spares
  /// after the world, as whole nodes with --gpus-per-node).
  std::optional<RankMap> spares;
};

/// "spares: 2 processes (8-9) hold no rank; 10 processes in all", with their nodes when the
/// map has nodes: the table's line and the base of the JSON object.
[[nodiscard]] std::string spares_text(const RankMap& map);

/// Output written straight into a large buffer with std::to_chars and handed to the
/// stream in blocks of about a mebibyte: a JSON or table of millions of numbers costs little
/// more than the bytes themselves, and memory stays one buffer at any world.
class OutputBuffer {
 public:
  explicit OutputBuffer(std::ostream& out, std::size_t capacity = std::size_t{1} << 20);
  ~OutputBuffer();
  OutputBuffer(const OutputBuffer&) = delete;
  OutputBuffer& operator=(const OutputBuffer&) = delete;

  /// Appends text; the buffer goes to the stream whenever it is full.
  void put(std::string_view s);
  void put(char c) {
    if (n_ == buf_.size()) drain();
    buf_[n_++] = c;
  }
  /// A decimal integer.
  void put_int(std::int64_t v) {
    if (buf_.size() - n_ < 24) drain();
    n_ = static_cast<std::size_t>(
        std::to_chars(buf_.data() + n_, buf_.data() + buf_.size(), v).ptr - buf_.data());
  }
  /// s right-aligned (or left-aligned) in `width` columns; never truncated.
  void pad(std::string_view s, std::size_t width, bool left = false);
  /// v right-aligned in `width` columns.
  void pad_int(std::int64_t v, std::size_t width);
  /// Hands everything buffered to the stream; throws Error when the stream failed. A
  /// document is complete only after flush(): the destructor drops what is left.
  void flush();

 private:
  void drain();
  std::ostream& out_;
  std::vector<char> buf_;
  std::size_t n_ = 0;
};

/// A list of ranks as ranges and strides, for people: lists of up to 8 members in full
/// ("0,1,8,9"); longer ones as runs, "0-7" for consecutive ranks and "0:4096:8" (start,
/// end exclusive, step) for a stride, at most 8 runs, then "...", and the count:
/// "0:4096:8 (512 ranks)". Members are fed one at a time, so any list can be streamed.
class RangeText {
 public:
  /// noun: what the count counts ("ranks", "nodes").
  explicit RangeText(std::string noun = "ranks") : noun_(std::move(noun)) {}
  void add(std::int64_t v);
  /// add() for each value; a run that goes on is extended in a tight loop, so lists of
  /// billions of members take a few seconds.
  void add(std::span<const std::int64_t> values);
  /// The text, with brackets and, past 8 members, the count.
  [[nodiscard]] std::string str() const;
  [[nodiscard]] std::int64_t count() const noexcept { return count_; }

 private:
  struct Run {
    std::int64_t first = 0, step = 0, n = 0;
  };
  void close_run();
  std::string noun_;
  std::vector<std::int64_t> head_;  ///< the first 9 members, for short lists
  std::vector<Run> runs_;           ///< the first runs (9 at most are kept)
  Run cur_;
  bool more_runs_ = false;
  std::int64_t count_ = 0;
};

/// Megatron-core's interleaved layer assignment: pipeline rank p, virtual stage v holds
/// num_layers / (pp * vpp) consecutive layers starting at v * (num_layers / vpp) +
/// p * (num_layers / (pp * vpp)) (vpp 1 without a virtual pipeline). Throws ConfigError
/// ("num_layers") unless num_layers >= 1 divides evenly.
struct LayerAssignment {
  std::int64_t num_layers = 0, pp = 1, vpp = 1;
  LayerAssignment(std::int64_t num_layers, const ParallelConfig& config);
  [[nodiscard]] std::int64_t per_stage() const noexcept { return num_layers / (pp * vpp); }
  [[nodiscard]] std::int64_t first(std::int64_t pp_rank, std::int64_t vstage) const noexcept {
    return vstage * (num_layers / vpp) + pp_rank * per_stage();
  }
};

/// The output formats of plan, for the size estimate.
enum class PlanFormat { table, json };

/// An upper bound of the bytes `plan` would write for this selection, computed from the
/// counts alone (no enumeration); compared with --max-output-mib before anything is written.
[[nodiscard]] std::int64_t estimate_plan_bytes(const Layout& layout, const PlanSelection& sel,
                                               PlanFormat format);

/// The "config" object of the JSON output.
[[nodiscard]] nlohmann::ordered_json config_json(const Layout& layout);
/// The whole JSON document, streamed kind by kind: {"config", "groups"} or, with a rank,
/// {"rank", "groups"} (and "node", "local_device", "layers" when asked for).
void write_plan_json(std::ostream& out, const Layout& layout, const PlanSelection& sel);
/// The table for people, streamed: config, per-kind summary, per-rank table; or one
/// rank's groups.
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
  /// The window of nodes drawn (`--nodes A-B`, inclusive); the whole world when unset.
  std::optional<std::int64_t> first_node, last_node;
  /// `--rank R`: R's group of each kind is outlined, R itself in red.
  std::optional<Rank> highlight;
};

/// The most ranks a picture draws: beyond it a picture is neither readable nor small (an
/// SVG of 16384 ranks and 5 kinds is about 21 MB); larger worlds draw a window of nodes.
inline constexpr std::int64_t kMaxPictureRanks = 16384;

/// Up to this many drawn ranks, each cell prints the rank's coordinates under the rank;
/// more print the rank only, in smaller cells, and keep the coordinates in the tooltip.
inline constexpr std::int64_t kMaxRanksWithCoordinates = 256;

/// Beyond this many groups in a panel, colours stop being told apart at a glance, so every
/// cell also prints its group's index ("g12").
inline constexpr std::size_t kDistinctColours = 12;

/// One panel of a picture: one kind (one hcp level) over the drawn ranks.
struct PicturePanel {
  GroupKind kind = GroupKind::tp;
  int level = 0;
  std::string title;                   ///< "tp", "hcp0", ...
  std::int64_t num_groups = 0;         ///< groups of the kind in the whole layout
  std::string group_size;              ///< "8", or "1-2" for a custom policy's groups
  std::vector<std::int64_t> group_of;  ///< per drawn rank: its group's index, -1 when none
  std::vector<std::int64_t> shown;     ///< the groups with a drawn member, ascending
  std::vector<std::string> colours;    ///< per shown group: "#rrggbb", all distinct
  std::vector<std::string> members;    ///< per shown group: its members as ranges
  bool labels = false;                 ///< cells print "g<index>" (shown > kDistinctColours)
  std::int64_t highlighted = -1;       ///< the highlighted rank's group, -1 when none
  /// Position of group q in `shown` (q must be shown).
  [[nodiscard]] std::size_t slot(std::int64_t q) const;
};

/// Sizes, in pixels, shared by every panel of a picture.
struct PictureGeometry {
  bool coordinates = false;           ///< whether cells print coordinates
  bool labels = false;                ///< whether some panel's cells print group labels
  Rank first_rank = 0, end_rank = 0;  ///< the drawn ranks, [first, end)
  std::int64_t first_node = 0;
  Rank highlight = -1;  ///< the highlighted rank, -1 when none
  int columns = 0, rows = 0, cell_w = 0, cell_h = 0, label_w = 0;
  int legend_w = 0, legend_h = 0;  ///< the widest and tallest legend (right of the grids)
  int panel_w = 0, panel_h = 0;
};

/// The fill of a rank that is in no group of the panel's kind.
inline constexpr const char* kNoGroupColour = "#f2f2f2";

/// n fill colours, all distinct and never kNoGroupColour: hues a golden angle apart
/// (consecutive groups contrast), lightness and saturation cycling through three and two
/// steps; a colour that would repeat is nudged in lightness until it is new. Deterministic.
[[nodiscard]] std::vector<std::string> group_colours(std::size_t n);

/// Throws ConfigError when the picture would draw more than kMaxPictureRanks ranks (then
/// --nodes A-B draws a window) or the highlighted rank is out of range.
void check_picture(const Layout& layout, const PictureOptions& opt);

/// The panels of a picture, over the drawn ranks only: memory and time grow with the
/// window, not the world.
[[nodiscard]] std::vector<PicturePanel> picture_panels(const Layout& layout,
                                                       const PictureOptions& opt);

/// The geometry of a picture of these panels.
[[nodiscard]] PictureGeometry picture_geometry(const Layout& layout, const PictureOptions& opt,
                                               const std::vector<PicturePanel>& panels);

/// One panel as an SVG <g> at (x, y): title, legend, node rows of device cells. Every cell
/// is `<g class="c" data-rank="r" data-node="n">` holding a <rect> filled with its group's
/// colour, the rank (class r or rs), its coordinates (class x) for small pictures and the
/// group label (class gl) where colours run out; with `tooltips`, a <title> gives the
/// rank's node, device, coordinates and group.
void write_svg_panel(std::ostream& out, const Layout& layout, const PictureGeometry& geo,
                     const PicturePanel& panel, int x, int y, bool tooltips);

/// The CSS classes the panels use (without the <style> element).
[[nodiscard]] const char* svg_panel_css();

/// The SVG picture: a header, then the panels side by side.
void write_plan_svg(std::ostream& out, const Layout& layout, const PictureOptions& opt);

/// The HTML page: one self-contained file (inline CSS, SVG, data and script; nothing
/// fetched) with a kind selector, a node window, hover details and a pinned highlight.
void write_plan_html(std::ostream& out, const Layout& layout, const PictureOptions& opt);

/// The topology report as a table: one row per kind, then nothing else (warnings are the
/// caller's, on stderr).
void write_topology_table(std::ostream& out, const TopologyReport& report);

/// The topology report as JSON: {"world_size", "gpus_per_node", "nodes", "order",
/// "kinds": [...], "warnings": [{"kind", "message", "order"}]}.
[[nodiscard]] nlohmann::ordered_json topology_json(const TopologyReport& report);

/// Escapes &, <, > and " for XML and HTML text and attribute values (the config is user
/// input, and "</" must never end an inline script).
[[nodiscard]] std::string xml_escape(std::string_view s);

}  // namespace commgrid::cli
