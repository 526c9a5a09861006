// The layout flags shared by plan, verify and bench, and strict number parsing.
#pragma once

#include <CLI/CLI.hpp>

#include <cstdint>
#include <map>
#include <optional>
#include <string>
#include <string_view>

#include "commgrid/config.hpp"

namespace commgrid::cli {

/// The raw text of every layout flag; parsed strictly by to_config().
struct LayoutFlags {
  std::string world_size, tp, pp, cp, ep, etp, hcp, dist_opt_instances, vpp, order;
  /// Megatron-core HEAD's switch and arguments (--compat head); see docs/megatron-head.md.
  std::string compat, gtp_remat, expert_gtp_remat, rank_offset, local_world_size;
  bool hybrid_context_parallel = false;
  bool all_gather_groups = false;
  /// The registered options by field name, so that an explicitly empty value ("--ep ''")
  /// is an error instead of the default.
  std::map<std::string, CLI::Option*> options;
  [[nodiscard]] bool given(const std::string& field) const {
    auto it = options.find(field);
    return it != options.end() && it->second->count() > 0;
  }
};

/// Adds --world-size (when with_world_size), --tp, --pp, --cp, --ep, --etp, --hcp,
/// --dist-opt-instances, --vpp, --order, the HEAD options (--compat, --gtp-remat,
/// --expert-gtp-remat, --hybrid-context-parallel, --all-gather-groups, --rank-offset,
/// --local-world-size) and Megatron's long names as aliases.
void add_layout_flags(CLI::App& app, LayoutFlags& flags, bool with_world_size);

/// Parses the flags into a config and validates it (throws ConfigError). world_size, when
/// given, comes from a launcher and overrides --world-size (which must then be absent or
/// equal).
ParallelConfig to_config(const LayoutFlags& flags,
                         std::optional<std::int64_t> world_size = std::nullopt);

/// Parses a whole decimal integer in [min, max]; throws InvalidValueError naming `param`
/// and the text for anything else ("2.5", "-1", "", "1e3", "99999999999999999999").
std::int64_t parse_integer(std::string_view param, std::string_view text, std::int64_t min,
                           std::int64_t max = INT64_MAX);

/// Parses a comma-separated list of integers, each >= min ("2,4").
std::vector<std::int64_t> parse_integer_list(std::string_view param, std::string_view text,
                                             std::int64_t min);

}  // namespace commgrid::cli
