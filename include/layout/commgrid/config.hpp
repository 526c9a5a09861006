// ParallelConfig: the inputs of a layout, their validation and their derived sizes.
#pragma once

#include <array>
#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "commgrid/axis.hpp"

namespace commgrid {

/// The default order: innermost (stride 1) axis first, as Megatron-core's default.
inline constexpr const char* kDefaultOrder = "tp-cp-ep-dp-pp";

/// The largest world size: ranks must fit the int of MPI, NCCL and Gloo.
inline constexpr std::int64_t kMaxWorldSize = 2147483647;

/// Which Megatron-core the layout reproduces: the seed's commit (8c1e094afe, the default)
/// or HEAD (d98e8a64dd), which adds gtp_remat, hybrid cp, all-gather groups, rank offsets
/// and refuses orders without tp. See docs/megatron-head.md.
enum class Compat : std::uint8_t { seed, head };

/// "seed" or "head".
const char* compat_name(Compat c) noexcept;

/// The inputs of Megatron-core's initialize_model_parallel that shape the groups.
/// Sizes are 64-bit so that out-of-range input is reported, never wrapped.
struct ParallelConfig {
  std::int64_t world_size = 1;          ///< W, the number of ranks
  std::int64_t tp = 1;                  ///< tensor parallel
  std::int64_t pp = 1;                  ///< pipeline parallel
  std::int64_t cp = 1;                  ///< context parallel
  std::int64_t ep = 1;                  ///< expert parallel
  std::optional<std::int64_t> etp;      ///< expert tensor parallel; defaults to tp
  std::vector<std::int64_t> hcp;        ///< hierarchical cp sizes; empty = none
  std::int64_t dist_opt_instances = 1;  ///< N, distributed-optimizer instances
  std::optional<std::int64_t> vpp;      ///< virtual pipeline size; recorded only
  std::string order = kDefaultOrder;    ///< innermost axis first
  // HEAD only (compat == head); under seed they must keep their defaults.
  Compat compat = Compat::seed;                  ///< which Megatron-core to reproduce
  std::int64_t gtp_remat = 1;                    ///< HEAD's gtp_remat_size (dense sixth axis)
  std::int64_t expert_gtp_remat = 1;             ///< HEAD's expert_gtp_remat_size
  bool hybrid_context_parallel = false;          ///< build hybrid_dp_cp_<n> groups
  bool all_gather_groups = false;                ///< build dp_cp_ag / expt_dp_ag
  std::int64_t rank_offset = 0;                  ///< added to every rank of the layout
  std::optional<std::int64_t> local_world_size;  ///< L, the ranks laid out; default world_size

  /// Checks every rule of docs/layout.md ("Errors"): sizes >= 1, a well-formed order,
  /// divisibility, the expert grid, the distributed optimizer, hcp, no overflow. When
  /// several fail, throws the one Megatron-core reports first, as a ConfigError subclass
  /// whose message names the parameters and their values. Creates nothing.
  void validate() const;

  /// etp, or tp when etp is not given.
  [[nodiscard]] std::int64_t expert_tp() const noexcept { return etp.value_or(tp); }
  /// L: local_world_size, or world_size when not given (always world_size under seed).
  [[nodiscard]] std::int64_t layout_world_size() const noexcept {
    return local_world_size.value_or(world_size);
  }
  /// dp = L / (tp*pp*cp*gtp_remat) (gtp_remat is 1 under seed). Meaningful only for a
  /// valid config.
  [[nodiscard]] std::int64_t dp() const noexcept;
  /// expert_dp = L / (etp*ep*pp*expert_gtp_remat); cp is not part of it. Meaningful only
  /// for a valid config.
  [[nodiscard]] std::int64_t expert_dp() const noexcept;

  /// The order of the dense (or expert) grid: all six axes, innermost first. The given
  /// tokens; under head gtp_remat injected where the order omits it (after tp on the dense
  /// grid, after ep on the expert grid, after tp without ep); then the omitted axes in
  /// Megatron's sequence tp, pp, dp, ep, cp, gtp_remat (they have size 1). Under seed both
  /// grids share one order, gtp_remat last. Throws OrderError when the order string is
  /// malformed for the config's edition.
  [[nodiscard]] std::array<Axis, kNumAxes> grid_order(bool expert = false) const;
  /// grid_order(false): the dense grid's order.
  [[nodiscard]] std::array<Axis, kNumAxes> resolved_order() const { return grid_order(false); }

  /// The order's tokens as HEAD's dense (or expert) RankGenerator sees them: grid_order
  /// under compat head, whatever this config's compat. Throws OrderError.
  [[nodiscard]] std::vector<std::string> head_order(bool expert) const;

  /// A canonical one-line text of every field, equal on two ranks exactly when their
  /// configs are equal ("world_size=8 tp=2 ..."); used to compare configs across ranks.
  /// The HEAD fields are appended only under compat head (seed text is unchanged).
  [[nodiscard]] std::string canonical() const;

  bool operator==(const ParallelConfig&) const = default;
};

/// The fields of ParallelConfig by name, in canonical() order.
inline constexpr std::array<const char*, 10> kConfigFields = {
    "world_size", "tp", "pp", "cp", "ep", "etp", "hcp", "dist_opt_instances", "vpp", "order"};

/// Parses an order string into its tokens, innermost first: the seed's five tokens, or with
/// compat head also gtp_remat. Throws OrderError (rule 3).
std::vector<Axis> parse_order(const std::string& order, Compat compat = Compat::seed);

}  // namespace commgrid
