"""compat="head" through the Python package: the golden layouts of Megatron-core HEAD
(tests/vectors/head, a copy of shared/vectors/head) through commgrid.Layout and HEAD's
RankGenerator, the per-group creation order against the new_group sequences recorded from
HEAD's own parallel_state.py (tests/data/head_creation_order), and bad HEAD arguments."""

import glob
import json
import os

import pytest

import commgrid
from commgrid.rank_generator import head_order

HERE = os.path.dirname(__file__)
ROOT = os.path.join(HERE, os.pardir, os.pardir)
VECTORS = sorted(glob.glob(os.path.join(ROOT, "tests", "vectors", "head", "*.json")))
VALID = [p for p in VECTORS if "error" not in json.load(open(p))]
INVALID = [p for p in VECTORS if p not in VALID]
RECORDS = sorted(glob.glob(os.path.join(ROOT, "tests", "data", "head_creation_order", "*.json")))

VALUE_FLAGS = {"--world-size": "world_size", "--tp": "tp", "--pp": "pp", "--cp": "cp",
               "--ep": "ep", "--etp": "etp", "--hcp": "hcp",
               "--dist-opt-instances": "dist_opt_instances", "--vpp": "vpp", "--order": "order",
               "--compat": "compat", "--gtp-remat": "gtp_remat",
               "--expert-gtp-remat": "expert_gtp_remat", "--rank-offset": "rank_offset",
               "--local-world-size": "local_world_size"}
SWITCHES = {"--hybrid-context-parallel": "hybrid_context_parallel",
            "--all-gather-groups": "all_gather_groups"}


def kwargs_of(args):
    """commgrid plan flags -> Layout keyword arguments."""
    kw, i = {}, 0
    while i < len(args):
        if args[i] in SWITCHES:
            kw[SWITCHES[args[i]]] = True
            i += 1
            continue
        name, value = VALUE_FLAGS[args[i]], args[i + 1]
        if name == "hcp":
            kw[name] = [int(v) for v in value.split(",")]
        elif name in ("order", "compat"):
            kw[name] = value
        else:
            kw[name] = int(value)
        i += 2
    return kw


def load(path):
    with open(path) as f:
        return json.load(f)


def test_vectors_and_records_are_found():
    assert len(VALID) >= 16 and len(INVALID) >= 4, VECTORS
    assert len(RECORDS) >= len(VALID), RECORDS


@pytest.mark.parametrize("path", VALID, ids=os.path.basename)
def test_golden_head_layout(path):
    doc = load(path)
    kw = kwargs_of(doc["args"])
    assert kw["compat"] == "head"
    layout = commgrid.Layout(**kw)
    # Every key of the file's config, and exactly the file's kinds with the same groups.
    assert layout.to_dict() == {"config": doc["config"], "groups": doc["groups"]}
    for kind, groups in doc["groups"].items():
        assert layout.groups(kind) == groups, kind
        if kind.startswith("hybrid_dp_cp_"):
            if len({len(g) for g in groups}) == 1:
                assert layout.array(kind).tolist() == groups
            else:  # a ragged level (the last slice shorter) has no 2-D array
                with pytest.raises(commgrid.InvalidValueError):
                    layout.array(kind)
    # Per rank: the group of each kind holding the rank, straight from the closed forms.
    for kind, groups in doc["groups"].items():
        for lv, level_groups in enumerate(groups if kind == "hcp" else [groups]):
            holder = {r: g for g in level_groups for r in g}
            for r in range(layout.world_size):
                got = layout.group_of(kind, r, lv if kind == "hcp" else None)
                assert got == holder.get(r), (kind, lv, r)


@pytest.mark.parametrize("path", INVALID, ids=os.path.basename)
def test_golden_head_error(path):
    doc = load(path)
    with pytest.raises(commgrid.ConfigError) as info:
        commgrid.Layout(**kwargs_of(doc["args"]))
    assert doc["error"].lower() in str(info.value).lower()
    assert info.value.parameter


# HEAD's RankGenerator tokens -> the JSON kind they build (dense grid, then expert grid).
DENSE = {"dp-cp": "dp_cp", "dp": "dp", "cp": "cp", "tp-gtp_remat-pp": "mp", "tp": "tp",
         "pp": "pp", "tp-gtp_remat-dp-cp": "tp_dp_cp", "tp-gtp_remat-dp": "tp_dp",
         "tp-cp": "tp_cp", "gtp_remat": "gtp_remat"}
EXPERT = {"ep": "ep", "tp": "expt_tp", "tp-ep": "tp_ep", "tp-ep-pp": "tp_ep_pp", "dp": "expt_dp",
          "gtp_remat": "expt_gtp_remat", "tp-ep-gtp_remat-pp": "tp_ep_pp_with_egtp_remat"}


@pytest.mark.parametrize("path", VALID, ids=os.path.basename)
def test_head_rank_generator_builds_the_golden_groups(path):
    doc = load(path)
    c = doc["config"]
    dense = commgrid.RankGenerator(tp=c["tp"], ep=1, dp=c["dp"], pp=c["pp"], cp=c["cp"],
                                   order=head_order(c["order"]), rank_offset=c["rank_offset"],
                                   gtp_remat=c["gtp_remat"], compat="head")
    expert = commgrid.RankGenerator(tp=c["etp"], ep=c["ep"], dp=c["expert_dp"], pp=c["pp"], cp=1,
                                    order=head_order(c["order"], expert=True),
                                    rank_offset=c["rank_offset"],
                                    gtp_remat=c["expert_gtp_remat"], compat="head")
    for gen, table in ((dense, DENSE), (expert, EXPERT)):
        for token, kind in table.items():
            assert gen.get_ranks(token) == doc["groups"][kind], (token, kind)
    assert dense.get_gtp_ranks(c["gtp_remat"]) == doc["groups"]["gtp_remat"]
    if c["gtp_remat"] > 1:
        assert dense.get_ranks("gtp_remat-dp") == doc["groups"]["dp_gtp_remat"]
        assert dense.get_ranks("gtp_remat-dp-cp") == doc["groups"]["dp_cp_gtp_remat"]
    if c["expert_gtp_remat"] > 1:
        assert expert.get_ranks("gtp_remat-dp") == doc["groups"]["expt_dp_gtp_remat"]


@pytest.mark.parametrize("path", RECORDS, ids=os.path.basename)
def test_creation_order_matches_head_record(path):
    rec = load(path)
    layout = commgrid.Layout(**kwargs_of(rec["args"]))
    want = [(c["kind"], c["level"], c["ranks"]) for c in rec["calls"] if c["backend"] is None]
    got = [(kind, level, members) for kind, level, _index, members in layout.creation_order()]
    assert got == want


def test_seed_creation_order_is_the_seeds():
    # Example (a) of the layout spec: 107 calls, dp first (HEAD: gtp_remat, then dp_cp).
    seed = commgrid.Layout(16, tp=2, pp=2, cp=2).creation_order()
    head = commgrid.Layout(16, tp=2, pp=2, cp=2, compat="head").creation_order()
    assert len(seed) == 107
    assert seed[0][0] == "dp" and head[0][0] == "gtp_remat"
    assert {k for k, *_ in head} - {k for k, *_ in seed} == {
        "gtp_remat", "expt_gtp_remat", "tp_ep_pp_with_egtp_remat"}
    assert [s[0] for s in commgrid.Layout(16, tp=2, compat="head").creation_order(["dp", "tp"])] \
        == ["dp"] * 2 + ["tp"] * 8  # dp 8: two dp groups


def test_head_arguments_and_megatron_names():
    a = commgrid.Layout(16, tp=2, compat="head", gtp_remat=2, expert_gtp_remat=2,
                        hybrid_context_parallel=False, all_gather_groups=False, rank_offset=0,
                        local_world_size=16)
    b = commgrid.Layout(16, tensor_model_parallel_size=2, compat="head", gtp_remat_size=2,
                        expert_gtp_remat_size=2, local_world_size=16)
    assert a.to_dict() == b.to_dict()
    assert a.config["gtp_remat"] == 2 and a.dp == 4
    assert "gtp_remat=2" in repr(a) and "compat" not in repr(commgrid.Layout(8, tp=2))
    assert "compat" not in commgrid.Layout(8, tp=2).config  # seed output unchanged
    with pytest.raises(TypeError):
        commgrid.Layout(16, compat="head", gtp_remat=2, gtp_remat_size=2)
    h = commgrid.Layout(16, tp=2, cp=4, compat="head", hybrid_context_parallel=True)
    assert h.hybrid_sizes() == [2, 4]
    assert [h.level_name("hybrid_dp_cp", lv) for lv in range(2)] == ["hybrid_dp_cp_2",
                                                                       "hybrid_dp_cp_4"]
    assert h.groups("hybrid_dp_cp") == [h.groups("hybrid_dp_cp_2"), h.groups("hybrid_dp_cp_4")]
    assert h.group_of("hybrid_dp_cp_4", 5) == h.group_of("hybrid_dp_cp", 5, 1)
    with pytest.raises(commgrid.UnknownKindError):
        h.groups("hybrid_dp_cp_8")


@pytest.mark.parametrize("kwargs, error, parameter", [
    (dict(compat="tail"), commgrid.InvalidValueError, "compat"),
    (dict(compat=None), commgrid.InvalidValueError, "compat"),
    (dict(gtp_remat=2), commgrid.IncompatibleError, "gtp_remat"),  # seed
    (dict(rank_offset=4), commgrid.IncompatibleError, "rank_offset"),  # seed
    (dict(hybrid_context_parallel=True), commgrid.IncompatibleError, "hybrid_context_parallel"),
    (dict(compat="head", gtp_remat=0), commgrid.InvalidValueError, "gtp_remat"),
    (dict(compat="head", expert_gtp_remat=-1), commgrid.InvalidValueError, "expert_gtp_remat"),
    (dict(compat="head", gtp_remat=3), commgrid.DivisibilityError, None),
    (dict(compat="head", rank_offset=-1), commgrid.InvalidValueError, "rank_offset"),
    (dict(compat="head", local_world_size=0), commgrid.InvalidValueError, "local_world_size"),
    (dict(compat="head", rank_offset=8, local_world_size=16), commgrid.ConfigError, None),
    (dict(compat="head", hybrid_context_parallel="yes"), commgrid.InvalidValueError,
     "hybrid_context_parallel"),
    (dict(compat="head", all_gather_groups=1), commgrid.InvalidValueError, "all_gather_groups"),
    (dict(compat="head", order="cp-ep-dp-pp", tp=1), commgrid.OrderError, "order"),
])
def test_bad_head_arguments(kwargs, error, parameter):
    kw = {"tp": 2}
    kw.update(kwargs)
    with pytest.raises(error) as info:
        commgrid.Layout(16, **kw)
    if parameter is not None:
        assert info.value.parameter == parameter
    assert "\n" not in str(info.value)


def test_bad_head_rank_generator():
    with pytest.raises(commgrid.InvalidValueError):
        commgrid.RankGenerator(2, 1, 2, 1, 1, "tp-dp", compat="tail")
    with pytest.raises(commgrid.IncompatibleError):
        commgrid.RankGenerator(2, 1, 2, 1, 1, "tp-dp", gtp_remat=2)  # seed
    with pytest.raises(commgrid.IncompatibleError):
        commgrid.RankGenerator(2, 1, 2, 1, 1, "tp-dp").get_gtp_ranks(1)
    gen = commgrid.RankGenerator(2, 1, 2, 1, 1, "tp-gtp_remat-dp", gtp_remat=2, compat="head")
    assert gen.order == "tp-gtp_remat-dp-pp-ep-cp" and gen.world_size == 8
    with pytest.raises(commgrid.IncompatibleError):
        gen.get_gtp_ranks(4)
    with pytest.raises(commgrid.OrderError):  # gtp_remat of size 2 missing from the order
        commgrid.RankGenerator(2, 1, 2, 1, 1, "tp-dp", gtp_remat=2, compat="head")
    with pytest.raises(commgrid.OrderError):  # HEAD would never add tp
        commgrid.RankGenerator(1, 1, 2, 1, 1, "gtp_remat-dp", gtp_remat=2, compat="head")
    with pytest.raises(commgrid.OrderError):
        commgrid.RankGenerator(2, 1, 2, 1, 1, "tp-gtp_remat-gtp_remat", compat="head")
    with pytest.raises(commgrid.InvalidValueError):
        commgrid.RankGenerator(2, 1, 2, 1, 1, "tp-dp", gtp_remat=0, compat="head")
    # Without gtp_remat in the order HEAD appends it last, after the seed's axes.
    assert commgrid.RankGenerator(2, 1, 2, 1, 1, "tp-dp", compat="head").order == \
        "tp-dp-pp-ep-cp-gtp_remat"
