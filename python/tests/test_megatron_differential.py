"""commgrid.torch.head against megatron-core 0.19.2's own parallel_state (the installed
package, whose parallel_state.py is Megatron-core HEAD's), on random layouts.

For each random configuration (world 8 to 24; tp, pp, cp, ep, etp, vpp, dist-opt
instances, hierarchical cp, the order, gtp_remat and expert gtp_remat, hybrid cp) every rank
of the world is played in turn in this process over torch's "fake" process-group backend
(real torch.distributed groups and rank bookkeeping, no sockets): Megatron's
initialize_model_parallel, then commgrid's. Compared, rank by rank: every getter of
parallel_state (called with its defaults and with each boolean argument flipped), as the
ranks of the group it returns, its value, or the built-in type of the error it raises, and
every field of ProcessGroupCollection.use_mpu_process_groups(). A configuration Megatron
refuses must be refused by commgrid with the same built-in type. The Gloo twins are left
out here (the fake backend makes no Gloo group): test_torch.py checks them on real ranks.

COMMGRID_TEST_SEED picks the configurations (printed on failure); COMMGRID_TEST_CONFIGS how
many accepted ones to compare (default 4; each is compared on every rank).
"""

import copy
import dataclasses
import inspect
import os
import random
import types
import warnings

import pytest

torch = pytest.importorskip("torch", reason="torch is not installed (scripts/install-venv)")
warnings.filterwarnings("ignore")
mps = pytest.importorskip("megatron.core.parallel_state",
                          reason="megatron-core is not installed (scripts/install-venv)")

import torch.distributed as dist  # noqa: E402
from megatron.core.process_groups_config import ProcessGroupCollection as MegatronPGC  # noqa: E402
from torch.testing._internal.distributed.fake_pg import FakeStore  # noqa: E402

import commgrid  # noqa: E402
import commgrid.torch.head as cps  # noqa: E402

SEED = int(os.environ.get("COMMGRID_TEST_SEED", random.randrange(1 << 30)))
CONFIGS = int(os.environ.get("COMMGRID_TEST_CONFIGS", "4"))
ERRORS = (AssertionError, RuntimeError, KeyError, ValueError, TypeError, IndexError, AttributeError)
# Getters that take no group-shaped answer to compare.
SKIP = {"get_nccl_options", "get_global_memory_buffer"}

# Megatron's module globals as imported: restored after each play (its destroy leaves some).
_MEGATRON_INITIAL = {k: copy.copy(v) for k, v in vars(mps).items()
                     if k.startswith("_") and k[1:2].isupper() and not isinstance(v, types.ModuleType)}


def _restore_megatron():
    for k, v in _MEGATRON_INITIAL.items():
        setattr(mps, k, copy.copy(v))


def plain(value):
    """A getter's answer as comparable data: a group as ("group", its global ranks)."""
    if isinstance(value, dist.ProcessGroup):
        return ("group", tuple(dist.get_process_group_ranks(value)))
    if isinstance(value, (list, tuple)):
        return [plain(v) for v in value]
    if isinstance(value, dict):
        return {k: plain(v) for k, v in value.items()}
    return value


def error_kind(e):
    return ("raises",) + tuple(t.__name__ for t in ERRORS if isinstance(e, t))


def same(want, got):
    """Equal answers; for errors, commgrid's is an instance of every built-in type Megatron's
    is (commgrid's StateError is both an AssertionError and a RuntimeError)."""
    if isinstance(want, tuple) and want[:1] == ("raises",):
        return isinstance(got, tuple) and got[:1] == ("raises",) and set(want[1:]) <= set(got[1:])
    return want == got


def calls_of(fn):
    """The argument sets a getter is called with: its defaults, then each boolean flipped."""
    params = inspect.signature(fn).parameters.values()
    out = [{}]
    for p in params:
        if isinstance(p.default, bool):
            out.append({p.name: not p.default})
    return out


def getters():
    return sorted(name for name, fn in inspect.getmembers(mps, inspect.isfunction)
                  if fn.__module__ == mps.__name__ and name.startswith(("get_", "is_"))
                  and name not in SKIP)


def snapshot(ps, pgc_class):
    snap = {}
    for name in getters():
        fn = getattr(ps, name, None)
        if fn is None:
            snap[name] = "missing"
            continue
        for kwargs in calls_of(getattr(mps, name)):
            key = name + repr(sorted(kwargs.items()))
            try:
                snap[key] = plain(fn(**kwargs))
            except ERRORS as e:
                snap[key] = error_kind(e)
    try:
        pgc = pgc_class.use_mpu_process_groups()
        for f in dataclasses.fields(MegatronPGC):
            snap["pgc." + f.name] = plain(getattr(pgc, f.name))
    except ERRORS as e:
        snap["pgc"] = error_kind(e)
    return snap


def play(ps, pgc_class, world, rank, kwargs):
    """One rank of one configuration with ``ps`` (Megatron's or commgrid's parallel state)."""
    dist.init_process_group("fake", rank=rank, world_size=world, store=FakeStore())
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            try:
                ps.initialize_model_parallel(create_gloo_process_groups=False, **kwargs)
            except ERRORS as e:
                return error_kind(e)
            try:
                return snapshot(ps, pgc_class)
            finally:
                ps.destroy_model_parallel()
    finally:
        if ps is mps:
            _restore_megatron()
        dist.destroy_process_group()


def random_config(rng):
    world = rng.choice([8, 12, 16, 24])
    kw = dict(tensor_model_parallel_size=rng.choice([1, 2, 2, 4]),
              pipeline_model_parallel_size=rng.choice([1, 2, 2, 4]),
              context_parallel_size=rng.choice([1, 1, 2]),
              expert_model_parallel_size=rng.choice([1, 2, 4]),
              expert_tensor_parallel_size=rng.choice([None, None, 1, 2]),
              order=rng.choice(["tp-cp-ep-dp-pp", "tp-cp-ep-dp-pp", "tp-cp-ep-pp-dp", "tp-pp-cp-ep-dp"]))
    if kw["pipeline_model_parallel_size"] > 1 and rng.random() < 0.4:
        kw["virtual_pipeline_model_parallel_size"] = 2
    if rng.random() < 0.3:
        kw["num_distributed_optimizer_instances"] = 2
    if kw["context_parallel_size"] == 2 and rng.random() < 0.4:
        kw["hierarchical_context_parallel_sizes"] = rng.choice([[1, 2], [2, 1]])
    if rng.random() < 0.25:
        kw["gtp_remat_size"] = 2
    if rng.random() < 0.2:
        kw["expert_gtp_remat_size"] = 2
    if rng.random() < 0.2:
        kw["hybrid_context_parallel"] = True
    return world, kw


def test_megatron_core_parallel_state_and_commgrid_agree_on_random_layouts():
    rng = random.Random(SEED)
    accepted, refused, tries = 0, 0, 0
    while accepted < CONFIGS and tries < 40 * CONFIGS:
        tries += 1
        world, kwargs = random_config(rng)
        where = f"COMMGRID_TEST_SEED={SEED}, world {world}, {kwargs}"
        want0 = play(mps, MegatronPGC, world, 0, kwargs)
        got0 = play(cps, commgrid.ProcessGroupCollection, world, 0, kwargs)
        if isinstance(want0, tuple):  # Megatron refuses the configuration
            assert isinstance(got0, tuple), f"{where}: Megatron raises {want0}, commgrid accepts"
            assert want0[1] in got0, f"{where}: Megatron raises {want0}, commgrid {got0}"
            refused += 1
            continue
        assert not isinstance(got0, tuple), f"{where}: commgrid raises {got0}, Megatron accepts"
        for rank in range(world):
            want = want0 if rank == 0 else play(mps, MegatronPGC, world, rank, kwargs)
            got = got0 if rank == 0 else play(cps, commgrid.ProcessGroupCollection, world, rank, kwargs)
            diff = sorted(k for k in set(want) | set(got) if not same(want.get(k), got.get(k)))
            assert not diff, (f"{where}, rank {rank}: " + "; ".join(
                f"{k}: Megatron {want.get(k)!r}, commgrid {got.get(k)!r}" for k in diff[:5]))
        accepted += 1
    print(f"seed {SEED}: {accepted} configurations compared on every rank, {refused} refused by both")
    assert accepted == CONFIGS, f"seed {SEED}: only {accepted} accepted configurations in {tries} tries"
