// `commgrid plan`: print or export a layout.
#include <iostream>

#include "command.hpp"
#include "commgrid/error.hpp"
#include "commgrid/layout.hpp"
#include "layout_flags.hpp"
#include "plan_output.hpp"

namespace commgrid::cli {
namespace {

struct PlanOptions {
  LayoutFlags layout;
  std::string rank, kinds, format = "table";
};

int run_plan(const PlanOptions& o) {
  // Parse every flag before producing any output, so that bad input never leaves a
  // partial document behind.
  if (o.format != "table" && o.format != "json")
    throw ConfigError("format", "format: unknown format \"" + o.format + "\" (valid: table, json)");
  const Layout layout(to_config(o.layout));
  PlanSelection sel;
  if (!o.rank.empty()) {
    sel.rank = parse_integer("rank", o.rank, INT64_MIN);
    layout.check_rank(*sel.rank);
  }
  if (o.kinds.empty()) {
    sel.kinds = layout.kinds();
  } else {
    for (GroupKind k : parse_kinds(o.kinds)) {
      if (!layout.has_kind(k)) (void)layout.num_groups(k);  // throws, naming why it is absent
      sel.kinds.push_back(k);
    }
    // Reference order, whatever the order of the request.
    std::sort(sel.kinds.begin(), sel.kinds.end());
  }
  if (o.format == "json")
    std::cout << plan_json(layout, sel).dump() << "\n";
  else
    write_plan_table(std::cout, layout, sel);
  std::cout.flush();
  if (!std::cout) throw Error("plan: writing the output failed");
  return 0;
}

}  // namespace

Command add_plan_command(CLI::App& root) {
  auto opts = std::make_shared<PlanOptions>();
  CLI::App* app = root.add_subcommand("plan", "print or export the groups of a layout");
  add_layout_flags(*app, opts->layout, /*with_world_size=*/true);
  app->add_option("--rank", opts->rank, "show only this rank's groups");
  app->add_option("--kinds", opts->kinds, "only these kinds, e.g. tp,dp,pp");
  app->add_option("--format", opts->format, "table (default) or json");
  return {app, [opts] { return run_plan(*opts); }};
}

}  // namespace commgrid::cli
