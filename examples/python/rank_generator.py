"""commgrid's RankGenerator in place of Megatron-core's, creating torch.distributed groups.

    PYTHONPATH=build/python commgrid launch -n 8 -- python3 examples/python/rank_generator.py --tp 2 --pp 2

Code written against Megatron-core's `parallel_state.RankGenerator` runs unchanged with
the import changed (the lists are the same, in the same order). This program does what
Megatron's `initialize_model_parallel` does with it: every rank calls `new_group` for every
group of each token, in the same order, and keeps the groups it is in. Then it proves each
of its groups on the wire: an all-reduce of the global ranks must give their sum.
"""
import argparse
import datetime
import sys

import torch
import torch.distributed as dist

from commgrid import RankGenerator  # instead of: from megatron.core.parallel_state import RankGenerator

TOKENS = ("tp", "pp", "dp", "tp-pp", "tp-dp", "dp-pp")


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--tp", type=int, default=2)
    parser.add_argument("--pp", type=int, default=2)
    parser.add_argument("--order", default="tp-cp-ep-dp-pp")
    parser.add_argument("--timeout", type=float, default=120, help="seconds for every collective")
    args = parser.parse_args()

    dist.init_process_group("gloo", timeout=datetime.timedelta(seconds=args.timeout))
    rank, world = dist.get_rank(), dist.get_world_size()
    if world % (args.tp * args.pp) != 0:
        raise SystemExit(f"error: world size {world} is not divisible by tp*pp = {args.tp * args.pp}")
    gen = RankGenerator(tp=args.tp, ep=1, dp=world // (args.tp * args.pp), pp=args.pp, cp=1,
                        order=args.order)

    mine = {}
    for token in TOKENS:
        for ranks in gen.get_ranks(token):
            group = dist.new_group(ranks)  # collective over the world: every rank, every group
            if rank in ranks:
                mine[token] = (ranks, group)

    for token, (ranks, group) in mine.items():
        value = torch.tensor([rank], dtype=torch.int64)
        dist.all_reduce(value, group=group)
        if value.item() != sum(ranks):
            raise RuntimeError(f"rank {rank}: {token} group {ranks} summed to {value.item()}, "
                               f"want {sum(ranks)}")
        if dist.get_world_size(group) != len(ranks):
            raise RuntimeError(f"rank {rank}: {token} group of {dist.get_world_size(group)}, "
                               f"want {len(ranks)}")

    dist.barrier()
    if rank == 0:
        tp_groups = gen.get_ranks("tp")
        print(f"rank_generator: world {world}, order {gen.order}: "
              f"{sum(len(gen.get_ranks(t)) for t in TOKENS)} groups of {len(TOKENS)} tokens "
              f"created and proven (tp groups {tp_groups[0]} ... {tp_groups[-1]})", flush=True)
    dist.destroy_process_group()
    return 0


if __name__ == "__main__":
    sys.exit(main())
