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
#include "plan_output.hpp"

namespace commgrid::cli {
namespace {

/// Exit code of `--check-topology --strict` when a node-local kind crosses nodes.
constexpr int kExitTopologyWarning = 3;

struct PlanOptions {
  LayoutFlags layout;
  std::string rank, kinds, format = "table";
  std::string gpus_per_node, output;
  bool check_topology = false, strict = false;
};

// Writes the whole document at once, so that bad input never leaves a partial file.
void write_file(const std::string& path, const std::string& text) {
  std::ofstream f(path, std::ios::binary | std::ios::trunc);
  if (!f)
    throw ConfigError("output", "output: cannot write \"" + path + "\": " + std::strerror(errno));
  f << text;
  f.close();
  if (!f) throw Error("output: writing \"" + path + "\" failed");
}

int run_plan(const PlanOptions& o) {
  // Parse every flag before producing any output, so that bad input never leaves a
  // partial document behind.
  const bool picture = o.format == "svg" || o.format == "html";
  if (o.format != "table" && o.format != "json" && !picture)
    throw ConfigError("format", "format: unknown format \"" + o.format +
                                    "\" (valid: table, json, svg, html)");
  const Layout layout(to_config(o.layout));
  PlanSelection sel;
  if (!o.rank.empty()) {
    sel.rank = parse_integer("rank", o.rank, INT64_MIN);
    layout.check_rank(*sel.rank);
    if (picture)
      throw ConfigError("rank", "rank: --rank applies to --format table and json, not " + o.format);
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
  }
  const NodeMap nodes(o.gpus_per_node.empty()
                          ? kDefaultGpusPerNode
                          : parse_integer("gpus_per_node", o.gpus_per_node, 1, kMaxWorldSize));
  if (o.strict && !o.check_topology)
    throw ConfigError("strict", "strict: --strict needs --check-topology");
  if (o.check_topology && picture && o.output.empty())
    throw ConfigError("output", "output: --check-topology prints its report on stdout, so "
                                "--format " + o.format + " needs --output FILE");

  // Without --output, table and JSON stream to stdout exactly as before pictures existed.
  std::ostringstream doc;
  std::ostream& out = o.output.empty() ? std::cout : doc;
  std::optional<TopologyReport> report;
  if (o.check_topology) report = check_topology(layout, sel.kinds, nodes);

  if (picture) {
    const PictureOptions pic{nodes.gpus_per_node(), sel.kinds};
    if (o.format == "svg")
      write_plan_svg(out, layout, pic);
    else
      write_plan_html(out, layout, pic);
  } else if (report) {
    if (o.format == "json")
      out << topology_json(*report).dump() << "\n";
    else
      write_topology_table(out, *report);
  } else if (o.format == "json") {
    out << plan_json(layout, sel).dump() << "\n";
  } else {
    write_plan_table(out, layout, sel);
  }
  if (!o.output.empty()) write_file(o.output, doc.str());
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
  app->add_option("--rank", opts->rank, "show only this rank's groups (table, json)");
  app->add_option("--kinds", opts->kinds,
                  "only these kinds, e.g. tp,dp,pp (svg and html default: tp,cp,ep,dp,pp)");
  app->add_option("--format", opts->format, "table (default), json, svg or html");
  app->add_option("--output", opts->output, "write the document to FILE instead of stdout");
  app->add_option("--gpus-per-node", opts->gpus_per_node,
                  "ranks per node, for svg, html and --check-topology (8); rank r is on node "
                  "r / G, and the last node may be partial");
  app->add_flag("--check-topology", opts->check_topology,
                "report, per kind, groups that span several nodes; warn when tp, cp, ep or "
                "expt_tp groups do");
  app->add_flag("--strict", opts->strict,
                "with --check-topology: exit 3 when a warning was printed");
  app->footer("Exit codes: 0 success, 1 runtime failure, 2 bad input, 3 --strict topology "
              "warning.");
  return {app, [opts] { return run_plan(*opts); }};
}

}  // namespace commgrid::cli
