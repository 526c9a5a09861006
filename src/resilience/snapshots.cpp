// The resilient driver's snapshots and resync rows (snapshots.hpp).
#include "snapshots.hpp"

#include <unistd.h>

#include <cstdio>
#include <limits>
#include <string>

#include "commgrid/resilience_keys.hpp"

namespace commgrid::detail {

const Snapshot* find(const std::deque<Snapshot>& list, std::int64_t step) {
  for (const Snapshot& snap : list)
    if (snap.step == step) return &snap;
  return nullptr;
}

void keep_two(std::deque<Snapshot>& list, Snapshot snap) {
  if (!list.empty() && list.back().step == snap.step) list.pop_back();
  list.push_back(std::move(snap));
  if (list.size() > 2) list.pop_front();
}

std::vector<std::int64_t> resync_row(std::int64_t offer, const std::deque<Snapshot>& snapshots,
                                     const std::deque<Snapshot>& copies) {
  std::vector<std::int64_t> r(kRowSize, -1);
  r[0] = offer;
  if (offer == kNone) return r;
  for (const auto& [list, at] :
       {std::pair{&snapshots, kRowSnapshots}, std::pair{&copies, kRowCopies}})
    for (std::size_t i = 0; i < list->size() && i < 2; ++i) {
      r[at + 2 * i] = (*list)[i].step;
      r[at + 2 * i + 1] = static_cast<std::int64_t>((*list)[i].bytes.size());
    }
  return r;
}

std::int64_t held(const std::int64_t* row, std::size_t at, std::int64_t step) {
  for (std::size_t i = 0; i < 2; ++i)
    if (row[at + 2 * i] == step) return row[at + 2 * i + 1];
  return -1;
}

std::vector<std::int64_t> rows_of(const EpochDecision& decision, std::size_t world_size) {
  if (decision.process_of.size() != world_size) return {};
  std::vector<std::int64_t> all;
  all.reserve(kRowSize * world_size);
  for (const std::int64_t p : decision.process_of) {
    const auto it = decision.notes.find(p);
    if (it == decision.notes.end()) return {};
    const std::string not_a_row = "recovery: process " + std::to_string(p) + "'s note '" +
                                  it->second + "' is not a resync row";
    std::vector<std::int64_t> row;
    try {
      row = parse_numbers(it->second, "resync row");
    } catch (const BackendError&) { throw InternalError(not_a_row); }
    if (row.size() != kRowSize) throw InternalError(not_a_row);
    all.insert(all.end(), row.begin(), row.end());
  }
  return all;
}

std::string size_text(std::size_t bytes) {
  const double b = static_cast<double>(bytes);
  char out[64];
  if (b >= 1024.0 * 1024 * 1024)
    std::snprintf(out, sizeof out, "%.2f GiB", b / (1024.0 * 1024 * 1024));
  else if (b >= 1024.0 * 1024) std::snprintf(out, sizeof out, "%.2f MiB", b / (1024.0 * 1024));
  else if (b >= 1024.0) std::snprintf(out, sizeof out, "%.1f KiB", b / 1024.0);
  else std::snprintf(out, sizeof out, "%zu bytes", bytes);
  return out;
}

std::size_t available_memory() {
  const long pages = ::sysconf(_SC_AVPHYS_PAGES);
  const long page = ::sysconf(_SC_PAGESIZE);
  if (pages <= 0 || page <= 0) return std::numeric_limits<std::size_t>::max();
  return static_cast<std::size_t>(pages) * static_cast<std::size_t>(page);
}

}  // namespace commgrid::detail
