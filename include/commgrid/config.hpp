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

/// The inputs of Megatron-core's initialize_model_parallel that shape the groups.
/// Sizes are 64-bit so that out-of-range input is reported, never wrapped.
struct ParallelConfig {
  std::int64_t world_size = 1;                ///< W, the number of ranks
  std::int64_t tp = 1;                        ///< tensor parallel
  std::int64_t pp = 1;                        ///< pipeline parallel
  std::int64_t cp = 1;                        ///< context parallel
  std::int64_t ep = 1;                        ///< expert parallel
  std::optional<std::int64_t> etp;            ///< expert tensor parallel; defaults to tp
  std::vector<std::int64_t> hcp;              ///< hierarchical cp sizes; empty = none
  std::int64_t dist_opt_instances = 1;        ///< N, distributed-optimizer instances
  std::optional<std::int64_t> vpp;            ///< virtual pipeline size; recorded only
  std::string order = kDefaultOrder;          ///< innermost axis first

  /// Checks every rule of docs/layout.md ("Errors"): sizes >= 1, a well-formed order,
  /// divisibility, the expert grid, the distributed optimizer, hcp, no overflow. When
  /// several fail, throws the one Megatron-core reports first, as a ConfigError subclass
  /// whose message names the parameters and their values. Creates nothing.
  void validate() const;

  /// etp, or tp when etp is not given.
  [[nodiscard]] std::int64_t expert_tp() const noexcept { return etp.value_or(tp); }
  /// dp = W / (tp*pp*cp). Meaningful only for a valid config.
  [[nodiscard]] std::int64_t dp() const noexcept;
  /// expert_dp = W / (etp*ep*pp); cp is not part of it. Meaningful only for a valid config.
  [[nodiscard]] std::int64_t expert_dp() const noexcept;

  /// The order resolved to all five axes, innermost first: the given tokens, then the
  /// omitted axes in Megatron's sequence tp, pp, dp, ep, cp. Throws OrderError when the
  /// order string is malformed.
  [[nodiscard]] std::array<Axis, kNumAxes> resolved_order() const;

  /// A canonical one-line text of every field, equal on two ranks exactly when their
  /// configs are equal ("world_size=8 tp=2 ..."); used to compare configs across ranks.
  [[nodiscard]] std::string canonical() const;

  bool operator==(const ParallelConfig&) const = default;
};

/// The fields of ParallelConfig by name, in canonical() order.
inline constexpr std::array<const char*, 10> kConfigFields = {
    "world_size", "tp", "pp", "cp", "ep", "etp", "hcp", "dist_opt_instances", "vpp", "order"};

/// Parses an order string into its tokens, innermost first. Throws OrderError (rule 3).
std::vector<Axis> parse_order(const std::string& order);

}  // namespace commgrid
