#!/usr/bin/env python3
"""`commgrid plan --check-topology` on known layouts (numbers, warnings, --strict exit 3,
the suggested order really fixing the layout), and the exit-2 errors of the picture and
topology flags.

Usage: check_topology.py PATH/TO/commgrid
"""
import json
import os
import sys
import tempfile

sys.dont_write_bytecode = True  # keep the source tree clean
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from common import check, finish, run  # noqa: E402


def rows(stdout):
    """kind -> (groups, size, crossing, max nodes) from the topology table."""
    out = {}
    for line in stdout.splitlines():
        f = line.split()
        if len(f) == 5 and f[1].isdigit():
            out[f[0]] = (int(f[1]), f[2], int(f[3]), int(f[4]))
    return out


def main():
    exe = sys.argv[1]
    tp8 = ["--world-size", "64", "--tp", "8"]

    # Default order: tp groups are whole nodes, dp groups stride over all 8 nodes.
    p = run(exe, *tp8, "--check-topology", "--strict")
    check(p.returncode == 0 and p.stderr == "", f"tp8 default: exit {p.returncode} {p.stderr!r}")
    r = rows(p.stdout)
    check(r.get("tp") == (8, "8", 0, 1), f"tp8 default tp row {r.get('tp')}")
    check(r.get("dp") == (8, "8", 8, 8), f"tp8 default dp row {r.get('dp')}")
    check("64 ranks on 8 nodes of 8 GPUs" in p.stdout, f"tp8 default header: {p.stdout[:80]!r}")

    # dp innermost: tp and expt_tp cross; --strict -> 3; the suggested order fixes it.
    bad = [*tp8, "--order", "dp-tp-cp-ep-pp"]
    p = run(exe, *bad, "--check-topology")
    check(p.returncode == 0, f"dp-innermost without --strict: exit {p.returncode}")
    warn = p.stderr.splitlines()
    check(warn == ['warning: tp groups cross nodes (8 of 8 groups span up to 8 nodes); '
                   'order "tp-dp-cp-ep-pp" keeps them inside',
                   'warning: expt_tp groups cross nodes (8 of 8 groups span up to 8 nodes); '
                   'order "tp-dp-cp-ep-pp" keeps them inside'], f"dp-innermost warnings {warn}")
    check(rows(p.stdout).get("tp") == (8, "8", 8, 8), f"dp-innermost tp row {rows(p.stdout).get('tp')}")
    p = run(exe, *bad, "--check-topology", "--strict")
    check(p.returncode == 3, f"dp-innermost --strict: exit {p.returncode}, want 3")
    p = run(exe, *tp8, "--order", "tp-dp-cp-ep-pp", "--check-topology", "--strict")
    check(p.returncode == 0 and p.stderr == "", f"suggested order: exit {p.returncode} {p.stderr!r}")

    # JSON report; --kinds limits the rows, never the warnings.
    p = run(exe, *bad, "--check-topology", "--format", "json", "--kinds", "dp,tp")
    j = json.loads(p.stdout) if p.returncode == 0 else {}
    check([k["kind"] for k in j.get("kinds", [])] == ["dp", "tp"], f"json kinds {j.get('kinds')}")
    check([w["kind"] for w in j.get("warnings", [])] == ["tp", "expt_tp"], f"json warnings {j.get('warnings')}")
    check(j.get("warnings", [{}])[0].get("order") == "tp-dp-cp-ep-pp", "json suggested order")

    # A group larger than a node: a warning without a fix. Partial last node: 12 on 8.
    p = run(exe, "--world-size", "32", "--tp", "16", "--check-topology", "--kinds", "tp")
    check("no order keeps them inside: a group has 16 ranks, a node 8 GPUs" in p.stderr,
          f"tp16 warning {p.stderr!r}")
    p = run(exe, "--world-size", "12", "--tp", "4", "--check-topology", "--kinds", "tp", "--strict")
    check(p.returncode == 0 and "(the last node holds 4)" in p.stdout, f"partial node: {p.returncode} {p.stdout!r}")

    with tempfile.TemporaryDirectory() as tmp:
        # Picture and report together: the picture to --output, the report to stdout.
        html = os.path.join(tmp, "x.html")
        p = run(exe, *bad, "--format", "html", "--output", html, "--check-topology", "--strict")
        check(p.returncode == 3 and os.path.getsize(html) > 0 and "crossing" in p.stdout,
              f"html + check: exit {p.returncode}")
        # --output for the table: the same bytes as stdout.
        table = os.path.join(tmp, "t.txt")
        p = run(exe, *tp8, "--output", table)
        check(p.returncode == 0 and p.stdout == "" and
              open(table).read() == run(exe, *tp8).stdout, "table --output differs from stdout")

        # Bad input: one `error: ...` line on stderr, exit 2, nothing on stdout.
        errors = [
            (["--gpus-per-node", "0", "--format", "svg"], "gpus_per_node must be >= 1, got 0"),
            (["--gpus-per-node", "x", "--check-topology"], 'gpus_per_node: expected an integer, got "x"'),
            (["--format", "pdf"], 'format: unknown format "pdf" (valid: table, json, svg, html)'),
            (["--strict"], "strict: --strict needs --check-topology"),
            (["--format", "svg", "--check-topology"], "--format svg needs --output FILE"),
            (["--format", "svg", "--rank", "64"], "rank 64 out of range [0, 64)"),
            (["--format", "svg", "--nodes", "3-2"], "nodes"),
            (["--format", "svg", "--nodes", "0-8"], "goes past the last node, 7"),
            (["--nodes", "0-1"], "--nodes applies to --format svg and html, not table"),
            (["--check-topology", "--rank", "3"], "--rank does not apply to --check-topology"),
            (["--format", "svg", "--output", os.path.join(tmp, "no", "such", "dir.svg")],
             'cannot write "' + os.path.join(tmp, "no", "such", "dir.svg") + '"'),
            (["--format", "html", "--output", tmp], f'cannot write "{tmp}"'),
            (["--format", "svg", "--kinds", "hcp"], "hcp"),
        ]
        for extra, text in errors:
            p = run(exe, *tp8, *extra)
            lines = p.stderr.splitlines()
            check(p.returncode == 2 and p.stdout == "" and len(lines) == 1 and
                  lines[0].startswith("error: ") and text in lines[0],
                  f"{extra}: exit {p.returncode}, stderr {p.stderr!r}, want {text!r}")
        p = run(exe, "--world-size", "16385", "--format", "svg")
        check(p.returncode == 2 and "at most 16384 ranks" in p.stderr, f"huge svg: {p.returncode} {p.stderr!r}")
    return finish("check_topology")


if __name__ == "__main__":
    sys.exit(main())
