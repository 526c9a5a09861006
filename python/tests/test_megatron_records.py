"""commgrid.torch against Megatron-core's own initialize_model_parallel, without processes:
the records in data/megatron_records/ hold, for configs of the seed (8c1e094afe: encoder /
decoder splits, the split rank, Gloo twins, dist-opt instances, hcp) and of HEAD
(d98e8a64dd: gtp_remat, expert gtp_remat, hybrid cp), every new_group call Megatron's code
makes (ranks, backend, group_desc, in order) and every rank's module globals afterwards.
They were made by ``python/tools/megatron_tests.py --record`` from Megatron's parallel_state.py
with torch.distributed replaced by a recorder. Here every rank of each world is played in
turn with the same recorder and commgrid.torch (or commgrid.torch.head) must make exactly
the same calls and leave exactly the same globals."""

import glob
import json
import os

import pytest

torch = pytest.importorskip("torch", reason="python3-torch is not installed")

import commgrid.torch as mpu  # noqa: E402
import commgrid.torch.head as mpu_head  # noqa: E402
from commgrid._state import STATE  # noqa: E402

RECORDS = sorted(glob.glob(os.path.join(os.path.dirname(__file__), "data", "megatron_records", "*.json")))


class Group:
    def __init__(self, ranks, backend, me):
        self.ranks, self.backend, self.me = list(ranks), backend, me

    def size(self):
        return len(self.ranks)

    def rank(self):
        return sorted(self.ranks).index(self.me)


def plain(value):
    if isinstance(value, Group):
        return {"ranks": value.ranks, "backend": value.backend}
    if isinstance(value, (list, tuple)):
        return [plain(v) for v in value]
    if isinstance(value, dict):
        return {str(k): plain(v) for k, v in value.items()}
    return value


def play(monkeypatch, module, world, rank, kwargs):
    calls = []

    def new_group(ranks=None, timeout=None, backend=None, pg_options=None, group_desc=None):
        calls.append({"ranks": [int(r) for r in ranks], "backend": backend, "desc": group_desc})
        return Group(ranks, backend, rank)
    d = torch.distributed
    monkeypatch.setattr(d, "is_initialized", lambda: True)
    monkeypatch.setattr(d, "get_world_size", lambda group=None: world if group is None else group.size())
    monkeypatch.setattr(d, "get_rank", lambda group=None: rank if group is None else group.rank())
    monkeypatch.setattr(d, "new_group", new_group)
    module.initialize_model_parallel(**kwargs)
    return calls


def test_records_are_found():
    assert len([r for r in RECORDS if "/seed-" in r]) >= 8 and len([r for r in RECORDS if "/head-" in r]) >= 4


@pytest.mark.parametrize("path", RECORDS, ids=[os.path.basename(p)[:-5] for p in RECORDS])
def test_same_calls_and_globals_as_megatron(monkeypatch, path):
    with open(path) as f:
        rec = json.load(f)
    module = mpu_head if rec["edition"] == "head" else mpu
    world = rec["world_size"]
    for rank in range(world):
        try:
            calls = play(monkeypatch, module, world, rank, rec["kwargs"])
            assert calls == rec["calls"], f"rank {rank}: the new_group calls differ"
            for name, want in rec["globals"][str(rank)].items():
                got = plain(getattr(module, name))
                assert got == want, f"rank {rank}: {name} = {got}, Megatron: {want}"
        finally:
            STATE.reset()
