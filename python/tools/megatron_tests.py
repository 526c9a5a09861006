#!/usr/bin/env python3
"""Runs Megatron-LM's own parallel-state unit tests on 8 Gloo ranks on the CPU, against
megatron-core's real modules (the installed package, 0.19.2 in .venv/) or against
commgrid's drop-ins, and counts what passes.

Nothing of Megatron is kept in this repository: the test files are read from a Megatron-LM
git directory at run time (``git archive REV``) into a temporary directory, which is removed
afterwards; the modules under test are the installed megatron-core's.

    .venv/bin/python python/tools/megatron_tests.py --megatron-git <Megatron-LM git dir> \
        --rev f8837c04ef --impl megatron --impl commgrid --commgrid build/python

(f8837c04ef is the head of Megatron-LM's core_r0.19.0 branch, whose parallel_state.py,
process_groups_config.py and hyper_comm_grid.py are byte for byte those of the
megatron-core 0.19.2 wheel.) The files: tests/unit_tests/test_parallel_state.py,
test_process_groups_config.py and test_hyper_comm_grid.py (where the revision has them).
With --impl commgrid, ``megatron.core.parallel_state`` is ``commgrid.torch.head``,
``megatron.core.process_groups_config`` and ``megatron.core.hyper_comm_grid`` are modules
holding commgrid's classes of those names, put in place before megatron.core is imported
(so the rest of megatron-core, and the tests, see commgrid's).

How the tests run: the ids are collected once (pytest's order, ``-k`` applied); WORLD_SIZE
rank processes, started together, each run one pytest session over exactly those ids in that
order, as Megatron-LM's CI runs a test file under torchrun, each test doing its own set-up
and tear-down (Megatron's ``Utils.initialize_model_parallel`` / ``destroy_model_parallel``).
After every test the ranks wait for each other (a file barrier, bounded), so that a rank whose
test failed early cannot run ahead into the next test. Between tests the harness destroys the
process groups a passed test left in torch.distributed (Megatron's destroy forgets its groups;
torch keeps them, and a Gloo group holds threads and sockets), and after a test that failed
on any rank it tears torch.distributed down and makes the default group again on a fresh
port, so that one failure does not spill into the next tests. A test passes when it passes
on every rank. A test running past --timeout on a rank is interrupted (SIGALRM) and fails;
ranks stuck where the alarm cannot reach them (inside a C call) or that die are killed, the
test fails on the ranks that did not finish it, and fresh ranks go on with the next test.

What is adapted, and only the environment (no assertion of any test is changed):
- Megatron's tests ask for NCCL and GPUs. ``torch.distributed.init_process_group`` and
  ``new_group`` (torch's own callers of it included) get backend "gloo" instead of "nccl"
  (with a bounded timeout);
  ``torch.cuda.set_device``, ``synchronize``, ``current_device`` and ``memory.empty_cache``
  do nothing and ``torch.cuda.device_count()`` is the world size.
- ``megatron.training.argument_utils``, which Megatron's test utilities import and these
  tests never use, is not part of megatron-core: a stub.
- pytest-mock (``mocker``) comes from .venv/ (python/requirements.txt).
"""

import argparse
import json
import os
import random
import shutil
import signal
import subprocess
import sys
import tempfile
import textwrap
import time

TEST_FILES = ("tests/unit_tests/test_parallel_state.py",
              "tests/unit_tests/test_process_groups_config.py",
              "tests/unit_tests/test_hyper_comm_grid.py")
MODULES = ("megatron/core/parallel_state.py", "megatron/core/process_groups_config.py",
           "megatron/core/hyper_comm_grid.py")
SUPPORT = ("tests/unit_tests/test_utilities.py",)

# The environment adaptation, loaded by pytest as the root conftest of the temporary tree.
CONFTEST = r'''
import json, os, sys, types
from datetime import timedelta

import torch
import torch.distributed as dist

_TIMEOUT = timedelta(seconds=float(os.environ["HARNESS_PG_TIMEOUT"]))
_WORLD = int(os.environ["WORLD_SIZE"])

torch.cuda.set_device = lambda *a, **k: None
torch.cuda.synchronize = lambda *a, **k: None
torch.cuda.current_device = lambda: 0
torch.cuda.device_count = lambda: _WORLD
torch.cuda.memory.empty_cache = lambda: None

def _gloo(backend):
    return "gloo" if backend in ("nccl", "NCCL") else backend

_init = dist.init_process_group
def init_process_group(backend=None, *args, **kwargs):
    kwargs["timeout"] = _TIMEOUT
    return _init(_gloo(backend) or "gloo", *args, **kwargs)
dist.init_process_group = init_process_group

_new_group = dist.new_group
_new_group_signature = __import__("inspect").signature(_new_group)
def new_group(*args, **kwargs):
    bound = _new_group_signature.bind(*args, **kwargs)
    bound.arguments["backend"] = _gloo(bound.arguments.get("backend"))
    if bound.arguments.get("timeout") is None:
        bound.arguments["timeout"] = _TIMEOUT
    return _new_group(*bound.args, **bound.kwargs)
new_group.__signature__ = _new_group_signature
# torch.distributed's own callers (new_subgroups_by_enumeration, used by HyperCommGrid) too.
dist.new_group = dist.distributed_c10d.new_group = new_group

def _module(name, **attrs):
    mod = types.ModuleType(name)
    mod.__dict__.update(attrs)
    sys.modules[name] = mod
    return mod

def _not_here(*a, **k):
    raise NotImplementedError("megatron.training is not part of megatron-core")
_module("megatron.training").__path__ = []
_module("megatron.training.argument_utils", gpt_config_from_args=_not_here,
        hybrid_config_from_args=_not_here, pretrain_cfg_container_from_args=_not_here)

if os.environ.get("HARNESS_IMPL") == "commgrid":
    # Before megatron.core is imported: its parallel state is commgrid's.
    import commgrid
    import commgrid.torch.head
    sys.modules["megatron.core.parallel_state"] = commgrid.torch.head
    _module("megatron.core.process_groups_config", ProcessGroupCollection=commgrid.ProcessGroupCollection,
            MultiModuleProcessGroupCollection=commgrid.MultiModuleProcessGroupCollection,
            ModelCommProcessGroups=commgrid.ModelCommProcessGroups,
            GradCommProcessGroups=commgrid.GradCommProcessGroups)
    _module("megatron.core.hyper_comm_grid", HyperCommGrid=commgrid.HyperCommGrid)
    import megatron.core
    assert megatron.core.parallel_state is commgrid.torch.head

def pytest_configure(config):
    for mark in ("flaky", "flaky_in_dev", "internal"):  # Megatron's own markers
        config.addinivalue_line("markers", f"{mark}: a Megatron-LM test marker")
'''

def git(repo, *args, binary=False):
    return subprocess.run(["git", "-C", repo, *args], check=True, capture_output=True,
                          text=not binary).stdout


def has_path(repo, rev, path):
    return subprocess.run(["git", "-C", repo, "cat-file", "-e", f"{rev}:{path}"],
                          capture_output=True).returncode == 0


def lay_out(repo, rev, root):
    """The temporary tree of Megatron's test files for one revision; returns them. The
    modules under test are the installed megatron-core's (no megatron/ here)."""
    tests = [p for p in TEST_FILES if has_path(repo, rev, p)]
    archive = git(repo, "archive", rev, *(tests + list(SUPPORT)), binary=True)
    subprocess.run(["tar", "-x", "-C", root], input=archive, check=True)
    for pkg in ("tests", "tests/unit_tests"):
        open(os.path.join(root, pkg, "__init__.py"), "a").close()
    with open(os.path.join(root, "conftest.py"), "w") as f:
        f.write(CONFTEST)
    return tests


def environment(root, world, rank, args, impl):
    env = dict(os.environ)
    path = [root] + ([os.path.abspath(args.commgrid)] if args.commgrid else [])
    env.update(WORLD_SIZE=str(world), RANK=str(rank), LOCAL_RANK=str(rank),
               MASTER_ADDR="127.0.0.1", PYTHONDONTWRITEBYTECODE="1", OMP_NUM_THREADS="1",
               PYTHONPATH=os.pathsep.join(path + [env.get("PYTHONPATH", "")]),
               HARNESS_PG_TIMEOUT=str(args.pg_timeout), HARNESS_IMPL=impl,
               HARNESS_TOOLS=os.path.dirname(os.path.abspath(__file__)))
    return env


def collect(root, tests, args, impl):
    """The test ids, in pytest's collection order (the order every rank runs them in)."""
    env = environment(root, args.world_size, 0, args, impl)
    cmd = [sys.executable, "-m", "pytest", "--collect-only", "-q", "-p", "no:cacheprovider",
           "--rootdir", root, *tests]
    if args.k:
        cmd += ["-k", args.k]
    out = subprocess.run(cmd, cwd=root, env=env, capture_output=True, text=True)
    ids = [line.strip() for line in out.stdout.splitlines() if "::" in line]
    if not ids:
        raise SystemExit(f"error: no tests collected in {root}:\n{out.stdout[-3000:]}{out.stderr[-3000:]}")
    if len(set(ids)) != len(ids):
        raise SystemExit("error: pytest collected a test id twice")
    return ids


# ---- one rank: one pytest session over every test id ---------------------------------------------

class HarnessTimeout(Exception):
    """Raised in a test that runs past --timeout (SIGALRM, repeated until the test ends)."""


def _threads():
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith("Threads:"):
                return int(line.split()[1])
    return 0


class RankPlugin:
    """The pytest plugin of one rank's session. It runs exactly the ids the orchestrator
    collected, from --start on, in that order; arms a per-test alarm; after every test writes
    the outcome to the rank's event file, waits for every rank to finish the test (a file
    barrier with a timeout: a rank that never arrives makes the others exit, and the
    orchestrator restarts the ranks after that test) and cleans up between tests:
    - the test passed everywhere: the process groups it left in torch.distributed (Megatron's
      destroy_model_parallel forgets its groups, torch keeps them; Gloo groups hold threads
      and sockets) are destroyed, unless the model-parallel state still holds them;
    - it failed on some rank: the model-parallel state and the whole of torch.distributed are
      torn down (a failed collective or a rank that skipped a barrier leaves the default
      group out of step), and the default group is made again on a fresh port if it existed,
      as a class's setup had made it."""

    def __init__(self, args):
        with open(args.ids) as f:
            self.ids = json.load(f)
        self.rank, self.world, self.start = args.rank, args.world, args.start
        self.timeout, self.port_base = args.timeout, args.port_base
        self.sync = os.path.join(args.root, "sync", str(args.epoch))
        os.makedirs(self.sync, exist_ok=True)
        self.events = open(args.out, "a")
        self.index, self.outcome = {}, {}
        self.current, self.timed_out, self.began = None, False, 0.0

    def event(self, **fields):
        self.events.write(json.dumps(fields) + "\n")
        self.events.flush()

    def alarm(self, signum, frame):
        self.timed_out = True
        raise HarnessTimeout(f"ran past {self.timeout} s on rank {self.rank}")

    def pytest_collection_modifyitems(self, session, config, items):
        by_id = {item.nodeid: item for item in items}
        wanted = self.ids[self.start:]
        missing = [nodeid for nodeid in wanted if nodeid not in by_id]
        if missing:
            self.event(error=f"rank {self.rank} did not collect {missing[:3]}")
            os._exit(2)
        keep = set(wanted)
        config.hook.pytest_deselected(items=[i for i in items if i.nodeid not in keep])
        items[:] = [by_id[nodeid] for nodeid in wanted]
        self.index = {nodeid: self.start + k for k, nodeid in enumerate(wanted)}

    def pytest_collection_finish(self, session):
        self.event(ready=True)

    def pytest_runtest_logstart(self, nodeid, location):
        self.current, self.timed_out, self.began = nodeid, False, time.monotonic()
        self.event(begin=self.index[nodeid])
        signal.setitimer(signal.ITIMER_REAL, self.timeout, 10)

    def pytest_runtest_logreport(self, report):
        o = self.outcome.setdefault(report.nodeid, {"outcome": "passed", "why": ""})
        if report.failed and o["outcome"] != "failed":
            text = str(report.longrepr).strip().splitlines()
            errors = [line for line in text if line.startswith("E ")]
            why = errors[0] if errors else text[-1] if text else ""
            if report.when != "call":
                why = f"in {report.when}: {why}"
            o.update(outcome="failed", why=why[:300])
        elif report.skipped and o["outcome"] == "passed":
            o.update(outcome="skipped", why=str(report.longrepr)[-200:])

    def pytest_runtest_logfinish(self, nodeid, location):
        signal.setitimer(signal.ITIMER_REAL, 0)
        i = self.index[nodeid]
        o = self.outcome.pop(nodeid, None) or {"outcome": "failed", "why": "no report"}
        if self.timed_out:
            o.update(outcome="failed", why=f"timeout ({self.timeout:g} s)")
        import torch.distributed as dist
        world = dist.is_available() and dist.is_initialized()
        o.update(seconds=round(time.monotonic() - self.began, 2), threads=_threads())
        self.event(done=i, id=nodeid, **o)
        everyone = self.barrier(i, {"outcome": o["outcome"], "world": world})
        try:
            self.between(i, any(e["outcome"] == "failed" for e in everyone),
                         any(e["world"] for e in everyone))
        except Exception as e:  # noqa: BLE001  (the orchestrator restarts the ranks)
            self.event(error=f"rank {self.rank} after test {i}: {type(e).__name__}: {e}")
            os._exit(4)

    def barrier(self, i, mine):
        tmp = os.path.join(self.sync, f".{i}.{self.rank}")
        with open(tmp, "w") as f:
            json.dump(mine, f)
        os.replace(tmp, os.path.join(self.sync, f"{i}.{self.rank}"))
        paths = [os.path.join(self.sync, f"{i}.{r}") for r in range(self.world)]
        deadline = time.monotonic() + self.timeout + 60
        while not all(os.path.exists(p) for p in paths):
            if time.monotonic() > deadline:
                self.event(error=f"rank {self.rank}: not every rank finished test {i} in time")
                os._exit(3)
            time.sleep(0.02)
        everyone = []
        for p in paths:
            with open(p) as f:
                everyone.append(json.load(f))
        return everyone

    def between(self, i, failed, world):
        import gc
        import torch.distributed as dist
        c10d = dist.distributed_c10d
        ps = sys.modules.get("megatron.core.parallel_state")
        utils = getattr(sys.modules.get("tests.unit_tests.test_utilities"), "Utils", None)
        if failed:
            if ps is not None:
                try:
                    ps.destroy_model_parallel()
                except Exception:  # noqa: BLE001  (a half-made state: the groups go below)
                    pass
            if utils is not None:
                utils.inited, utils.store = False, None
            if dist.is_initialized():
                dist.destroy_process_group()
            gc.collect()
            os.environ["MASTER_PORT"] = str(self.port_base + 1 + i)
            if world:
                dist.init_process_group("gloo")  # env:// on the new port (conftest: timeout)
        elif dist.is_initialized() and not (ps is not None and ps.model_parallel_is_initialized()):
            default = c10d._get_default_group()
            for pg in list(c10d._world.pg_map):
                if pg is not default:
                    dist.destroy_process_group(pg)
            gc.collect()

    def pytest_sessionfinish(self, session, exitstatus):
        self.event(finished=int(exitstatus))


def rank_runner(args):
    """One rank: pytest over the test files, the ids restricted and ordered by RankPlugin."""
    import pytest
    plugin = RankPlugin(args)
    signal.signal(signal.SIGALRM, plugin.alarm)
    os.chdir(args.root)
    sys.path.insert(0, args.root)
    with open(args.files) as f:
        files = json.load(f)
    pytest.main([*files, "-p", "no:cacheprovider", "--rootdir", args.root, "-W",
                 "ignore::DeprecationWarning", "-o", "console_output_style=classic"],
                plugins=[plugin])
    sys.stdout.flush()
    sys.stderr.flush()
    # Not through the interpreter's exit: Gloo groups still alive are not torn down there.
    os._exit(0)


# ---- the orchestrator ----------------------------------------------------------------------------

def free_port_base(count):
    """A base port such that base .. base + count - 1 are free now (the default group of the
    first test is on base, a default group made again after test i on base + 1 + i)."""
    import socket
    for _ in range(200):
        base = random.randint(20000, 60000 - count)
        try:
            for port in range(base, base + count):
                with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
                    s.bind(("", port))
            return base
        except OSError:
            continue
    raise SystemExit(f"error: found no {count} free consecutive ports")


def _read_events(path):
    events = []
    try:
        with open(path) as f:
            for line in f:
                if line.endswith("\n"):
                    events.append(json.loads(line))
    except OSError:
        pass
    return events


def run_ranks(root, tests, ids, impl, args, log_name):
    """Runs ``ids`` on args.world_size long-lived ranks; returns every rank's outcome per id.
    Ranks that stop making progress (a test stuck where the alarm cannot reach it) or that
    die are killed, the test they were in counts as failed on the ranks that did not finish
    it, and fresh ranks go on with the next test."""
    world = args.world_size
    with open(os.path.join(root, "ids.json"), "w") as f:
        json.dump(ids, f)
    with open(os.path.join(root, "files.json"), "w") as f:
        json.dump(tests, f)
    port_base = free_port_base(len(ids) + 1)
    per_rank = [{} for _ in range(world)]
    start, epoch, restarts = 0, 0, {}
    stall = args.timeout + 90
    while start < len(ids):
        procs, logs, event_files = [], [], []
        for r in range(world):
            event_files.append(os.path.join(root, f"events.{epoch}.{r}"))
            env = environment(root, world, r, args, impl)
            env["MASTER_PORT"] = str(port_base + start)
            log = open(os.path.join(args.logs or root, f"{log_name}-rank{r}.log"), "a")
            logs.append(log)
            cmd = [sys.executable, os.path.abspath(__file__), "--rank-runner",
                   "--rank", str(r), "--world", str(world), "--root", root,
                   "--ids", os.path.join(root, "ids.json"), "--files", os.path.join(root, "files.json"),
                   "--start", str(start), "--epoch", str(epoch), "--out", event_files[-1],
                   "--port-base", str(port_base), "--timeout", str(args.timeout)]
            procs.append(subprocess.Popen(cmd, cwd=root, env=env, stdout=log, stderr=subprocess.STDOUT))
        began_epoch, seen, last_change, why_killed = time.monotonic(), -1, time.monotonic(), None
        try:
            while True:
                time.sleep(0.5)
                events = [_read_events(p) for p in event_files]
                count = sum(len(e) for e in events)
                if count != seen:
                    seen, last_change = count, time.monotonic()
                ready = all(any("ready" in e for e in ev) for ev in events)
                finished = [any("finished" in e for e in ev) for ev in events]
                codes = [p.poll() for p in procs]
                if all(c is not None for c in codes):
                    break
                died = [r for r in range(world) if codes[r] is not None and not finished[r]]
                if died:
                    why_killed = f"rank {died[0]} exited (exit {codes[died[0]]})"
                elif not ready and time.monotonic() - began_epoch > args.startup_timeout:
                    why_killed = f"the ranks did not start in {args.startup_timeout:g} s"
                elif ready and time.monotonic() - last_change > stall:
                    why_killed = f"timeout (no rank progressed for {stall:g} s; ranks killed)"
                if why_killed:
                    break
        finally:
            for p in procs:
                if p.poll() is None:
                    p.kill()
            for p in procs:
                p.wait()
            for log in logs:
                log.close()
        events = [_read_events(p) for p in event_files]
        late = [r for r, ev in enumerate(events) if not any("ready" in e for e in ev)]
        if late:
            with open(os.path.join(args.logs or root, f"{log_name}-rank{late[0]}.log")) as f:
                tail = f.read()[-3000:]
            raise SystemExit(f"error: {impl}: rank {late[0]} did not collect the tests "
                             f"({why_killed or 'it exited'}):\n{tail}")
        for r, ev in enumerate(events):
            for e in ev:
                if "done" in e:
                    per_rank[r][e["id"]] = {k: v for k, v in e.items() if k not in ("done", "id")}
                elif "error" in e:
                    print(f"   {impl}: {e['error']}", file=sys.stderr)
        if all(any("finished" in e for e in ev) for ev in events) and all(ids[-1] in pr for pr in per_rank):
            break
        # The first test that not every rank finished.
        j = min((i for i in range(start, len(ids)) if any(ids[i] not in pr for pr in per_rank)),
                default=len(ids))
        if j == len(ids):
            break
        began = [any(e.get("begin") == j for e in ev) for ev in events]
        why = why_killed or "a rank exited early"
        if not any(began):
            restarts[j] = restarts.get(j, 0) + 1
            if restarts[j] < 2:
                start, epoch = j, epoch + 1
                continue
            why = f"the ranks did not start it ({why})"
        for r, pr in enumerate(per_rank):
            if not began[r]:
                pr.setdefault(ids[j], {"outcome": "failed", "why": why})
            elif codes[r] is not None and codes[r] != 0:
                pr.setdefault(ids[j], {"outcome": "failed", "why": f"the rank died in the test (exit {codes[r]})"})
            else:
                pr.setdefault(ids[j], {"outcome": "failed", "why": (
                    "timeout: did not finish, the per-test alarm could not interrupt it "
                    f"(killed after {why_killed or 'the others'}); the ranks were restarted")})
        start, epoch = j + 1, epoch + 1
    return per_rank


def merge(ids, per_rank):
    merged = {}
    for nodeid in ids:
        outs = [pr.get(nodeid, {"outcome": "failed", "why": "not run"}) for pr in per_rank]
        kinds = {o["outcome"] for o in outs}
        seconds = max(o.get("seconds", 0) for o in outs)
        if kinds == {"passed"}:
            merged[nodeid] = {"outcome": "passed", "seconds": seconds}
        elif kinds == {"skipped"}:
            merged[nodeid] = {"outcome": "skipped", "why": outs[0]["why"], "seconds": seconds}
        else:
            bad = [r for r, o in enumerate(outs) if o["outcome"] != "passed"]
            first = next((outs[r] for r in bad if outs[r]["outcome"] == "failed"), outs[bad[0]])
            merged[nodeid] = {"outcome": "failed", "ranks": bad, "why": first["why"],
                              "seconds": seconds}
    threads = max((o.get("threads", 0) for pr in per_rank for o in pr.values()), default=0)
    return merged, threads


def run(repo, rev, impl, args):
    root = tempfile.mkdtemp(prefix=f"megatron-{rev[:10]}-{impl}-")
    try:
        tests = lay_out(repo, rev, root)
        ids = collect(root, tests, args, impl)
        per_rank = run_ranks(root, tests, ids, impl, args, f"{rev[:10]}-{impl}")
        return merge(ids, per_rank)
    finally:
        if not args.keep:
            shutil.rmtree(root, ignore_errors=True)


# ---- --record: Megatron's own creation sequence and per-rank globals ----------------------------

# The configs recorded with --record (name -> (world size, initialize_model_parallel keywords)),
# for the seed (encoder/decoder splits, the split rank, Gloo twins, dist-opt instances) and
# for HEAD (gtp_remat, hybrid cp, twins switched off). commgrid.torch is checked against
# them by python/tests/test_megatron_records.py.
RECORD_CONFIGS = {
    "seed": {
        "enc-tp5-etp3": (8, dict(tensor_model_parallel_size=5, encoder_tensor_model_parallel_size=3,
                                 encoder_pipeline_model_parallel_size=1)),
        "enc-tp3-etp1": (8, dict(tensor_model_parallel_size=3, encoder_tensor_model_parallel_size=1,
                                 encoder_pipeline_model_parallel_size=1)),
        "enc-tp2-ep2": (12, dict(tensor_model_parallel_size=2, expert_model_parallel_size=2,
                                 encoder_tensor_model_parallel_size=1,
                                 encoder_pipeline_model_parallel_size=1)),
        "enc-tp2-distopt2": (12, dict(tensor_model_parallel_size=2, encoder_tensor_model_parallel_size=1,
                                      encoder_pipeline_model_parallel_size=1,
                                      num_distributed_optimizer_instances=2)),
        "enc-cp2-pp2": (12, dict(pipeline_model_parallel_size=2, context_parallel_size=2,
                                 encoder_pipeline_model_parallel_size=1)),
        "tp2-pp2-ep2": (8, dict(tensor_model_parallel_size=2, pipeline_model_parallel_size=2,
                                expert_model_parallel_size=2)),
        "cp2-hcp-distopt2-vpp": (16, dict(tensor_model_parallel_size=2, pipeline_model_parallel_size=2,
                                          context_parallel_size=2,
                                          hierarchical_context_parallel_sizes=[2],
                                          num_distributed_optimizer_instances=2,
                                          virtual_pipeline_model_parallel_size=2)),
        "pp4-split2": (8, dict(pipeline_model_parallel_size=4, pipeline_model_parallel_split_rank=2)),
        "order-tp-pp-ep-dp-nogloo": (8, dict(tensor_model_parallel_size=2, expert_model_parallel_size=2,
                                             order="tp-pp-ep-dp", create_gloo_process_groups=False)),
    },
    "head": {
        "gtp2-egtp2": (16, dict(tensor_model_parallel_size=2, expert_model_parallel_size=2,
                                gtp_remat_size=2, expert_gtp_remat_size=2)),
        "egtp2-pp2": (16, dict(pipeline_model_parallel_size=2, expert_model_parallel_size=2,
                               expert_gtp_remat_size=2)),
        "hybrid-cp2-distopt2": (16, dict(context_parallel_size=2, hybrid_context_parallel=True,
                                         expert_model_parallel_size=2,
                                         num_distributed_optimizer_instances=2)),
        "tp2-pp2-hcp": (16, dict(tensor_model_parallel_size=2, pipeline_model_parallel_size=2,
                                 context_parallel_size=2, hierarchical_context_parallel_sizes=[2])),
    },
}


class _Group:
    """What the recorder's new_group returns: the ranks, the backend, size() and rank()."""

    def __init__(self, ranks, backend, me):
        self.ranks, self.backend, self.me = list(ranks), backend, me

    def size(self):
        return len(self.ranks)

    def rank(self):
        return sorted(self.ranks).index(self.me)


def plain(value):
    """A global's value as JSON: a group as {"ranks", "backend"}, lists and dicts inside."""
    if isinstance(value, _Group):
        return {"ranks": value.ranks, "backend": value.backend}
    if isinstance(value, (list, tuple)):
        return [plain(v) for v in value]
    if isinstance(value, dict):
        return {str(k): plain(v) for k, v in value.items()}
    if value is None or isinstance(value, (int, str, bool)):
        return value
    return "<object>"


def record_one(module_path, world, kwargs, install):
    """Runs Megatron's initialize_model_parallel as every rank of ``world`` in turn with
    torch.distributed replaced by a recorder; returns the calls (the same on every rank) and
    every rank's globals."""
    import importlib.util
    import torch.distributed as dist
    calls, per_rank = None, {}
    for rank in range(world):
        mine = []

        def new_group(ranks=None, timeout=None, backend=None, pg_options=None,
                      use_local_synchronization=False, group_desc=None):
            mine.append({"ranks": [int(r) for r in ranks], "backend": backend, "desc": group_desc})
            return _Group(ranks, backend, rank)
        saved = {n: getattr(dist, n) for n in ("is_initialized", "get_world_size", "get_rank", "new_group")}
        dist.is_initialized, dist.new_group = (lambda: True), new_group
        dist.get_world_size = lambda group=None: world if group is None else group.size()
        dist.get_rank = lambda group=None: rank if group is None else group.rank()
        try:
            install()
            spec = importlib.util.spec_from_file_location("megatron.core.parallel_state", module_path)
            ps = importlib.util.module_from_spec(spec)
            ps.__package__ = "megatron.core"
            spec.loader.exec_module(ps)
            ps.initialize_model_parallel(**kwargs)
        finally:
            for n, f in saved.items():
                setattr(dist, n, f)
        if calls is None:
            calls = mine
        elif mine != calls:
            raise SystemExit(f"error: {kwargs}: rank {rank} made other new_group calls than rank 0")
        per_rank[str(rank)] = {name: plain(getattr(ps, name)) for name in sorted(vars(ps))
                               if name.startswith("_") and name[1:2].isupper()
                               and name not in ("_GLOBAL_MEMORY_BUFFER", "_global_process_group_list")}
    return calls, per_rank


def record(args):
    """--record DIR: writes DIR/<edition>-<name>.json for every config of RECORD_CONFIGS."""
    os.makedirs(args.record, exist_ok=True)
    sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
    # The recorder's stubs (is_torch_min_version answers True, so that Megatron passes
    # group_desc, which the records keep).
    from head_creation_order import install_stubs as install

    for rev in args.rev or ["HEAD"]:
        commit = git(args.megatron_git, "rev-parse", rev).strip()
        source = git(args.megatron_git, "show", f"{commit}:megatron/core/parallel_state.py")
        edition = "head" if "gtp_remat_size" in source else "seed"
        with tempfile.TemporaryDirectory() as tmp:
            path = os.path.join(tmp, "parallel_state.py")
            with open(path, "w") as f:
                f.write(source)
            for name, (world, kwargs) in RECORD_CONFIGS[edition].items():
                calls, per_rank = record_one(path, world, kwargs, install)
                out = os.path.join(args.record, f"{edition}-{name}.json")
                with open(out, "w") as f:
                    json.dump({"megatron_commit": commit, "edition": edition, "world_size": world,
                               "kwargs": kwargs, "calls": calls, "globals": per_rank}, f,
                              separators=(",", ":"))
                    f.write("\n")
                print(f"{out}: {len(calls)} new_group calls, {world} ranks")


def summary(report):
    """The table per test file and implementation, as Markdown."""
    files = sorted({nodeid.split("::")[0] for merged, _ in report.values() for nodeid in merged})
    keys = list(report)
    lines = ["| test file | ids | " + " | ".join(f"{k}: passed / failed / skipped" for k in keys) + " |",
             "|---|---|" + "---|" * len(keys)]
    for name in files + ["all"]:
        row = []
        for key in keys:
            vs = [v for nodeid, v in report[key][0].items() if name == "all" or nodeid.startswith(name + "::")]
            n = {k: sum(1 for v in vs if v["outcome"] == k) for k in ("passed", "failed", "skipped")}
            row.append(f"{n['passed']} / {n['failed']} / {n['skipped']}")
        count = max(sum(1 for nodeid in merged if name == "all" or nodeid.startswith(name + "::"))
                    for merged, _ in report.values())
        label = "all" if name == "all" else f"`{os.path.basename(name)}`"
        lines.append(f"| {label} | {count} | " + " | ".join(row) + " |")
    return "\n".join(lines)


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--megatron-git", help="a Megatron-LM git directory (clone or bare mirror)")
    p.add_argument("--rev", action="append", help="revision (repeatable; default: HEAD)")
    p.add_argument("--impl", action="append", choices=["megatron", "commgrid"],
                   help="what megatron.core.parallel_state is (repeatable; default: both)")
    p.add_argument("--commgrid", help="directory that holds the commgrid package (build/python)")
    p.add_argument("--world-size", type=int, default=8)
    p.add_argument("--timeout", type=float, default=150,
                   help="seconds a test may run on a rank before it counts as failed")
    p.add_argument("--pg-timeout", type=float, default=60, help="Gloo collective timeout (s)")
    p.add_argument("--startup-timeout", type=float, default=900,
                   help="seconds the ranks may take to import and collect the tests")
    p.add_argument("-k", help="pytest -k expression: run only the matching tests")
    p.add_argument("--json", help="write every outcome to this file")
    p.add_argument("--logs", help="directory for the per-rank pytest logs (default: dropped)")
    p.add_argument("--keep", action="store_true", help="keep the temporary trees")
    p.add_argument("--record", metavar="DIR",
                   help="instead of running tests: record Megatron's creation calls and every rank's "
                        "globals for RECORD_CONFIGS into DIR (python/tests/data/megatron_records)")
    p.add_argument("--rank-runner", action="store_true", help=argparse.SUPPRESS)
    for hidden in ("--root", "--ids", "--files", "--out"):
        p.add_argument(hidden, help=argparse.SUPPRESS)
    for hidden in ("--port-base", "--rank", "--world", "--start", "--epoch"):
        p.add_argument(hidden, type=int, help=argparse.SUPPRESS)
    args = p.parse_args()
    if args.rank_runner:
        return rank_runner(args)
    if not args.megatron_git:
        p.error("--megatron-git is required")
    if args.record:
        return record(args)
    if min(args.world_size, args.timeout, args.pg_timeout, args.startup_timeout) <= 0:
        p.error("--world-size, --timeout, --pg-timeout and --startup-timeout must be positive")
    if args.logs:
        os.makedirs(args.logs, exist_ok=True)
    impls = args.impl or ["megatron", "commgrid"]
    if "commgrid" in impls and not args.commgrid:
        p.error("--impl commgrid needs --commgrid (the directory holding the commgrid package)")
    report = {}
    regressions = []
    for rev in args.rev or ["HEAD"]:
        commit = git(args.megatron_git, "rev-parse", rev).strip()
        for impl in impls:
            start = time.monotonic()
            merged, threads = run(args.megatron_git, commit, impl, args)
            key = f"{rev} {impl}" if args.rev and len(args.rev) > 1 else impl
            report[key] = (merged, threads)
            n = {k: sum(1 for v in merged.values() if v["outcome"] == k)
                 for k in ("passed", "failed", "skipped")}
            print(f"== {rev} ({commit[:10]}) {impl}: {n['passed']}/{len(merged)} passed, "
                  f"{n['failed']} failed, {n['skipped']} skipped ({time.monotonic() - start:.0f} s; "
                  f"at most {threads} threads in a rank)")
            for nodeid, v in merged.items():
                if v["outcome"] != "passed":
                    where = f" ranks {v['ranks']}" if "ranks" in v else ""
                    print(f"   {v['outcome']}: {nodeid}{where}: {textwrap.shorten(v['why'], 200)}")
            sys.stdout.flush()
        if "megatron" in impls and "commgrid" in impls:
            ours = report[f"{rev} commgrid" if args.rev and len(args.rev) > 1 else "commgrid"][0]
            theirs = report[f"{rev} megatron" if args.rev and len(args.rev) > 1 else "megatron"][0]
            regressions += [f"{rev} {nodeid}" for nodeid, v in theirs.items()
                            if v["outcome"] == "passed" and ours.get(nodeid, {}).get("outcome") != "passed"]
    print()
    print(summary(report))
    if args.json:
        with open(args.json, "w") as f:
            json.dump({k: merged for k, (merged, _) in report.items()}, f, indent=1)
    if regressions:
        print(f"\nerror: {len(regressions)} test(s) pass with megatron-core's modules but not with "
              "commgrid's:\n  " + "\n  ".join(regressions), file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
