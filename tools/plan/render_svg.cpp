// `commgrid plan --format svg`: the ranks as nodes (rows) by local devices (columns), one
// panel per kind, each group in its own colour.
#include <algorithm>
#include <cmath>
#include <cstdio>
#include <set>
#include <string>

#include "commgrid/error.hpp"
#include "plan/plan_output.hpp"

namespace commgrid::cli {
namespace {

constexpr int kMargin = 16;
constexpr int kPanelGap = 28;
constexpr int kTitleH = 24;
constexpr int kLegendLineH = 16;
constexpr std::size_t kLegendGroups = 8;   // groups listed in a legend; the rest on hover
constexpr std::size_t kLegendMembers = 8;  // members printed per legend line
constexpr int kColumnHeaderH = 14;
constexpr int kHeaderLineH = 18;
constexpr int kLegendGap = 16;        // between the grid and its legend
constexpr double kLegendCharW = 6.4;  // 11px sans-serif, generously

std::string hex_colour(double h, double s, double l) {
  // HSL to RGB (CSS Color 4 formula), so the palette is computed here and every SVG
  // viewer shows the same hex value.
  auto f = [&](double n) {
    const double k = std::fmod(n + h / 30.0, 12.0);
    const double a = s * std::min(l, 1.0 - l);
    return l - a * std::max(-1.0, std::min({k - 3.0, 9.0 - k, 1.0}));
  };
  char buf[8];
  auto byte = [](double v) { return static_cast<int>(std::lround(std::clamp(v, 0.0, 1.0) * 255)); };
  std::snprintf(buf, sizeof buf, "#%02x%02x%02x", byte(f(0)), byte(f(8)), byte(f(4)));
  return buf;
}

// Dark text on light fills, white on dark ones (relative luminance, sRGB approximated).
bool is_dark(const std::string& hex) {
  const long v = std::strtol(hex.c_str() + 1, nullptr, 16);
  const double r = ((v >> 16) & 255) / 255.0, g = ((v >> 8) & 255) / 255.0, b = (v & 255) / 255.0;
  return 0.2126 * r + 0.7152 * g + 0.0722 * b < 0.45;
}

// Kinds built on the expert grid: their cells show expert coordinates.
bool expert_kind(GroupKind k) {
  switch (k) {
    case GroupKind::ep:
    case GroupKind::expt_tp:
    case GroupKind::tp_ep:
    case GroupKind::tp_ep_pp:
    case GroupKind::expt_dp:
    case GroupKind::intra_expt_dp:
    case GroupKind::inter_dist_opt:
    case GroupKind::intra_dist_opt: return true;
    default: return false;
  }
}

// Legend lines of a panel: up to kLegendGroups groups, "... and N more", "in no group".
std::size_t legend_lines(const PicturePanel& p) {
  std::size_t n = std::min(p.shown.size(), kLegendGroups);
  if (p.shown.size() > kLegendGroups) ++n;
  if (std::find(p.group_of.begin(), p.group_of.end(), -1) != p.group_of.end()) ++n;
  return n;
}

// "g3: [0,8]": the group's index as the cells' labels print it (where colours run out),
// in every legend, so that a picture reads one way whatever its number of groups.
std::string legend_text(const PicturePanel& p, std::size_t i) {
  return "g" + std::to_string(p.shown[i]) + ": " + p.members[i];
}

std::string group_summary(const PicturePanel& p) {
  return std::to_string(p.num_groups) + (p.num_groups == 1 ? " group of " : " groups of ") +
         p.group_size + " ranks" +
         (p.shown.size() < static_cast<std::size_t>(p.num_groups)
              ? ", " + std::to_string(p.shown.size()) + " drawn"
              : std::string());
}

// The drawn ranks: the whole world, or the nodes of the window.
std::pair<Rank, Rank> drawn_ranks(const Layout& layout, const PictureOptions& opt) {
  const std::int64_t G = opt.gpus_per_node, W = layout.world_size();
  if (!opt.first_node) return {0, W};
  return {*opt.first_node * G, std::min(W, (*opt.last_node + 1) * G)};
}

}  // namespace

std::string xml_escape(std::string_view s) {
  std::string out;
  for (char c : s) {
    switch (c) {
      case '&': out += "&amp;"; break;
      case '<': out += "&lt;"; break;
      case '>': out += "&gt;"; break;
      case '"': out += "&quot;"; break;
      default: out += c;
    }
  }
  return out;
}

std::vector<std::string> group_colours(std::size_t n) {
  constexpr double kGoldenAngle = 137.50776405003785;
  constexpr double kLightness[] = {0.62, 0.45, 0.76};
  constexpr double kSaturation[] = {0.68, 0.50};
  std::vector<std::string> out;
  out.reserve(n);
  std::set<std::string> used = {kNoGroupColour};
  for (std::size_t i = 0; i < n; ++i) {
    const double h = std::fmod(static_cast<double>(i) * kGoldenAngle, 360.0);
    const double s = kSaturation[(i / 3) % 2];
    double l = kLightness[i % 3];
    std::string c = hex_colour(h, s, l);
    // Nudge alternately darker and lighter until the colour is new; 24-bit colours leave
    // room for far more groups than a picture can hold.
    for (int step = 1; used.count(c) > 0; ++step) {
      const int nudge = (step + 1) / 2;  // 1, 1, 2, 2, 3, ...: whole steps on purpose
      const double d = 0.004 * static_cast<double>(nudge) * (step % 2 ? -1 : 1);
      c = hex_colour(std::fmod(h + 0.37 * step, 360.0), s, std::clamp(l + d, 0.15, 0.9));
    }
    used.insert(c);
    out.push_back(std::move(c));
  }
  return out;
}

std::size_t PicturePanel::slot(std::int64_t q) const {
  return static_cast<std::size_t>(std::lower_bound(shown.begin(), shown.end(), q) - shown.begin());
}

void check_picture(const Layout& layout, const PictureOptions& opt) {
  const auto [first, end] = drawn_ranks(layout, opt);
  if (end - first > kMaxPictureRanks) {
    const std::int64_t G = opt.gpus_per_node;
    const std::int64_t fit = std::max<std::int64_t>(1, kMaxPictureRanks / G);
    throw ConfigError(opt.first_node ? "nodes" : "world_size",
                      "format: a picture draws at most " + std::to_string(kMaxPictureRanks) +
                          " ranks, here " + std::to_string(end - first) +
                          "; draw a window of "
                          "nodes with --nodes A-B (up to " +
                          std::to_string(fit) + " nodes of " + std::to_string(G) +
                          " GPUs, e.g. --nodes 0-" + std::to_string(fit - 1) +
                          "), or use --format table or json");
  }
  if (opt.highlight) layout.check_rank(*opt.highlight);
}

std::vector<PicturePanel> picture_panels(const Layout& layout, const PictureOptions& opt) {
  check_picture(layout, opt);
  const auto [first, end] = drawn_ranks(layout, opt);
  std::vector<PicturePanel> panels;
  for (GroupKind k : opt.kinds) {
    for (int l = 0; l < layout.levels(k); ++l) {
      PicturePanel p;
      p.kind = k;
      p.level = l;
      p.title = std::string(kind_name(k)) + (k == GroupKind::hcp ? std::to_string(l) : "");
      p.num_groups = layout.num_groups(k, l);
      const std::optional<std::int64_t> size = layout.group_size(k, l);
      if (size) {
        p.group_size = std::to_string(*size);
      } else {
        const GroupList all = layout.groups(k, l);
        std::size_t lo = SIZE_MAX, hi = 0;
        for (std::size_t i = 0; i < all.size(); ++i) {
          lo = std::min(lo, all[i].size());
          hi = std::max(hi, all[i].size());
        }
        p.group_size =
            lo == hi ? std::to_string(hi) : std::to_string(lo) + "-" + std::to_string(hi);
      }
      p.group_of.resize(static_cast<std::size_t>(end - first));
      for (Rank r = first; r < end; ++r) {
        const auto q = layout.group_index(k, r, l);
        p.group_of[static_cast<std::size_t>(r - first)] = q ? *q : -1;
        if (q) p.shown.push_back(*q);
      }
      std::sort(p.shown.begin(), p.shown.end());
      p.shown.erase(std::unique(p.shown.begin(), p.shown.end()), p.shown.end());
      p.colours = group_colours(p.shown.size());
      p.labels = p.shown.size() > kDistinctColours;
      if (opt.highlight)
        if (const auto q = layout.group_index(k, *opt.highlight, l)) p.highlighted = *q;
      // Members as ranges, streamed: a group may be far larger than the window.
      for (std::int64_t q : p.shown) {
        RangeText t;
        if (size) {
          std::vector<Rank> buf(static_cast<std::size_t>(std::min<std::int64_t>(*size, 1 << 14)));
          for (std::int64_t done = 0; done < *size;) {
            const auto n =
                std::min<std::int64_t>(static_cast<std::int64_t>(buf.size()), *size - done);
            const std::span<Rank> piece(buf.data(), static_cast<std::size_t>(n));
            layout.members(k, l, q * *size + done, piece);
            for (Rank m : piece) t.add(m);
            done += n;
          }
        } else {
          const GroupList all = layout.groups(k, l);
          for (Rank m : all[static_cast<std::size_t>(q)]) t.add(m);
        }
        p.members.push_back(t.str());
      }
      panels.push_back(std::move(p));
    }
  }
  return panels;
}

PictureGeometry picture_geometry(const Layout& layout, const PictureOptions& opt,
                                 const std::vector<PicturePanel>& panels) {
  PictureGeometry g;
  const NodeMap nodes(opt.gpus_per_node);
  const auto [first, end] = drawn_ranks(layout, opt);
  g.first_rank = first;
  g.end_rank = end;
  g.first_node = nodes.node(first);
  g.highlight = opt.highlight.value_or(-1);
  g.coordinates = end - first <= kMaxRanksWithCoordinates;
  for (const PicturePanel& p : panels) g.labels = g.labels || p.labels;
  g.columns = static_cast<int>(std::min(opt.gpus_per_node, end - first));
  g.rows = static_cast<int>(nodes.node(end - 1) - g.first_node + 1);
  g.cell_w = g.coordinates ? 70 : 36;
  g.cell_h = (g.coordinates ? 32 : 16) + (g.labels ? 11 : 0);
  // Room for the widest node label ("node 262143").
  g.label_w = 34 + static_cast<int>(6 * std::to_string(g.first_node + g.rows).size());
  std::size_t lines = 0, chars = 24;  // "in no group of this kind"
  for (const PicturePanel& p : panels) {
    lines = std::max(lines, legend_lines(p));
    for (std::size_t i = 0; i < p.shown.size() && i < kLegendGroups; ++i)
      chars = std::max(chars, legend_text(p, i).size());
  }
  g.legend_h = static_cast<int>(lines) * kLegendLineH;
  g.legend_w = 18 + static_cast<int>(static_cast<double>(chars) * kLegendCharW);
  // The legend stands right of the grid, inside the panel's width and height, so it can
  // never run into a neighbouring panel.
  g.panel_w = g.label_w + g.columns * g.cell_w + kLegendGap + g.legend_w;
  g.panel_h = kTitleH + kColumnHeaderH + std::max(g.legend_h, g.rows * g.cell_h);
  return g;
}

const char* svg_panel_css() {
  return ".t{font:bold 15px sans-serif}"
         ".s,.lg{font:11px sans-serif;fill:#333}"
         ".ax{font:10px sans-serif;fill:#666}"
         ".c rect{stroke:#fff;stroke-width:1}"
         ".c text{text-anchor:middle;fill:#111;pointer-events:none}"
         ".c.w text{fill:#fff}"
         ".c .r{font:bold 11px sans-serif}"
         ".c .x{font:9px sans-serif}"
         ".c .rs{font:9px sans-serif}"
         ".c .gl{font:italic 8px sans-serif}"
         ".c.hl rect{stroke:#000;stroke-width:2}"
         ".c.cur rect{stroke:#d00000;stroke-width:3}"
         ".h{font:bold 16px sans-serif}"
         ".hs{font:12px sans-serif;fill:#333}";
}

void write_svg_panel(std::ostream& out, const Layout& layout, const PictureGeometry& geo,
                     const PicturePanel& p, int x0, int y0, bool tooltips) {
  const bool expert = expert_kind(p.kind);
  out << "<g class=\"panel\" data-kind=\"" << kind_name(p.kind) << "\" data-level=\"" << p.level
      << "\" data-title=\"" << p.title << "\" transform=\"translate(" << x0 << "," << y0
      << ")\">\n";
  out << "<text class=\"t\" x=\"0\" y=\"16\">" << p.title << "</text>"
      << "<text class=\"s\" x=\"" << 10 + 9 * static_cast<int>(p.title.size()) << "\" y=\"16\">"
      << group_summary(p) << (expert ? " (expert grid)" : "") << "</text>\n";

  // Legend: the first drawn groups with their members as ranges; the rest on hover.
  const int lx = geo.label_w + geo.columns * geo.cell_w + kLegendGap;
  int y = kTitleH + kColumnHeaderH;
  for (std::size_t i = 0; i < p.shown.size() && i < kLegendGroups; ++i, y += kLegendLineH)
    out << "<rect x=\"" << lx << "\" y=\"" << y + 2 << "\" width=\"12\" height=\"12\" fill=\""
        << p.colours[i] << "\"/><text class=\"lg\" x=\"" << lx + 18 << "\" y=\"" << y + 12 << "\">"
        << legend_text(p, i) << "</text>\n";
  if (p.shown.size() > kLegendGroups) {
    out << "<text class=\"lg\" x=\"" << lx + 18 << "\" y=\"" << y + 12 << "\">... and "
        << p.shown.size() - kLegendGroups << " more groups</text>\n";
    y += kLegendLineH;
  }
  if (std::find(p.group_of.begin(), p.group_of.end(), -1) != p.group_of.end())
    out << "<rect x=\"" << lx << "\" y=\"" << y + 2 << "\" width=\"12\" height=\"12\" fill=\""
        << kNoGroupColour << "\" stroke=\"#999\"/><text class=\"lg\" x=\"" << lx + 18 << "\" y=\""
        << y + 12 << "\">in no group of this kind</text>\n";

  // Column headers (local device) and row labels (node).
  const int grid_y = kTitleH + kColumnHeaderH;
  for (int c = 0; c < geo.columns; ++c)
    out << "<text class=\"ax\" text-anchor=\"middle\" x=\""
        << geo.label_w + c * geo.cell_w + geo.cell_w / 2 << "\" y=\"" << grid_y - 3 << "\">" << c
        << "</text>";
  out << "\n";
  for (int n = 0; n < geo.rows; ++n)
    out << "<text class=\"ax\" x=\"0\" y=\"" << grid_y + n * geo.cell_h + geo.cell_h / 2 + 4
        << "\">node " << geo.first_node + n << "</text>";
  out << "\n";

  const NodeMap nodes(geo.columns);
  const std::int64_t G = geo.columns;
  for (Rank r = geo.first_rank; r < geo.end_rank; ++r) {
    const std::int64_t g = p.group_of[static_cast<std::size_t>(r - geo.first_rank)];
    const std::string& fill = g < 0 ? std::string(kNoGroupColour) : p.colours[p.slot(g)];
    const std::int64_t node = r / G;
    const int cx = geo.label_w + static_cast<int>(r % G) * geo.cell_w;
    const int cy = grid_y + static_cast<int>(node - geo.first_node) * geo.cell_h;
    const RankCoordinates xc = layout.coordinates(r);
    std::string cls = "c";
    if (is_dark(fill)) cls += " w";
    if (g >= 0 && g == p.highlighted) cls += " hl";
    if (r == geo.highlight) cls += " cur";
    out << "<g class=\"" << cls << "\" data-rank=\"" << r << "\" data-node=\"" << node << "\">"
        << "<rect x=\"" << cx << "\" y=\"" << cy << "\" width=\"" << geo.cell_w << "\" height=\""
        << geo.cell_h << "\" fill=\"" << fill << "\"/>";
    const int mid = cx + geo.cell_w / 2;
    int line = cy;
    if (geo.coordinates) {
      out << "<text class=\"r\" x=\"" << mid << "\" y=\"" << cy + 13 << "\">" << r << "</text>"
          << "<text class=\"x\" x=\"" << mid << "\" y=\"" << cy + 26 << "\">";
      if (expert) out << "t" << xc.etp << " e" << xc.ep << " d" << xc.expert_dp << " p" << xc.pp;
      else out << "t" << xc.tp << " c" << xc.cp << " d" << xc.dp << " p" << xc.pp;
      out << "</text>";
      line = cy + 26;
    } else {
      out << "<text class=\"rs\" x=\"" << mid << "\" y=\"" << cy + 12 << "\">" << r << "</text>";
      line = cy + 12;
    }
    if (p.labels && g >= 0)
      out << "<text class=\"gl\" x=\"" << mid << "\" y=\"" << line + 10 << "\">g" << g << "</text>";
    if (tooltips) {
      out << "<title>rank " << r << ", node " << node << ", device " << r % G << "; tp " << xc.tp
          << " cp " << xc.cp << " dp " << xc.dp << " pp " << xc.pp << "; etp " << xc.etp << " ep "
          << xc.ep << " edp " << xc.expert_dp << "; " << p.title;
      if (g < 0) out << ": no group";
      else out << " group " << g << " of " << p.num_groups << ": " << p.members[p.slot(g)];
      out << "</title>";
    }
    out << "</g>\n";
  }
  out << "</g>\n";
}

void write_plan_svg(std::ostream& out, const Layout& layout, const PictureOptions& opt) {
  const std::vector<PicturePanel> panels = picture_panels(layout, opt);
  const PictureGeometry geo = picture_geometry(layout, opt, panels);
  const ParallelConfig& c = layout.config();
  const int n = static_cast<int>(panels.size());
  // Panels in rows of `per_row`, chosen so the picture is closest to a 16:10 screen: small
  // worlds wrap into a block, tall 1024-rank panels stay side by side.
  int per_row = 1;
  double best = INFINITY;
  for (int c = 1; c <= n; ++c) {
    const int rows = (n + c - 1) / c;
    const double w = c * (geo.panel_w + kPanelGap), h = rows * (geo.panel_h + kPanelGap);
    const double miss = std::abs(std::log(w / h / 1.6));
    if (miss < best - 1e-9) best = miss, per_row = c;
  }
  const int panel_rows = (n + per_row - 1) / per_row;
  const int header_h = 4 * kHeaderLineH + 10;
  const int width = std::max(2 * kMargin + per_row * geo.panel_w + (per_row - 1) * kPanelGap, 820);
  const int height =
      2 * kMargin + header_h + panel_rows * geo.panel_h + (panel_rows - 1) * kPanelGap;

  out << "<?xml version=\"1.0\" encoding=\"UTF-8\"?>\n"
      << "<svg xmlns=\"http://www.w3.org/2000/svg\" width=\"" << width << "\" height=\"" << height
      << "\" viewBox=\"0 0 " << width << " " << height << "\">\n"
      << "<title>commgrid layout: world " << c.world_size
      << (c.compat == Compat::head ? ", compat head" : "") << ", order " << xml_escape(c.order)
      << "</title>\n"
      << "<style>" << svg_panel_css() << "</style>\n"
      << "<rect width=\"100%\" height=\"100%\" fill=\"#fff\"/>\n";
  const int hx = kMargin;
  int hy = kMargin + 14;
  out << "<text class=\"h\" x=\"" << hx << "\" y=\"" << hy << "\">commgrid layout: world "
      << c.world_size << ", order " << xml_escape(c.order) << " (innermost first)"
      << (c.compat == Compat::head ? ", compat head (Megatron-core HEAD's groups)" : "")
      << "</text>\n";
  hy += kHeaderLineH;
  const std::int64_t total_nodes = NodeMap(opt.gpus_per_node).nodes(c.world_size);
  out << "<text class=\"hs\" x=\"" << hx << "\" y=\"" << hy << "\">dense tp " << c.tp << " x cp "
      << c.cp << " x dp " << layout.dp() << " x pp " << c.pp << "  |  expert etp " << c.expert_tp()
      << " x ep " << c.ep << " x edp " << layout.expert_dp() << " x pp " << c.pp << "  |  "
      << total_nodes << (total_nodes == 1 ? " node" : " nodes") << " of " << opt.gpus_per_node
      << " GPUs: rows are nodes, columns local devices</text>\n";
  hy += kHeaderLineH;
  out << "<text class=\"hs\" x=\"" << hx << "\" y=\"" << hy << "\">";
  if (geo.coordinates)
    out << "cell: rank, then coordinates t c d p = tp cp dp pp (expert-grid panels: t e d p = "
           "etp ep edp pp); each colour is one group";
  else
    out << "cell: rank (coordinates are printed up to " << kMaxRanksWithCoordinates
        << " ranks; here they are in each cell's tooltip); each colour is one group";
  out << "; g12 = group 12" << (geo.labels ? " (cells print it where colours run out)" : "");
  out << "</text>\n";
  hy += kHeaderLineH;
  out << "<text class=\"hs\" x=\"" << hx << "\" y=\"" << hy << "\">";
  if (geo.first_rank != 0 || geo.end_rank != c.world_size)
    out << "drawn: nodes " << geo.first_node << "-" << geo.first_node + geo.rows - 1 << " (ranks "
        << geo.first_rank << "-" << geo.end_rank - 1 << ") of " << total_nodes;
  else out << "drawn: every node";
  if (opt.highlight) out << "; outlined: the groups of rank " << *opt.highlight << " (red)";
  out << "</text>\n";

  for (int i = 0; i < n; ++i)
    write_svg_panel(out, layout, geo, panels[static_cast<std::size_t>(i)],
                    kMargin + (i % per_row) * (geo.panel_w + kPanelGap),
                    kMargin + header_h + (i / per_row) * (geo.panel_h + kPanelGap),
                    /*tooltips=*/true);
  out << "</svg>\n";
}

}  // namespace commgrid::cli
