// The work of `commgrid verify` on one rank, apart from launching and printing, so that any
// backend (MPI processes, Gloo rank-threads) can run it.
#pragma once

#include <chrono>
#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "commgrid/communicator.hpp"
#include "commgrid/config.hpp"
#include "commgrid/group_kind.hpp"
#include "commgrid/process_groups.hpp"
#include "layout_flags.hpp"

namespace commgrid::cli {

/// What to verify.
struct VerifyOptions {
  std::vector<GroupKind> kinds;  ///< empty: every kind of the layout
  CreationStrategy strategy = kDefaultStrategy;
  /// InitOptions::share_identical_groups (member strategy only).
  bool share_identical_groups = false;
  /// Timeout of the created groups; nullopt keeps the world's.
  std::optional<std::chrono::milliseconds> timeout;
  /// For testing verify itself: this world rank reports a wrong global rank in every
  /// membership check, so that the failure path runs end to end. -1: none.
  int fault_rank = -1;
};

/// The verdict on one kind (one hcp level), the same on every rank.
struct KindVerdict {
  GroupKind kind = GroupKind::tp;
  int level = 0;
  std::string label;          ///< "tp", "hcp[1]"
  std::int64_t groups = 0;    ///< number of groups of the kind
  std::int64_t min_size = 0;  ///< smallest and largest group
  std::int64_t max_size = 0;
  bool passed = true;
  bool alias = false;               ///< shares the communicator of its parent kind
  std::string failure;              ///< the first failure, naming group, ranks and check
  double creation_seconds = 0;      ///< slowest rank's creation time for this kind
  std::int64_t creation_calls = 0;  ///< most creation calls any rank made for this kind
};

/// The outcome of run_verify, the same on every rank.
struct VerifyReport {
  int world_size = 0;
  CreationStrategy strategy = kDefaultStrategy;
  std::vector<KindVerdict> kinds;
  double fingerprint_seconds = 0;  ///< slowest rank's config fingerprint exchange
  double creation_seconds = 0;     ///< slowest rank's total group creation
  [[nodiscard]] bool passed() const;
  [[nodiscard]] std::int64_t total_groups() const;
};

/// Collective over `world`: creates the groups of `config` (ProcessGroups::initialize,
/// including the fingerprint exchange) and proves each on the wire: communicator size and
/// rank against the layout, an allgather of global ranks equal to the members, an
/// allreduce with a known sum, and a token passed around each pipeline ring with send and
/// recv. The verdicts are gathered so that every rank returns the same report. Throws what
/// initialize throws (ConfigMismatchError, ConfigError, BackendError) and BackendError
/// (TimeoutError) when a check's communication fails outright.
[[nodiscard]] VerifyReport run_verify(Communicator& world, const ParallelConfig& config,
                                      const VerifyOptions& options);

/// The report as a table, then `verified K kinds, G groups on W ranks` (or the failures).
[[nodiscard]] std::string format_verify_report(const VerifyReport& report);

/// The config of `layout` on `world_size` ranks, with every kind of `options` checked to
/// exist: bad input is a ConfigError found before any communication, the same on every rank.
[[nodiscard]] ParallelConfig checked_verify_config(const LayoutFlags& layout,
                                                   const VerifyOptions& options, int world_size);

/// Prints the report (stdout) and each failure (stderr, `error: verify failed: ...`);
/// returns the exit code, 0 when every kind passed, else 1.
[[nodiscard]] int print_verify_report(const VerifyReport& report);

}  // namespace commgrid::cli
