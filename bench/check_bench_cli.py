#!/usr/bin/env python3
"""Checks `commgrid bench` on small sizes: the JSON documents parse, carry their fields, and
hold sane values; bad input exits 2 with one `error:` line.

Usage: check_bench_cli.py PATH/TO/commgrid
"""
import json
import subprocess
import sys

failures = []


def check(cond, what):
    if not cond:
        failures.append(what)


def run(exe, *args):
    p = subprocess.run([exe, *args], capture_output=True, text=True, timeout=300)
    return p.returncode, p.stdout, p.stderr


def check_layout(exe):
    rc, out, err = run(exe, "bench", "layout", "--worlds", "1024,16384", "--query-worlds",
                       "1024,1073741824", "--repeats", "2", "--queries", "1000",
                       "--format", "json")
    check(rc == 0, f"bench layout exited {rc}: {err}")
    if rc != 0:
        return
    doc = json.loads(out)
    check(doc.get("benchmark") == "layout", "benchmark is not 'layout'")
    en = doc.get("enumeration", [])
    check([e.get("world_size") for e in en] == [1024, 16384], "enumeration worlds")
    for e in en:
        w = e["world_size"]
        check(e["kinds"] == 19, f"{w}: kinds {e['kinds']} != 19")
        check(len(e["per_kind"]) == e["kinds"], f"{w}: per_kind has {len(e['per_kind'])} rows")
        # Every plain kind holds each rank once; embd and pos_embd hold fewer.
        check(e["members"] > 16 * w, f"{w}: only {e['members']} members")
        check(e["members"] == sum(k["members"] for k in e["per_kind"]), f"{w}: members sum")
        check(e["bytes"] >= 8 * e["members"], f"{w}: bytes {e['bytes']} < 8 x members")
        check(e["seconds"] > 0 and e["baseline_seconds"] > 0, f"{w}: non-positive times")
        check(abs(e["ratio"] - e["seconds"] / e["baseline_seconds"]) < 1e-9 * e["ratio"] + 1e-12,
              f"{w}: ratio is not seconds / baseline_seconds")
        for k in e["per_kind"]:
            check(k["groups"] >= 1 and k["seconds"] > 0, f"{w} {k['kind']}: groups or time")
    qs = doc.get("queries", [])
    check(len(qs) == 14, f"{len(qs)} query rows, expected 7 kinds x 2 worlds")
    sizes = {"tp": 8, "pp": 8, "cp": 2, "ep": 8, "mp": 64, "tp_cp": 16, "expt_tp": 1}
    for q in qs:
        check(q["group_size"] == sizes.get(q["kind"]), f"{q['kind']}: group size {q['group_size']}")
        # Generous: a sanity bound for a loaded machine, not the 10 us goal.
        check(0 < q["ns_per_query"] < 1e6, f"{q['kind']} at {q['world_size']}: {q['ns_per_query']} ns")


def check_init_gloo(exe):
    rc, out, err = run(exe, "bench", "init", "--backend", "gloo", "--local", "2",
                       "--repeats", "1", "--timeout", "60", "--format", "json")
    if rc == 2 and "no Gloo backend" in err:
        print("skip: bench init on gloo (this build has no Gloo backend)")
        return
    check(rc == 0, f"bench init --backend gloo exited {rc}: {err}")
    if rc != 0:
        return
    doc = json.loads(out)
    check(doc.get("backend") == "gloo" and doc.get("world_size") == 2, "init backend/world")
    secs = doc.get("seconds", {})
    check(set(secs) == {"split", "member", "per-group"}, f"init seconds keys {sorted(secs)}")
    check(all(v > 0 for v in secs.values()), "init: non-positive seconds")
    check(doc.get("ratio") and abs(doc["ratio"] - secs["per-group"] / secs[doc["default_strategy"]]) < 1e-9,
          "init ratio is not per-group / default")
    for s in doc.get("strategies", []):
        check(s["creation_calls_per_rank_max"] >= 1, f"{s['strategy']}: no creation calls")


def check_bad_input(exe):
    for args in (["bench", "layout", "--format", "xml"],
                 ["bench", "layout", "--worlds", "100"],
                 ["bench", "layout", "--repeats", "0"],
                 ["bench", "layout", "--memory", "hot"],
                 ["bench", "collectives", "--sizes", "3B", "--backend", "gloo", "--local", "2"],
                 ["bench", "init", "--backend", "tcp"],  # nccl is a backend now
                 ["bench", "init", "--backend", "mpi", "--local", "4"],
                 ["bench", "init", "--pp", "2"]):  # no launcher: one rank cannot hold pp 2
        rc, out, err = run(exe, *args)
        check(rc == 2, f"{' '.join(args)}: exit {rc}, expected 2")
        lines = err.strip().splitlines()
        check(len(lines) == 1 and lines[0].startswith("error: "),
              f"{' '.join(args)}: stderr {err!r}")
        check(out == "", f"{' '.join(args)}: wrote to stdout")
    # A world whose lists cannot be held is refused before anything runs, naming the size.
    rc, out, err = run(exe, "bench", "layout", "--worlds", "1073741824", "--query-worlds", "none")
    check(rc == 2 and out == "" and "GiB at once" in err and "--worlds" in err,
          f"bench layout 2^30: exit {rc}, stderr {err!r}")


def main():
    exe = sys.argv[1]
    check_layout(exe)
    check_init_gloo(exe)
    check_bad_input(exe)
    for f in failures:
        print("FAIL:", f)
    print(f"bench cli: {len(failures)} failed")
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
