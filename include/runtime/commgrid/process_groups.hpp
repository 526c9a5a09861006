// ProcessGroups: the live groups of a layout on one rank, and Megatron-core's
// parallel_state getters over them.
#pragma once

#include <array>
#include <chrono>
#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "commgrid/communicator.hpp"
#include "commgrid/config.hpp"
#include "commgrid/creation_order.hpp"
#include "commgrid/error.hpp"
#include "commgrid/group_kind.hpp"
#include "commgrid/layout.hpp"

namespace commgrid {

/// How the groups are created. Every strategy gives the same groups; they differ in the
/// backend calls each rank makes. With every strategy the kinds Megatron does not create
/// but points at another kind's groups (creation_aliases) reuse that kind's communicator.
enum class CreationStrategy : std::uint8_t {
  split,   ///< one split per kind and level: color = group index, key = global rank
  member,  ///< each rank creates only its own groups, with their members only
  /// Megatron's way: every rank takes part in creating every group, in Megatron-core's own
  /// creation order (for_each_creation: the seed's, or HEAD's under compat head).
  per_group,
};

/// The strategy used when InitOptions does not name one; chosen by measurement (see
/// docs/runtime.md).
inline constexpr CreationStrategy kDefaultStrategy = CreationStrategy::member;

/// "split", "member" or "per-group".
[[nodiscard]] std::string_view strategy_name(CreationStrategy s) noexcept;
/// Parses "split", "member", "per-group" (or "per_group"); throws InvalidValueError naming
/// the valid names.
[[nodiscard]] CreationStrategy parse_strategy(std::string_view name);

/// Options of ProcessGroups::initialize. Every rank must pass the same kinds and strategy
/// (they are part of the fingerprint).
struct InitOptions {
  /// Kinds to create; empty means every kind the layout has. A requested kind that does
  /// not exist for the config (hcp without hcp sizes, inter_dist_opt with one instance) is
  /// a ConfigError.
  std::vector<GroupKind> kinds;
  CreationStrategy strategy = kDefaultStrategy;
  /// Timeout of every call on the created groups; nullopt keeps the world's.
  std::optional<std::chrono::milliseconds> timeout;
  /// With the member strategy: a kind whose group on this rank has the same members as an
  /// earlier kind's (reference order) reuses that kind's communicator instead of making
  /// its own, as Megatron's aliases do (dp and dp_cp when cp = 1, tp_dp and intra_dist_opt
  /// over the same ranks, ...): fewer connections to make, at creation and at every
  /// recovery. Operations of the sharing kinds then run on one communicator in the order
  /// they are called, so use it where the program does not drive two such kinds from
  /// different threads at once. Another strategy with this set is an InvalidValueError.
  bool share_identical_groups = false;
  /// Embedding policies (Layout); empty functions mean Megatron's defaults. A rank-local
  /// function cannot be compared across ranks, so its results over every pipeline group
  /// are hashed into the fingerprint: a custom policy costs O(W) calls of it (streamed, O(pp)
  /// memory), the one part of initialize that visits the world; with the default policies
  /// initialize does O(sum of this rank's group sizes) work with the split and member
  /// strategies.
  EmbeddingPolicies policies;
  /// The fingerprint of config and options (ProcessGroups::fingerprint) when the caller has
  /// proven by other means that every rank of the world holds it (commgrid's recovery: the
  /// decision that started the epoch, which every process registered for with it).
  /// initialize then skips its exchange over the world; a value that is not this rank's
  /// own fingerprint is a ConfigMismatchError at once, on this rank. Not itself part of the
  /// fingerprint.
  std::optional<std::uint64_t> proven_fingerprint;
};

/// What creating one kind (one hcp level) cost on this rank.
struct KindCreation {
  GroupKind kind = GroupKind::tp;
  int level = 0;
  std::string label;                 ///< "tp", "hcp[1]"
  std::chrono::nanoseconds time{0};  ///< wall time of this rank's creation calls
  std::int64_t creation_calls = 0;   ///< backend creation calls this rank made
  bool alias = false;                ///< reuses another kind's communicator
};

/// One rank's communication groups: Megatron-core's parallel_state as an object, so that
/// several can live in one process (one per rank-thread). Not thread-safe: one thread uses
/// one ProcessGroups. Communicators are shared: a collection taken from this object keeps
/// its groups alive after destroy().
class ProcessGroups {
 public:
  ProcessGroups() = default;
  /// Destroys the groups (destroy()).
  ~ProcessGroups();
  ProcessGroups(const ProcessGroups&) = delete;
  ProcessGroups& operator=(const ProcessGroups&) = delete;

  /// Collective over `world`: every rank calls it with the same config and options.
  /// First exchanges a fingerprint of config and options; when ranks differ, every rank
  /// throws ConfigMismatchError naming the first differing field and who holds which value.
  /// Then validates the config (ConfigError, the same on every rank), checks that
  /// world.size() == config.world_size, and creates the groups with options.strategy.
  /// `world` must outlive the call only; the created groups do not depend on it.
  /// The whole call has one deadline, world.timeout() from its start: each backend call on
  /// the world gets what is left of it (the world's timeout is restored at the end), so a
  /// creation of many kinds, each slow but within the timeout, still ends in time
  /// (TimeoutError). The created groups get options.timeout, else the world's timeout.
  /// Throws StateError when already initialized, BackendError when the backend fails.
  void initialize(Communicator& world, const ParallelConfig& config, InitOptions options = {});
  /// initialize() with shared ownership of the world, which lets share_identical_groups
  /// reuse the world itself too: a kind whose group is the whole world (dp alone, tp_dp when
  /// pp = cp = 1, ...) uses `world` instead of a communicator of the same members, one full
  /// mesh of connections fewer at creation and at every recovery. Only when the groups'
  /// timeout is the world's (InitOptions::timeout unset or equal), and only with
  /// share_identical_groups; the rules of sharing (operations in call order on one
  /// communicator) then hold for the world and those kinds too. Every rank must call the
  /// same overload: the fingerprint says which. A null world is an InvalidValueError.
  void initialize(std::shared_ptr<Communicator> world, const ParallelConfig& config,
                  InitOptions options = {});
  /// The fingerprint initialize's shared-world overload exchanges for `config` and
  /// `options`: one hash of every field it compares (the same on every rank that was given
  /// the same config and options).
  [[nodiscard]] static std::uint64_t fingerprint(const ParallelConfig& config,
                                                 const InitOptions& options);
  /// Whether initialize() succeeded and destroy() has not been called since.
  [[nodiscard]] bool is_initialized() const noexcept { return initialized_; }
  /// Releases every group (in reverse creation order) and forgets the layout; getters then
  /// throw StateError and initialize() may be called again. No-op when not initialized.
  void destroy() noexcept;

  // ---- the layout ---------------------------------------------------------------
  [[nodiscard]] const Layout& layout() const;
  [[nodiscard]] const ParallelConfig& config() const;
  [[nodiscard]] CreationStrategy strategy() const;
  /// This rank's global rank and the world size.
  [[nodiscard]] Rank world_rank() const;
  [[nodiscard]] Rank world_size() const;
  /// The kinds created, in reference order.
  [[nodiscard]] const std::vector<GroupKind>& kinds() const;

  // ---- any kind (level: the hcp level, 0 for every other kind) ------------------
  /// Whether this rank has a group of the kind.
  [[nodiscard]] bool has_group(GroupKind k, int level = 0) const;
  /// Why this rank has no group of the kind; empty when it has one.
  [[nodiscard]] std::string no_group_reason(GroupKind k, int level = 0) const;
  /// This rank's communicator of the kind. Throws NoGroupError when it has none.
  [[nodiscard]] Communicator& group(GroupKind k, int level = 0) const;
  /// The same as a shared handle; nullptr when this rank has no group of the kind.
  [[nodiscard]] std::shared_ptr<Communicator> group_handle(GroupKind k, int level = 0) const;
  /// Number of ranks in this rank's group of the kind (get_*_world_size).
  [[nodiscard]] Rank size(GroupKind k, int level = 0) const;
  /// This rank's rank in its group of the kind (get_*_rank): the communicator's rank,
  /// which is the position among the members sorted ascending.
  [[nodiscard]] Rank rank(GroupKind k, int level = 0) const;
  /// The global ranks of this rank's group, in the kind's member order (docs/layout.md; not
  /// sorted for intra_dist_opt and for an unsorted custom embedding policy).
  [[nodiscard]] const std::vector<Rank>& global_ranks(GroupKind k, int level = 0) const;
  /// Index of this rank's group in the kind's enumeration order.
  [[nodiscard]] std::int64_t group_index(GroupKind k, int level = 0) const;

  // ---- Megatron-core's named getters ----------------------------------------------
  /// First member of the tp group (get_tensor_model_parallel_src_rank).
  [[nodiscard]] Rank tensor_model_parallel_src_rank() const;
  /// First member of the mp group (get_model_parallel_src_rank).
  [[nodiscard]] Rank model_parallel_src_rank() const;
  /// First member of the dp group, or of dp_cp with cp (get_data_parallel_src_rank).
  [[nodiscard]] Rank data_parallel_src_rank(bool with_context_parallel = false) const;
  /// Rank in dp, dp_cp (with cp) or intra_dp_cp (with cp and partial). partial without cp
  /// is an InvalidValueError, as in Megatron ("partial DP needs to include CP").
  [[nodiscard]] Rank data_parallel_rank(bool with_context_parallel = false,
                                        bool partial_data_parallel = false) const;
  /// Size of the same group.
  [[nodiscard]] Rank data_parallel_size(bool with_context_parallel = false,
                                        bool partial_data_parallel = false) const;
  /// Rank in expt_dp, or intra_expt_dp when partial.
  [[nodiscard]] Rank expert_data_parallel_rank(bool partial = false) const;
  /// Size of the same group.
  [[nodiscard]] Rank expert_data_parallel_size(bool partial = false) const;

  /// First and last member of this rank's pp group (stage 0 and stage pp-1).
  [[nodiscard]] Rank pipeline_first_rank() const;
  [[nodiscard]] Rank pipeline_last_rank() const;
  /// The next and previous stage's rank in the pp group; both wrap around, and are this
  /// rank when pp == 1.
  [[nodiscard]] Rank pipeline_next_rank() const;
  [[nodiscard]] Rank pipeline_prev_rank() const;
  /// pp rank == 0; with a virtual stage also vstage == 0. Without vstage the virtual stage
  /// is ignored (Megatron's ignore_virtual=True); pass virtual_pipeline_rank() for
  /// Megatron's stateful default. vstage needs vpp and 0 <= vstage < vpp (ConfigError).
  [[nodiscard]] bool is_pipeline_first_stage(std::optional<Rank> vstage = std::nullopt) const;
  /// pp rank == pp-1; with a virtual stage also vstage == vpp-1.
  [[nodiscard]] bool is_pipeline_last_stage(std::optional<Rank> vstage = std::nullopt) const;
  /// Without vstage: whether this rank is in an embd group. With vstage, the virtual-aware
  /// form of Megatron-core's getter: the list's first entry is in only at the first stage, its last
  /// entry only at the last stage, any other entry always.
  [[nodiscard]] bool is_rank_in_embedding_group(std::optional<Rank> vstage = std::nullopt) const;
  /// Whether this rank is in a pos_embd group.
  [[nodiscard]] bool is_rank_in_position_embedding_group() const;

  /// The virtual pipeline rank: 0 after initialize when vpp is given, nullopt otherwise.
  [[nodiscard]] std::optional<Rank> virtual_pipeline_rank() const;
  /// Sets it; needs vpp and 0 <= vrank < vpp (ConfigError otherwise).
  void set_virtual_pipeline_rank(Rank vrank);
  /// vpp, or nullopt when not given.
  [[nodiscard]] std::optional<Rank> virtual_pipeline_size() const;

  /// The FP8 amax reduction group: tp_dp_cp (with cp), tp_cp (with cp, tp only), tp_dp
  /// (without cp), tp (without cp, tp only).
  [[nodiscard]] Communicator& amax_reduction_group(bool with_context_parallel = false,
                                                   bool tp_only = false) const;
  /// This rank's tp, dp, cp, pp and ep ranks joined by '_' (get_all_ranks).
  [[nodiscard]] std::string all_ranks() const;

  // ---- cost of initialization ---------------------------------------------------
  /// Per created kind and level, in creation order: time and backend calls on this rank.
  /// With the member strategy every group is made in one batch, and a kind's time is from
  /// the batch's start to its group being usable (the kinds' times overlap).
  [[nodiscard]] const std::vector<KindCreation>& creation_stats() const;
  /// Time of the fingerprint exchange on this rank.
  [[nodiscard]] std::chrono::nanoseconds fingerprint_time() const;
  /// Wall time of creating every group on this rank (after the fingerprint).
  [[nodiscard]] std::chrono::nanoseconds creation_time() const;

 private:
  struct Slot {
    std::optional<GroupRef> ref;         ///< this rank's group, nullopt when none
    std::shared_ptr<Communicator> comm;  ///< nullptr when none
    std::string no_group_reason;
  };
  void require(const char* call) const;
  const Slot& slot(GroupKind k, int level, const char* call) const;
  const Slot& member_slot(GroupKind k, int level, const char* call) const;
  void exchange_fingerprint(Communicator& world, const ParallelConfig& config,
                            const InitOptions& options);
  void create_split_or_member(Communicator& world, const InitOptions& options);
  /// A communicator made by create_members_at_once, with the time it took to be usable.
  struct Made {
    GroupKind kind;
    int level;
    std::shared_ptr<Communicator> comm;
    std::chrono::nanoseconds time;
    /// share_identical_groups: `comm` is an earlier Made's (the same members).
    bool reuses = false;
  };
  /// The member strategy's creation: this rank's group of every kind that is no alias, in
  /// one Communicator::create_groups call, in reference order.
  std::vector<Made> create_members_at_once(
      Communicator& world, const std::array<std::optional<GroupKind>, kNumKinds>& parent_of,
      bool share_identical, bool reuse_world);
  void create_per_group(Communicator& world, const InitOptions& options);
  /// Before each backend call of initialize on `world`: sets its timeout to what is left
  /// of the initialize's deadline.
  void before_world_call(Communicator& world) const;
  /// The timeout a created group gets: options.timeout, else the world's own.
  [[nodiscard]] std::chrono::milliseconds group_timeout(const InitOptions& options) const;
  void check_stage(std::optional<Rank> vstage, const char* call) const;

  bool initialized_ = false;
  /// During initialize(shared_ptr): the world, which a kind whose group is the whole world
  /// may reuse.
  std::shared_ptr<Communicator> shared_world_;
  std::optional<Layout> layout_;
  CreationStrategy strategy_ = kDefaultStrategy;
  Rank world_rank_ = 0;
  Rank world_size_ = 0;
  std::vector<GroupKind> kinds_;
  /// Per kind (indexed by GroupKind), one slot per level; empty when the kind was not
  /// created, with the reason in not_created_.
  std::array<std::vector<Slot>, kNumKinds> slots_;
  std::array<std::string, kNumKinds> not_created_;
  /// Communicators in creation order, for destroying in reverse.
  std::vector<std::shared_ptr<Communicator>> created_;
  std::vector<KindCreation> stats_;
  std::chrono::nanoseconds fingerprint_time_{0};
  std::chrono::nanoseconds creation_time_{0};
  std::optional<Rank> virtual_rank_;
  /// During initialize: the world's own timeout and the deadline of the whole call.
  std::chrono::milliseconds world_timeout_{0};
  std::chrono::steady_clock::time_point init_deadline_{};
};

}  // namespace commgrid
