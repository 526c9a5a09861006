// The layout benchmark: its workload (shared by `commgrid bench layout` and the Google
// Benchmark program bench/bench_layout) and the command's own timing loop.
#pragma once

#include <array>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <span>
#include <string>
#include <vector>

#include "commgrid/config.hpp"
#include "commgrid/group_kind.hpp"
#include "commgrid/group_list.hpp"
#include "commgrid/layout.hpp"

namespace commgrid::bench {

/// The worlds whose every kind is enumerated by default: 2^10, 2^14, 2^17, 2^20.
inline constexpr std::array<std::int64_t, 4> kEnumerationWorlds = {1 << 10, 1 << 14, 1 << 17,
                                                                   1 << 20};
/// The worlds of the one-rank queries by default: 2^10 ... 2^30.
inline constexpr std::array<std::int64_t, 7> kQueryWorlds = {1 << 10, 1 << 14, 1 << 17, 1 << 20,
                                                             1 << 24, 1 << 27, 1 << 30};
/// The small kinds whose one-rank query is timed.
inline constexpr std::array<GroupKind, 7> kQueryKinds = {
    GroupKind::tp, GroupKind::pp,    GroupKind::cp,     GroupKind::ep,
    GroupKind::mp, GroupKind::tp_cp, GroupKind::expt_tp};

/// Which edition the layout benchmark lays out, and HEAD's gtp_remat (1 under seed).
struct BenchEdition {
  Compat compat = Compat::seed;
  std::int64_t gtp_remat = 1;
};

/// The benchmark's configuration: tp8 pp8 cp2 ep8 etp1 (under head also gtp_remat), dp
/// filling the world (a multiple of 128 * gtp_remat ranks). Validated; throws ConfigError
/// for a world it does not fit.
[[nodiscard]] ParallelConfig bench_config(std::int64_t world_size, BenchEdition edition = {});

/// Bytes a GroupList holds: its members, plus its offsets when its groups differ in size.
[[nodiscard]] std::size_t group_list_bytes(const GroupList& groups) noexcept;

/// The baseline: n int64 values (first, first+1, ...) written into newly allocated memory,
/// which, like a GroupList's buffer, has to be faulted in.
[[nodiscard]] std::unique_ptr<std::int64_t[]> write_integers(std::size_t n, std::int64_t first = 0);
/// The same into memory that is already mapped: the bound that memory bandwidth alone sets.
void write_integers(std::span<std::int64_t> out, std::int64_t first = 0) noexcept;

/// n ranks spread over [0, world_size) by a fixed multiplicative sequence, so that
/// consecutive queries touch unrelated groups and both runs use the same ranks.
[[nodiscard]] std::vector<Rank> query_ranks(std::int64_t world_size, std::size_t n);

/// Where the memory of each enumeration and baseline comes from. This matters more than
/// the code: on a VM a first touch of a page can cost tens of microseconds.
enum class MemoryMode {
  /// The allocator keeps freed memory (no mmap, no trimming), so from the
  /// second repetition on, lists land in pages already mapped; baselines write into a
  /// buffer mapped beforehand. Measures the code, as in a long-running process.
  warm,
  /// Every allocation of 128 KiB or more is a fresh mmap, for the lists and the baselines
  /// alike. Measures what a process that enumerates once pays.
  cold,
};

/// Sets the allocator up for a mode (mallopt; process-wide, so for benchmark programs).
void use_memory_mode(MemoryMode mode);

/// Options of `commgrid bench layout`.
struct LayoutBenchOptions {
  MemoryMode memory = MemoryMode::warm;
  BenchEdition edition;
  std::vector<std::int64_t> worlds{kEnumerationWorlds.begin(), kEnumerationWorlds.end()};
  std::vector<std::int64_t> query_worlds{kQueryWorlds.begin(), kQueryWorlds.end()};
  int repeats = 5;               ///< timed repetitions of each enumeration (min is reported)
  std::size_t queries = 100000;  ///< queries per kind and world in each repetition
};

/// One kind of one world, enumerated.
struct KindResult {
  GroupKind kind{};
  std::int64_t groups = 0, members = 0;
  std::size_t bytes = 0;
  double seconds = 0, baseline_seconds = 0;  ///< fastest repetition of each
};

/// Every kind of one world, enumerated and held together.
struct EnumerationResult {
  std::int64_t world_size = 0;
  std::int64_t groups = 0, members = 0;
  std::size_t bytes = 0;          ///< of all lists held at once
  std::size_t largest_bytes = 0;  ///< of the largest single list
  std::int64_t rss_growth = 0;    ///< growth of the peak resident set (getrusage) in bytes
  double seconds = 0;             ///< fastest repetition: every kind, one after another
  double baseline_seconds = 0;    ///< fastest: `members` int64 written (same memory mode)
  std::vector<KindResult> kinds;
};

/// One kind's one-rank query in one world.
struct QueryResult {
  std::int64_t world_size = 0;
  GroupKind kind{};
  std::int64_t group_size = 0;
  double ns_per_query = 0;  ///< fastest repetition's mean
};

/// Bytes the enumeration of one world holds at once: every kind's list (held together, as
/// measured) plus, in warm mode, the baseline's buffer of as many integers. From the counts
/// alone, without enumerating.
[[nodiscard]] std::int64_t enumeration_bytes(std::int64_t world_size, MemoryMode mode,
                                             BenchEdition edition = {});

/// The physical memory of this machine in bytes (0 when unknown).
[[nodiscard]] std::int64_t physical_memory_bytes();

/// Measures every world and kind of the options with a plain steady_clock loop;
/// enumeration and its baselines alternate within each repetition so that noise hits both.
/// Throws ConfigError ("worlds") before measuring anything when a world's lists would not
/// fit in half of the physical memory (a world of 2^30 ranks needs about 290 GiB).
[[nodiscard]] std::vector<EnumerationResult> run_enumeration(const LayoutBenchOptions& options);
[[nodiscard]] std::vector<QueryResult> run_queries(const LayoutBenchOptions& options);

}  // namespace commgrid::bench
