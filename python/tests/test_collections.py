"""The seed's collections: keyword construction, unknown keywords, unset fields, and
use_mpu_process_groups over the state (here filled by hand; test_torch.py fills it with
real torch groups)."""

import dataclasses

import pytest

import commgrid
from commgrid._state import GROUP_GLOBAL, STATE

MODEL_FIELDS = ["tp", "pp", "mp", "embd", "pos_embd", "cp", "tp_cp", "hcp", "ep", "expt_tp",
                "tp_ep", "tp_ep_pp", "expt_dp"]
GRAD_FIELDS = ["dp", "dp_cp", "expt_dp", "intra_dp_cp", "intra_expt_dp", "inter_dist_opt"]


@pytest.fixture
def state():
    STATE.reset()
    yield STATE
    STATE.reset()


def test_fields_in_the_seed_order():
    assert [f.name for f in dataclasses.fields(commgrid.ModelCommProcessGroups)] == MODEL_FIELDS
    assert [f.name for f in dataclasses.fields(commgrid.GradCommProcessGroups)] == GRAD_FIELDS


def test_keyword_construction_and_unset_fields():
    tp, pp = object(), object()
    m = commgrid.ModelCommProcessGroups(tp=tp, pp=pp, embd=None)
    assert m.tp is tp and m.pp is pp and m.embd is None  # None counts as set
    assert not hasattr(m, "cp")
    with pytest.raises(AttributeError, match="'ModelCommProcessGroups' object has no attribute 'cp'"):
        m.cp
    with pytest.raises(AttributeError):
        repr(m)  # the generated repr reads every field, as in the seed
    m.cp = "cp group"
    assert m.cp == "cp group"
    m.anything = 1  # the seed does not reject undeclared attributes after construction
    g = commgrid.GradCommProcessGroups()
    with pytest.raises(AttributeError):
        g.dp
    g.dp = tp
    assert g.dp is tp


def test_unknown_keyword():
    with pytest.raises(ValueError, match="^Unknown attribute: foo$"):
        commgrid.ModelCommProcessGroups(tp=1, foo=2)
    with pytest.raises(ValueError, match="^Unknown attribute: tp$"):
        commgrid.GradCommProcessGroups(tp=1)


def test_equality_and_repr_when_every_field_is_set():
    a = commgrid.GradCommProcessGroups(**{f: 1 for f in GRAD_FIELDS})
    b = commgrid.GradCommProcessGroups(**{f: 1 for f in GRAD_FIELDS})
    assert a == b and "dp=1" in repr(a)


def test_use_mpu_process_groups_invalid_names_first(state):
    with pytest.raises(ValueError, match=r"^Invalid process groups requested: \['foo', 'bar'\]$"):
        commgrid.ModelCommProcessGroups.use_mpu_process_groups(["tp", "foo", "bar"])
    with pytest.raises(ValueError, match=r"Invalid process groups requested: \['tp'\]"):
        commgrid.GradCommProcessGroups.use_mpu_process_groups(["tp"])


def test_use_mpu_process_groups_before_initialization_reads_none(state):
    m = commgrid.ModelCommProcessGroups.use_mpu_process_groups()
    assert all(getattr(m, f) is None for f in MODEL_FIELDS)


def test_use_mpu_process_groups_from_state(state):
    groups = {f: object() for f in MODEL_FIELDS + GRAD_FIELDS if f not in ("pos_embd", "hcp")}
    groups["hcp"] = [object(), object()]
    for f, g in groups.items():  # pos_embd: this rank has none
        state.vars[GROUP_GLOBAL[f]] = g
    m = commgrid.ModelCommProcessGroups.use_mpu_process_groups()
    for f in MODEL_FIELDS:
        assert getattr(m, f) is groups.get(f)
    assert m.pos_embd is None
    only = commgrid.ModelCommProcessGroups.use_mpu_process_groups(["tp", "hcp"])
    assert only.tp is groups["tp"] and only.hcp is groups["hcp"]
    assert not hasattr(only, "pp")  # not requested: stays unset
    empty = commgrid.ModelCommProcessGroups.use_mpu_process_groups([])
    assert not any(hasattr(empty, f) for f in MODEL_FIELDS)
    grad = commgrid.GradCommProcessGroups.use_mpu_process_groups()
    assert all(getattr(grad, f) is groups[f] for f in GRAD_FIELDS)
