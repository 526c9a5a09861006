#include "layout_flags.hpp"

#include <charconv>
#include <limits>

#include "commgrid/error.hpp"

namespace commgrid::cli {

void add_layout_flags(CLI::App& app, LayoutFlags& f, bool with_world_size) {
  // Values are kept as text and parsed strictly by to_config(); the help names their type.
  auto add = [&](const char* field, const char* names, std::string& value, const char* help,
                 const char* type = "INT") {
    f.options[field] = app.add_option(names, value, help)->type_name(type);
  };
  if (with_world_size)
    add("world_size", "--world-size", f.world_size, "number of ranks W (required)");
  add("tp", "--tp,--tensor-model-parallel-size", f.tp, "tensor parallel size (1)");
  add("pp", "--pp,--pipeline-model-parallel-size", f.pp, "pipeline parallel size (1)");
  add("cp", "--cp,--context-parallel-size", f.cp, "context parallel size (1)");
  add("ep", "--ep,--expert-model-parallel-size", f.ep, "expert parallel size (1)");
  add("etp", "--etp,--expert-tensor-parallel-size", f.etp,
      "expert tensor parallel size (default: tp)");
  add("hcp", "--hcp,--hierarchical-context-parallel-sizes", f.hcp,
      "hierarchical cp sizes, e.g. 2,4 (product = cp)", "INT,...");
  add("dist_opt_instances", "--dist-opt-instances,--num-distributed-optimizer-instances",
      f.dist_opt_instances, "distributed-optimizer instances (1)");
  add("vpp", "--vpp,--virtual-pipeline-model-parallel-size", f.vpp, "virtual pipeline size (none)");
  add("order", "--order", f.order, "axis order, innermost first (tp-cp-ep-dp-pp)", "ORDER");
  add("compat", "--compat", f.compat,
      "Megatron-core to reproduce: seed (default, 8c1e094afe) or head (d98e8a64dd)", "seed|head");
  add("gtp_remat", "--gtp-remat,--gtp-remat-size", f.gtp_remat, "HEAD: gtp_remat size (1)");
  add("expert_gtp_remat", "--expert-gtp-remat,--expert-gtp-remat-size", f.expert_gtp_remat,
      "HEAD: expert gtp_remat size (1)");
  add("rank_offset", "--rank-offset", f.rank_offset, "HEAD: added to every rank (0)");
  add("local_world_size", "--local-world-size", f.local_world_size,
      "HEAD: ranks laid out (default: the world size)");
  f.options["hybrid_context_parallel"] =
      app.add_flag("--hybrid-context-parallel", f.hybrid_context_parallel,
                   "HEAD: build hybrid_dp_cp_<n> groups");
  f.options["all_gather_groups"] = app.add_flag("--all-gather-groups", f.all_gather_groups,
                                                "HEAD: build dp_cp_ag / expt_dp_ag groups");
}

std::int64_t parse_integer(std::string_view param, std::string_view text, std::int64_t min,
                           std::int64_t max) {
  std::int64_t value = 0;
  const char* first = text.data();
  const char* last = text.data() + text.size();
  auto [ptr, ec] = std::from_chars(first, last, value);
  if (text.empty() || ec == std::errc::invalid_argument || ptr != last)
    throw InvalidValueError(
        std::string(param),
        std::string(param) + ": expected an integer, got \"" + std::string(text) + "\"");
  if (ec == std::errc::result_out_of_range || value > max)
    throw InvalidValueError(std::string(param), std::string(param) + " = " + std::string(text) +
                                                    " is too large (max " + std::to_string(max) +
                                                    ")");
  if (value < min)
    throw InvalidValueError(
        std::string(param),
        std::string(param) + " must be >= " + std::to_string(min) + ", got " + std::string(text));
  return value;
}

std::vector<std::int64_t> parse_integer_list(std::string_view param, std::string_view text,
                                             std::int64_t min) {
  std::vector<std::int64_t> out;
  std::size_t start = 0;
  for (int i = 0;; ++i) {
    std::size_t comma = text.find(',', start);
    std::string_view item = text.substr(
        start, comma == std::string_view::npos ? std::string_view::npos : comma - start);
    out.push_back(parse_integer(std::string(param) + "[" + std::to_string(i) + "]", item, min));
    if (comma == std::string_view::npos) break;
    start = comma + 1;
  }
  return out;
}

ParallelConfig to_config(const LayoutFlags& f, std::optional<std::int64_t> world_size) {
  ParallelConfig c;
  // Values below the rule-2 minimum are passed through so that validate() reports them
  // with the spec's wording; only non-integers and overflow are caught here.
  constexpr std::int64_t lo = std::numeric_limits<std::int64_t>::min();
  auto opt = [&](const char* name, const std::string& text, std::int64_t def) {
    return f.given(name) ? parse_integer(name, text, lo) : def;
  };
  if (world_size) {
    if (f.given("world_size") && parse_integer("world_size", f.world_size, lo) != *world_size)
      throw InvalidValueError("world_size", "world_size: --world-size " + f.world_size +
                                                " differs from the launcher's " +
                                                std::to_string(*world_size));
    c.world_size = *world_size;
  } else {
    if (!f.given("world_size"))
      throw InvalidValueError("world_size", "world_size: --world-size is required");
    c.world_size = parse_integer("world_size", f.world_size, lo);
  }
  c.tp = opt("tp", f.tp, 1);
  c.pp = opt("pp", f.pp, 1);
  c.cp = opt("cp", f.cp, 1);
  c.ep = opt("ep", f.ep, 1);
  if (f.given("etp")) c.etp = parse_integer("etp", f.etp, lo);
  if (f.given("hcp")) c.hcp = parse_integer_list("hcp", f.hcp, lo);
  c.dist_opt_instances = opt("dist_opt_instances", f.dist_opt_instances, 1);
  if (f.given("vpp")) c.vpp = parse_integer("vpp", f.vpp, lo);
  if (f.given("order")) c.order = f.order;
  if (f.given("compat")) {
    if (f.compat == "head") c.compat = Compat::head;
    else if (f.compat != "seed")
      throw InvalidValueError("compat", "compat: expected seed or head, got \"" + f.compat + "\"");
  }
  c.gtp_remat = opt("gtp_remat", f.gtp_remat, 1);
  c.expert_gtp_remat = opt("expert_gtp_remat", f.expert_gtp_remat, 1);
  c.rank_offset = opt("rank_offset", f.rank_offset, 0);
  if (f.given("local_world_size"))
    c.local_world_size = parse_integer("local_world_size", f.local_world_size, lo);
  c.hybrid_context_parallel = f.hybrid_context_parallel;
  c.all_gather_groups = f.all_gather_groups;
  c.validate();
  return c;
}

}  // namespace commgrid::cli
