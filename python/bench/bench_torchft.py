#!/usr/bin/env python3
"""Fault tolerance side by side: commgrid.torch's ResilientDriver vs TorchFT 0.2.0.

    PYTHONPATH=build/python .venv/bin/python python/bench/bench_torchft.py \\
        --procs 4 8 --repeats 2 --timeout 60 10 --heartbeat-ms 5000 1000

The same small model (a two-layer MLP, Adam, float32 on the CPU) is trained data-parallel
over N processes in both: each process is one data-parallel replica, each step's gradients
are averaged with one all-reduce of one flat buffer over Gloo.

- TorchFT: its lighthouse (the `torchft_lighthouse` binary of the torchft wheel, started
  here), one replica group of 1 process per replica, each with a torchft.Manager (its own
  TCPStore, torchft.process_group.ProcessGroupGloo) that takes a quorum every step,
  all-reduces with Manager.allreduce and steps the optimizer when Manager.should_commit()
  says so. Lighthouse min_replicas and the Manager's min_replica_size are N - 1 (the
  survivors of one death go on with N - 1 replicas: TorchFT's way after a death without a
  restart).
- commgrid: `commgrid launch -n N+1 --spares 1` (one hot spare takes the dead rank) and,
  with --shrink, `commgrid launch -n N --spares 0` (dp N -> N - 1), each process running
  commgrid.torch.ResilientDriver (snapshot every step, state from a replica), all-reducing
  over the epoch's torch Gloo dp group.

Each run trains --warmup steps, then --steps measured steps (the steady-state time per step:
process 0's mean interval between completed steps over them, no failure yet); in the next
step replica 1's process stops at its kill point (--kill-point: before the step, or in it just
before the gradient all-reduce) and the bench SIGKILLs it; the survivors train --after more
steps. Recovery time (the same definition for both, printed): from the SIGKILL to the moment
every process of the configuration that excludes the killed process (TorchFT: the quorum of
N - 1 replicas; commgrid: the next epoch, with the spare, or shrunk) has completed its first
step in it; the last of them counts. --sides warm is commgrid with a spare whose processes
first run one throwaway step, a state save/load and a 1-rank Gloo all-reduce (program code).

Timeouts are set alike on both sides per setting T/H: T seconds bounds every operation
(TorchFT's Manager timeout, quorum_timeout and connect_timeout, its ProcessGroupGloo's
timeout; commgrid's COMMGRID_TIMEOUT via `launch --timeout T`), H ms is TorchFT's lighthouse
heartbeat timeout (commgrid has none: launch sees a child's death at once). TorchFT's
defaults are T = 60, H = 5000.

Every process started here is in its own session and is killed (SIGKILL to its process
group) on exit, on error and on SIGINT/SIGTERM; every wait is bounded by --run-timeout.
"""
import argparse
import json
import os
import queue
import re
import shutil
import signal
import socket
import statistics
import subprocess
import sys
import threading
import time
from pathlib import Path

SEED = 1234
TAG = "cgbench"
RECOVERY_DEFINITION = (
    "recovery = from the SIGKILL of replica 1's process to the moment every process of the "
    "configuration without it (TorchFT: the quorum of N-1 replicas; commgrid: the next epoch, "
    "spare or shrunk) has completed its first step in it (the last of them)")


# ---------------------------------------------------------------------------------------
# Flags
# ---------------------------------------------------------------------------------------
def positive_int(text):
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected an integer, got {text!r}") from None
    if value < 1:
        raise argparse.ArgumentTypeError(f"must be >= 1, got {value}")
    return value


def positive_float(text):
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a number, got {text!r}") from None
    if not value > 0:
        raise argparse.ArgumentTypeError(f"must be > 0, got {text}")
    return value


def parse_args(argv):
    parser = argparse.ArgumentParser(prog="bench_torchft.py", description=__doc__.splitlines()[0])
    parser.add_argument("--procs", type=positive_int, nargs="+", default=[4, 8],
                        help="data-parallel sizes N (processes training; >= 2)")
    parser.add_argument("--warmup", type=positive_int, default=5, help="steps before the measured ones")
    parser.add_argument("--steps", type=positive_int, default=30,
                        help="measured steps before the kill (steady-state time per step)")
    parser.add_argument("--after", type=positive_int, default=5, help="steps after the kill")
    parser.add_argument("--repeats", type=positive_int, default=2, help="runs of each side and setting")
    parser.add_argument("--timeout", type=positive_float, nargs="+", default=[60.0, 10.0],
                        help="T per setting: seconds bounding every operation on both sides")
    parser.add_argument("--heartbeat-ms", type=positive_int, nargs="+", default=[5000, 1000],
                        help="H per setting: TorchFT's lighthouse heartbeat timeout (ms)")
    parser.add_argument("--sides", nargs="+", choices=("torchft", "spare", "warm", "shrink"),
                        default=["torchft", "spare", "warm", "shrink"],
                        help="what runs: TorchFT; commgrid with a spare; the same with every "
                             "process warmed up first (one throwaway step, a state save/load and a "
                             "1-rank Gloo all-reduce before driver.run, so that a spare has the "
                             "code a recovery runs paged in); commgrid without a spare (dp N -> "
                             "N-1; at the first setting and kill point only)")
    parser.add_argument("--kill-point", choices=("start", "collective"), nargs="+",
                        default=["start", "collective"],
                        help="where in step K = warmup + steps the victim is killed: start (before "
                             "anything of the step: TorchFT's quorum, commgrid's snapshot) or "
                             "collective (in the step, just before the gradient all-reduce, "
                             "TorchFT's quorum of the step taken)")
    parser.add_argument("--warm-spares", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--snapshot-every", type=positive_int, default=1,
                        help="commgrid's K: a snapshot every K steps (a rollback loses < K steps)")
    parser.add_argument("--hidden", type=positive_int, default=64, help="model width")
    parser.add_argument("--ffn", type=positive_int, default=256, help="model inner width")
    parser.add_argument("--batch", type=positive_int, default=32, help="samples per replica and step")
    parser.add_argument("--run-timeout", type=positive_float, default=300.0,
                        help="seconds: the bound of one run (start to every process's end)")
    parser.add_argument("--commgrid", default="build/tools/commgrid", help="the commgrid command")
    parser.add_argument("--lighthouse", default=None,
                        help="the torchft_lighthouse binary (default: beside this Python)")
    parser.add_argument("--format", choices=("text", "json"), default="text")
    # The processes this bench starts run this file again with --worker.
    parser.add_argument("--worker", choices=("torchft", "commgrid"), help=argparse.SUPPRESS)
    parser.add_argument("--replica", type=int, default=0, help=argparse.SUPPRESS)
    parser.add_argument("--lighthouse-addr", default="", help=argparse.SUPPRESS)
    parser.add_argument("--ready-dir", default="", help=argparse.SUPPRESS)
    parser.add_argument("--victim", type=int, default=1, help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.worker is None:
        if min(args.procs) < 2:
            parser.error(f"--procs: every N must be >= 2 (a survivor is needed), got {min(args.procs)}")
        if len(args.timeout) != len(args.heartbeat_ms):
            parser.error(f"--timeout has {len(args.timeout)} values and --heartbeat-ms "
                         f"{len(args.heartbeat_ms)}: one of each per setting")
        for t, h in zip(args.timeout, args.heartbeat_ms):
            if h >= t * 1000:
                parser.error(f"--heartbeat-ms {h} must be below its setting's --timeout {t:g} s")
        if shutil.which(args.commgrid) is None:
            parser.error(f"--commgrid: {args.commgrid!r} is not an executable (build it: "
                         "cmake --build build --target commgrid_cli)")
        if args.lighthouse is None:
            args.lighthouse = str(Path(sys.executable).parent / "torchft_lighthouse")
        if shutil.which(args.lighthouse) is None:
            parser.error(f"--lighthouse: {args.lighthouse!r} is not an executable (torchft "
                         "0.2.0 installs it: scripts/install-venv)")
    return args


# ---------------------------------------------------------------------------------------
# The model and the data, the same on both sides
# ---------------------------------------------------------------------------------------
def make_model(torch, hidden, ffn):
    torch.manual_seed(SEED)
    return torch.nn.Sequential(torch.nn.Linear(hidden, ffn), torch.nn.ReLU(),
                               torch.nn.Linear(ffn, hidden))


def batch(torch, step, replica, size, hidden):
    g = torch.Generator().manual_seed(SEED + 7919 * step + 104729 * replica)
    x = torch.randn(size, hidden, generator=g)
    return x, torch.sin(x.roll(1, dims=1) * 1.5)


def flat_grads(torch, model):
    return torch.cat([p.grad.reshape(-1) for p in model.parameters()])


def set_grads(model, flat):
    at = 0
    for p in model.parameters():
        p.grad.copy_(flat[at:at + p.numel()].view_as(p))
        at += p.numel()


def emit(line):
    """One line the bench parses, in one write(2) of the line and its newline: the process
    shares its stdout pipe with TorchFT's Rust logger, and a line written in parts can have
    a log record land inside it."""
    sys.stdout.flush()
    os.write(1, (line + "\n").encode())


def log(kind, proc, step, config, members):
    emit(f"{TAG} {kind} proc {proc} step {step} t {time.time():.6f} config {config} "
         f"members {members}")


def total_steps(args):
    return args.warmup + args.steps + args.after


def kill_step(args):
    return args.warmup + args.steps


def await_kill(kind, proc, args):
    """The victim, at its kill point: says so and waits for the bench's SIGKILL."""
    emit(f"{TAG} awaiting-kill {kind} proc {proc} t {time.time():.6f}")
    time.sleep(args.run_timeout)
    print(f"error: process {proc} was not killed within {args.run_timeout:g} s", file=sys.stderr,
          flush=True)
    os._exit(1)


# ---------------------------------------------------------------------------------------
# Workers
# ---------------------------------------------------------------------------------------
def torchft_worker(args):
    import datetime

    import torch
    from torch.distributed import TCPStore
    from torchft import Manager
    from torchft.process_group import ProcessGroupGloo

    torch.set_num_threads(1)
    n, replica = args.procs[0], args.replica
    timeout = datetime.timedelta(seconds=args.timeout[0])
    model = make_model(torch, args.hidden, args.ffn)
    optim = torch.optim.Adam(model.parameters(), lr=0.01, foreach=False)
    for p in model.parameters():
        p.grad = torch.zeros_like(p)
    # The replica group's own store (one process per group: this one serves it).
    store = TCPStore("127.0.0.1", 0, None, True, timeout=timeout, wait_for_workers=False)
    manager = Manager(
        pg=ProcessGroupGloo(timeout=timeout),
        load_state_dict=lambda s: (model.load_state_dict(s["model"]), optim.load_state_dict(s["optim"])),
        state_dict=lambda: {"model": model.state_dict(), "optim": optim.state_dict()},
        min_replica_size=n - 1, timeout=timeout, quorum_timeout=timeout, connect_timeout=timeout,
        rank=0, world_size=1, store_addr="127.0.0.1", store_port=store.port,
        lighthouse_addr=args.lighthouse_addr, replica_id=f"bench_{replica}", hostname="127.0.0.1")
    emit(f"{TAG} ready torchft proc {replica} pid {os.getpid()}")
    # Start together: every replica heartbeats before the first quorum, so that it has all N.
    Path(args.ready_dir, str(replica)).touch()
    deadline = time.monotonic() + args.run_timeout
    while len(os.listdir(args.ready_dir)) < n:
        if time.monotonic() > deadline:
            print(f"error: replica {replica}: the other replicas were not ready in "
                  f"{args.run_timeout:g} s", file=sys.stderr, flush=True)
            os._exit(1)
        time.sleep(0.05)
    steps = total_steps(args)
    victim = replica == args.victim
    while manager.current_step() < steps:
        if victim and manager.current_step() == kill_step(args) and args.kill_point[0] == "start":
            await_kill("torchft", replica, args)
        manager.start_quorum()
        step = manager.current_step()
        model.zero_grad(set_to_none=False)
        x, target = batch(torch, step, replica, args.batch, args.hidden)
        torch.nn.functional.mse_loss(model(x), target).backward()
        flat = flat_grads(torch, model)
        if victim and step == kill_step(args) and args.kill_point[0] == "collective":
            manager.wait_quorum()  # a member of the step's quorum
            await_kill("torchft", replica, args)
        manager.allreduce(flat).wait()  # averaged over the quorum's participants
        set_grads(model, flat)
        if manager.should_commit():
            optim.step()
            log("torchft", replica, step, manager._quorum_id, manager.num_participants())
        else:
            error = str(manager.errored() or "").splitlines()
            emit(f"{TAG} uncommitted proc {replica} step {step} t {time.time():.6f} "
                 f"{error[0][:160] if error else ''}")
    manager.shutdown(wait=False)
    sys.stdout.flush()
    os._exit(0)


def warm_up(torch, dist, args):
    """One throwaway step, state round trip and 1-rank Gloo all-reduce (--warm-spares)."""
    import datetime
    import io

    model = make_model(torch, args.hidden, args.ffn)
    optim = torch.optim.Adam(model.parameters(), lr=0.01, foreach=False)
    x, target = batch(torch, 0, 0, args.batch, args.hidden)
    torch.nn.functional.mse_loss(model(x), target).backward()
    optim.step()
    buffer = io.BytesIO()
    torch.save({"model": model.state_dict(), "optim": optim.state_dict()}, buffer)
    state = torch.load(io.BytesIO(buffer.getvalue()), weights_only=True)
    model.load_state_dict(state["model"])
    optim.load_state_dict(state["optim"])
    store = dist.TCPStore("127.0.0.1", 0, 1, True, timeout=datetime.timedelta(seconds=60))
    dist.init_process_group("gloo", store=store, rank=0, world_size=1)
    flat = flat_grads(torch, model)
    dist.all_reduce(flat)
    dist.destroy_process_group()


def commgrid_worker(args):
    import torch
    import torch.distributed as dist

    import commgrid.torch as cgt

    torch.set_num_threads(1)
    if args.warm_spares:
        warm_up(torch, dist, args)
    driver = cgt.ResilientDriver(snapshot_every=args.snapshot_every, shrink=True, kinds=("dp",))
    proc = driver.process
    victim = proc == args.victim and driver.incarnation == 0
    emit(f"{TAG} ready commgrid proc {proc} pid {os.getpid()}")
    live = {}

    def start_epoch(epoch):
        model = make_model(torch, args.hidden, args.ffn)
        for p in model.parameters():
            p.grad = torch.zeros_like(p)
        live.update(epoch=epoch, model=model,
                    optim=torch.optim.Adam(model.parameters(), lr=0.01, foreach=False))

    def step(n):
        epoch, model, optim = live["epoch"], live["model"], live["optim"]
        model.zero_grad(set_to_none=False)
        x, target = batch(torch, n, epoch.coordinates["dp"], args.batch, args.hidden)
        torch.nn.functional.mse_loss(model(x), target).backward()
        flat = flat_grads(torch, model)
        if victim and n == kill_step(args) and args.kill_point[0] == "collective":
            await_kill("commgrid", proc, args)
        dist.all_reduce(flat, group=epoch.group("dp"))
        flat /= epoch.dp
        set_grads(model, flat)
        optim.step()
        log("commgrid", proc, n, epoch.epoch, epoch.dp)

    def begin_step(n):
        if victim and n == kill_step(args) and args.kill_point[0] == "start":
            await_kill("commgrid", proc, args)

    def recovered(record):
        emit(f"{TAG} recovered proc {proc} " + json.dumps(
            {k: record[k] for k in ("epoch", "resumed_at", "agreement_s", "groups_s", "model_s",
                                    "state_s") if k in record}))

    driver.run(total_steps(args), start_epoch=start_epoch, stop_epoch=live.clear, step=step,
               begin_step=begin_step, recovered=recovered,
               state_dict=lambda: {"model": live["model"].state_dict(),
                                   "optim": live["optim"].state_dict()},
               load_state_dict=lambda s: (live["model"].load_state_dict(s["model"]),
                                          live["optim"].load_state_dict(s["optim"])))
    return 0


# ---------------------------------------------------------------------------------------
# The bench: start, watch, kill, clean up
# ---------------------------------------------------------------------------------------
class Run:
    """The processes of one run, their output lines (timestamped as read), and cleanup."""

    def __init__(self, deadline):
        self.procs = []
        self.lines = queue.Queue()
        self.deadline = deadline
        self.log = []

    def start(self, name, cmd, env=None):
        p = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                             env=env, start_new_session=True, stdin=subprocess.DEVNULL)
        self.procs.append((name, p))
        threading.Thread(target=self._read, args=(name, p), daemon=True).start()
        return p

    def _read(self, name, p):
        for line in p.stdout:
            self.lines.put((name, line.rstrip("\n")))
        self.lines.put((name, None))

    def next_line(self):
        left = self.deadline - time.monotonic()
        try:
            if left <= 0:
                raise queue.Empty
            return self.lines.get(timeout=left)
        except queue.Empty:
            raise TimeoutError("the run passed --run-timeout") from None

    def kill_all(self):
        for _, p in self.procs:
            if p.poll() is None:
                try:
                    os.killpg(p.pid, signal.SIGKILL)
                except ProcessLookupError:
                    pass
        for _, p in self.procs:
            try:
                p.wait(timeout=10)
            except subprocess.TimeoutExpired:
                pass


RUNS = []  # the live runs, for the signal handler


def cleanup_all():
    for run in list(RUNS):
        run.kill_all()


READY = re.compile(re.escape(TAG) + r" ready \S+ proc (\d+) pid (\d+)")


def parse_step(line):
    # cgbench KIND proc P step S t T config C members M
    f = line.split()
    return {"proc": int(f[3]), "step": int(f[5]), "t": float(f[7]), "config": int(f[9]),
            "members": int(f[11])}


def watch(run, expected_exits, victim_pid_of):
    """Reads lines until `expected_exits` readers closed; SIGKILLs the victim when it says it
    waits at its kill point. Returns (steps, kill time, events, the other lines): events are
    TorchFT's uncommitted steps (time, line) and commgrid's recovery records (dicts)."""
    steps, events, other, pids = [], [], [], {}
    t_kill = None
    closed = 0
    while closed < expected_exits:
        name, line = run.next_line()
        if line is None:
            closed += 1
            continue
        if line.startswith(f"{TAG} ready"):
            m = READY.fullmatch(line)
            if m is None:  # never guess a pid to SIGKILL
                raise RuntimeError(f"unreadable ready line from {name}: {line!r}")
            pids[int(m.group(1))] = int(m.group(2))
        elif line.startswith(f"{TAG} awaiting-kill") and t_kill is None:
            pid = victim_pid_of(pids)
            t_kill = time.time()
            os.kill(pid, signal.SIGKILL)
        elif line.startswith(f"{TAG} recovered"):
            events.append(json.loads(line.split(" ", 4)[4]))
        elif line.startswith(f"{TAG} uncommitted"):
            events.append({"t": float(line.split()[7]), "line": line})
        elif line.startswith(f"{TAG} ") and " step " in line:
            steps.append(parse_step(line))
        else:
            other.append(f"[{name}] {line}")
    if t_kill is None:
        raise RuntimeError("the victim never reached its kill point:\n" + "\n".join(other[-30:]))
    return steps, t_kill, events, other


def measure(steps, t_kill, args, victim_proc, new_config):
    """Steady-state seconds per step (process 0's mean interval between completed steps over
    the measured steps, each step's first completion) and recovery seconds (see
    RECOVERY_DEFINITION); `new_config(line)` says whether a step ran without the victim."""
    first, last = args.warmup, args.warmup + args.steps - 1
    t0 = {}
    for s in steps:
        if s["proc"] == 0:
            t0.setdefault(s["step"], s["t"])
    if first - 1 not in t0 or last not in t0:
        raise RuntimeError(f"process 0 did not report steps {first - 1} and {last}")
    per_step = (t0[last] - t0[first - 1]) / (last - first + 1)
    recovery, firsts = None, {}
    if t_kill is not None:
        for s in steps:
            if s["t"] > t_kill and new_config(s) and s["proc"] != victim_proc:
                firsts.setdefault(s["proc"], s["t"])
        if firsts:
            recovery = max(firsts.values()) - t_kill
    return per_step, recovery, sorted(firsts)


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def run_torchft(args, n, timeout, heartbeat_ms, point, tmp):
    run = Run(time.monotonic() + args.run_timeout)
    RUNS.append(run)
    try:
        port = free_port()
        run.start("lighthouse", [args.lighthouse, "--bind", f"127.0.0.1:{port}",
                                 "--min_replicas", str(n - 1),
                                 "--heartbeat_timeout_ms", str(heartbeat_ms)])
        ready = Path(tmp, f"ready-{n}-{time.monotonic_ns()}")
        ready.mkdir()
        common = [sys.executable, os.path.abspath(__file__), "--worker", "torchft",
                  "--procs", str(n), "--timeout", str(timeout), "--heartbeat-ms", str(heartbeat_ms),
                  "--warmup", str(args.warmup), "--steps", str(args.steps), "--after", str(args.after),
                  "--hidden", str(args.hidden), "--ffn", str(args.ffn), "--batch", str(args.batch),
                  "--run-timeout", str(args.run_timeout), "--lighthouse-addr",
                  f"http://127.0.0.1:{port}", "--ready-dir", str(ready), "--kill-point", point]
        replicas = {}
        for r in range(n):
            replicas[r] = run.start(f"replica {r}", common + ["--replica", str(r)])
        # The lighthouse does not end by itself: watch the replicas' n readers.
        steps, t_kill, events, other = watch(run, n, lambda pids: replicas[1].pid)
        for r, p in replicas.items():
            p.wait(timeout=max(1.0, run.deadline - time.monotonic()))
        ok_codes = {r: p.returncode for r, p in replicas.items() if r != 1}
        if any(ok_codes.values()):
            raise RuntimeError(f"TorchFT replicas exited {ok_codes}:\n" + "\n".join(other[-30:]))
        before = [s for s in steps if s["proc"] == 0 and s["t"] < t_kill]
        if before and before[-1]["members"] != n:
            raise RuntimeError(f"TorchFT had {before[-1]['members']} of {n} replicas before the kill")
        # Without the victim: a step committed by a quorum of N - 1 replicas.
        per_step, recovery, _ = measure(steps, t_kill, args, 1, lambda s: s["members"] == n - 1)
        late = [e for e in events if t_kill is not None and e["t"] > t_kill]
        detail = {}
        if late:  # the survivors' steps given up (an allreduce failed, or timed out)
            first, last = min(late, key=lambda e: e["t"]), max(late, key=lambda e: e["t"])
            detail = {"uncommitted": len(late), "first_uncommitted_s": first["t"] - t_kill,
                      "last_uncommitted_s": last["t"] - t_kill,
                      "last_why": last["line"].split(" ", 8)[-1][:120]}
        else:
            detail = {"uncommitted": 0}
        return per_step, recovery, detail
    finally:
        run.kill_all()
        RUNS.remove(run)


def run_commgrid(args, n, timeout, spares, point, warm):
    run = Run(time.monotonic() + args.run_timeout)
    RUNS.append(run)
    try:
        env = dict(os.environ)
        cmd = [args.commgrid, "launch", "-n", str(n + spares), "--spares", str(spares),
               "--timeout", f"{timeout:g}", "--output", "raw", "--",
               sys.executable, os.path.abspath(__file__), "--worker", "commgrid",
               "--warmup", str(args.warmup), "--steps", str(args.steps), "--after", str(args.after),
               "--hidden", str(args.hidden), "--ffn", str(args.ffn), "--batch", str(args.batch),
               "--snapshot-every", str(args.snapshot_every), "--kill-point", point,
               *(["--warm-spares"] if warm else []),
               "--run-timeout", str(args.run_timeout)]
        launch = run.start("launch", cmd, env=env)
        steps, t_kill, events, other = watch(run, 1, lambda pids: pids[1])
        launch.wait(timeout=max(1.0, run.deadline - time.monotonic()))
        if launch.returncode != 0:
            raise RuntimeError(f"commgrid launch exited {launch.returncode}:\n" + "\n".join(other[-30:]))
        # Without the victim: a step of a later epoch than the first.
        per_step, recovery, _ = measure(steps, t_kill, args, 1, lambda s: s["config"] > 0)
        # The slowest process's part of the recovery (the driver's own record).
        detail = {k: max(e[k] for e in events) for k in ("agreement_s", "groups_s", "model_s",
                                                         "state_s") if events and k in events[0]}
        return per_step, recovery, detail
    finally:
        run.kill_all()
        RUNS.remove(run)


SIDES = {"torchft": "torchft", "spare": "commgrid spare", "warm": "commgrid warm spare",
         "shrink": "commgrid shrink"}


def plan(args, settings):
    """The runs, in order: the sides of each case one after the other (side by side under
    the same load); commgrid's shrink at the first setting and kill point only."""
    for n in args.procs:
        for si, (t, h) in enumerate(settings):
            for pi, point in enumerate(args.kill_point):
                for rep in range(args.repeats):
                    sides = [SIDES[side] for side in args.sides
                             if side != "shrink" or (si == 0 and pi == 0)]
                    for side in sides:
                        yield n, t, h, point, rep, side


def median(values):
    values = [v for v in values if v is not None]
    return statistics.median(values) if values else None


def fmt(seconds, unit="s"):
    if seconds is None:
        return "-"
    return f"{seconds * 1000:.2f} ms" if unit == "ms" else f"{seconds:.2f} s"


def main(argv=None):
    args = parse_args(sys.argv[1:] if argv is None else argv)
    if args.worker == "torchft":
        return torchft_worker(args)
    if args.worker == "commgrid":
        return commgrid_worker(args)

    def on_signal(signum, _frame):
        cleanup_all()
        sys.exit(128 + signum)

    signal.signal(signal.SIGTERM, on_signal)
    signal.signal(signal.SIGINT, on_signal)
    import tempfile

    import torch
    import torchft  # noqa: F401 - the version is checked below
    from importlib.metadata import version
    tft = version("torchft")
    if tft != "0.2.0":
        print(f"error: torchft {tft} is installed; this bench pins 0.2.0 (its lighthouse and "
              "Manager must match)", file=sys.stderr)
        return 2
    settings = list(zip(args.timeout, args.heartbeat_ms))
    out = print if args.format == "text" else (lambda *a, **k: print(*a, file=sys.stderr, **k))
    load0 = os.getloadavg()
    out(f"torch {torch.__version__}, torchft {tft}, commgrid {args.commgrid}; "
        f"load {load0[0]:.2f} {load0[1]:.2f} {load0[2]:.2f}")
    out(f"model: MLP {args.hidden}-{args.ffn}-{args.hidden}, Adam, float32, batch {args.batch} per "
        f"replica; {args.warmup} warm-up + {args.steps} measured steps, replica 1's process "
        f"SIGKILLed in step {args.warmup + args.steps} (at the kill point), {args.after} more "
        "steps")
    out(RECOVERY_DEFINITION)
    for t, h in settings:
        out(f"setting T={t:g}/H={h}: TorchFT lighthouse --heartbeat_timeout_ms {h} "
            f"--min_replicas N-1 (join_timeout_ms, quorum_tick_ms: defaults 60000, 100), Manager "
            f"timeout=quorum_timeout=connect_timeout={t:g} s, heartbeat_interval 100 ms "
            f"(default), ProcessGroupGloo timeout {t:g} s; commgrid launch --timeout {t:g} "
            f"(COMMGRID_TIMEOUT), snapshot every step")
    results = []
    with tempfile.TemporaryDirectory(prefix="bench_torchft_") as tmp:
        try:
            for n, t, h, point, rep, side in plan(args, settings):
                load = os.getloadavg()[0]
                try:
                    if side == "torchft":
                        per_step, recovery, detail = run_torchft(args, n, t, h, point, tmp)
                    else:
                        spares = 0 if side == "commgrid shrink" else 1
                        per_step, recovery, detail = run_commgrid(args, n, t, spares, point,
                                                                  side == "commgrid warm spare")
                except (RuntimeError, TimeoutError, subprocess.TimeoutExpired) as error:
                    # One failed run is reported (in full on stderr) and the others go on.
                    print(f"{side} run failed: {error}", file=sys.stderr, flush=True)
                    per_step, recovery = None, None
                    detail = {"error": str(error).splitlines()[0][:200]}
                results.append({"procs": n, "timeout_s": t, "heartbeat_ms": h, "kill_point": point,
                                "repeat": rep, "side": side, "per_step_s": per_step,
                                "recovery_s": recovery, "load": load, "detail": detail})
                parts = ", ".join(f"{k} {v:.2f}" if isinstance(v, float) else f"{k}: {v}"
                                  for k, v in detail.items())
                out(f"N={n} T={t:g}/H={h} kill at {point:10s} #{rep} {side:19s} per step "
                    f"{fmt(per_step, 'ms'):>9s}  recovery {fmt(recovery):>7s}  (load {load:.2f}) "
                    f"{parts}", flush=True)
        finally:
            cleanup_all()
    load1 = os.getloadavg()
    out(f"load at the end {load1[0]:.2f} {load1[1]:.2f} {load1[2]:.2f}")
    out("\nmedians (min-max) | N | T/H | kill at | per step TorchFT | commgrid | commgrid/TorchFT | "
        "recovery TorchFT | commgrid spare | TorchFT/commgrid | warm spare: per step | recovery | "
        "TorchFT/warm | commgrid shrink")
    summary = []

    def cell(values, unit):
        values = [v for v in values if v is not None]
        if not values:
            return "-"
        if len(values) == 1:
            return fmt(values[0], unit)
        return f"{fmt(median(values), unit)} ({fmt(min(values), unit)}-{fmt(max(values), unit)})"

    cases = [(n, s, p) for n in args.procs for s in settings for p in args.kill_point]
    for n, (t, h), point in cases:
        def pick(side, key):
            return [r[key] for r in results if r["procs"] == n and r["timeout_s"] == t
                    and r["heartbeat_ms"] == h and r["kill_point"] == point
                    and r["side"] == side and r[key] is not None]
        ft_s, cg_s = pick("torchft", "per_step_s"), pick("commgrid spare", "per_step_s")
        ft_r, cg_r = pick("torchft", "recovery_s"), pick("commgrid spare", "recovery_s")
        sh_r = pick("commgrid shrink", "recovery_s")
        wa_s, wa_r = pick("commgrid warm spare", "per_step_s"), pick("commgrid warm spare", "recovery_s")
        row = {"procs": n, "timeout_s": t, "heartbeat_ms": h, "kill_point": point,
               "torchft_per_step_s": median(ft_s), "commgrid_per_step_s": median(cg_s),
               "torchft_recovery_s": median(ft_r), "commgrid_recovery_s": median(cg_r),
               "commgrid_shrink_recovery_s": median(sh_r),
               "commgrid_warm_per_step_s": median(wa_s), "commgrid_warm_recovery_s": median(wa_r)}
        summary.append(row)
        a, b = row["commgrid_per_step_s"], row["torchft_per_step_s"]
        ratio_s = f"{a / b:.2f}" if a and b else "-"
        a, b = row["torchft_recovery_s"], row["commgrid_recovery_s"]
        ratio_r = f"{a / b:.1f}" if a and b else "-"
        b = row["commgrid_warm_recovery_s"]
        ratio_w = f"{a / b:.1f}" if a and b else "-"
        out(f"| {n} | {t:g}/{h} | {point} | {cell(ft_s, 'ms')} | {cell(cg_s, 'ms')} | {ratio_s} | "
            f"{cell(ft_r, 's')} | {cell(cg_r, 's')} | {ratio_r} | {cell(wa_s, 'ms')} | "
            f"{cell(wa_r, 's')} | {ratio_w} | {cell(sh_r, 's')} |")
    if args.format == "json":
        print(json.dumps({"benchmark": "torchft", "torchft": tft, "torch": torch.__version__,
                          "definition": RECOVERY_DEFINITION, "load_start": load0,
                          "load_end": load1, "runs": results, "summary": summary}, indent=1))
    return 0


if __name__ == "__main__":
    try:
        sys.exit(main())
    except Exception as error:  # noqa: BLE001 - one error line, every process killed
        cleanup_all()
        print(f"error: {type(error).__name__}: {error}", file=sys.stderr)
        sys.exit(1)
