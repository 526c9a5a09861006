#!/usr/bin/env python3
"""Pictures at scale: `--nodes A-B` draws exactly that window of a large world, `--rank R`
outlines exactly R's group of every kind (R itself in red), cells carry group labels where
colours run out, no legend reaches past its panel into the next one, and a world too large
to draw whole is refused with a hint to draw a window.

Usage: check_scale.py PATH/TO/commgrid
"""
import json
import os
import sys
import xml.etree.ElementTree as ET

sys.dont_write_bytecode = True  # keep the source tree clean
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from common import check, finish, run  # noqa: E402

NS = "{http://www.w3.org/2000/svg}"
CHAR_W = 6.4  # the renderer's allowance per legend character (11px sans-serif)
JOB = ["--world-size", "4096", "--tp", "8", "--pp", "16", "--cp", "2", "--ep", "8", "--etp", "1",
       "--vpp", "4"]


def translate(g):
    t = g.get("transform", "translate(0,0)")
    x, y = t[len("translate("):-1].split(",")
    return float(x), float(y)


def main():
    exe = sys.argv[1]
    # Nodes 2-5 of the 4,096-GPU job, rank 20 highlighted.
    p = run(exe, *JOB, "--format", "svg", "--nodes", "2-5", "--rank", "20")
    if not check(p.returncode == 0, f"window svg: exit {p.returncode} {p.stderr}"):
        return finish("check_scale")
    root = ET.fromstring(p.stdout)
    panels = root.findall(f".//{NS}g[@class='panel']")
    check([pn.get("data-title") for pn in panels] == ["tp", "cp", "ep", "dp", "pp"], "window panels")
    mine = json.loads(run(exe, *JOB, "--format", "json", "--rank", "20").stdout)["groups"]
    boxes = []
    for pn in panels:
        title = pn.get("data-title")
        cells = [c for c in pn.findall(f"{NS}g") if "c" in c.get("class", "").split()]
        ranks = sorted(int(c.get("data-rank")) for c in cells)
        check(ranks == list(range(16, 48)), f"{title}: drew ranks {ranks[:3]}..{ranks[-3:]}, want 16-47")
        check({int(c.get("data-node")) for c in cells} == {2, 3, 4, 5}, f"{title}: nodes")
        outlined = sorted(int(c.get("data-rank")) for c in cells if "hl" in c.get("class").split())
        want = sorted(r for r in mine[title] if 16 <= r < 48)
        check(outlined == want, f"{title}: outlined {outlined}, want rank 20's group in the window {want}")
        red = [int(c.get("data-rank")) for c in cells if "cur" in c.get("class").split()]
        check(red == [20], f"{title}: red cells {red}")
        labels = [t for c in cells for t in c.findall(f"{NS}text") if t.get("class") == "gl"]
        groups_drawn = {c.find(f"{NS}rect").get("fill") for c in cells}
        check(bool(labels) == (len(groups_drawn) > 12), f"{title}: {len(labels)} labels for {len(groups_drawn)} colours")
        # The panel's extent: its own grid and legend texts (at 6.4 px a character).
        x0, y0 = translate(pn)
        right = 0.0
        for t in pn.iter(f"{NS}text"):
            if t.get("class") == "lg":
                right = max(right, float(t.get("x")) + CHAR_W * len(t.text or ""))
        boxes.append((title, x0, y0, x0 + right))
        rows = [t.text for t in pn.findall(f"{NS}text") if (t.text or "").startswith("node ")]
        check(rows == ["node 2", "node 3", "node 4", "node 5"], f"{title}: row labels {rows}")
    # No legend reaches into the panel to its right (same row of panels).
    for a in boxes:
        for b in boxes:
            if a is not b and a[2] == b[2] and b[1] > a[1]:
                check(a[3] < b[1], f"legend of {a[0]} ends at {a[3]:.0f}, panel {b[0]} starts at {b[1]:.0f}")
    # Colours run out: 64 tp groups drawn in nodes 0-63, every cell labelled with its group.
    p = run(exe, *JOB, "--format", "svg", "--nodes", "0-63", "--kinds", "tp")
    root = ET.fromstring(p.stdout) if p.returncode == 0 else None
    if check(root is not None, f"tp 64 nodes: exit {p.returncode} {p.stderr}"):
        cells = [c for c in root.iter(f"{NS}g") if "c" in c.get("class", "").split()]
        labels = {int(c.get("data-rank")): t.text for c in cells for t in c.findall(f"{NS}text")
                  if t.get("class") == "gl"}
        check(len(labels) == 512 and all(labels[r] == f"g{r // 8}" for r in labels), "tp labels g<r/8>")
    # A million ranks: refused whole, drawn as a window, quickly.
    p = run(exe, "--world-size", "1048576", "--tp", "8", "--format", "svg")
    check(p.returncode == 2 and "--nodes A-B" in p.stderr and p.stdout == "", f"1M whole: {p.returncode} {p.stderr}")
    p = run(exe, "--world-size", "1048576", "--tp", "8", "--format", "html", "--nodes", "131064-131071",
            "--rank", "1048575")
    check(p.returncode == 0 and 'id="to-node"' in p.stdout and "131071" in p.stdout,
          f"1M window html: {p.returncode} {p.stderr[:200]}")
    return finish("check_scale")


if __name__ == "__main__":
    sys.exit(main())
