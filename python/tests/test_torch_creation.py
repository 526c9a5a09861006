"""The creation order of commgrid.torch, without processes: torch.distributed's calls are
replaced by recorders so that every rank of a world of 16 can be played in turn. The real
groups are tested in test_torch.py (8 Gloo processes); this covers both strategies on every
rank at once, and the naming rule of torch's new_group that "local" must keep: a group made
with use_local_synchronization is named by its ranks and the number of groups the calling
rank made before, so that number must agree on every member (and, for later new_group
calls, on every rank)."""

import itertools

import pytest

torch = pytest.importorskip("torch", reason="python3-torch is not installed")

import commgrid  # noqa: E402
import commgrid.torch as mpu  # noqa: E402

CONFIG = dict(tensor_model_parallel_size=2, pipeline_model_parallel_size=2,
              context_parallel_size=2, hierarchical_context_parallel_sizes=[2],
              num_distributed_optimizer_instances=2)
WORLD = 16


class Recorder:
    def __init__(self, rank, local):
        self.rank, self.local, self.calls = rank, local, []

    def new_group(self, ranks=None, timeout=None, backend=None, pg_options=None,
                  use_local_synchronization=False):
        assert self.local or not use_local_synchronization
        self.calls.append((tuple(ranks), backend, use_local_synchronization))
        return ("group", len(self.calls), tuple(sorted(ranks)))


def play(monkeypatch, rank, creation, gloo=True):
    rec = Recorder(rank, creation == "local")
    d = torch.distributed
    monkeypatch.setattr(d, "is_initialized", lambda: True)
    monkeypatch.setattr(d, "get_rank", lambda group=None: rank)
    monkeypatch.setattr(d, "get_world_size", lambda group=None: WORLD)
    monkeypatch.setattr(d, "new_group", rec.new_group)
    monkeypatch.setattr(mpu, "creation_strategies", lambda: ["local", "megatron"])
    mpu.initialize_model_parallel(create_gloo_process_groups=gloo, creation=creation, **CONFIG)
    state = {k: mpu.STATE.group(k) for k in mpu.STATE.layout.kinds()}
    ranks = {k: mpu.get_global_ranks(k) for k in mpu.STATE.layout.kinds()}
    mpu.destroy_model_parallel()
    return rec.calls, state, ranks


@pytest.mark.parametrize("creation", ["local", "megatron"])
def test_every_rank_gets_its_groups(monkeypatch, creation):
    layout = commgrid.Layout(WORLD, tp=2, pp=2, cp=2, hcp=[2], dist_opt_instances=2)
    orders = {}
    for rank in range(WORLD):
        calls, state, ranks = play(monkeypatch, rank, creation)
        for kind in layout.kinds():
            members = layout.group_of(kind, rank)
            if kind == "hcp":
                assert [g[2] for g in state[kind]] == [tuple(sorted(m)) for m in members]
            elif members is None:
                assert state[kind] is None, (rank, kind)
            else:
                assert state[kind][2] == tuple(sorted(members)), (rank, kind)
                assert ranks[kind] == members
        if creation == "local":
            # Its own groups with use_local_synchronization, each with this rank a member; a
            # rank in no group of a kind that leaves ranks out (embd, pos_embd) calls
            # new_group once for that kind without it, as a non-member (counted, joined by
            # no one); no other call.
            assert all(rank in r for r, _, local in calls if local)
            assert all(rank not in r for r, _, local in calls if not local), calls
            assert any(local for _, _, local in calls)
        else:
            assert not any(local for _, _, local in calls)
        orders[rank] = calls
    if creation == "megatron":
        # Every rank made the same calls in the same order (torch numbers such groups by call).
        assert len({tuple(c) for c in orders.values()}) == 1
        return
    # torch's names: a local group is (its sorted ranks, the caller's count of groups made
    # before); a group made without use_local_synchronization is the count alone.
    names = {}
    for rank, calls in orders.items():
        names[rank] = [(tuple(sorted(r)), n) if local else n for n, (r, _, local) in enumerate(calls)]
    # Every rank made the same number of groups: later new_group calls stay consistent.
    assert len({len(n) for n in names.values()}) == 1
    # Every member of a local group computed the same name for it.
    for rank, ns in names.items():
        for name in ns:
            if isinstance(name, tuple):
                assert all(name in names[m] for m in name[0]), (rank, name)
    # Some rank is in no pos_embd group here (the last stage): its one call for the kind is
    # a non-member's, at the count its members make their group at.
    assert any(not local for calls in orders.values() for _, _, local in calls)
    # Two ranks that share groups create them in the same relative order: no member waits
    # on another that is creating a different group first.
    for a, b in itertools.combinations(range(WORLD), 2):
        shared_a = [g for g, _, local in orders[a] if b in g and local]
        shared_b = [g for g, _, local in orders[b] if a in g and local]
        assert shared_a == shared_b, (a, b)


def test_bad_config_creates_nothing(monkeypatch):
    calls = []
    d = torch.distributed
    monkeypatch.setattr(d, "is_initialized", lambda: True)
    monkeypatch.setattr(d, "get_rank", lambda group=None: 0)
    monkeypatch.setattr(d, "get_world_size", lambda group=None: 8)
    monkeypatch.setattr(d, "new_group", lambda *a, **k: calls.append(1))
    with pytest.raises(commgrid.DivisibilityError):
        mpu.initialize_model_parallel(num_distributed_optimizer_instances=3)
    with pytest.raises(commgrid.IncompatibleError, match="more TP than the decoder"):
        mpu.initialize_model_parallel(encoder_tensor_model_parallel_size=2,
                                      encoder_pipeline_model_parallel_size=1)
    with pytest.raises(commgrid.InvalidValueError, match="offers"):
        mpu.initialize_model_parallel(creation="local" if "local" not in mpu.creation_strategies()
                                      else "bogus")
    assert calls == [] and not mpu.is_initialized()


def test_getters_before_initialization():
    assert not mpu.is_initialized() and mpu.is_unitialized()
    assert mpu.get_tensor_model_parallel_group(check_initialized=False) is None
    with pytest.raises(commgrid.StateError, match="tensor model parallel group is not initialized"):
        mpu.get_tensor_model_parallel_group()
    with pytest.raises(commgrid.StateError):
        mpu.get_pipeline_model_parallel_first_rank()
