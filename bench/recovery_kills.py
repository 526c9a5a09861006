#!/usr/bin/env python3
"""Recovery time from SIGKILL to the first step completed after it, for a process lost in
each parallel dimension, side by side with restarting the whole job.

    bench/recovery_kills.py --build build --world 8 --repeats 5

For each layout (`--layouts` to choose; dp fills the world, so at W ranks each layout's
groups are tp, pp, cp, ep and a dp of W over the rest), each repeat runs train_gpt under
`commgrid launch -n W+1 --spares 1` with one process, chosen at random, killed at a random
step (train_gpt's own --fault-kill: it prints the monotonic time of its SIGKILL), and reads
from every process the monotonic time of its first step completed after the recovery.
Recovery = the last of those minus the kill. In the same run, the whole-job restart bound
of the same layout: the start-up of a fresh job (launch, world, groups, model: a 1-step run
minus one step, as bench/resilience.sh measures it), which leaves out reading a checkpoint
and the steps lost; and one steady step of the same job without a failure (42 steps minus 2,
over 40): the recovery ends with one step redone, so "median - one step" is what the
recovery itself took. Prints one row per layout and the medians, 95th percentiles and
maxima over every kill (Markdown). Seeds are printed: `--seed` replays.

Also, from the recovery line each process prints (train_gpt: its parts, its CPU time, the
monotonic time it ended at): the CPU time per process in a recovery, and when the last
process reached each point after the kill (entered its recovery, agreed, made its world
and groups, ended its recovery, completed the step redone).
"""
import argparse
import os
import random
import re
import statistics
import subprocess
import sys
import time

# Name -> (train_gpt's layout flags, the product of the sizes other than dp).
LAYOUTS = {
    "tp2 pp2": (["--tp", "2", "--pp", "2"], 4),
    "tp2 cp2": (["--tp", "2", "--cp", "2"], 4),
    "ep2 pp2 (moe)": (["--pp", "2", "--ep", "2", "--moe"], 2),
    "tp2 ep2 (moe)": (["--tp", "2", "--ep", "2", "--moe", "--sequence-parallel"], 2),
    "dp": ([], 1),
}
MODEL = ["--hidden", "16", "--seq", "16", "--layers", "2", "--snapshot-every", "1"]
KILLED = re.compile(r"process (\d+) kills itself at monotonic ([\d.]+) s")
CPU = re.compile(r"back at step \d+: agreement .* s, cpu ([\d.]+) s")
PARTS = re.compile(r"agreement ([\d.]+) s, groups ([\d.]+) s, model ([\d.]+) s, state ([\d.]+) s, "
                   r"cpu [\d.]+ s, done at monotonic ([\d.]+) s")
FIRST = re.compile(r"process (\d+) completed step \d+, its first since the recovery, at monotonic ([\d.]+) s")


def run(cmd, timeout):
    t0 = time.monotonic()
    p = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout)
    if p.returncode != 0:
        raise SystemExit(f"error: {' '.join(cmd)} exited {p.returncode}\n{p.stderr[-3000:]}")
    return time.monotonic() - t0, p.stderr


def percentile(values, q):
    v = sorted(values)
    return v[min(len(v) - 1, max(0, int(round(q * (len(v) - 1)))))]


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--build", default="build", help="build folder (commgrid and train_gpt)")
    ap.add_argument("--world", type=int, default=8, help="ranks W (the job runs W+1 processes)")
    ap.add_argument("--repeats", type=int, default=5, help="kills per layout")
    ap.add_argument("--steps", type=int, default=10, help="training steps per run")
    ap.add_argument("--timeout", type=int, default=60, help="commgrid launch --timeout")
    ap.add_argument("--layouts", nargs="*", default=list(LAYOUTS), choices=list(LAYOUTS))
    ap.add_argument("--seed", type=int, default=None)
    ap.add_argument("--keep-connections", action="store_true",
                    help="train_gpt --keep-connections in the killed runs; the restart bound is "
                         "then also measured for a job that keeps its connections")
    args = ap.parse_args()
    w = args.world
    for name in args.layouts:
        if w % LAYOUTS[name][1] != 0:
            ap.error(f"--world {w}: layout {name!r} needs a multiple of {LAYOUTS[name][1]}")
    if args.steps < 4:
        ap.error(f"--steps {args.steps}: at least 4 (the kill falls in steps 2 .. steps-2)")
    seed = args.seed if args.seed is not None else random.randrange(1 << 30)
    rng = random.Random(seed)
    cli = os.path.join(args.build, "tools", "commgrid")
    gpt = os.path.join(args.build, "examples", "train_gpt", "commgrid-train-gpt")
    print(f"world {w} (+1 spare), {args.steps} steps, {args.repeats} kills per layout, "
          f"seed {seed}, load {os.getloadavg()[0]:.1f}", flush=True)
    kept = ["--keep-connections"] if args.keep_connections else []
    head = ("| layout | dp | recovery median | p95 | max | one step | median - one step "
            "| whole-job restart >= | restart / median |")
    if kept:
        print(head + " kept-connections job's start-up >= | start-up / median |")
        print("|---|---|---|---|---|---|---|---|---|---|---|")
    else:
        print(head)
        print("|---|---|---|---|---|---|---|---|---|")
    every = []
    cpus = []  # per kill: every process's CPU time in its recovery
    # Per kill, the moment (after the kill) the last process reached each point of its
    # recovery: entered it (found the failure), agreed, made its world and groups, ended
    # its recovery, completed the step redone. From each process's parts and the monotonic
    # time it ended at (a shrink's transfer, counted in "state", is left in "groups").
    timelines = []
    for name in args.layouts:
        flags, others = LAYOUTS[name]
        # One sample per data-parallel rank and step, whatever dp the world gives.
        flags = flags + MODEL + ["--global-batch", str(w // others)]
        one, _ = run([cli, "launch", "-n", str(w), "--", gpt] + flags + ["--steps", "1"], 600)
        two, _ = run([cli, "launch", "-n", str(w), "--", gpt] + flags + ["--steps", "2"], 600)
        restart = 2 * one - two
        if kept:
            start = [cli, "launch", "-n", str(w), "--spares", "0", "--", gpt] + flags + \
                ["--spares", "0"] + kept
            k_one, _ = run(start + ["--steps", "1"], 600)
            k_two, _ = run(start + ["--steps", "2"], 600)
            kept_restart = 2 * k_one - k_two
        # One steady step of the killed runs' job (the same flags, no failure): 42 steps
        # minus 2, over 40. A recovery is measured to the end of the step redone after it,
        # so it holds one such step.
        steady = [cli, "launch", "-n", str(w + 1), "--spares", "1", "--", gpt] + flags + \
            ["--spares", "1"] + kept
        t42, _ = run(steady + ["--steps", "42"], 600)
        t2, _ = run(steady + ["--steps", "2"], 600)
        step_time = max(0.0, (t42 - t2) / 40)
        times = []
        for _ in range(args.repeats):
            victim, step = rng.randrange(w), rng.randint(2, args.steps - 2)
            _, err = run([cli, "launch", "-n", str(w + 1), "--spares", "1", "--timeout",
                          str(args.timeout), "--", gpt] + flags +
                         ["--steps", str(args.steps), "--spares", "1", "--fault-kill",
                          f"{victim}:{step}"] + kept, 600)
            killed = KILLED.search(err)
            firsts = [float(m.group(2)) for m in FIRST.finditer(err)]
            if killed is None or len(firsts) < w:
                raise SystemExit(f"error: {name}: process {victim} at step {step}: {len(firsts)} "
                                 f"first steps after the kill, expected {w}\n{err[-3000:]}")
            times.append(max(firsts) - float(killed.group(2)))
            cpus.append([float(c) for c in CPU.findall(err)])
            k = float(killed.group(2))
            points = {"entered": [], "agreed": [], "groups": [], "recovered": []}
            for a, g, m, st, done in (map(float, p) for p in PARTS.findall(err)):
                entered = done - (a + g + m + st) - k
                points["entered"].append(entered)
                points["agreed"].append(entered + a)
                points["groups"].append(entered + a + g)
                points["recovered"].append(done - k)
            timelines.append({n: max(v) for n, v in points.items()} | {"step redone": times[-1]})
            print(f"  {name}: process {victim} killed at step {step}: {times[-1]:.3f} s, "
                  f"recovery CPU per process median {statistics.median(cpus[-1]):.4f} s, "
                  f"max {max(cpus[-1]):.4f} s, all {sum(cpus[-1]):.3f} s",
                  file=sys.stderr, flush=True)
            print("    the last process: " + ", ".join(
                f"{n} {v * 1000:.0f} ms" for n, v in timelines[-1].items()),
                file=sys.stderr, flush=True)
        every += times
        med = statistics.median(times)
        row = (f"| {name} | {w // others} | {med:.3f} s | {percentile(times, 0.95):.3f} s | "
               f"{max(times):.3f} s | {step_time:.3f} s | {med - step_time:.3f} s | "
               f"{restart:.2f} s | {restart / med:.1f} |")
        if kept:
            row += f" {kept_restart:.2f} s | {kept_restart / med:.1f} |"
        print(row, flush=True)
    print(f"| every kill ({len(every)}) | | {statistics.median(every):.3f} s | "
          f"{percentile(every, 0.95):.3f} s | {max(every):.3f} s | | | | |" +
          (" | |" if kept else ""))
    # The work of a recovery, whatever the cores: CPU time of each process (all its
    # threads) from its failure notice to its recovery's end (the step redone left out).
    per = [c for kill in cpus for c in kill]
    print(f"recovery CPU time per process over every kill: median {statistics.median(per):.4f} s, "
          f"p95 {percentile(per, 0.95):.4f} s, max {max(per):.4f} s; all processes of a kill "
          f"together, median {statistics.median(sum(k) for k in cpus):.3f} s")
    print("when the last process reached each point after the kill, median over every kill: " +
          ", ".join(f"{n} {statistics.median(t[n] for t in timelines) * 1000:.0f} ms"
                    for n in timelines[0]))
    print(f"load at the end {os.getloadavg()[0]:.1f}")


if __name__ == "__main__":
    main()
