#include <iomanip>
#include <sstream>
#include <string>

#include "plan_output.hpp"

namespace commgrid::cli {
namespace {

std::string list_text(std::span<const Rank> v) {
  std::string s = "[";
  for (std::size_t i = 0; i < v.size(); ++i) s += (i ? "," : "") + std::to_string(v[i]);
  return s + "]";
}

std::string opt_text(const std::optional<std::int64_t>& v) {
  return v ? std::to_string(*v) : "none";
}

// Column titles of the per-rank table: one per kind, one per level for hcp.
struct Column {
  GroupKind kind;
  int level;
  std::string title;
};

std::vector<Column> columns(const Layout& layout, const std::vector<GroupKind>& kinds) {
  std::vector<Column> cols;
  for (GroupKind k : kinds) {
    const int levels = layout.levels(k);
    for (int l = 0; l < levels; ++l)
      cols.push_back({k, l, std::string(kind_name(k)) + (k == GroupKind::hcp ? std::to_string(l) : "")});
  }
  return cols;
}

constexpr std::size_t kShownGroups = 4;

}  // namespace

void write_plan_table(std::ostream& out, const Layout& layout, const PlanSelection& sel) {
  const ParallelConfig& c = layout.config();
  std::string hcp = "none";
  if (!c.hcp.empty()) hcp = list_text(c.hcp);
  out << "world " << c.world_size << ", order " << c.order << " (innermost first)\n"
      << "  dense grid:  tp " << c.tp << " x cp " << c.cp << " x dp " << layout.dp() << " x pp "
      << c.pp << "\n"
      << "  expert grid: etp " << c.expert_tp() << " x ep " << c.ep << " x expert_dp "
      << layout.expert_dp() << " x pp " << c.pp << "\n"
      << "  dist_opt_instances " << c.dist_opt_instances << ", hcp " << hcp << ", vpp "
      << opt_text(c.vpp) << "\n\n";

  const std::vector<Column> cols = columns(layout, sel.kinds);
  if (sel.rank) {
    const Rank r = *sel.rank;
    const RankCoordinates x = layout.coordinates(r);
    out << "rank " << r << ": tp " << x.tp << ", cp " << x.cp << ", dp " << x.dp << ", pp "
        << x.pp << " | etp " << x.etp << ", ep " << x.ep << ", expert_dp " << x.expert_dp
        << "\n\n";
    out << std::left << std::setw(16) << "kind" << std::right << std::setw(8) << "group"
        << std::setw(8) << "rank" << std::setw(6) << "size" << "  members\n";
    for (const Column& col : cols) {
      auto g = layout.group_of(col.kind, r, col.level);
      out << std::left << std::setw(16) << col.title << std::right;
      if (!g) {
        out << std::setw(8) << "-" << std::setw(8) << "-" << std::setw(6) << "-"
            << "  (not a member)\n";
        continue;
      }
      out << std::setw(8) << g->index << std::setw(8) << g->comm_rank << std::setw(6)
          << g->members.size() << "  " << list_text(g->members) << "\n";
    }
    return;
  }

  // Per-kind summary, and each rank's group index per column (from one enumeration).
  const auto W = static_cast<std::size_t>(c.world_size);
  std::vector<std::vector<std::int64_t>> index(cols.size(), std::vector<std::int64_t>(W, -1));
  out << std::left << std::setw(16) << "kind" << std::right << std::setw(8) << "groups"
      << std::setw(8) << "size" << "  first groups\n";
  for (std::size_t ci = 0; ci < cols.size(); ++ci) {
    const GroupList groups = layout.groups(cols[ci].kind, cols[ci].level);
    std::size_t min_size = SIZE_MAX, max_size = 0;
    std::ostringstream first;
    for (std::size_t g = 0; g < groups.size(); ++g) {
      min_size = std::min(min_size, groups[g].size());
      max_size = std::max(max_size, groups[g].size());
      for (Rank r : groups[g]) index[ci][static_cast<std::size_t>(r)] = static_cast<std::int64_t>(g);
      if (g < kShownGroups) first << (g ? " " : "") << list_text(groups[g]);
    }
    if (groups.size() > kShownGroups) first << " ...";
    std::string size = std::to_string(max_size);
    if (min_size != max_size) size = std::to_string(min_size) + "-" + size;
    out << std::left << std::setw(16) << cols[ci].title << std::right << std::setw(8)
        << groups.size() << std::setw(8) << size << "  " << first.str() << "\n";
  }

  out << "\nper rank: coordinates, then the index of the rank's group of each kind "
         "(- = in no group)\n";
  std::vector<std::size_t> width(cols.size());
  out << std::setw(6) << "rank" << std::setw(4) << "tp" << std::setw(4) << "cp" << std::setw(4)
      << "dp" << std::setw(4) << "pp" << std::setw(5) << "etp" << std::setw(4) << "ep"
      << std::setw(5) << "edp" << " |";
  for (std::size_t ci = 0; ci < cols.size(); ++ci) {
    width[ci] = std::max<std::size_t>(cols[ci].title.size(), 3) + 1;
    out << std::setw(static_cast<int>(width[ci])) << cols[ci].title;
  }
  out << "\n";
  for (std::size_t r = 0; r < W; ++r) {
    const RankCoordinates x = layout.coordinates(static_cast<Rank>(r));
    out << std::setw(6) << r << std::setw(4) << x.tp << std::setw(4) << x.cp << std::setw(4)
        << x.dp << std::setw(4) << x.pp << std::setw(5) << x.etp << std::setw(4) << x.ep
        << std::setw(5) << x.expert_dp << " |";
    for (std::size_t ci = 0; ci < cols.size(); ++ci) {
      const std::int64_t i = index[ci][r];
      out << std::setw(static_cast<int>(width[ci])) << (i < 0 ? std::string("-") : std::to_string(i));
    }
    out << "\n";
  }
}

}  // namespace commgrid::cli
