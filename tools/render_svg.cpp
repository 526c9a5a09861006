// `commgrid plan --format svg`: the ranks as nodes (rows) by local devices (columns), one
// panel per kind, each group in its own colour.
#include <algorithm>
#include <cmath>
#include <cstdio>
#include <set>
#include <string>

#include "commgrid/error.hpp"
#include "plan_output.hpp"

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
constexpr int kLegendGap = 16;             // between the grid and its legend
constexpr int kLegendW = 230;              // room for the legend text

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

std::string members_text(std::span<const Rank> m) {
  std::string s;
  for (std::size_t i = 0; i < m.size() && i < kLegendMembers; ++i) s += (i ? " " : "") + std::to_string(m[i]);
  if (m.size() > kLegendMembers) s += " ... (" + std::to_string(m.size()) + ")";
  return s;
}

std::size_t legend_lines(const PicturePanel& p) {
  std::size_t n = std::min(p.groups.size(), kLegendGroups);
  if (p.groups.size() > kLegendGroups) ++n;  // "... and N more"
  if (std::find(p.group_of.begin(), p.group_of.end(), -1) != p.group_of.end()) ++n;
  return n;
}

std::string group_summary(const PicturePanel& p) {
  std::size_t lo = SIZE_MAX, hi = 0;
  for (std::size_t i = 0; i < p.groups.size(); ++i) {
    lo = std::min(lo, p.groups[i].size());
    hi = std::max(hi, p.groups[i].size());
  }
  std::string size = std::to_string(hi);
  if (lo != hi) size = std::to_string(lo) + "-" + size;
  return std::to_string(p.groups.size()) + (p.groups.size() == 1 ? " group of " : " groups of ") +
         size + " ranks";
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
      const double d = 0.004 * ((step + 1) / 2) * (step % 2 ? -1 : 1);
      c = hex_colour(std::fmod(h + 0.37 * step, 360.0), s, std::clamp(l + d, 0.15, 0.9));
    }
    used.insert(c);
    out.push_back(std::move(c));
  }
  return out;
}

std::vector<PicturePanel> picture_panels(const Layout& layout, const PictureOptions& opt) {
  if (layout.world_size() > kMaxPictureRanks)
    throw ConfigError("world_size", "format: a picture draws at most " +
                                        std::to_string(kMaxPictureRanks) + " ranks, world size is " +
                                        std::to_string(layout.world_size()) +
                                        "; use --format table or json");
  std::vector<PicturePanel> panels;
  const auto W = static_cast<std::size_t>(layout.world_size());
  for (GroupKind k : opt.kinds) {
    for (int l = 0; l < layout.levels(k); ++l) {
      PicturePanel p;
      p.kind = k;
      p.level = l;
      p.title = std::string(kind_name(k)) + (k == GroupKind::hcp ? std::to_string(l) : "");
      p.groups = layout.groups(k, l);
      p.group_of.assign(W, -1);
      for (std::size_t g = 0; g < p.groups.size(); ++g)
        for (Rank r : p.groups[g]) p.group_of[static_cast<std::size_t>(r)] = static_cast<std::int64_t>(g);
      p.colours = group_colours(p.groups.size());
      panels.push_back(std::move(p));
    }
  }
  return panels;
}

PictureGeometry picture_geometry(const Layout& layout, const PictureOptions& opt,
                                 const std::vector<PicturePanel>& panels) {
  PictureGeometry g;
  const NodeMap nodes(opt.gpus_per_node);
  g.coordinates = layout.world_size() <= kMaxRanksWithCoordinates;
  g.columns = static_cast<int>(std::min(opt.gpus_per_node, layout.world_size()));
  g.rows = static_cast<int>(nodes.nodes(layout.world_size()));
  g.cell_w = g.coordinates ? 70 : 36;
  g.cell_h = g.coordinates ? 32 : 16;
  g.label_w = 58;
  std::size_t lines = 0;
  for (const PicturePanel& p : panels) lines = std::max(lines, legend_lines(p));
  g.legend_h = static_cast<int>(lines) * kLegendLineH;
  // The legend stands right of the grid: small worlds stay compact, tall ones lose nothing.
  g.panel_w = g.label_w + g.columns * g.cell_w + kLegendGap + kLegendW;
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
         ".h{font:bold 16px sans-serif}"
         ".hs{font:12px sans-serif;fill:#333}";
}

void write_svg_panel(std::ostream& out, const Layout& layout, const PictureGeometry& geo,
                     const PicturePanel& p, int x0, int y0, bool tooltips) {
  const bool expert = expert_kind(p.kind);
  out << "<g class=\"panel\" data-kind=\"" << kind_name(p.kind) << "\" data-level=\"" << p.level
      << "\" data-title=\"" << p.title << "\" transform=\"translate(" << x0 << "," << y0 << ")\">\n";
  out << "<text class=\"t\" x=\"0\" y=\"16\">" << p.title << "</text>"
      << "<text class=\"s\" x=\"" << 10 + 9 * static_cast<int>(p.title.size()) << "\" y=\"16\">"
      << group_summary(p) << (expert ? " (expert grid)" : "") << "</text>\n";

  // Legend: the first groups with their members; the rest are in the cells' tooltips.
  const int lx = geo.label_w + geo.columns * geo.cell_w + kLegendGap;
  int y = kTitleH + kColumnHeaderH;
  for (std::size_t g = 0; g < p.groups.size() && g < kLegendGroups; ++g, y += kLegendLineH)
    out << "<rect x=\"" << lx << "\" y=\"" << y + 2 << "\" width=\"12\" height=\"12\" fill=\""
        << p.colours[g] << "\"/><text class=\"lg\" x=\"" << lx + 18 << "\" y=\"" << y + 12 << "\">"
        << g << ": " << members_text(p.groups[g]) << "</text>\n";
  if (p.groups.size() > kLegendGroups) {
    out << "<text class=\"lg\" x=\"" << lx + 18 << "\" y=\"" << y + 12 << "\">... and "
        << p.groups.size() - kLegendGroups << " more groups</text>\n";
    y += kLegendLineH;
  }
  if (std::find(p.group_of.begin(), p.group_of.end(), -1) != p.group_of.end())
    out << "<rect x=\"" << lx << "\" y=\"" << y + 2 << "\" width=\"12\" height=\"12\" fill=\""
        << kNoGroupColour << "\" stroke=\"#999\"/><text class=\"lg\" x=\"" << lx + 18 << "\" y=\"" << y + 12
        << "\">in no group of this kind</text>\n";

  // Column headers (local device) and row labels (node).
  const int grid_y = kTitleH + kColumnHeaderH;
  for (int c = 0; c < geo.columns; ++c)
    out << "<text class=\"ax\" text-anchor=\"middle\" x=\"" << geo.label_w + c * geo.cell_w + geo.cell_w / 2
        << "\" y=\"" << grid_y - 3 << "\">" << c << "</text>";
  out << "\n";
  for (int n = 0; n < geo.rows; ++n)
    out << "<text class=\"ax\" x=\"0\" y=\"" << grid_y + n * geo.cell_h + geo.cell_h / 2 + 4
        << "\">node " << n << "</text>";
  out << "\n";

  const NodeMap nodes(geo.columns);
  for (Rank r = 0; r < layout.world_size(); ++r) {
    const std::int64_t g = p.group_of[static_cast<std::size_t>(r)];
    const std::string& fill = g < 0 ? std::string(kNoGroupColour) : p.colours[static_cast<std::size_t>(g)];
    const int cx = geo.label_w + static_cast<int>(nodes.device(r)) * geo.cell_w;
    const int cy = grid_y + static_cast<int>(nodes.node(r)) * geo.cell_h;
    const RankCoordinates xc = layout.coordinates(r);
    out << "<g class=\"c" << (is_dark(fill) ? " w" : "") << "\" data-rank=\"" << r << "\">"
        << "<rect x=\"" << cx << "\" y=\"" << cy << "\" width=\"" << geo.cell_w << "\" height=\""
        << geo.cell_h << "\" fill=\"" << fill << "\"/>";
    const int mid = cx + geo.cell_w / 2;
    if (geo.coordinates) {
      out << "<text class=\"r\" x=\"" << mid << "\" y=\"" << cy + 13 << "\">" << r << "</text>"
          << "<text class=\"x\" x=\"" << mid << "\" y=\"" << cy + 26 << "\">";
      if (expert)
        out << "t" << xc.etp << " e" << xc.ep << " d" << xc.expert_dp << " p" << xc.pp;
      else
        out << "t" << xc.tp << " c" << xc.cp << " d" << xc.dp << " p" << xc.pp;
      out << "</text>";
    } else {
      out << "<text class=\"rs\" x=\"" << mid << "\" y=\"" << cy + 12 << "\">" << r << "</text>";
    }
    if (tooltips) {
      out << "<title>rank " << r << ", node " << nodes.node(r) << ", device " << nodes.device(r)
          << "; tp " << xc.tp << " cp " << xc.cp << " dp " << xc.dp << " pp " << xc.pp << "; etp "
          << xc.etp << " ep " << xc.ep << " edp " << xc.expert_dp << "; " << p.title;
      if (g < 0)
        out << ": no group";
      else
        out << " group " << g << " of " << p.groups.size();
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
  const int header_h = 3 * kHeaderLineH + 10;
  const int width =
      std::max(2 * kMargin + per_row * geo.panel_w + (per_row - 1) * kPanelGap, 820);
  const int height =
      2 * kMargin + header_h + panel_rows * geo.panel_h + (panel_rows - 1) * kPanelGap;

  out << "<?xml version=\"1.0\" encoding=\"UTF-8\"?>\n"
      << "<svg xmlns=\"http://www.w3.org/2000/svg\" width=\"" << width << "\" height=\"" << height
      << "\" viewBox=\"0 0 " << width << " " << height << "\">\n"
      << "<style>" << svg_panel_css() << "</style>\n"
      << "<rect width=\"100%\" height=\"100%\" fill=\"#fff\"/>\n";
  const int hx = kMargin;
  int hy = kMargin + 14;
  out << "<text class=\"h\" x=\"" << hx << "\" y=\"" << hy << "\">commgrid layout: world "
      << c.world_size << ", order " << xml_escape(c.order) << " (innermost first)</text>\n";
  hy += kHeaderLineH;
  out << "<text class=\"hs\" x=\"" << hx << "\" y=\"" << hy << "\">dense tp " << c.tp << " x cp "
      << c.cp << " x dp " << layout.dp() << " x pp " << c.pp << "  |  expert etp " << c.expert_tp()
      << " x ep " << c.ep << " x edp " << layout.expert_dp() << " x pp " << c.pp << "  |  "
      << geo.rows << (geo.rows == 1 ? " node" : " nodes") << " of " << opt.gpus_per_node
      << " GPUs: rows are nodes, columns local devices</text>\n";
  hy += kHeaderLineH;
  out << "<text class=\"hs\" x=\"" << hx << "\" y=\"" << hy << "\">";
  if (geo.coordinates)
    out << "cell: rank, then coordinates t c d p = tp cp dp pp (expert-grid panels: t e d p = "
           "etp ep edp pp); each colour is one group";
  else
    out << "cell: rank (coordinates are printed up to " << kMaxRanksWithCoordinates
        << " ranks; here they are in each cell's tooltip); each colour is one group";
  out << "</text>\n";

  for (int i = 0; i < n; ++i)
    write_svg_panel(out, layout, geo, panels[static_cast<std::size_t>(i)],
                    kMargin + (i % per_row) * (geo.panel_w + kPanelGap),
                    kMargin + header_h + (i / per_row) * (geo.panel_h + kPanelGap),
                    /*tooltips=*/true);
  out << "</svg>\n";
}

}  // namespace commgrid::cli
