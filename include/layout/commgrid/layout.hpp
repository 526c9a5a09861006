// Layout: every group of a parallel configuration, exactly as Megatron-core builds them.
#pragma once

#include <array>
#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <vector>

#include "commgrid/config.hpp"
#include "commgrid/group_kind.hpp"
#include "commgrid/group_list.hpp"
#include "commgrid/rank_grid.hpp"

namespace commgrid {

namespace detail {
struct Edition;
}

/// Chooses the members of one embedding group from a pipeline group. Called with the pp
/// group's members in stage order (stage 0 first); returns a non-empty list of distinct
/// members of that group.
using EmbeddingPolicy = std::function<std::vector<Rank>(std::span<const Rank> pp_group)>;

/// The two embedding policies; an empty function means the default (embd: first and last
/// stage, or the single stage when pp == 1; pos_embd: the first stage).
struct EmbeddingPolicies {
  EmbeddingPolicy embedding;
  EmbeddingPolicy position_embedding;
};

/// One rank's group of one kind.
struct GroupRef {
  std::int64_t index = 0;      ///< index of the group in the kind's enumeration order
  std::int64_t position = 0;   ///< index of the rank in `members`
  std::int64_t comm_rank = 0;  ///< the rank's rank in a communicator of the group (its
                               ///< position among the members sorted ascending)
  std::vector<Rank> members;   ///< in the kind's member order
  bool operator==(const GroupRef&) const = default;
};

/// A rank's coordinates on both grids.
struct RankCoordinates {
  std::int64_t tp = 0, cp = 0, dp = 0, pp = 0;       ///< dense grid
  std::int64_t etp = 0, ep = 0, expert_dp = 0;       ///< expert grid (pp is shared)
  std::int64_t gtp_remat = 0, expert_gtp_remat = 0;  ///< HEAD's sixth axis (0 at the seed)
  bool operator==(const RankCoordinates&) const = default;
};

/// The groups of a validated configuration, under either edition (compat seed or head).
/// Cheap to build (no enumeration, O(1) memory in the world size); every per-rank query is
/// O(group size) and needs no memory proportional to the world, except intra_dist_opt,
/// whose single group of a rank has W/N members. Under head the grids have HEAD's sixth
/// axis (gtp_remat) and cover [rank_offset, rank_offset + L); ranks outside are in no group
/// (except the all-gather kinds, whose grids start at rank 0).
class Layout {
 public:
  /// Validates the config (ParallelConfig::validate) and, for custom policies, every
  /// policy result (rule 13; this calls the policy once per pp group). Throws ConfigError.
  explicit Layout(ParallelConfig config, EmbeddingPolicies policies = {});

  [[nodiscard]] const ParallelConfig& config() const noexcept { return config_; }
  [[nodiscard]] std::int64_t world_size() const noexcept { return config_.world_size; }
  [[nodiscard]] std::int64_t dp() const noexcept { return dp_; }
  [[nodiscard]] std::int64_t expert_dp() const noexcept { return edp_; }
  /// The dense grid (tp, cp, dp, pp, gtp_remat; ep has size 1) and the expert grid (etp as
  /// tp, ep, expert_dp as dp, pp, expert_gtp_remat as gtp_remat; cp has size 1).
  [[nodiscard]] const RankGrid& dense_grid() const noexcept { return dense_; }
  [[nodiscard]] const RankGrid& expert_grid() const noexcept { return expert_; }

  /// Whether Megatron-core builds the kind for this config: hcp only with hcp sizes,
  /// inter_dist_opt only with more than one dist-opt instance; the HEAD kinds only under
  /// compat head (hybrid_dp_cp with --hybrid-context-parallel and a dp_cp group of at
  /// least 4, dp_cp_ag / expt_dp_ag with --all-gather-groups, expt_dp_ag when ep > 1);
  /// every other kind always.
  [[nodiscard]] bool has_kind(GroupKind k) const noexcept;
  /// Kinds that exist for this config, in reference order.
  [[nodiscard]] std::vector<GroupKind> kinds() const;
  /// Number of levels of the kind: the hcp sizes for hcp, the group sizes n for
  /// hybrid_dp_cp, 1 for every other kind.
  [[nodiscard]] int levels(GroupKind k) const noexcept;

  /// Every group of the kind (for hcp: of one level), in Megatron's order. Throws
  /// UnknownKindError for a kind that does not exist, ConfigError for a bad level.
  [[nodiscard]] GroupList groups(GroupKind k, int level = 0) const;
  /// Number of groups of the kind (at that level), without enumerating them.
  [[nodiscard]] std::int64_t num_groups(GroupKind k, int level = 0) const;

  /// The group of the kind that holds rank r, computed directly; nullopt when r is in no
  /// group of the kind (embd, pos_embd). Throws RankOutOfRangeError, UnknownKindError.
  [[nodiscard]] std::optional<GroupRef> group_of(GroupKind k, Rank r, int level = 0) const;
  /// Only the index of r's group (GroupRef::index), in O(1) without listing members (a
  /// custom embedding policy is called once); nullopt when r is in no group of the kind.
  [[nodiscard]] std::optional<std::int64_t> group_index(GroupKind k, Rank r, int level = 0) const;

  /// The size every group of the kind has (at that level), or nullopt when the groups
  /// differ in size (possible only with a custom embedding policy). O(1).
  [[nodiscard]] std::optional<std::int64_t> group_size(GroupKind k, int level = 0) const;
  /// The number of members of all groups of the kind together (W for most kinds).
  [[nodiscard]] std::int64_t num_members(GroupKind k, int level = 0) const;
  /// Entries [first, first + out.size()) of the kind's member list: every group's members,
  /// group after group, in the order of groups(). With the group size, this streams any
  /// kind of any world in pieces: O(out.size()) time and no other memory (except with a
  /// custom embedding policy, whose groups are listed whole). Throws ConfigError when the
  /// range does not lie inside [0, num_members()).
  void members(GroupKind k, int level, std::int64_t first, std::span<Rank> out) const;

  /// r's coordinates on the dense and expert grids. Throws RankOutOfRangeError.
  [[nodiscard]] RankCoordinates coordinates(Rank r) const;

  /// Throws RankOutOfRangeError unless 0 <= r < world_size.
  void check_rank(Rank r) const;

  /// The name of one level of a kind as reports print it: the kind's name, except
  /// hybrid_dp_cp, whose levels are "hybrid_dp_cp_<n>".
  [[nodiscard]] std::string level_name(GroupKind k, int level) const;
  /// Under compat head: the size n of each hybrid_dp_cp level (empty otherwise).
  [[nodiscard]] std::vector<std::int64_t> hybrid_sizes() const;

 private:
  struct Split;
  [[nodiscard]] const RankGrid& grid_of_kind(GroupKind k) const noexcept;
  [[nodiscard]] Split split(GroupKind k, int level) const noexcept;
  [[nodiscard]] bool gtp_instance() const noexcept;
  void check_kind(GroupKind k, int level) const;
  [[nodiscard]] const EmbeddingPolicy& policy(GroupKind k) const noexcept;
  [[nodiscard]] std::vector<Rank> embedding_members(GroupKind k,
                                                    std::span<const Rank> pp_group) const;
  void check_policy_results() const;

  ParallelConfig config_;
  EmbeddingPolicies policies_;
  const detail::Edition* edition_;
  std::vector<std::int64_t> hcp_inner_;     ///< per hcp level: product of the sizes before it
  std::vector<std::int64_t> hybrid_sizes_;  ///< n of each hybrid_dp_cp level (head)
  std::int64_t dp_ = 1;
  std::int64_t edp_ = 1;
  RankGrid dense_;
  RankGrid expert_;
  /// HEAD's create_all_gather_groups grids (default order, from rank 0), when built.
  std::optional<RankGrid> dense_ag_, expert_ag_;
};

/// The hierarchical split of a parent list P into levels of sizes [h0, h1, ...] (their
/// product is |P|), as Megatron-core builds hierarchical cp groups: level 0 is consecutive
/// chunks of h0 members, each later level strides by the product of the sizes before it.
/// Appends level `level`'s groups to `out`.
void hierarchical_split(std::span<const Rank> parent, std::span<const std::int64_t> sizes,
                        int level, GroupList& out);

}  // namespace commgrid
