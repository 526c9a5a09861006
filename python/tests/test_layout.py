"""commgrid.Layout against the golden vectors, the C++ CLI, and a Megatron-style
pure-Python enumeration on random configs; numpy arrays; errors."""

import glob
import json
import os
import random
import re
import subprocess

import numpy as np
import pytest

import commgrid
import megatron_style

HERE = os.path.dirname(__file__)
VECTORS = sorted(glob.glob(os.path.join(HERE, os.pardir, os.pardir, "tests", "vectors", "layout",
                                        "*.json")))
FLAGS = {"--world-size": "world_size", "--tp": "tp", "--pp": "pp", "--cp": "cp", "--ep": "ep",
         "--etp": "etp", "--hcp": "hcp", "--dist-opt-instances": "dist_opt_instances",
         "--vpp": "vpp", "--order": "order", "--rank": "rank"}


def kwargs_of(args):
    kw = {}
    for flag, value in zip(args[::2], args[1::2]):
        name = FLAGS[flag]
        if name == "hcp":
            kw[name] = [int(v) for v in value.split(",")]
        elif name == "order":
            kw[name] = value
        else:
            kw[name] = int(value)
    return kw


def test_golden_vectors_are_found():
    assert len(VECTORS) >= 10, VECTORS


@pytest.mark.parametrize("path", VECTORS, ids=os.path.basename)
def test_golden_vector(path):
    with open(path) as f:
        doc = json.load(f)
    kw = kwargs_of(doc["args"])
    rank = kw.pop("rank", None)
    layout = commgrid.Layout(**kw)
    expected = {k: v for k, v in doc.items() if k != "args"}
    assert layout.to_dict(rank=rank) == expected
    for kind, groups in doc["groups"].items():
        if rank is None:
            assert layout.groups(kind) == groups
        else:
            assert layout.group_of(kind, rank) == groups


def random_config(rng):
    """A valid config: sizes drawn as factors of a world of up to 2^9 ranks."""
    while True:
        tp, pp, cp = rng.choice([1, 2, 4]), rng.choice([1, 2, 3]), rng.choice([1, 2])
        dp = rng.choice([1, 2, 4])
        world = tp * pp * cp * dp
        etp = rng.choice([None, 1, 2])
        ep = rng.choice([1, 2, 4])
        e = (tp if etp is None else etp) * ep * pp
        if world % e:
            continue
        edp = world // e
        n = rng.choice([1, 2])
        if (dp * cp) % n or edp % n:
            n = 1
        hcp = [2, cp // 2] if cp == 2 and rng.random() < 0.5 else None
        order = rng.choice(["tp-cp-ep-dp-pp", "tp-cp-ep-dp-pp", "tp-dp-cp-ep-pp", "cp-tp-dp-ep-pp"])
        return dict(world_size=world, tp=tp, pp=pp, cp=cp, ep=ep, etp=etp, hcp=hcp,
                    dist_opt_instances=n, order=order)


def test_random_configs_match_megatron_style_enumeration():
    rng = random.Random(14)
    for _ in range(60):
        kw = random_config(rng)
        layout = commgrid.Layout(**kw)
        ref = megatron_style.all_groups(**kw)
        assert sorted(layout.kinds()) == sorted(ref), kw
        for kind, groups in ref.items():
            assert layout.groups(kind) == groups, (kind, kw)
            for lv, level in enumerate(groups if kind == "hcp" else [groups]):
                arr = layout.array(kind, lv)
                assert arr.dtype == np.int64 and arr.tolist() == level, (kind, kw)
        r = rng.randrange(kw["world_size"])
        for kind, groups in ref.items():
            if kind == "hcp":
                continue
            mine = [g for g in groups if r in g]
            assert layout.group_of(kind, r) == (mine[0] if mine else None), (kind, r, kw)


def test_cli_plan_json_equals_to_dict():
    cli = os.environ.get("COMMGRID_CLI")
    if not cli:
        pytest.skip("COMMGRID_CLI (the commgrid command) is not set; ctest sets it")
    rng = random.Random(7)
    for _ in range(8):
        kw = random_config(rng)
        args = [cli, "plan", "--format", "json", "--world-size", str(kw["world_size"]),
                "--tp", str(kw["tp"]), "--pp", str(kw["pp"]), "--cp", str(kw["cp"]),
                "--ep", str(kw["ep"]), "--dist-opt-instances", str(kw["dist_opt_instances"]),
                "--order", kw["order"]]
        if kw["etp"] is not None:
            args += ["--etp", str(kw["etp"])]
        if kw["hcp"]:
            args += ["--hcp", ",".join(map(str, kw["hcp"]))]
        layout = commgrid.Layout(**kw)
        assert json.loads(subprocess.run(args, check=True, capture_output=True,
                                         text=True).stdout) == layout.to_dict()
        r = rng.randrange(kw["world_size"])
        got = json.loads(subprocess.run(args + ["--rank", str(r)], check=True,
                                        capture_output=True, text=True).stdout)
        assert got == layout.to_dict(rank=r)


def test_array_is_a_view_of_the_core_buffer_and_outlives_the_layout():
    layout = commgrid.Layout(1 << 12, tp=4, pp=2, cp=2)
    arr = layout.array("tp")
    assert arr.shape == (1 << 10, 4) and arr.dtype == np.int64
    assert not arr.flags["OWNDATA"] and arr.base is not None  # no copy: the core's buffer
    del layout
    assert arr[1].tolist() == [4, 5, 6, 7] and int(arr.sum()) == sum(range(1 << 12))


def test_groups_as_array():
    layout = commgrid.Layout(16, tp=2, cp=4, hcp=[2, 2])
    assert layout.groups("tp", as_array=True).tolist() == layout.groups("tp")
    levels = layout.groups("hcp", as_array=True)
    assert [a.tolist() for a in levels] == layout.groups("hcp")


def test_group_ref_and_coordinates():
    layout = commgrid.Layout(16, tp=2, pp=2, cp=2)  # spec §9 example (a), rank 5
    ref = layout.group_ref("intra_dist_opt", 5)
    assert (ref.position, ref.comm_rank) == (9, 5)
    assert layout.group_ref("pos_embd", 12) is None
    assert layout.coordinates(13)["dp"] == 1 and layout.coordinates(13)["pp"] == 1
    assert layout.num_groups("dp_cp") == 4 and layout.levels("tp") == 1


def test_megatron_long_names_and_policies():
    a = commgrid.Layout(16, tensor_model_parallel_size=2, pipeline_model_parallel_size=4,
                        num_distributed_optimizer_instances=2,
                        get_embedding_ranks=lambda pp: [pp[0], pp[1], pp[-1]])
    b = commgrid.Layout(16, tp=2, pp=4, dist_opt_instances=2)
    assert a.groups("tp_ep_pp") == b.groups("tp_ep_pp")
    assert a.groups("embd")[0] == [0, 4, 12]
    with pytest.raises(commgrid.InvalidValueError, match="different sizes|use groups"):
        commgrid.Layout(8, pp=4, embedding_ranks=lambda pp: pp[:1] if pp[0] else pp[:2]).array("embd")
    with pytest.raises(TypeError):
        commgrid.Layout(8, tp=2, tensor_model_parallel_size=2)
    with pytest.raises(TypeError):
        commgrid.Layout(8, tpp=2)


@pytest.mark.parametrize("kwargs, error, message", [
    (dict(world_size=8, tp=3), commgrid.DivisibilityError,
     "world_size 8 is not divisible by tp*pp*cp = 3*1*1 = 3"),
    (dict(world_size=8, tp=0), commgrid.InvalidValueError, "tp must be >= 1, got 0"),
    (dict(world_size=8, order="tp-xx-dp"), commgrid.OrderError, 'unknown token "xx"'),
    (dict(world_size=8, ep=2, order="tp-cp-dp-pp"), commgrid.OrderError, 'omits "ep"'),
    (dict(world_size=8, vpp=2), commgrid.IncompatibleError, "vpp = 2 requires pp > 1"),
    (dict(world_size=8, cp=4, hcp=[2, 4]), commgrid.IncompatibleError, "multiply to 8"),
    (dict(world_size=3_000_000_000), commgrid.OverflowError, "exceeds 2147483647"),
    (dict(world_size=8, pp=4, embedding_ranks=lambda g: [g[0], 99]), commgrid.PolicyError,
     "rank 99 is not in that group"),
])
def test_invalid_configs_raise_the_core_errors(kwargs, error, message):
    with pytest.raises(error, match=re.escape(message)) as info:
        commgrid.Layout(**kwargs)
    assert isinstance(info.value, ValueError) and isinstance(info.value, commgrid.ConfigError)
    assert info.value.parameter


def test_query_errors():
    layout = commgrid.Layout(16, tp=2)
    with pytest.raises(commgrid.RankOutOfRangeError, match=r"rank 16 out of range \[0, 16\)"):
        layout.group_of("tp", 16)
    with pytest.raises(commgrid.UnknownKindError, match='unknown group kind "foo"'):
        layout.groups("foo")
    with pytest.raises(commgrid.UnknownKindError):
        layout.groups("hcp")  # no hcp sizes: the kind does not exist
    with pytest.raises(commgrid.ConfigError):
        layout.groups("tp", level=1)
    assert isinstance(commgrid.OverflowError("x"), OverflowError)
