// The resilient driver's snapshots (internal to commgrid::resilience): a step's state kept
// in memory, the last two of a list, and the resync row that tells every rank of a new
// epoch which snapshots and buddy copies a rank keeps (resilient_driver.cpp).
#pragma once

#include <cstdint>
#include <deque>
#include <limits>
#include <string>
#include <vector>

#include "commgrid/recovery.hpp"
#include "commgrid/state_provider.hpp"

namespace commgrid::detail {

/// No step: a rank without state offers it, and a minimum over nothing is it.
inline constexpr std::int64_t kNone = std::numeric_limits<std::int64_t>::max();

/// A snapshot: the state at the start of step `step`.
struct Snapshot {
  std::int64_t step = 0;
  StateBytes bytes;
};

/// The snapshot of step `step` in `list`, or nullptr.
[[nodiscard]] const Snapshot* find(const std::deque<Snapshot>& list, std::int64_t step);
/// Appends `snap` (replacing one of the same step) and keeps the last two: every survivor
/// holds the older one when another is one step ahead.
void keep_two(std::deque<Snapshot>& list, Snapshot snap);

/// A resync row, kRowSize numbers: the step the rank can go back to (kNone: it has no
/// state), then the step and size of each snapshot it keeps (from kRowSnapshots), then of
/// each buddy copy (from kRowCopies); -1 for none.
inline constexpr std::size_t kRowSize = 9, kRowSnapshots = 1, kRowCopies = 5;
[[nodiscard]] std::vector<std::int64_t> resync_row(std::int64_t offer,
                                                   const std::deque<Snapshot>& snapshots,
                                                   const std::deque<Snapshot>& copies);
/// The size of the snapshot (at = kRowSnapshots) or copy (kRowCopies) of step `step` in
/// `row`; -1 when the row's rank keeps none.
[[nodiscard]] std::int64_t held(const std::int64_t* row, std::size_t at, std::int64_t step);
/// Every rank's row, rank after rank, from the notes of `decision` (each process's row,
/// Recovery::set_note); empty when a rank's process left none (every rank finds it missing
/// alike). InternalError for a note that is not a row.
[[nodiscard]] std::vector<std::int64_t> rows_of(const EpochDecision& decision,
                                                std::size_t world_size);

/// `bytes` for a person: "512 bytes", "1.5 KiB", "3.25 MiB", "1.02 GiB".
[[nodiscard]] std::string size_text(std::size_t bytes);
/// The memory the system has free now (the limit of the snapshots and copies kept when
/// the program sets none); the largest size_t when it cannot tell.
[[nodiscard]] std::size_t available_memory();

}  // namespace commgrid::detail
