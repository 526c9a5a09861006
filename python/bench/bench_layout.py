"""commgrid.Layout from Python vs a pure-Python enumeration written the way Megatron-core's
RankGenerator does it, in the same run: every group kind of tp8 pp8 cp2 ep8 etp1.

    PYTHONPATH=build/python /usr/bin/python3 python/bench/bench_layout.py [--worlds 16,20]

Times are CPU time (time.process_time): the work is single-threaded, and CPU time leaves
out waiting for a core on a shared machine. commgrid: fastest of --repeats (and the
first run, which pays for fresh memory); the Megatron-style enumeration: one run (about
half a minute at 2^20). "One rank's groups": group_of of every kind for one rank, which
is all a rank needs (Megatron enumerates every group on every rank).
"""

import argparse
import gc
import json
import os
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

import numpy as np  # noqa: E402

import commgrid  # noqa: E402
import megatron_style  # noqa: E402

CONFIG = dict(tp=8, pp=8, cp=2, ep=8, etp=1)


def cpu(fn, repeats):
    """(fastest, first) CPU time of fn over `repeats` runs, and its last result."""
    times, result = [], None
    for _ in range(repeats):
        result = None
        gc.collect()
        t0 = time.process_time()
        result = fn()
        times.append(time.process_time() - t0)
    return min(times), times[0], result


def commgrid_arrays(world):
    layout = commgrid.Layout(world, **CONFIG)
    return {k: layout.array(k) for k in layout.kinds()}


def commgrid_lists(world):
    layout = commgrid.Layout(world, **CONFIG)
    return {k: layout.groups(k) for k in layout.kinds()}


def one_rank(world, rank):
    layout = commgrid.Layout(world, **CONFIG)
    return {k: layout.group_of(k, rank) for k in layout.kinds()}


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--worlds", default="16,20", help="log2 of the world sizes (16,20)")
    ap.add_argument("--repeats", type=int, default=5)
    ap.add_argument("--json", action="store_true", help="one JSON object per world")
    args = ap.parse_args()
    # pybind11 imports numpy's C API on the first array it makes: not part of any timing.
    commgrid.Layout(8, tp=2).array("tp")
    for log2 in (int(x) for x in args.worlds.split(",")):
        world = 1 << log2
        t_arrays, t_first, arrays = cpu(lambda: commgrid_arrays(world), args.repeats)
        shapes = [a.shape for a in arrays.values()]
        # The floor: numpy allocating and writing arrays of the same shapes.
        t_write, _, _ = cpu(lambda: [np.ones(sh, np.int64) for sh in shapes], args.repeats)
        t_lists, _, lists = cpu(lambda: commgrid_lists(world), max(1, args.repeats // 2))
        t_rank, _, mine = cpu(lambda: one_rank(world, world // 3), args.repeats)
        t_ref, _, ref = cpu(lambda: megatron_style.all_groups(world, **CONFIG), 1)
        # The same groups, or the comparison means nothing.
        assert lists == ref, "commgrid and the Megatron-style enumeration differ"
        assert all(arrays[k].tolist() == ref[k] for k in ref)
        assert all(mine[k] == next((g for g in ref[k] if world // 3 in g), None) for k in ref)
        groups = sum(len(v) for v in ref.values())
        members = sum(a.size for a in arrays.values())
        row = dict(world=world, kinds=len(ref), groups=groups, members=members,
                   megatron_style_s=t_ref, commgrid_numpy_s=t_arrays,
                   commgrid_numpy_first_s=t_first, numpy_write_int64_s=t_write, commgrid_lists_s=t_lists,
                   commgrid_one_rank_s=t_rank, ratio_numpy=t_ref / t_arrays,
                   ratio_numpy_first=t_ref / t_first, ratio_lists=t_ref / t_lists,
                   ratio_one_rank=t_ref / t_rank,
                   config=CONFIG)
        del arrays, lists, ref
        if args.json:
            print(json.dumps(row), flush=True)
        else:
            print(f"2^{log2}: {row['kinds']} kinds, {groups:,} groups, {members:,} members | "
                  f"Megatron-style {t_ref:.3f} s | commgrid numpy {t_arrays * 1e3:.2f} ms "
                  f"({row['ratio_numpy']:.0f}x; first run {t_first * 1e3:.1f} ms, "
                  f"{row['ratio_numpy_first']:.0f}x) | numpy writing as many int64 {t_write * 1e3:.2f} ms "
                  f"| commgrid lists {t_lists * 1e3:.1f} ms "
                  f"({row['ratio_lists']:.0f}x) | one rank's groups {t_rank * 1e3:.3f} ms "
                  f"({row['ratio_one_rank']:.0f}x)", flush=True)


if __name__ == "__main__":
    main()
