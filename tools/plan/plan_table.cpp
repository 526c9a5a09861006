// `commgrid plan` as a table for people: member lists as ranges and strides, one rank's
// groups with its node and layers, and the per-rank table, all streamed.
#include <algorithm>
#include <string>

#include "commgrid/error.hpp"
#include "plan/plan_output.hpp"

namespace commgrid::cli {

// ---- RangeText ------------------------------------------------------------------------

namespace {
constexpr std::size_t kShortList = 8;  // lists up to this long are printed in full
constexpr std::size_t kShownRuns = 8;  // runs printed before "..."
}  // namespace

void RangeText::add(std::int64_t v) {
  ++count_;
  if (head_.size() <= kShortList) head_.push_back(v);
  if (cur_.n == 0) {
    cur_ = {v, 0, 1};
  } else if (cur_.n == 1 && v > cur_.first) {
    cur_.step = v - cur_.first;
    cur_.n = 2;
  } else if (cur_.n >= 2 && v == cur_.first + cur_.n * cur_.step) {
    ++cur_.n;
  } else if (cur_.n == 2) {
    // A pair that does not continue: its first member stands alone, and its second may
    // start the next run ("0,8-11" rather than "0,8,9-11").
    const Run pair = cur_;
    cur_ = {pair.first, 0, 1};
    close_run();
    const std::int64_t second = pair.first + pair.step;
    cur_ = v > second ? Run{second, v - second, 2} : Run{second, 0, 1};
    if (cur_.n == 1) {
      close_run();
      cur_ = {v, 0, 1};
    }
  } else {
    close_run();
    cur_ = {v, 0, 1};
  }
}

void RangeText::add(std::span<const std::int64_t> values) {
  std::size_t i = 0;
  while (i < values.size()) {
    if (cur_.n >= 2 && head_.size() > kShortList) {
      std::int64_t next = cur_.first + cur_.n * cur_.step;
      std::size_t j = i;
      while (j < values.size() && values[j] == next) {
        next += cur_.step;
        ++j;
      }
      cur_.n += static_cast<std::int64_t>(j - i);
      count_ += static_cast<std::int64_t>(j - i);
      i = j;
      if (i == values.size()) break;
    }
    add(values[i++]);
  }
}

void RangeText::close_run() {
  if (runs_.size() <= kShownRuns) runs_.push_back(cur_);
  else more_runs_ = true;
}

std::string RangeText::str() const {
  auto num = [](std::int64_t v) { return std::to_string(v); };
  std::vector<Run> runs = runs_;
  bool more = more_runs_;
  if (cur_.n > 0) {
    if (runs.size() <= kShownRuns) runs.push_back(cur_);
    else more = true;
  }
  if (count_ <= static_cast<std::int64_t>(kShortList)) {
    // A short list reads best in full, unless it is made of plain ranges ("0-7").
    const bool ranges =
        std::all_of(runs.begin(), runs.end(), [](const Run& r) { return r.step == 1 && r.n >= 3; });
    if (!ranges || more) {
      std::string s = "[";
      for (std::size_t i = 0; i < head_.size(); ++i) s += (i ? "," : "") + num(head_[i]);
      return s + "]";
    }
  }
  if (runs.size() > kShownRuns) {
    runs.resize(kShownRuns);
    more = true;
  }
  std::string s = "[";
  for (std::size_t i = 0; i < runs.size(); ++i) {
    const Run& r = runs[i];
    s += i ? "," : "";
    if (r.n == 1) s += num(r.first);
    else if (r.n == 2) s += num(r.first) + "," + num(r.first + r.step);
    else if (r.step == 1) s += num(r.first) + "-" + num(r.first + r.n - 1);
    else s += num(r.first) + ":" + num(r.first + r.n * r.step) + ":" + num(r.step);
  }
  s += more ? ",...]" : "]";
  if (count_ > static_cast<std::int64_t>(kShortList)) s += " (" + num(count_) + " " + noun_ + ")";
  return s;
}

// ---- layers ---------------------------------------------------------------------------

LayerAssignment::LayerAssignment(std::int64_t layers, const ParallelConfig& c)
    : num_layers(layers), pp(c.pp), vpp(c.vpp.value_or(1)) {
  const std::string L = std::to_string(layers);
  if (layers < 1) throw InvalidValueError("num_layers", "num_layers must be >= 1, got " + L);
  if (layers % pp != 0)
    throw DivisibilityError(
        "num_layers", "num_layers = " + L + " is not divisible by pp = " + std::to_string(pp));
  if ((layers / pp) % vpp != 0)
    throw DivisibilityError(
        "num_layers",
        "num_layers = " + L + " gives " + std::to_string(layers / pp) +
            " layers per pipeline rank, not divisible by vpp = " + std::to_string(vpp));
}

namespace {

std::string layer_range(const LayerAssignment& la, std::int64_t p, std::int64_t v) {
  const std::int64_t a = la.first(p, v), b = a + la.per_stage() - 1;
  return a == b ? std::to_string(a) : std::to_string(a) + "-" + std::to_string(b);
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
      cols.push_back({k, l,
                      k == GroupKind::hcp ? std::string(kind_name(k)) + std::to_string(l)
                                          : layout.level_name(k, l)});
  }
  return cols;
}

// The width of the kind column: the longest title (HEAD's names run to 24 characters,
// tp_ep_pp_with_egtp_remat) and two spaces, at least 16.
std::size_t kind_width(const std::vector<Column>& cols) {
  std::size_t w = 16;
  for (const Column& c : cols) w = std::max(w, c.title.size() + 2);
  return w;
}

constexpr std::int64_t kShownGroups = 4;
constexpr std::size_t kFirstGroupsWidth = 90;  // characters of first groups per summary line

// Streams entries [first, first + n) of a kind's member list through fn(piece).
template <class Fn>
void for_each_piece(const Layout& layout, GroupKind k, int level, std::int64_t first,
                    std::int64_t n, Fn&& fn) {
  std::vector<Rank> buf(static_cast<std::size_t>(std::min(n, kPiece)));
  for (std::int64_t done = 0; done < n;) {
    const std::int64_t m = std::min(kPiece, n - done);
    const std::span<Rank> piece(buf.data(), static_cast<std::size_t>(m));
    layout.members(k, level, first + done, piece);
    fn(std::span<const Rank>(piece));
    done += m;
  }
}

// Streams entries [first, first + n) of a kind's member list through fn(rank).
template <class Fn>
void for_each_member(const Layout& layout, GroupKind k, int level, std::int64_t first,
                     std::int64_t n, Fn&& fn) {
  std::vector<Rank> buf(static_cast<std::size_t>(std::min(n, kPiece)));
  for (std::int64_t done = 0; done < n;) {
    const std::int64_t m = std::min(kPiece, n - done);
    const std::span<Rank> piece(buf.data(), static_cast<std::size_t>(m));
    layout.members(k, level, first + done, piece);
    for (Rank r : piece) fn(r);
    done += m;
  }
}

std::string spares_text(const RankMap& map) {
  const std::int64_t W = map.world_size(), P = map.num_processes(), S = P - W;
  auto range = [](std::int64_t a, std::int64_t b) {
    return a == b ? std::to_string(a) : std::to_string(a) + "-" + std::to_string(b);
  };
  std::string t = "spares: " + std::to_string(S) + (S == 1 ? " process" : " processes");
  if (S > 0) {
    t += " (" + range(W, P - 1);
    if (const auto first = map.node_of(W)) {
      const std::int64_t last = *map.node_of(P - 1);
      t += std::string(first == last ? ", node " : ", nodes ") + range(*first, last);
    }
    t += ")";
  }
  t += " hold no rank and take a failed process's place; " + std::to_string(P) +
       " processes in all, logical rank r on process r until a failure";
  return t;
}

void write_header(OutputBuffer& out, const Layout& layout, const PlanSelection& sel) {
  const ParallelConfig& c = layout.config();
  std::string hcp = "none";
  if (!c.hcp.empty()) {
    hcp = "[";
    for (std::size_t i = 0; i < c.hcp.size(); ++i) hcp += (i ? "," : "") + std::to_string(c.hcp[i]);
    hcp += "]";
  }
  out.put("world " + std::to_string(c.world_size) + ", order " + c.order + " (innermost first)" +
          (c.compat == Compat::head ? ", compat head (Megatron-core HEAD's groups)" : "") + "\n" +
          "  dense grid:  tp " + std::to_string(c.tp) + " x cp " + std::to_string(c.cp) + " x dp " +
          std::to_string(layout.dp()) + " x pp " + std::to_string(c.pp) + "\n" +
          "  expert grid: etp " + std::to_string(c.expert_tp()) + " x ep " + std::to_string(c.ep) +
          " x expert_dp " + std::to_string(layout.expert_dp()) + " x pp " + std::to_string(c.pp) +
          "\n" + "  dist_opt_instances " + std::to_string(c.dist_opt_instances) + ", hcp " + hcp +
          ", vpp " + opt_text(c.vpp) + "\n");
  if (c.compat == Compat::head)
    out.put("  gtp_remat " + std::to_string(c.gtp_remat) + ", expert_gtp_remat " +
            std::to_string(c.expert_gtp_remat) + ", rank_offset " + std::to_string(c.rank_offset) +
            ", local_world_size " + std::to_string(c.layout_world_size()) +
            (c.hybrid_context_parallel ? ", hybrid context parallel" : "") +
            (c.all_gather_groups ? ", all-gather groups" : "") + "\n");
  if (sel.spares) {
    out.put("  " + spares_text(*sel.spares) + "\n");
    if (sel.rank)
      out.put("  logical rank " + std::to_string(*sel.rank) + " on process " +
              std::to_string(sel.spares->process_of(*sel.rank)) + "\n");
  }
  out.put("\n");
  if (!sel.num_layers || sel.rank) return;
  // Megatron's interleaved assignment: each pipeline rank's virtual stages.
  const LayerAssignment la(*sel.num_layers, c);
  out.put("layers: " + std::to_string(la.num_layers) + " over pp " + std::to_string(la.pp) +
          (c.vpp ? " x vpp " + std::to_string(la.vpp) + " (interleaved)" : std::string()) + ", " +
          std::to_string(la.per_stage()) + (la.per_stage() == 1 ? " layer" : " layers") + " per " +
          (c.vpp ? "virtual stage" : "pipeline rank") + "\n");
  const std::size_t w = static_cast<std::size_t>(2 * digits(la.num_layers) + 3);
  out.pad("pp rank", 9);
  for (std::int64_t v = 0; v < la.vpp; ++v)
    out.pad(c.vpp ? "stage " + std::to_string(v) : "layers", std::max<std::size_t>(w, 9));
  out.put('\n');
  for (std::int64_t p = 0; p < la.pp; ++p) {
    out.pad_int(p, 9);
    for (std::int64_t v = 0; v < la.vpp; ++v)
      out.pad(layer_range(la, p, v), std::max<std::size_t>(w, 9));
    out.put('\n');
  }
  out.put('\n');
}

// One rank's groups: index, communicator rank, size, members as ranges, and with
// --gpus-per-node the nodes they are on.
void write_rank_view(OutputBuffer& out, const Layout& layout, const PlanSelection& sel) {
  const Rank r = *sel.rank;
  const RankCoordinates x = layout.coordinates(r);
  out.put("rank " + std::to_string(r) + ": tp " + std::to_string(x.tp) + ", cp " +
          std::to_string(x.cp) + ", dp " + std::to_string(x.dp) + ", pp " + std::to_string(x.pp) +
          " | etp " + std::to_string(x.etp) + ", ep " + std::to_string(x.ep) + ", expert_dp " +
          std::to_string(x.expert_dp) + "\n");
  if (sel.gpus_per_node)
    out.put("node " + std::to_string(r / *sel.gpus_per_node) + ", local device " +
            std::to_string(r % *sel.gpus_per_node) + " (" + std::to_string(*sel.gpus_per_node) +
            " GPUs per node)\n");
  if (sel.num_layers) {
    const LayerAssignment la(*sel.num_layers, layout.config());
    std::string s = "layers:";
    if (!layout.config().vpp) {
      s += " " + layer_range(la, x.pp, 0);
    } else {
      for (std::int64_t v = 0; v < la.vpp; ++v)
        s += (v ? ", " : " ") + std::string("virtual stage ") + std::to_string(v) + ": " +
             layer_range(la, x.pp, v);
    }
    out.put(s + " (pipeline rank " + std::to_string(x.pp) + " of " + std::to_string(la.pp) + ")\n");
  }
  out.put("\n");
  // Columns as wide as the largest number they can hold.
  const auto wide = static_cast<std::size_t>(digits(layout.world_size()) + 2);
  const std::size_t w8 = std::max<std::size_t>(8, wide), w6 = std::max<std::size_t>(6, wide);
  const std::vector<Column> cols = columns(layout, sel.kinds);
  const std::size_t wk = kind_width(cols);
  out.pad("kind", wk, true);
  out.pad("group", w8);
  out.pad("rank", w8);
  out.pad("size", w6);
  out.put(sel.gpus_per_node ? "  members; nodes\n" : "  members\n");
  const NodeMap nodes(sel.gpus_per_node.value_or(1));
  for (const Column& col : cols) {
    out.pad(col.title, wk, true);
    const std::optional<std::int64_t> q = layout.group_index(col.kind, r, col.level);
    if (!q) {
      out.pad("-", w8);
      out.pad("-", w8);
      out.pad("-", w6);
      out.put("  (not a member)\n");
      continue;
    }
    RangeText members("ranks"), node_text("nodes");
    std::int64_t below = 0, size = 0;
    const bool ascending = col.kind != GroupKind::intra_dist_opt;
    std::vector<std::uint64_t> seen;  // nodes of an unsorted group, one bit each
    if (sel.gpus_per_node && !ascending)
      seen.assign(static_cast<std::size_t>(nodes.nodes(layout.world_size()) / 64 + 1), 0);
    std::int64_t last_node = -1;
    std::vector<std::int64_t> node_ids;
    // One piece of the group's members: ranges, the communicator rank (members below r)
    // and the nodes, each in a tight loop.
    auto visit = [&](std::span<const Rank> piece) {
      members.add(piece);
      size += static_cast<std::int64_t>(piece.size());
      if (ascending) below += std::lower_bound(piece.begin(), piece.end(), r) - piece.begin();
      else
        for (Rank m : piece) below += m < r ? 1 : 0;
      if (!sel.gpus_per_node) return;
      const std::int64_t G = *sel.gpus_per_node;
      if (ascending) {
        // Members ascend: skip to the first member of the next node each time.
        node_ids.clear();
        for (std::size_t i = 0; i < piece.size();) {
          const std::int64_t n = piece[i] / G;
          if (n != last_node) node_ids.push_back(n);
          last_node = n;
          const Rank next = (n + 1) * G;
          while (i < piece.size() && piece[i] < next) ++i;
        }
        node_text.add(node_ids);
      } else {
        for (Rank m : piece) {
          const std::int64_t n = m / G;
          seen[static_cast<std::size_t>(n / 64)] |= std::uint64_t{1} << (n % 64);
        }
      }
    };
    if (const auto g = layout.group_size(col.kind, col.level)) {
      for_each_piece(layout, col.kind, col.level, *q * *g, *g, visit);
    } else {
      const std::optional<GroupRef> ref = layout.group_of(col.kind, r, col.level);
      visit(ref->members);
    }
    if (sel.gpus_per_node && !ascending)
      for (std::size_t w = 0; w < seen.size(); ++w)
        for (std::uint64_t bits = seen[w]; bits != 0; bits &= bits - 1)
          node_text.add(static_cast<std::int64_t>(w * 64) + __builtin_ctzll(bits));
    out.pad_int(*q, w8);
    out.pad_int(below, w8);
    out.pad_int(size, w6);
    out.put("  ");
    out.put(members.str());
    if (sel.gpus_per_node) {
      const std::string t = node_text.str();
      out.put(node_text.count() == 1 ? "; node " + t.substr(1, t.size() - 2) : "; nodes " + t);
    }
    out.put('\n');
  }
}

}  // namespace

void write_plan_table(std::ostream& stream, const Layout& layout, const PlanSelection& sel) {
  OutputBuffer out(stream);
  write_header(out, layout, sel);
  if (sel.rank) {
    write_rank_view(out, layout, sel);
    out.flush();
    return;
  }
  const ParallelConfig& c = layout.config();
  const std::vector<Column> cols = columns(layout, sel.kinds);
  const std::int64_t W = c.world_size;
  const auto D = static_cast<std::size_t>(digits(std::max<std::int64_t>(W - 1, 0)));

  // Per-kind summary: the first groups, each as ranges.
  const std::size_t wk = kind_width(cols);
  out.pad("kind", wk, true);
  out.pad("groups", 8);
  out.pad("size", 8);
  out.put("  first groups\n");
  for (const Column& col : cols) {
    const std::int64_t n = layout.num_groups(col.kind, col.level);
    std::string first, size_text;
    std::int64_t shown = std::min(n, kShownGroups);
    if (const auto g = layout.group_size(col.kind, col.level)) {
      size_text = std::to_string(*g);
      std::int64_t q = 0;
      // The first groups, as many as fit about a line (at least one).
      for (; q < std::min(n, kShownGroups) && (q == 0 || first.size() < kFirstGroupsWidth); ++q) {
        RangeText t;
        for_each_member(layout, col.kind, col.level, q * *g, *g, [&](Rank m) { t.add(m); });
        first += (q ? " " : "") + t.str();
      }
      shown = q;
    } else {  // a custom embedding policy's groups of several sizes
      const GroupList groups = layout.groups(col.kind, col.level);
      std::size_t lo = SIZE_MAX, hi = 0;
      for (std::size_t q = 0; q < groups.size(); ++q) {
        lo = std::min(lo, groups[q].size());
        hi = std::max(hi, groups[q].size());
        if (q < static_cast<std::size_t>(kShownGroups)) {
          RangeText t;
          for (Rank m : groups[q]) t.add(m);
          first += (q ? " " : "") + t.str();
        }
      }
      size_text = lo == hi ? std::to_string(hi) : std::to_string(lo) + "-" + std::to_string(hi);
    }
    if (n > shown) first += " ...";
    out.pad(col.title, wk, true);
    out.pad_int(n, 8);
    out.pad(size_text, 8);
    out.put("  ");
    out.put(first);
    out.put('\n');
  }

  // Per rank: coordinates and the index of the rank's group of each kind, computed in
  // closed form row by row (no per-kind array of W entries).
  out.put(
      "\nper rank: coordinates, then the index of the rank's group of each kind "
      "(- = in no group)\n");
  const std::size_t wr = std::max<std::size_t>(6, D + 1);
  const std::size_t w4 = std::max<std::size_t>(4, D + 1), w5 = std::max<std::size_t>(5, D + 1);
  std::vector<std::size_t> width(cols.size());
  out.pad("rank", wr);
  out.pad("tp", w4);
  out.pad("cp", w4);
  out.pad("dp", w4);
  out.pad("pp", w4);
  out.pad("etp", w5);
  out.pad("ep", w4);
  out.pad("edp", w5);
  out.put(" |");
  for (std::size_t ci = 0; ci < cols.size(); ++ci) {
    width[ci] = std::max<std::size_t>({cols[ci].title.size(), 3, D}) + 1;
    out.pad(cols[ci].title, width[ci]);
  }
  out.put('\n');
  for (Rank r = 0; r < W; ++r) {
    const RankCoordinates x = layout.coordinates(r);
    out.pad_int(r, wr);
    out.pad_int(x.tp, w4);
    out.pad_int(x.cp, w4);
    out.pad_int(x.dp, w4);
    out.pad_int(x.pp, w4);
    out.pad_int(x.etp, w5);
    out.pad_int(x.ep, w4);
    out.pad_int(x.expert_dp, w5);
    out.put(" |");
    for (std::size_t ci = 0; ci < cols.size(); ++ci) {
      const std::optional<std::int64_t> i = layout.group_index(cols[ci].kind, r, cols[ci].level);
      if (i) out.pad_int(*i, width[ci]);
      else out.pad("-", width[ci]);
    }
    out.put('\n');
  }
  out.flush();
}

}  // namespace commgrid::cli
