"""Megatron-style initialization of a torch program under `commgrid launch`.

    PYTHONPATH=build/python commgrid launch -n 8 -- python3 examples/python/megatron_init.py --tp 2 --pp 2

`commgrid launch` sets torchrun's variables (RANK, WORLD_SIZE, LOCAL_RANK, MASTER_ADDR,
MASTER_PORT, ...), so `init_process_group("gloo")` starts from the environment (env://) as
under torchrun. Then `commgrid.torch` creates every group of Megatron-core's
`initialize_model_parallel` and the program uses them as a model would:

- a tensor-parallel linear layer: each tp rank multiplies by its column block of the
  weight and an all-reduce over the tp group sums the blocks' results;
- a pipeline: each stage receives the activation from the previous stage, applies its
  layer and sends the result to the next stage (point to point over the pipeline group's
  ranks, with `batch_isend_irecv`);
- a data-parallel all-reduce of the loss.

Each rank checks its results against the whole model computed alone, and raises if they
differ; rank 0 prints one line when every check passed.
"""
import argparse
import datetime
import sys

import torch
import torch.distributed as dist

import commgrid
import commgrid.torch as mpu

HIDDEN = 8


def weight(stage):
    """The pipeline stage's weight, the same on every rank (a seeded generator)."""
    g = torch.Generator().manual_seed(1000 + stage)
    return torch.randn(HIDDEN, HIDDEN, generator=g, dtype=torch.float64) / HIDDEN ** 0.5


def tensor_parallel_linear(x, w, tp_rank, tp_size, tp_group):
    """y = x @ w with w split by rows over the tp ranks: each rank multiplies its slice of
    x by its row block, and the partial products are summed over the tp group (Megatron's
    RowParallelLinear)."""
    block = HIDDEN // tp_size
    rows = slice(tp_rank * block, (tp_rank + 1) * block)
    y = x[:, rows] @ w[rows, :]
    dist.all_reduce(y, group=tp_group)
    return torch.tanh(y)


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--tp", type=int, default=2, help="tensor model parallel size")
    parser.add_argument("--pp", type=int, default=2, help="pipeline model parallel size")
    parser.add_argument("--timeout", type=float, default=120, help="seconds for every collective")
    args = parser.parse_args()

    # env://: RANK, WORLD_SIZE, MASTER_ADDR and MASTER_PORT come from the launcher.
    dist.init_process_group("gloo", timeout=datetime.timedelta(seconds=args.timeout))
    rank, world = dist.get_rank(), dist.get_world_size()
    mpu.initialize_model_parallel(tensor_model_parallel_size=args.tp,
                                  pipeline_model_parallel_size=args.pp,
                                  create_gloo_process_groups=False)
    tp_rank = mpu.get_tensor_model_parallel_rank()
    tp_size = mpu.get_tensor_model_parallel_world_size()
    pp_rank = mpu.get_pipeline_model_parallel_rank()
    pp_size = mpu.get_pipeline_model_parallel_world_size()
    dp_rank = mpu.get_data_parallel_rank()

    # The groups are the layout's: the same members commgrid's C++ core computes.
    layout = commgrid.Layout(world, tp=args.tp, pp=args.pp)
    for kind in ("tp", "pp", "dp"):
        if mpu.get_global_ranks(kind) != layout.group_of(kind, rank):
            raise RuntimeError(f"rank {rank}: {kind} group {mpu.get_global_ranks(kind)} "
                               f"differs from the layout's {layout.group_of(kind, rank)}")

    # Every data-parallel replica gets its own input; each stage's tp ranks share it.
    x0 = torch.full((2, HIDDEN), 0.1 * (dp_rank + 1), dtype=torch.float64)
    expected = x0
    for stage in range(pp_size):
        expected = torch.tanh(expected @ weight(stage))

    x = x0
    if not mpu.is_pipeline_first_stage():
        x = torch.empty_like(x0)
        op = dist.P2POp(dist.irecv, x, mpu.get_pipeline_model_parallel_prev_rank())
        for work in dist.batch_isend_irecv([op]):
            work.wait()
    y = tensor_parallel_linear(x, weight(pp_rank), tp_rank, tp_size,
                               mpu.get_tensor_model_parallel_group())
    if not mpu.is_pipeline_last_stage():
        op = dist.P2POp(dist.isend, y, mpu.get_pipeline_model_parallel_next_rank())
        for work in dist.batch_isend_irecv([op]):
            work.wait()
        loss = torch.zeros(1, dtype=torch.float64)
    else:
        if not torch.allclose(y, expected, rtol=1e-12, atol=1e-12):
            raise RuntimeError(f"rank {rank}: the pipeline's output differs from the model's")
        loss = y.square().mean().reshape(1)

    # The loss lives on the last stage; share it with the stage's data-parallel peers
    # (mean over dp), then check it against every replica's loss computed alone.
    dist.all_reduce(loss, group=mpu.get_data_parallel_group())
    if mpu.is_pipeline_last_stage():
        dp_size = mpu.get_data_parallel_world_size()
        want = 0.0
        for d in range(dp_size):
            out = torch.full((2, HIDDEN), 0.1 * (d + 1), dtype=torch.float64)
            for stage in range(pp_size):
                out = torch.tanh(out @ weight(stage))
            want += out.square().mean().item()
        if abs(loss.item() - want) > 1e-12 * max(1.0, abs(want)):
            raise RuntimeError(f"rank {rank}: dp all-reduce gave {loss.item()}, want {want}")

    dist.barrier()
    if rank == 0:
        print(f"megatron_init: world {world}, tp {tp_size}, pp {pp_size}, "
              f"dp {mpu.get_data_parallel_world_size()}: groups as the layout, tp all-reduce, "
              f"pipeline send/recv and dp all-reduce ok", flush=True)
    mpu.destroy_model_parallel()
    dist.destroy_process_group()
    return 0


if __name__ == "__main__":
    sys.exit(main())
