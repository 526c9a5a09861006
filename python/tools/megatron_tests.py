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

How a test runs: every test id runs on its own, on WORLD_SIZE processes at once (one per
rank; each forks a fresh pytest for the test from a process that has imported torch once),
with a fresh rendezvous, and the ranks start each test together, so a test that fails or
hangs on one rank cannot leave the next one out of step. A test passes when it passes on
every rank; a rank that runs longer than --timeout is killed (the test counts as failed,
"timeout").

What is adapted, and only the environment (no assertion of any test is changed):
- Megatron's tests ask for NCCL and GPUs. ``torch.distributed.init_process_group`` and
  ``new_group`` get backend "gloo" instead of "nccl" (with a bounded timeout);
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
def new_group(*args, **kwargs):
    if "backend" in kwargs:
        kwargs["backend"] = _gloo(kwargs["backend"])
    if kwargs.get("timeout") is None:
        kwargs["timeout"] = _TIMEOUT
    return _new_group(*args, **kwargs)
new_group.__signature__ = __import__("inspect").signature(_new_group)
dist.new_group = new_group

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

_RESULT = os.environ.get("HARNESS_RESULT")
_outcome = {}

def pytest_runtest_logreport(report):
    o = _outcome.setdefault(report.nodeid, {"outcome": "passed", "why": ""})
    if report.failed and o["outcome"] != "failed":
        text = str(report.longrepr).strip().splitlines()
        errors = [l for l in text if l.startswith("E ")]
        o.update(outcome="failed", why=(errors[0] if errors else text[-1] if text else "")[:300])
    elif report.skipped and o["outcome"] == "passed":
        o.update(outcome="skipped", why=str(report.longrepr)[-200:])

def pytest_sessionfinish(session, exitstatus):
    if _RESULT:
        with open(_RESULT, "w") as f:
            json.dump(_outcome, f)
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
               MASTER_ADDR="127.0.0.1", PYTHONDONTWRITEBYTECODE="1",
               PYTHONPATH=os.pathsep.join(path + [env.get("PYTHONPATH", "")]),
               HARNESS_PG_TIMEOUT=str(args.pg_timeout), HARNESS_IMPL=impl,
               HARNESS_TOOLS=os.path.dirname(os.path.abspath(__file__)))
    return env


def collect(root, tests, args, impl):
    env = environment(root, args.world_size, 0, args, impl)
    cmd = [sys.executable, "-m", "pytest", "--collect-only", "-q", "-p", "no:cacheprovider",
           "--rootdir", root, *tests]
    if args.k:
        cmd += ["-k", args.k]
    out = subprocess.run(cmd, cwd=root, env=env, capture_output=True, text=True)
    ids = [line.strip() for line in out.stdout.splitlines() if "::" in line]
    if not ids:
        raise SystemExit(f"error: no tests collected in {root}:\n{out.stdout[-3000:]}{out.stderr[-3000:]}")
    return ids


def rank_runner(args):
    """One rank: runs every test id in a forked pytest, in order, writing outcomes."""
    import pytest  # noqa: F401  (imported once here, inherited by every fork)
    import numpy  # noqa: F401
    import torch  # noqa: F401
    # megatron.core too (slow to import), resolved as the conftest resolves it.
    if os.environ.get("HARNESS_IMPL") == "commgrid":
        import commgrid
        import commgrid.torch.head
        sys.modules["megatron.core.parallel_state"] = commgrid.torch.head
    import megatron.core  # noqa: F401
    with open(args.ids) as f:
        ids = json.load(f)
    results = {}
    log = open(args.log, "w")
    sync = os.path.join(args.root, "sync")
    os.makedirs(sync, exist_ok=True)
    for i, nodeid in enumerate(ids):
        if i > 0:
            # Every rank starts test i together: a rank whose previous test failed or hung
            # must not run ahead into the next test's rendezvous alone.
            open(os.path.join(sync, f"{i - 1}.{args.rank}"), "w").close()
            deadline = time.monotonic() + args.timeout + 60
            while time.monotonic() < deadline and not all(
                    os.path.exists(os.path.join(sync, f"{i - 1}.{r}")) for r in range(args.world)):
                time.sleep(0.02)
        result_file = f"{args.out}.{i}"
        log.write(f"==== {nodeid}\n")
        log.flush()
        pid = os.fork()
        if pid == 0:
            os.dup2(log.fileno(), 1)
            os.dup2(log.fileno(), 2)
            os.environ.update(MASTER_PORT=str(args.port_base + i), HARNESS_RESULT=result_file)
            os.chdir(args.root)
            sys.path.insert(0, args.root)
            rc = pytest.main([nodeid, "-q", "-p", "no:cacheprovider", "--rootdir", args.root,
                              "-W", "ignore::DeprecationWarning"])
            # Stay until every rank has run the test: rank 0 serves the rendezvous store,
            # and a rank still connecting to it must not find it gone.
            open(os.path.join(sync, f"{i}.ran.{args.rank}"), "w").close()
            until = time.monotonic() + args.timeout
            while time.monotonic() < until and not all(
                    os.path.exists(os.path.join(sync, f"{i}.ran.{r}")) for r in range(args.world)):
                time.sleep(0.02)
            os._exit(int(rc))
        deadline = time.monotonic() + args.timeout
        status = None
        while time.monotonic() < deadline:
            done, status = os.waitpid(pid, os.WNOHANG)
            if done:
                break
            time.sleep(0.05)
        else:
            os.kill(pid, signal.SIGKILL)
            os.waitpid(pid, 0)
            results[nodeid] = {"outcome": "failed", "why": f"timeout ({args.timeout} s)"}
            continue
        try:
            with open(result_file) as f:
                results[nodeid] = json.load(f).get(nodeid) or {"outcome": "failed",
                                                                "why": "no report"}
            os.remove(result_file)
        except (OSError, ValueError):
            code = os.waitstatus_to_exitcode(status)
            results[nodeid] = {"outcome": "failed", "why": f"pytest died (exit {code})"}
    with open(args.out, "w") as f:
        json.dump(results, f)


def free_port_base(count):
    """A base port such that base .. base + count - 1 are free now (test i's rendezvous is on
    base + i; a port another program holds would fail that test with EADDRINUSE)."""
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


def _run_session(root, ids, impl, port, args):
    """--session: one pytest session per rank over every test id, in one order, as
    Megatron-LM's CI runs its unit tests (torchrun ... -m pytest FILE); each rank's outcomes
    go to rank<r>.json. Faster (one start per rank), but a test that hangs holds up the rest
    until the Gloo timeout."""
    procs = []
    for r in range(args.world_size):
        env = environment(root, args.world_size, r, args, impl)
        env.update(MASTER_PORT=str(port), HARNESS_RESULT=os.path.join(root, f"rank{r}.json"))
        log = open(os.path.join(args.logs or root, f"session-{impl}-rank{r}.log"), "w")
        cmd = [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "--rootdir", root,
               "-W", "ignore::DeprecationWarning", *ids]
        procs.append(subprocess.Popen(cmd, cwd=root, env=env, stdout=log, stderr=log))
    deadline = time.monotonic() + args.timeout * len(ids)
    for p in procs:
        try:
            p.wait(timeout=max(1, deadline - time.monotonic()))
        except subprocess.TimeoutExpired:
            p.kill()
            p.wait()
    for r in range(args.world_size):
        out = os.path.join(root, f"rank{r}.json")
        if not os.path.exists(out):
            with open(out, "w") as f:
                json.dump({}, f)


def run(repo, rev, impl, args):
    root = tempfile.mkdtemp(prefix=f"megatron-{rev[:10]}-{impl}-")
    try:
        tests = lay_out(repo, rev, root)
        ids = collect(root, tests, args, impl)
        with open(os.path.join(root, "ids.json"), "w") as f:
            json.dump(ids, f)
        port_base = free_port_base(len(ids))
        procs = []
        if args.session:
            _run_session(root, ids, impl, port_base, args)
        for r in range(0 if args.session else args.world_size):
            cmd = [sys.executable, os.path.abspath(__file__), "--rank-runner",
                   "--rank", str(r), "--world", str(args.world_size), "--root", root, "--ids", os.path.join(root, "ids.json"),
                   "--out", os.path.join(root, f"rank{r}.json"),
                   "--log", os.path.join(args.logs or root, f"{rev[:10]}-{impl}-rank{r}.log"),
                   "--port-base", str(port_base), "--timeout", str(args.timeout)]
            procs.append(subprocess.Popen(cmd, cwd=root, env=environment(root, args.world_size, r, args, impl)))
        for p in procs:
            p.wait()
        per_rank = []
        for r in range(args.world_size):
            with open(os.path.join(root, f"rank{r}.json")) as f:
                per_rank.append(json.load(f))
        merged = {}
        for nodeid in ids:
            outs = [pr.get(nodeid, {"outcome": "failed", "why": "not run"}) for pr in per_rank]
            kinds = {o["outcome"] for o in outs}
            if kinds == {"passed"}:
                merged[nodeid] = {"outcome": "passed"}
            elif kinds == {"skipped"}:
                merged[nodeid] = {"outcome": "skipped", "why": outs[0]["why"]}
            else:
                bad = [r for r, o in enumerate(outs) if o["outcome"] != "passed"]
                first = outs[bad[0]]
                merged[nodeid] = {"outcome": "failed", "ranks": bad, "why": first["why"]}
        return merged
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


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--megatron-git", help="a Megatron-LM git directory (clone or bare mirror)")
    p.add_argument("--rev", action="append", help="revision (repeatable; default: HEAD)")
    p.add_argument("--impl", action="append", choices=["megatron", "commgrid"],
                   help="what megatron.core.parallel_state is (repeatable; default: both)")
    p.add_argument("--commgrid", help="directory that holds the commgrid package (build/python)")
    p.add_argument("--world-size", type=int, default=8)
    p.add_argument("--timeout", type=float, default=150, help="seconds per test and rank")
    p.add_argument("--pg-timeout", type=float, default=60, help="Gloo collective timeout (s)")
    p.add_argument("-k", help="pytest -k expression: run only the matching tests")
    p.add_argument("--session", action="store_true",
                   help="run every test in one pytest session per rank (as Megatron's CI does) "
                        "instead of each test id in a fresh one")
    p.add_argument("--json", help="write every outcome to this file")
    p.add_argument("--logs", help="directory for the per-rank pytest logs (default: dropped)")
    p.add_argument("--keep", action="store_true", help="keep the temporary trees")
    p.add_argument("--record", metavar="DIR",
                   help="instead of running tests: record Megatron's creation calls and every rank's "
                        "globals for RECORD_CONFIGS into DIR (python/tests/data/megatron_records)")
    p.add_argument("--rank-runner", action="store_true", help=argparse.SUPPRESS)
    for hidden in ("--root", "--ids", "--out", "--log"):
        p.add_argument(hidden, help=argparse.SUPPRESS)
    p.add_argument("--port-base", type=int, help=argparse.SUPPRESS)
    p.add_argument("--rank", type=int, help=argparse.SUPPRESS)
    p.add_argument("--world", type=int, help=argparse.SUPPRESS)
    args = p.parse_args()
    if args.rank_runner:
        return rank_runner(args)
    if not args.megatron_git:
        p.error("--megatron-git is required")
    if args.record:
        return record(args)
    if args.logs:
        os.makedirs(args.logs, exist_ok=True)
    impls = args.impl or ["megatron", "commgrid"]
    if "commgrid" in impls and not args.commgrid:
        p.error("--impl commgrid needs --commgrid (the directory holding the commgrid package)")
    report = {}
    for rev in args.rev or ["HEAD"]:
        commit = git(args.megatron_git, "rev-parse", rev).strip()
        for impl in impls:
            start = time.monotonic()
            merged = run(args.megatron_git, commit, impl, args)
            report[f"{rev} {impl}"] = merged
            n = {k: sum(1 for v in merged.values() if v["outcome"] == k)
                 for k in ("passed", "failed", "skipped")}
            print(f"== {rev} ({commit[:10]}) {impl}: {n['passed']}/{len(merged)} passed, "
                  f"{n['failed']} failed, {n['skipped']} skipped ({time.monotonic() - start:.0f} s)")
            for nodeid, v in merged.items():
                if v["outcome"] != "passed":
                    where = f" ranks {v['ranks']}" if "ranks" in v else ""
                    print(f"   {v['outcome']}: {nodeid}{where}: {textwrap.shorten(v['why'], 160)}")
            sys.stdout.flush()
    if len(report) > 1:
        print("\n| revision | implementation | passed |\n|---|---|---|")
        for key, merged in report.items():
            rev, impl = key.split(" ")
            passed = sum(1 for v in merged.values() if v["outcome"] == "passed")
            print(f"| {rev} | {impl} | {passed}/{len(merged)} |")
    if args.json:
        with open(args.json, "w") as f:
            json.dump(report, f, indent=1)


if __name__ == "__main__":
    main()
