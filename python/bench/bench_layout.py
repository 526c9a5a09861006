"""commgrid.Layout from Python vs a pure-Python enumeration written the way Megatron-core's
RankGenerator does it, in the same run: every group kind of tp8 pp8 cp2 ep8 etp1.

    PYTHONPATH=build/python /usr/bin/python3 python/bench/bench_layout.py [--worlds 16,20]

Times are CPU time (time.process_time): the work is single-threaded, and CPU time leaves
out waiting for a core on a shared machine. commgrid: fastest of --repeats; the
Megatron-style enumeration: one run (a minute at 2^20).
"""

import argparse
import gc
import json
import os
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

import commgrid  # noqa: E402
import megatron_style  # noqa: E402

CONFIG = dict(tp=8, pp=8, cp=2, ep=8, etp=1)


def cpu(fn, repeats):
    best, result = None, None
    for _ in range(repeats):
        result = None
        gc.collect()
        t0 = time.process_time()
        result = fn()
        dt = time.process_time() - t0
        best = dt if best is None else min(best, dt)
    return best, result


def commgrid_arrays(world):
    layout = commgrid.Layout(world, **CONFIG)
    return {k: layout.array(k) for k in layout.kinds()}


def commgrid_lists(world):
    layout = commgrid.Layout(world, **CONFIG)
    return {k: layout.groups(k) for k in layout.kinds()}


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--worlds", default="16,20", help="log2 of the world sizes (16,20)")
    ap.add_argument("--repeats", type=int, default=5)
    ap.add_argument("--json", action="store_true", help="one JSON object per world")
    args = ap.parse_args()
    for log2 in (int(x) for x in args.worlds.split(",")):
        world = 1 << log2
        t_arrays, arrays = cpu(lambda: commgrid_arrays(world), args.repeats)
        t_lists, lists = cpu(lambda: commgrid_lists(world), max(1, args.repeats // 2))
        t_ref, ref = cpu(lambda: megatron_style.all_groups(world, **CONFIG), 1)
        # The same groups, or the comparison means nothing.
        assert lists == ref, "commgrid and the Megatron-style enumeration differ"
        assert all(arrays[k].tolist() == ref[k] for k in ref)
        groups = sum(len(v) for v in ref.values())
        members = sum(a.size for a in arrays.values())
        row = dict(world=world, kinds=len(ref), groups=groups, members=members,
                   megatron_style_s=t_ref, commgrid_numpy_s=t_arrays, commgrid_lists_s=t_lists,
                   ratio_numpy=t_ref / t_arrays, ratio_lists=t_ref / t_lists,
                   config=CONFIG)
        del arrays, lists, ref
        if args.json:
            print(json.dumps(row), flush=True)
        else:
            print(f"2^{log2}: {row['kinds']} kinds, {groups:,} groups, {members:,} members | "
                  f"Megatron-style {t_ref:.3f} s | commgrid numpy {t_arrays * 1e3:.2f} ms "
                  f"({row['ratio_numpy']:.0f}x) | commgrid lists {t_lists * 1e3:.1f} ms "
                  f"({row['ratio_lists']:.0f}x)", flush=True)


if __name__ == "__main__":
    main()
