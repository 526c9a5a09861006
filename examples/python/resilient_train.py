"""A torch training loop that survives a lost process, under `commgrid launch --spares S`.

    PYTHONPATH=build/python commgrid launch -n 5 --spares 1 -- \\
        python3 examples/python/resilient_train.py --steps 8 --tp 2 --dp 2 --snapshot-every 2 \\
        --fault-kill 1:3

A tiny model (a two-layer MLP, tensor-parallel over tp as Megatron's column- and
row-parallel linear layers: one all-reduce over the tp group in the forward pass), trained
with Adam in float32 on the CPU; each step's gradients are all-reduced over the
data-parallel group (DDP-style, one flat buffer) and averaged. The data of a step is a
function of the step and the rank's dp coordinate alone, so a run that loses a process
and recovers prints the same losses, bit for bit, as a run that loses none.

commgrid.torch.ResilientDriver runs the loop: the state provider is the model's and the
optimizer's state_dict; each epoch's torch groups come from the driver (one Gloo group per
tp, dp group of the epoch's layout). Logical rank 0 prints ``step <n> loss <repr(float)>``
once per step it runs (after a rollback a step runs again, and prints the same value
again). ``--fault-kill P:S`` SIGKILLs process P at the start of step S (its first
incarnation), to see a recovery.
"""
import argparse
import os
import signal
import sys

import torch
import torch.distributed as dist

HIDDEN = 8
FFN = 16
SEED = 1234


def parse_args(argv):
    parser = argparse.ArgumentParser(prog="resilient_train.py", description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=8, help="training steps (N)")
    parser.add_argument("--tp", type=int, default=1, help="tensor parallel size (T)")
    parser.add_argument("--dp", type=int, required=True,
                        help="data parallel size (D); the launch's world must be T x D")
    parser.add_argument("--snapshot-every", type=int, default=1, help="K: a snapshot every K steps")
    parser.add_argument("--state-from", default="auto", choices=("auto", "replica", "buddy"),
                        help="where a spare gets a dead rank's state")
    parser.add_argument("--no-shrink", action="store_true",
                        help="end the job when no spare is left, instead of shrinking dp")
    parser.add_argument("--micro-batch", type=int, default=4, help="samples per micro-batch")
    parser.add_argument("--lr", type=float, default=0.01, help="Adam's learning rate")
    parser.add_argument("--fault-kill", action="append", default=[], metavar="P:S",
                        help="SIGKILL process P at the start of step S (repeatable)")
    args = parser.parse_args(argv)
    for name in ("steps", "tp", "snapshot_every", "micro_batch"):
        value = getattr(args, name)
        if value < (0 if name == "steps" else 1):
            parser.error(f"--{name.replace('_', '-')} must be >= {0 if name == 'steps' else 1}, got {value}")
    if args.dp < 1:
        parser.error(f"--dp must be >= 1, got {args.dp}")
    if FFN % args.tp:
        parser.error(f"--tp {args.tp} must divide the hidden size {FFN}")
    faults = []
    for text in args.fault_kill:
        try:
            process, step = (int(v) for v in text.split(":"))
        except ValueError:
            parser.error(f"--fault-kill expects P:S (two integers), got {text!r}")
        faults.append((process, step))
    args.fault_kill = faults
    return args


class AllReduceForward(torch.autograd.Function):
    """Sums the tp ranks' partial results in the forward pass; the gradient passes through
    unchanged (Megatron's reduce-from-tensor-parallel region)."""

    @staticmethod
    def forward(ctx, x, group):
        out = x.clone()
        dist.all_reduce(out, group=group)
        return out

    @staticmethod
    def backward(ctx, grad):
        return grad, None


class Model(torch.nn.Module):
    """y = relu(x W1 + b1) W2 + b2, with W1's columns, b1 and W2's rows split over tp."""

    def __init__(self, tp, tp_rank, tp_group):
        super().__init__()
        g = torch.Generator().manual_seed(SEED)
        w1 = torch.randn(HIDDEN, FFN, generator=g) / HIDDEN ** 0.5
        b1 = torch.zeros(FFN)
        w2 = torch.randn(FFN, HIDDEN, generator=g) / FFN ** 0.5
        cols = slice(tp_rank * FFN // tp, (tp_rank + 1) * FFN // tp)
        self.w1 = torch.nn.Parameter(w1[:, cols].clone())
        self.b1 = torch.nn.Parameter(b1[cols].clone())
        self.w2 = torch.nn.Parameter(w2[cols, :].clone())
        self.b2 = torch.nn.Parameter(torch.zeros(HIDDEN))
        self.tp_group = tp_group

    def forward(self, x):
        h = torch.relu(x @ self.w1 + self.b1)
        return AllReduceForward.apply(h @ self.w2, self.tp_group) + self.b2


def batch(step, micro, size):
    """Micro-batch `micro` of step `step`: a function of both alone."""
    g = torch.Generator().manual_seed(SEED + 7919 * step + 104729 * micro)
    x = torch.randn(size, HIDDEN, generator=g)
    target = torch.sin(x.roll(1, dims=1) * 1.5)
    return x, target


def main(argv=None):
    args = parse_args(sys.argv[1:] if argv is None else argv)
    torch.set_num_threads(1)
    torch.use_deterministic_algorithms(True)
    import commgrid
    import commgrid.torch as cgt

    dp = args.dp
    try:
        driver = cgt.ResilientDriver(tp=args.tp, snapshot_every=args.snapshot_every,
                                     state_from=args.state_from, shrink=not args.no_shrink,
                                     global_batch=dp, kinds=("tp", "dp"))
    except (commgrid.ConfigError, cgt.TorchTooOldError) as error:
        print(f"error: {error}", file=sys.stderr)
        return 2
    if args.tp * dp != driver.world_size:
        print(f"error: --tp {args.tp} x --dp {dp} is {args.tp * dp}, but the launch's world "
              f"has {driver.world_size} ranks", file=sys.stderr)
        return 2
    micro_batches = dp  # the global batch: one micro-batch per replica of epoch 0
    live = {}

    def start_epoch(epoch):
        tp_rank = epoch.coordinates["tp"]
        model = Model(args.tp, tp_rank, epoch.group("tp"))
        live["epoch"] = epoch
        live["model"] = model
        live["optim"] = torch.optim.Adam(model.parameters(), lr=args.lr, foreach=False)

    def stop_epoch():
        live.clear()

    def state_dict():
        return {"model": live["model"].state_dict(), "optim": live["optim"].state_dict()}

    def load_state_dict(state):
        live["model"].load_state_dict(state["model"])
        live["optim"].load_state_dict(state["optim"])

    def begin_step(step):
        if driver.incarnation == 0 and (driver.process, step) in args.fault_kill:
            os.kill(os.getpid(), signal.SIGKILL)

    def step(n):
        epoch, model, optim = live["epoch"], live["model"], live["optim"]
        dp_group = epoch.group("dp")
        # Each replica takes its share of the global batch (more micro-batches after a
        # shrink), and sums their gradients; the dp all-reduce sums the replicas'.
        share = micro_batches // epoch.dp
        first = epoch.coordinates["dp"] * share
        optim.zero_grad(set_to_none=False)
        total = torch.zeros(())
        for micro in range(first, first + share):
            x, target = batch(n, micro, args.micro_batch)
            loss = torch.nn.functional.mse_loss(model(x), target)
            loss.backward()
            total += loss.detach()
        params = [p for p in model.parameters()]
        flat = torch.cat([p.grad.reshape(-1) for p in params])
        dist.all_reduce(flat, group=dp_group)
        flat /= micro_batches
        at = 0
        for p in params:
            p.grad.copy_(flat[at:at + p.numel()].view_as(p))
            at += p.numel()
        optim.step()
        dist.all_reduce(total, group=dp_group)
        if epoch.rank == 0:
            print(f"step {n} loss {float(total / micro_batches)!r}", flush=True)

    def recovered(record):
        if live.get("epoch") is not None and live["epoch"].rank == 0:
            print(f"recovered into epoch {record['epoch']} at step {record['resumed_at']} "
                  f"(dead: {record['dead']}, shrink: {record['shrink']}; agreement "
                  f"{record['agreement_s']:.3f} s, groups {record['groups_s']:.3f} s, model "
                  f"{record['model_s']:.3f} s, state {record['state_s']:.3f} s; collectives "
                  f"ended by launch's signal on this process: {record['ended_by_launch']})",
                  file=sys.stderr, flush=True)

    try:
        driver.run(args.steps, start_epoch=start_epoch, stop_epoch=stop_epoch, step=step,
                   state_dict=state_dict, load_state_dict=load_state_dict,
                   begin_step=begin_step, recovered=recovered)
    except cgt.RecoveryError as error:
        print(f"error: {error}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
