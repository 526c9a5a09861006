#!/usr/bin/env python3
"""`commgrid plan --format svg`: the picture is valid XML with, in every panel, exactly one
cell per rank, placed at (node row, device column), and colours that follow the groups of
`--format json` (same group <=> same colour), coordinates that match the member order.

Usage: check_svg.py PATH/TO/commgrid
"""
import os
import re
import sys
import tempfile
import xml.etree.ElementTree as ET

sys.dont_write_bytecode = True  # keep the source tree clean
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from common import check, finish, plan_groups, run  # noqa: E402

NS = "{http://www.w3.org/2000/svg}"
NO_GROUP = "#f2f2f2"
EXPERT = {"ep", "expt_tp", "tp_ep", "tp_ep_pp", "expt_dp", "intra_expt_dp", "inter_dist_opt",
          "intra_dist_opt"}


def panel_groups(groups, kind, level):
    g = groups[kind]
    return g[level] if kind == "hcp" else g


def position_in(groups, kind, world):
    """Each rank's index inside its group of the kind (= its coordinate on that axis)."""
    pos = [None] * world
    for g in groups[kind]:
        for i, r in enumerate(g):
            pos[r] = i
    return pos


def check_picture(exe, name, layout, gpus, kinds, max_bytes):
    world = int(layout[layout.index("--world-size") + 1])
    args = [*layout, "--format", "svg", "--gpus-per-node", str(gpus)]
    if kinds:
        args += ["--kinds", ",".join(kinds)]
    with tempfile.TemporaryDirectory() as tmp:
        path = os.path.join(tmp, "layout.svg")
        p = run(exe, *args, "--output", path)
        if not check(p.returncode == 0 and p.stdout == "", f"{name}: exit {p.returncode} {p.stderr}"):
            return
        text = open(path, encoding="utf-8").read()
    check(len(text) <= max_bytes, f"{name}: {len(text)} bytes > {max_bytes}")
    print(f"{name}: {world} ranks, {len(text)} bytes")
    stdout = run(exe, *args)
    check(stdout.returncode == 0 and stdout.stdout == text, f"{name}: stdout differs from --output")

    root = ET.fromstring(text)
    check(root.tag == NS + "svg", f"{name}: root is {root.tag}")
    # The picture's title names the world and, under --compat head, says so.
    head = "--compat" in layout and layout[layout.index("--compat") + 1] == "head"
    title = root.find(f"{NS}title")
    want = f"commgrid layout: world {world}{', compat head' if head else ''}, order "
    check(title is not None and (title.text or "").startswith(want),
          f"{name}: title {None if title is None else title.text!r}, want {want!r}...")
    groups = plan_groups(exe, *layout)
    panels = root.findall(f".//{NS}g[@class='panel']")
    titles = [pn.get("data-title") for pn in panels]
    # The default panels come in the order tp, cp, ep, dp, pp; chosen kinds in reference
    # order (the JSON's key order), hcp as one panel per level.
    want_titles = ["tp", "cp", "ep", "dp", "pp"]
    if kinds:
        want_titles = []
        for k in groups:
            if k in kinds:
                want_titles += [f"hcp{i}" for i in range(len(groups[k]))] if k == "hcp" else [k]
    check(titles == want_titles, f"{name}: panels {titles}, want {want_titles}")
    coords = {k: position_in(groups, k, world) for k in ("tp", "cp", "dp", "pp", "ep", "expt_tp", "expt_dp")}

    for pn in panels:
        kind, level, title = pn.get("data-kind"), int(pn.get("data-level")), pn.get("data-title")
        where = f"{name}/{title}"
        cells = pn.findall(f"{NS}g")
        cells = [c for c in cells if "c" in c.get("class", "").split()]
        ranks = [int(c.get("data-rank")) for c in cells]
        check(sorted(ranks) == list(range(world)), f"{where}: {len(ranks)} cells, not one per rank")
        fill = {}
        xs, ys = {}, {}
        index_of = {}
        for i, g in enumerate(panel_groups(groups, kind, level)):
            for m in g:
                index_of[m] = i
        labelled = sum(1 for c in cells if any(t.get("class") == "gl" for t in c.findall(f"{NS}text")))
        ngroups = len(panel_groups(groups, kind, level))
        # Cells carry group labels exactly when colours run out (more than 12 groups).
        check((labelled > 0) == (ngroups > 12), f"{where}: {labelled} labelled cells for {ngroups} groups")
        # One legend style, whatever the number of groups: "g<index>: <members>".
        for t in pn.findall(f"{NS}text"):
            if t.get("class") != "lg" or (t.text or "").startswith(("... and", "in no group")):
                continue
            m = re.fullmatch(r"g(\d+): \[.*\]( \(\d+ ranks\))?", t.text or "")
            check(m is not None, f"{where}: legend line {t.text!r} is not 'g<index>: [members]'")
        for c in cells:
            r = int(c.get("data-rank"))
            rect = c.find(f"{NS}rect")
            fill[r] = rect.get("fill")
            xs.setdefault(r % gpus, set()).add(float(rect.get("x")))
            ys.setdefault(r // gpus, set()).add(float(rect.get("y")))
            texts = {t.get("class"): t.text for t in c.findall(f"{NS}text")}
            rank_text = texts.get("r", texts.get("rs"))
            check(rank_text == str(r), f"{where}: cell {r} reads {rank_text!r}")
            if "gl" in texts:  # where colours run out, the group's index
                check(texts["gl"] == f"g{index_of[r]}", f"{where}: cell {r} label {texts['gl']!r}, want g{index_of[r]}")
            if "x" in texts:  # coordinates: t c d p, or t e d p on the expert grid
                m = re.fullmatch(r"t(\d+) ([ce])(\d+) d(\d+) p(\d+)", texts["x"] or "")
                if check(m is not None, f"{where}: cell {r} coordinates {texts['x']!r}"):
                    t, c2, d, pp = (int(m.group(i)) for i in (1, 3, 4, 5))
                    ex = kind in EXPERT
                    got = (t, c2, d, pp)
                    exp = ((coords["expt_tp"][r], coords["ep"][r], coords["expt_dp"][r], coords["pp"][r])
                           if ex else (coords["tp"][r], coords["cp"][r], coords["dp"][r], coords["pp"][r]))
                    check(got == exp and m.group(2) == ("e" if ex else "c"),
                          f"{where}: cell {r} coordinates {texts['x']!r}, want {exp}")
            if world > 256:
                check(c.find(f"{NS}title") is not None, f"{where}: cell {r} has no tooltip")
        # Rows are nodes, columns devices: one x per device, one y per node, increasing.
        xcol = [xs[d] for d in sorted(xs)]
        yrow = [ys[n] for n in sorted(ys)]
        check(all(len(s) == 1 for s in xcol + yrow), f"{where}: cells not on a node x device grid")
        check([min(s) for s in xcol] == sorted(min(s) for s in xcol), f"{where}: columns out of order")
        check([min(s) for s in yrow] == sorted(min(s) for s in yrow), f"{where}: rows out of order")
        # Same group <=> same colour; ranks in no group (and only they) are grey.
        in_group = set()
        colours = []
        for i, g in enumerate(panel_groups(groups, kind, level)):
            fs = {fill[r] for r in g}
            check(len(fs) == 1, f"{where}: group {i} has colours {sorted(fs)}")
            colours.append(fill[g[0]])
            in_group.update(g)
        check(len(set(colours)) == len(colours), f"{where}: {len(colours)} groups, {len(set(colours))} colours")
        check(NO_GROUP not in colours, f"{where}: a group is drawn in the no-group colour")
        for r in range(world):
            if r not in in_group:
                check(fill[r] == NO_GROUP, f"{where}: rank {r} is in no group but drawn {fill[r]}")


def main():
    exe = sys.argv[1]
    check_picture(exe, "moe64", ["--world-size", "64", "--tp", "2", "--cp", "2", "--ep", "4", "--pp", "2"],
                  8, None, 200_000)
    # Partial last node (32 = 5 x 6 + 2), ranks in no group, hcp levels, unsorted groups.
    check_picture(exe, "hcp32", ["--world-size", "32", "--cp", "4", "--hcp", "2,2", "--pp", "4",
                                 "--dist-opt-instances", "2"],
                  6, ["embd", "hcp", "intra_dist_opt", "pos_embd", "ep"], 200_000)
    # Many groups: 512 pp groups of 2 must still get 512 distinct colours.
    check_picture(exe, "pp1024", ["--world-size", "1024", "--pp", "2"], 16, ["pp", "dp"], 1_000_000)
    check_picture(exe, "moe1024", ["--world-size", "1024", "--tp", "8", "--cp", "2", "--ep", "8",
                                   "--pp", "4"], 8, None, 2_000_000)
    # Megatron-core HEAD's groups: the kinds the seed does not have draw like the others.
    check_picture(exe, "head16", ["--compat", "head", "--world-size", "16", "--tp", "2", "--ep", "2",
                                  "--cp", "2", "--expert-gtp-remat", "2"],
                  4, ["tp", "tp_ep_pp_with_egtp_remat", "dp"], 200_000)
    return finish("check_svg")


if __name__ == "__main__":
    sys.exit(main())
