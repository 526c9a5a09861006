"""Initialization time of commgrid.torch against megatron-core's own parallel_state, side
by side in one run on the same torch: WORLD Gloo processes on this machine; each
implementation's initialize_model_parallel (tp 2, pp 2, the Gloo twins, as Megatron's
defaults) is timed from a barrier, alternating, REPEATS times each, then destroyed. Each
round also times the initialization plus a first all-reduce on every group the rank was
given (issued on all of them at once, then waited for): with Gloo's lazy connection
(``--lazy``: TORCH_GLOO_LAZY_INIT=1 in every rank, for both implementations) a group's
pairs connect only then. The time of a round is the slowest rank's; the table shows medians.

    .venv/bin/python python/bench/bench_init.py --world 8 16 32 --repeats 3 [--lazy]

(with the package importable: PYTHONPATH=build/python). Prints one Markdown row per world.
"""

import argparse
import gc
import json
import os
import socket
import subprocess
import sys
import time
import warnings
from datetime import timedelta


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def rank_main(rank, world, port, repeats, out, options):
    warnings.filterwarnings("ignore")
    import faulthandler
    faulthandler.dump_traceback_later(1500, exit=True)  # a stuck rank ends, its stack on stderr
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port), RANK=str(rank),
                      WORLD_SIZE=str(world))
    import torch
    import torch.distributed as dist
    import megatron.core.parallel_state as megatron
    import commgrid.torch as commgrid_torch

    dist.init_process_group("gloo", timeout=timedelta(seconds=600))
    kwargs = dict(tensor_model_parallel_size=2, pipeline_model_parallel_size=2)
    commgrid_kwargs = dict(kwargs, **json.loads(options))
    pg_map = dist.distributed_c10d._world.pg_map
    times = {"megatron": [], "commgrid": [], "megatron_first": [], "commgrid_first": []}
    for _ in range(repeats):
        for name, ps in (("megatron", megatron), ("commgrid", commgrid_torch)):
            before = set(pg_map)
            dist.barrier()
            start = time.perf_counter()
            ps.initialize_model_parallel(**(commgrid_kwargs if name == "commgrid" else kwargs))
            init = time.perf_counter() - start
            works = [dist.all_reduce(torch.ones(1), group=g, async_op=True)
                     for g in list(pg_map) if g not in before]
            for w in works:
                w.wait()
            took = torch.tensor([init, time.perf_counter() - start], dtype=torch.float64)
            dist.all_reduce(took, op=dist.ReduceOp.MAX)  # the slowest rank's
            times[name].append(float(took[0]))
            times[name + "_first"].append(float(took[1]))
            ps.destroy_model_parallel()
            # Megatron's destroy forgets its groups but torch keeps them (and every Gloo
            # group's device, whose event loop wakes every 10 ms): destroy every group the
            # round made, so that no round runs beside the groups of the rounds before it,
            # and drop every reference to them here (the works hold their Gloo contexts):
            # closing a round's pairs waits for their loops, and must not be timed as part
            # of the next round.
            works = w = None
            for g in set(pg_map) - before:
                dist.destroy_process_group(g)
            gc.collect()
    if rank == 0:
        with open(out, "w") as f:
            json.dump(times, f)
    dist.destroy_process_group()


def run_world(world, repeats, lazy, options):
    port = free_port()
    out = f"/tmp/bench_init_{os.getpid()}_{world}.json"
    env = dict(os.environ, **({"TORCH_GLOO_LAZY_INIT": "1"} if lazy else {}))
    procs = [subprocess.Popen([sys.executable, __file__, "--rank", str(r), "--world", str(world),
                               "--port", str(port), "--repeats", str(repeats), "--out", out,
                               "--commgrid-options", options],
                              env=env, stderr=subprocess.DEVNULL) for r in range(world)]
    for p in procs:
        if p.wait(timeout=1800) != 0:
            raise SystemExit(f"error: a rank of world {world} exited with {p.returncode}")
    with open(out) as f:
        times = json.load(f)
    os.remove(out)
    return times


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--world", type=int, nargs="+", default=[8, 16, 32])
    p.add_argument("--repeats", type=int, default=3)
    p.add_argument("--lazy", action="store_true",
                   help="TORCH_GLOO_LAZY_INIT=1 in every rank (Gloo connects a pair at its first use)")
    p.add_argument("--commgrid-options", default="{}", metavar="JSON",
                   help="further keywords of commgrid's initialize_model_parallel, e.g. "
                        "'{\"gloo_device\": \"per_group\", \"share_identical_groups\": false}'")
    p.add_argument("--rank", type=int, help=argparse.SUPPRESS)
    p.add_argument("--port", type=int, help=argparse.SUPPRESS)
    p.add_argument("--out", help=argparse.SUPPRESS)
    args = p.parse_args()
    if args.rank is not None:
        return rank_main(args.rank, args.world[0], args.port, args.repeats, args.out,
                         args.commgrid_options)
    try:
        if not isinstance(json.loads(args.commgrid_options), dict):
            raise ValueError("not an object")
    except ValueError as e:
        p.error(f"--commgrid-options: expected a JSON object, got {args.commgrid_options!r} ({e})")
    print("| ranks | megatron-core init (s) | commgrid.torch init (s) | ratio | "
          "megatron-core init + first all-reduce (s) | commgrid.torch init + first all-reduce (s) | ratio | load |")
    print("|---|---|---|---|---|---|---|---|")
    for world in args.world:
        t = run_world(world, args.repeats, args.lazy, args.commgrid_options)
        med = {k: sorted(v)[len(v) // 2] for k, v in t.items()}
        print(f"| {world} | {med['megatron']:.3f} | {med['commgrid']:.3f} | "
              f"{med['megatron'] / med['commgrid']:.2f}x | {med['megatron_first']:.3f} | "
              f"{med['commgrid_first']:.3f} | {med['megatron_first'] / med['commgrid_first']:.2f}x | "
              f"{os.getloadavg()[0]:.1f} |", flush=True)


if __name__ == "__main__":
    main()
