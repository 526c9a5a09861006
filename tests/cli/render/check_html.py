#!/usr/bin/env python3
"""`commgrid plan --format html` in headless Chromium: the page loads nothing from outside,
runs its self-test (every kind of the selector, hover details on the first and last cell)
with no console message and no error, and a screenshot is not blank.

Usage: check_html.py PATH/TO/commgrid
Exits 77 (ctest's SKIP_RETURN_CODE) when no Chromium is installed.
"""
import os
import re
import shutil
import subprocess
import sys
import tempfile

sys.dont_write_bytecode = True  # keep the source tree clean
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from common import check, finish, run  # noqa: E402
import png_stats  # noqa: E402

SKIP = 77
FLAGS = ["--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
         "--disable-background-networking", "--disable-component-update", "--disable-sync",
         "--disable-extensions", "--enable-logging=stderr", "--v=0"]


def chromium():
    for name in ("chromium", "chromium-browser", "google-chrome"):
        path = shutil.which(name)
        if path:
            return path
    return None


def browse(browser, tmp, url, *extra):
    profile = tempfile.mkdtemp(dir=tmp)
    return subprocess.run([browser, *FLAGS, f"--user-data-dir={profile}", *extra, url],
                          capture_output=True, text=True, timeout=120)


def console_lines(stderr):
    return [line for line in stderr.splitlines() if ":CONSOLE" in line or "Uncaught" in line]


def check_page(exe, browser, tmp, name, layout, screenshot):
    path = os.path.join(tmp, f"{name}.html")
    p = run(exe, *layout, "--format", "html", "--output", path)
    if not check(p.returncode == 0, f"{name}: exit {p.returncode} {p.stderr}"):
        return
    page = open(path, encoding="utf-8").read()
    print(f"{name}: {len(page)} bytes")
    # The page's title names the world and, under --compat head, says so.
    world = layout[layout.index("--world-size") + 1]
    head = "--compat" in layout and layout[layout.index("--compat") + 1] == "head"
    title = re.search(r"<title>([^<]*)</title>", page)
    want = f"commgrid layout: world {world}{', compat head' if head else ''}, order "
    check(title is not None and title.group(1).startswith(want),
          f"{name}: title {title.group(1) if title else None!r}, want {want!r}...")
    # Self-contained: no src= at all, and href= only to data: URLs.
    refs = re.findall(r'\b(src|href)\s*=\s*"([^"]*)"', page)
    check(all(attr == "href" and val.startswith("data:") for attr, val in refs),
          f"{name}: external references {refs[:5]}")
    check(not re.search(r"@import|url\(|fetch\(|XMLHttpRequest", page), f"{name}: page may fetch")

    url = "file://" + path
    p = browse(browser, tmp, url + "#selftest", "--virtual-time-budget=5000", "--dump-dom")
    check(p.returncode == 0, f"{name}: chromium --dump-dom exit {p.returncode}")
    html_tag = re.search(r"<html[^>]*>", p.stdout)
    tag = html_tag.group(0) if html_tag else ""
    check('data-ready="1"' in tag, f"{name}: script did not finish: {tag!r}")
    check('data-selftest="ok"' in tag, f"{name}: self-test: {tag!r}")
    check("data-errors" not in tag, f"{name}: page errors: {tag!r}")
    check(not console_lines(p.stderr), f"{name}: console: {console_lines(p.stderr)[:3]}")

    if screenshot:
        png = os.path.join(tmp, f"{name}.png")
        p = browse(browser, tmp, url, f"--screenshot={png}", "--window-size=1280,900")
        check(not console_lines(p.stderr), f"{name}: console: {console_lines(p.stderr)[:3]}")
        if check(os.path.exists(png), f"{name}: no screenshot ({p.returncode}) {p.stderr[-300:]}"):
            w, h, colours, ink = png_stats.stats(png)
            print(f"{name}: screenshot {w}x{h}, {colours} colours, {ink:.0%} not background")
            # The tp panel alone draws 32 group colours over a third of the window.
            check(colours >= 32 and ink >= 0.15, f"{name}: screenshot looks blank")


def main():
    exe = sys.argv[1]
    browser = chromium()
    if browser is None:
        print("SKIP: no chromium on PATH (apt-get install -y chromium)")
        return SKIP
    with tempfile.TemporaryDirectory() as tmp:
        check_page(exe, browser, tmp, "moe64",
                   ["--world-size", "64", "--tp", "2", "--cp", "2", "--ep", "4", "--pp", "2"], True)
        check_page(exe, browser, tmp, "moe1024",
                   ["--world-size", "1024", "--tp", "8", "--cp", "2", "--ep", "8", "--pp", "4",
                    "--kinds", "tp,dp,pp,embd,hcp", "--hcp", "2,1"], False)
        # A window of a 4,096-GPU job with one rank highlighted (pinned at load).
        check_page(exe, browser, tmp, "window4096",
                   ["--world-size", "4096", "--tp", "8", "--pp", "16", "--cp", "2", "--ep", "8",
                    "--etp", "1", "--nodes", "2-5", "--rank", "20"], False)
        # Megatron-core HEAD's groups, their long kind names in the selector.
        check_page(exe, browser, tmp, "head16",
                   ["--compat", "head", "--world-size", "16", "--tp", "2", "--ep", "2", "--cp",
                    "2", "--expert-gtp-remat", "2"], False)
    return finish("check_html")


if __name__ == "__main__":
    sys.exit(main())
