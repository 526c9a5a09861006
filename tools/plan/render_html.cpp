// `commgrid plan --format html`: one self-contained page (inline CSS, SVG, data and
// script; nothing is fetched) with a kind selector and hover details.
#include <string>

#include "plan/plan_output.hpp"

namespace commgrid::cli {
namespace {

// The page's behaviour. Kept in one raw string so the page needs no other file; the data
// it reads is the JSON in #commgrid-data.
//
// "#selftest" in the URL makes the page drive itself once (every selector entry, a hover
// on the first and last cell) and record the outcome in <html data-selftest>, so a test in
// headless Chromium can check the interactive parts without a browser driver.
constexpr const char* kScript = R"JS(
"use strict";
(function () {
  const data = JSON.parse(document.getElementById("commgrid-data").textContent);
  const first = data.first_rank, count = data.count, G = data.gpus_per_node;
  const select = document.getElementById("kind");
  const details = document.getElementById("details");
  const fromNode = document.getElementById("from-node"), toNode = document.getElementById("to-node");
  const svgs = Array.from(document.querySelectorAll("#panels svg.panel"));
  // Per panel: each drawn rank's group index and its cell element.
  const panels = data.panels.map(function (p, i) {
    const cells = new Array(count);
    svgs[i].querySelectorAll("g.c").forEach(function (c) { cells[+c.dataset.rank - first] = c; });
    return { title: p.title, groups: p.groups, of: p.of, text: p.text, cells: cells, svg: svgs[i] };
  });
  let marked = [];
  let pinned = data.highlight;

  function show(value) {
    panels.forEach(function (p, i) {
      p.svg.style.display = (value === "all" || +value === i) ? "" : "none";
    });
  }
  // The node window: rows outside [from, to] are hidden in every panel.
  function windowNodes() {
    const a = +fromNode.value, b = +toNode.value;
    panels.forEach(function (p) {
      p.cells.forEach(function (c) {
        const n = +c.dataset.node;
        c.style.display = (n >= a && n <= b) ? "" : "none";
      });
    });
  }
  function el(tag, text, cls) {
    const e = document.createElement(tag);
    if (text !== undefined) e.textContent = text;
    if (cls) e.className = cls;
    return e;
  }
  function mark(r) {
    marked.forEach(function (c) { c.classList.remove("hl", "cur"); });
    marked = [];
    const i = r - first;
    panels.forEach(function (p) {
      const gi = i >= 0 && i < count ? p.of[i] : -1;
      if (gi >= 0)
        p.of.forEach(function (g, j) { if (g === gi) { p.cells[j].classList.add("hl"); marked.push(p.cells[j]); } });
      if (i >= 0 && i < count) { p.cells[i].classList.add("cur"); marked.push(p.cells[i]); }
    });
  }
  function describe(r) {
    const i = r - first;
    const x = data.coords.slice(7 * i, 7 * i + 7);
    details.replaceChildren();
    details.appendChild(el("h2", "rank " + r + (pinned === r ? " (pinned)" : "")));
    details.appendChild(el("p", "node " + Math.floor(r / G) + ", device " + (r % G)));
    details.appendChild(el("p", "dense: tp " + x[0] + ", cp " + x[1] + ", dp " + x[2] + ", pp " + x[3]));
    details.appendChild(el("p", "expert: etp " + x[4] + ", ep " + x[5] + ", edp " + x[6] + ", pp " + x[3]));
    const table = el("table");
    const head = el("tr");
    ["kind", "group", "members"].forEach(function (h) { head.appendChild(el("th", h)); });
    table.appendChild(head);
    panels.forEach(function (p) {
      const gi = p.of[i];
      const row = el("tr");
      row.appendChild(el("td", p.title));
      if (gi < 0) {
        row.appendChild(el("td", "-"));
        row.appendChild(el("td", "in no group", "none"));
      } else {
        row.appendChild(el("td", "g" + gi + " of " + p.groups));
        row.appendChild(el("td", p.text[gi]));
      }
      table.appendChild(row);
    });
    details.appendChild(table);
  }
  function hover(r) {
    if (pinned !== null && pinned !== undefined) return;
    mark(r);
    describe(r);
  }
  function pin(r) {
    pinned = pinned === r ? null : r;
    mark(r);
    describe(r);
  }

  select.addEventListener("change", function () { show(select.value); });
  fromNode.addEventListener("change", windowNodes);
  toNode.addEventListener("change", windowNodes);
  const area = document.getElementById("panels");
  area.addEventListener("mouseover", function (e) {
    const c = e.target.closest ? e.target.closest("g.c") : null;
    if (c) hover(+c.dataset.rank);
  });
  area.addEventListener("click", function (e) {
    const c = e.target.closest ? e.target.closest("g.c") : null;
    if (c) pin(+c.dataset.rank);
  });
  show(select.value);
  if (pinned !== null && pinned >= first && pinned < first + count) { mark(pinned); describe(pinned); }

  if (location.hash === "#selftest") {
    const problems = [];
    const saved = pinned;
    pinned = null;
    Array.from(select.options).forEach(function (o) {
      select.value = o.value;
      select.dispatchEvent(new Event("change"));
      const visible = svgs.filter(function (s) { return s.style.display !== "none"; });
      const want = o.value === "all" ? svgs.length : 1;
      if (visible.length !== want) problems.push(o.value + ": " + visible.length + " panels shown");
      visible.forEach(function (s) {
        const cells = s.querySelectorAll("g.c");
        if (cells.length !== count) problems.push(o.value + ": " + cells.length + " cells");
        [cells[0], cells[cells.length - 1]].forEach(function (c) {
          c.querySelector("rect").dispatchEvent(new MouseEvent("mouseover", { bubbles: true }));
          if (details.querySelector("h2").textContent !== "rank " + c.dataset.rank)
            problems.push(o.value + ": no details for rank " + c.dataset.rank);
        });
      });
    });
    // The window: only the first drawn node stays visible, then all again.
    const a = fromNode.value, b = toNode.value;
    toNode.value = a;
    toNode.dispatchEvent(new Event("change"));
    const shown = panels[0].cells.filter(function (c) { return c.style.display !== "none"; }).length;
    const want = Math.min(count, G - (first % G));
    if (shown !== want) problems.push("window: " + shown + " cells shown, want " + want);
    toNode.value = b;
    toNode.dispatchEvent(new Event("change"));
    // A click pins the highlight: a later hover elsewhere leaves it.
    const c0 = panels[0].cells[0], c1 = panels[0].cells[count - 1];
    c0.querySelector("rect").dispatchEvent(new MouseEvent("click", { bubbles: true }));
    c1.querySelector("rect").dispatchEvent(new MouseEvent("mouseover", { bubbles: true }));
    if (!c0.classList.contains("cur")) problems.push("pin: clicked cell not marked");
    c0.querySelector("rect").dispatchEvent(new MouseEvent("click", { bubbles: true }));
    pinned = saved;
    select.value = select.options[0].value;
    select.dispatchEvent(new Event("change"));
    document.documentElement.dataset.selftest = problems.length ? "fail: " + problems.join("; ") : "ok";
  }
  document.documentElement.dataset.ready = "1";
})();
)JS";

constexpr const char* kCss = R"CSS(
body{font:14px sans-serif;margin:0;color:#222;background:#fafafa}
header{padding:12px 20px;background:#fff;border-bottom:1px solid #ddd}
h1{font-size:18px;margin:0 0 4px}
header p{margin:2px 0;color:#444}
label{font-weight:bold}
select{font-size:14px;margin-left:6px}
input{width:6em;font-size:14px}
main{display:flex;align-items:flex-start;gap:20px;padding:16px 20px}
#panels{display:flex;flex-wrap:wrap;gap:24px;flex:1 1 auto;min-width:0}
#panels svg{background:#fff;border:1px solid #e3e3e3;padding:8px}
#details{position:sticky;top:12px;flex:0 0 340px;max-height:90vh;overflow:auto;background:#fff;
  border:1px solid #ddd;padding:10px 14px;font-size:13px}
#details h2{font-size:16px;margin:0 0 4px}
#details p{margin:2px 0}
#details table{border-collapse:collapse;margin-top:8px;width:100%}
#details th,#details td{text-align:left;padding:2px 6px 2px 0;vertical-align:top}
#details td:nth-child(3){font-family:monospace;word-break:break-word}
#details .none{color:#888}
g.c{cursor:pointer}
g.c.hl rect{stroke:#000;stroke-width:2}
g.c.cur rect{stroke:#d00000;stroke-width:3}
)CSS";

}  // namespace

void write_plan_html(std::ostream& out, const Layout& layout, const PictureOptions& opt) {
  const std::vector<PicturePanel> panels = picture_panels(layout, opt);
  const PictureGeometry geo = picture_geometry(layout, opt, panels);
  const ParallelConfig& c = layout.config();

  // Only the drawn ranks: per panel each one's group and each drawn group's members as
  // ranges, so the page grows with the window, not the world.
  nlohmann::ordered_json data;
  data["world_size"] = c.world_size;
  data["gpus_per_node"] = opt.gpus_per_node;
  data["first_rank"] = geo.first_rank;
  data["count"] = geo.end_rank - geo.first_rank;
  data["highlight"] =
      opt.highlight ? nlohmann::ordered_json(*opt.highlight) : nlohmann::ordered_json(nullptr);
  data["config"] = config_json(layout);
  data["panels"] = nlohmann::ordered_json::array();
  for (const PicturePanel& p : panels) {
    nlohmann::ordered_json text = nlohmann::ordered_json::object();
    for (std::size_t i = 0; i < p.shown.size(); ++i)
      text[std::to_string(p.shown[i])] = p.members[i];
    data["panels"].push_back({{"title", p.title},
                              {"kind", std::string(kind_name(p.kind))},
                              {"level", p.level},
                              {"groups", p.num_groups},
                              {"of", p.group_of},
                              {"text", std::move(text)}});
  }
  // Coordinates flat, 7 per drawn rank (tp cp dp pp etp ep edp): compact for large windows.
  std::vector<std::int64_t> coords;
  coords.reserve(static_cast<std::size_t>(7 * (geo.end_rank - geo.first_rank)));
  for (Rank r = geo.first_rank; r < geo.end_rank; ++r) {
    const RankCoordinates x = layout.coordinates(r);
    coords.insert(coords.end(), {x.tp, x.cp, x.dp, x.pp, x.etp, x.ep, x.expert_dp});
  }
  data["coords"] = coords;
  std::string json = data.dump();
  // "</" inside a script element would end it; JSON allows "<\/" for the same text.
  for (std::size_t i = 0; (i = json.find("</", i)) != std::string::npos; i += 3)
    json.replace(i, 2, "<\\/");

  const std::int64_t last_node = geo.first_node + geo.rows - 1;
  const std::int64_t total_nodes = NodeMap(opt.gpus_per_node).nodes(c.world_size);
  const std::string title = "commgrid layout: world " + std::to_string(c.world_size) +
                            (c.compat == Compat::head ? ", compat head" : "") + ", order " +
                            c.order;
  out << "<!DOCTYPE html>\n<html lang=\"en\">\n<head>\n<meta charset=\"utf-8\">\n"
      << "<meta name=\"viewport\" content=\"width=device-width, initial-scale=1\">\n"
      // A data: icon, so that no browser asks a server for favicon.ico.
      << "<link rel=\"icon\" href=\"data:,\">\n"
      << "<title>" << xml_escape(title) << "</title>\n"
      << "<style>" << kCss << svg_panel_css()
      << "</style>\n"
      // Installed first, so that an error anywhere later is still recorded for tests.
      << "<script>addEventListener(\"error\",function(e){var d=document.documentElement;"
         "d.dataset.errors=(d.dataset.errors||\"\")+e.message+\";\"});</script>\n"
      << "</head>\n<body>\n<header>\n<h1>" << xml_escape(title) << " (innermost first)</h1>\n"
      << "<p>dense tp " << c.tp << " &times; cp " << c.cp << " &times; dp " << layout.dp()
      << " &times; pp " << c.pp << " &nbsp;|&nbsp; expert etp " << c.expert_tp() << " &times; ep "
      << c.ep << " &times; edp " << layout.expert_dp() << " &times; pp " << c.pp << "</p>\n"
      << "<p>" << total_nodes << (total_nodes == 1 ? " node" : " nodes") << " of "
      << opt.gpus_per_node << " GPUs; drawn: nodes " << geo.first_node << "-" << last_node
      << ". Rows are nodes, columns local devices; each colour is one group"
      << " (g12 = group 12" << (geo.labels ? ", printed in the cells where colours run out" : "")
      << "). "
      << (geo.coordinates
              ? "Cells show the rank and its coordinates (t c d p; expert panels t e d p)."
              : "Cells show the rank.")
      << " Hover a cell for its coordinates and groups; click to pin it.</p>\n"
      << "<p><label for=\"kind\">kind</label><select id=\"kind\">";
  for (std::size_t i = 0; i < panels.size(); ++i)
    out << "<option value=\"" << i << "\">" << panels[i].title << "</option>";
  out << "<option value=\"all\">all kinds side by side</option></select>"
      << " &nbsp; <label for=\"from-node\">nodes</label> <input id=\"from-node\" type=\"number\" min=\""
      << geo.first_node << "\" max=\"" << last_node << "\" value=\"" << geo.first_node
      << "\"> to <input id=\"to-node\" type=\"number\" min=\"" << geo.first_node << "\" max=\""
      << last_node << "\" value=\"" << last_node << "\"></p>\n</header>\n"
      << "<main>\n<div id=\"panels\">\n";
  for (const PicturePanel& p : panels) {
    out << "<svg class=\"panel\" xmlns=\"http://www.w3.org/2000/svg\" width=\"" << geo.panel_w
        << "\" height=\"" << geo.panel_h << "\" viewBox=\"0 0 " << geo.panel_w << " " << geo.panel_h
        << "\">\n";
    write_svg_panel(out, layout, geo, p, 0, 0, /*tooltips=*/false);
    out << "</svg>\n";
  }
  out << "</div>\n<aside id=\"details\"><h2>hover a rank</h2><p>its node, coordinates and "
         "the members of each of its groups appear here</p></aside>\n</main>\n"
      << "<script type=\"application/json\" id=\"commgrid-data\">" << json << "</script>\n"
      << "<script>" << kScript << "</script>\n</body>\n</html>\n";
}

}  // namespace commgrid::cli
