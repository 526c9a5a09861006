// `commgrid plan`: print or export a layout, draw it, check it against the nodes.
#include <algorithm>
#include <cerrno>
#include <cstring>
#include <fstream>
#include <iostream>
#include <sstream>

#include "command.hpp"
#include "commgrid/error.hpp"
#include "commgrid/layout.hpp"
#include "commgrid/topology.hpp"
#include "layout_flags.hpp"
#include "plan/plan_job.hpp"
#include "plan/plan_output.hpp"

namespace commgrid::cli {
namespace {

/// Exit code of `--check-topology --strict` when an order would have kept a node-local
/// kind inside nodes.
constexpr int kExitTopologyWarning = 3;

/// The default limit of --max-output-mib: a document larger than 1 GiB is refused.
constexpr std::int64_t kDefaultMaxOutputMiB = 1024;

struct PlanOptions {
  LayoutFlags layout;
  std::string rank, kinds, format = "table";
  std::string gpus_per_node, output, num_layers, nodes, max_output_mib, job, spares;
  bool check_topology = false, strict = false;
};

std::string size_text(std::int64_t bytes) {
  char buf[64];
  const double mib = static_cast<double>(bytes) / (1024.0 * 1024.0);
  if (mib >= 1024) std::snprintf(buf, sizeof buf, "%.1f GiB", mib / 1024.0);
  else std::snprintf(buf, sizeof buf, "%.1f MiB", mib);
  return buf;
}

// "A-B" (or "A"): an inclusive range of nodes.
std::pair<std::int64_t, std::int64_t> parse_node_range(const std::string& text,
                                                       std::int64_t nodes) {
  const std::size_t dash = text.find('-');
  const std::string a = text.substr(0, dash),
                    b = dash == std::string::npos ? a : text.substr(dash + 1);
  const std::int64_t first = parse_integer("nodes", a, 0, kMaxWorldSize);
  const std::int64_t last = parse_integer("nodes", b, 0, kMaxWorldSize);
  if (first > last)
    throw InvalidValueError("nodes", "nodes: \"" + text + "\" is empty (first node after last)");
  if (last >= nodes)
    throw InvalidValueError("nodes", "nodes: \"" + text + "\" goes past the last node, " +
                                         std::to_string(nodes - 1) + " (" + std::to_string(nodes) +
                                         " nodes)");
  return {first, last};
}

// HEAD builds dp_cp_ag / expt_dp_ag with the default order and rank offset 0, whatever
// --order and --rank-offset say: say so when they are not the groups they shadow.
// The two kinds list the same groups: same sizes, same members in order, streamed in
// pieces (no list of the world is held).
bool same_groups(const Layout& layout, GroupKind a, GroupKind b) {
  if (layout.group_size(a) != layout.group_size(b) ||
      layout.num_members(a) != layout.num_members(b))
    return false;
  const std::int64_t total = layout.num_members(a);
  constexpr std::int64_t kPiece = 1 << 16;
  std::vector<Rank> x(static_cast<std::size_t>(std::min(kPiece, total))), y(x.size());
  for (std::int64_t first = 0; first < total; first += kPiece) {
    const auto n = static_cast<std::size_t>(std::min(kPiece, total - first));
    layout.members(a, 0, first, std::span<Rank>(x).first(n));
    layout.members(b, 0, first, std::span<Rank>(y).first(n));
    if (!std::equal(x.begin(), x.begin() + static_cast<std::ptrdiff_t>(n), y.begin())) return false;
  }
  return true;
}

void warn_all_gather_groups(const Layout& layout) {
  for (auto [ag, base] : {std::pair{GroupKind::dp_cp_ag, GroupKind::dp_cp},
                          std::pair{GroupKind::expt_dp_ag, GroupKind::expt_dp}}) {
    if (!layout.has_kind(ag) || same_groups(layout, ag, base)) continue;
    std::cerr << "warning: " << kind_name(ag) << " differs from " << kind_name(base)
              << ": Megatron-core HEAD builds the all-gather groups with the default order "
                 "tp-cp-ep-dp-pp and rank offset 0, whatever --order and --rank-offset say\n";
  }
}

// A multi-module job (--job): the modules' grids come from the file, not the layout flags.
int run_job_plan(const PlanOptions& o) {
  for (const auto& [field, opt] : o.layout.options)
    if (opt->count() > 0)
      throw ConfigError(
          "job", "job: --" + field + " does not apply with --job (the job file gives the layout)");
  if (o.format != "table" && o.format != "json")
    throw ConfigError("format", "format: --job supports table and json, not " + o.format);
  const Job job = read_job(o.job);
  write_job_plan(std::cout, job, o.format == "json");
  std::cout.flush();
  return 0;
}

// What plan shows of the layout: --rank, --kinds, --gpus-per-node, --spares, --num-layers.
PlanSelection select(const PlanOptions& o, const Layout& layout, bool picture) {
  PlanSelection sel;
  if (!o.rank.empty()) {
    sel.rank = parse_integer("rank", o.rank, INT64_MIN);
    layout.check_rank(*sel.rank);
    if (o.check_topology)
      throw ConfigError("rank", "rank: --rank does not apply to --check-topology");
  }
  if (o.kinds.empty()) {
    // A picture of every kind would bury the five that explain a layout.
    sel.kinds = picture ? std::vector<GroupKind>{GroupKind::tp, GroupKind::cp, GroupKind::ep,
                                                 GroupKind::dp, GroupKind::pp}
                        : layout.kinds();
  } else {
    for (GroupKind k : parse_kinds(o.kinds)) {
      if (!layout.has_kind(k)) (void)layout.num_groups(k);  // throws, naming why it is absent
      sel.kinds.push_back(k);
    }
    // Reference order, whatever the order of the request.
    std::sort(sel.kinds.begin(), sel.kinds.end());
    sel.kinds.erase(std::unique(sel.kinds.begin(), sel.kinds.end()), sel.kinds.end());
  }
  if (!o.gpus_per_node.empty())
    sel.gpus_per_node = parse_integer("gpus_per_node", o.gpus_per_node, 1, kMaxWorldSize);
  if (!o.spares.empty()) {
    if (picture || o.check_topology)
      throw ConfigError("spares",
                        "spares: --spares is shown by --format table and json, not " +
                            (o.check_topology ? std::string("--check-topology") : o.format));
    SparePlacement placement;
    placement.spares = parse_integer("spares", o.spares, 0, kMaxWorldSize);
    placement.gpus_per_node = sel.gpus_per_node;  // whole spare nodes when nodes are given
    if (placement.spares > 0) sel.spares.emplace(layout.world_size(), placement);
  }
  if (!o.num_layers.empty()) {
    sel.num_layers = parse_integer("num_layers", o.num_layers, 1, kMaxWorldSize);
    (void)LayerAssignment(*sel.num_layers, layout.config());  // throws unless it divides
  }
  return sel;
}

// --max-output-mib: a table or JSON document over the limit is refused before it starts.
void check_output_size(const PlanOptions& o, const Layout& layout, const PlanSelection& sel) {
  const std::int64_t limit_mib =
      o.max_output_mib.empty()
          ? kDefaultMaxOutputMiB
          : parse_integer("max_output_mib", o.max_output_mib, 0, INT64_MAX / (1 << 20));
  if (limit_mib == 0) return;
  const std::int64_t bytes =
      estimate_plan_bytes(layout, sel, o.format == "json" ? PlanFormat::json : PlanFormat::table);
  if (bytes > limit_mib * 1024 * 1024)
    throw ConfigError("output",
                      "output: --format " + o.format + " of this layout would be up to " +
                          size_text(bytes) + ", over the " + size_text(limit_mib << 20) +
                          " limit; show one rank with --rank R or fewer kinds with "
                          "--kinds, or raise the limit with --max-output-mib N (0: none)");
}

// The picture's options (--format svg|html), checked before any output.
PictureOptions picture_options(const PlanOptions& o, const Layout& layout, const PlanSelection& sel,
                               const NodeMap& nodes) {
  PictureOptions pic;
  pic.gpus_per_node = nodes.gpus_per_node();
  pic.kinds = sel.kinds;
  pic.highlight = sel.rank;
  if (!o.nodes.empty()) {
    const auto [first, last] = parse_node_range(o.nodes, nodes.nodes(layout.world_size()));
    pic.first_node = first;
    pic.last_node = last;
  }
  check_picture(layout, pic);  // the window's size, before any output
  return pic;
}

// Writes the document to --output FILE (created only now: every check has passed) or
// stdout.
void write_document(const PlanOptions& o, const Layout& layout, const PlanSelection& sel,
                    const std::optional<PictureOptions>& pic,
                    const std::optional<TopologyReport>& report) {
  std::ofstream file;
  if (!o.output.empty()) {
    file.open(o.output, std::ios::binary | std::ios::trunc);
    if (!file)
      throw ConfigError("output",
                        "output: cannot write \"" + o.output + "\": " + std::strerror(errno));
  }
  std::ostream& out = o.output.empty() ? std::cout : file;
  if (pic) {
    if (o.format == "svg") write_plan_svg(out, layout, *pic);
    else write_plan_html(out, layout, *pic);
  } else if (report) {
    if (o.format == "json") out << topology_json(*report).dump() << "\n";
    else write_topology_table(out, *report);
  } else if (o.format == "json") {
    write_plan_json(out, layout, sel);
  } else {
    write_plan_table(out, layout, sel);
  }
  if (file.is_open()) {
    file.close();
    if (!file) throw Error("output: writing \"" + o.output + "\" failed");
  }
}

int run_plan(const PlanOptions& o) {
  // Check every flag and the size of the output before writing anything, so that bad input
  // never leaves a partial document behind.
  const bool picture = o.format == "svg" || o.format == "html";
  if (o.format != "table" && o.format != "json" && !picture)
    throw ConfigError(
        "format", "format: unknown format \"" + o.format + "\" (valid: table, json, svg, html)");
  if (!o.job.empty()) return run_job_plan(o);
  const Layout layout(to_config(o.layout));
  warn_all_gather_groups(layout);
  const PlanSelection sel = select(o, layout, picture);
  const NodeMap nodes(sel.gpus_per_node.value_or(kDefaultGpusPerNode));
  if (o.strict && !o.check_topology)
    throw ConfigError("strict", "strict: --strict needs --check-topology");
  if (o.check_topology && picture && o.output.empty())
    throw ConfigError("output",
                      "output: --check-topology prints its report on stdout, so "
                      "--format " +
                          o.format + " needs --output FILE");
  if (!o.nodes.empty() && !picture)
    throw ConfigError("nodes", "nodes: --nodes applies to --format svg and html, not " + o.format);
  if (!picture && !o.check_topology) check_output_size(o, layout, sel);
  std::optional<PictureOptions> pic;
  if (picture) pic = picture_options(o, layout, sel, nodes);
  std::optional<TopologyReport> report;
  if (o.check_topology) report = check_topology(layout, sel.kinds, nodes);

  write_document(o, layout, sel, pic, report);
  if (report && picture) write_topology_table(std::cout, *report);
  std::cout.flush();
  if (!std::cout) throw Error("plan: writing the output failed");

  if (!report) return 0;
  for (const TopologyWarning& w : report->warnings) std::cerr << "warning: " << w.message() << "\n";
  return o.strict && report->avoidable() ? kExitTopologyWarning : 0;
}

}  // namespace

Command add_plan_command(CLI::App& root) {
  auto opts = std::make_shared<PlanOptions>();
  CLI::App* app = root.add_subcommand("plan", "print, export or draw the groups of a layout");
  add_layout_flags(*app, opts->layout, /*with_world_size=*/true);
  app->add_option("--rank", opts->rank,
                  "show only this rank's groups (table, json); highlight them (svg, html)")
      ->type_name("INT");
  app->add_option("--kinds", opts->kinds,
                  "only these kinds, e.g. tp,dp,pp (svg and html default: tp,cp,ep,dp,pp)")
      ->type_name("LIST");
  app->add_option("--format", opts->format, "table (default), json, svg or html")
      ->type_name("FORMAT");
  app->add_option("--output", opts->output, "write the document to FILE instead of stdout")
      ->type_name("FILE");
  app->add_option("--gpus-per-node", opts->gpus_per_node,
                  "ranks per node (8): rank r is on node r / G, the last node may be partial; "
                  "for svg, html, --check-topology, and the node column of --rank")
      ->type_name("INT");
  app->add_option("--spares", opts->spares,
                  "S hot spare processes beyond the world (table, json): show where they are "
                  "(whole nodes with --gpus-per-node) and, with --rank, the rank's process; "
                  "see docs/resilience.md")
      ->type_name("INT");
  app->add_option("--num-layers", opts->num_layers,
                  "transformer layers: show which layers each pipeline rank (and virtual "
                  "stage, with --vpp) holds, as Megatron's interleaved schedule assigns them")
      ->type_name("INT");
  app->add_option("--nodes", opts->nodes, "draw only nodes A to B (svg, html), e.g. 0-15")
      ->type_name("A-B");
  app->add_option("--job", opts->job,
                  "plan a multi-module job from a JSON file (see docs/megatron-head.md) instead "
                  "of the layout flags")
      ->type_name("FILE");
  app->add_option("--max-output-mib", opts->max_output_mib,
                  "refuse a table or json larger than this many MiB (1024; 0: no limit)")
      ->type_name("INT");
  app->add_flag("--check-topology", opts->check_topology,
                "report, per kind, groups that span several nodes; warn when tp, cp, ep or "
                "expt_tp groups do, with the order that serves them best");
  app->add_flag("--strict", opts->strict,
                "with --check-topology: exit 3 when another order would have kept a warned "
                "kind inside nodes");
  app->footer(
      "Exit codes: 0 success, 1 runtime failure, 2 bad input, 3 --strict topology "
      "warning.");
  return {app, [opts] { return run_plan(*opts); }};
}

}  // namespace commgrid::cli
