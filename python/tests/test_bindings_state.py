"""The binding's objects in every state: an object whose construction raised (reachable from
the traceback's frames, as pytest reaches it to render a failure), one made by __new__ alone,
a bad embedding policy, a kind that is not a name, and results too large to build (world
2^31-1): typed errors, never a read of uninitialized memory or an exhausted machine."""

import gc
import os

import pytest

import commgrid
from commgrid import _commgrid

BIG = commgrid.MAX_WORLD_SIZE  # 2^31 - 1


def half_built_layout():
    """The commgrid.Layout whose __init__ raised, taken from the traceback's frame."""
    try:
        commgrid.Layout(8, pp=2, ep=2, order="tp-pp-ep-dp")
    except commgrid.IncompatibleError as e:
        tb = e.__traceback__
        while tb.tb_next is not None:
            tb = tb.tb_next
        return tb.tb_frame.f_locals["self"]
    raise AssertionError("the config must be refused")


def test_a_layout_whose_construction_raised():
    layout = half_built_layout()
    assert isinstance(layout, commgrid.Layout) and not layout.initialized()
    assert repr(layout) == "commgrid.Layout(<not initialized: its construction failed>)"
    for use in (lambda: layout.config, lambda: layout.world_size, lambda: layout.groups("tp"),
                lambda: layout.group_of("tp", 0), lambda: layout.to_dict(), lambda: layout.kinds(),
                lambda: layout.creation_order(), lambda: layout.array("dp"),
                lambda: layout.coordinates(0)):
        with pytest.raises(commgrid.StateError, match="Layout is not initialized"):
            use()
    layout = None
    gc.collect()  # and it is freed without touching the C++ object it never had


@pytest.mark.parametrize("cls, attr", [(_commgrid.Layout, "world_size"), (commgrid.Layout, "dp"),
                                       (commgrid.GroupRef, "members"), (commgrid.GroupRef, "index"),
                                       (_commgrid.HyperGrid, "size")])
def test_objects_made_by_new_alone(cls, attr):
    obj = cls.__new__(cls)
    with pytest.raises(commgrid.StateError, match="is not initialized"):
        getattr(obj, attr)
    if cls is commgrid.GroupRef:
        with pytest.raises(commgrid.StateError):
            repr(obj)
    elif cls is not _commgrid.HyperGrid:
        assert not obj.initialized()
        repr(obj)  # safe


def test_a_method_called_on_another_type():
    with pytest.raises(TypeError, match="Layout method called on"):
        _commgrid.Layout.kinds(object())


def test_the_failed_construction_under_pytest_rendering(pytester, monkeypatch):
    # The failure of the issue: pytest renders the frames (and reprs their locals) of a
    # test whose Layout construction raised. It must report the error and not crash.
    monkeypatch.setenv("PYTHONPATH", os.path.dirname(os.path.abspath(commgrid.__path__[0])))
    pytester.makepyfile("""
        import commgrid
        def test_fails():
            commgrid.Layout(8, pp=2, ep=2, order="tp-pp-ep-dp")
    """)
    result = pytester.runpytest_subprocess("-l", "--tb=long")
    result.assert_outcomes(failed=1)
    result.stdout.fnmatch_lines(["*IncompatibleError*does not end with pp*"])
    assert "not initialized: its construction failed" in result.stdout.str()


@pytest.mark.parametrize("policy, match", [
    (lambda pp: "ab", "returned 'ab'"), (lambda pp: None, "returned None"),
    (lambda pp: [0.5], "returned \\[0.5\\]"), (lambda pp: [pp[0], 99], "rank 99"),
    (lambda pp: [], "empty"), (42, "expected a callable"),
])
def test_a_bad_embedding_policy_is_a_policy_error(policy, match):
    with pytest.raises(commgrid.PolicyError, match=match) as caught:
        commgrid.Layout(8, pp=2, embedding_ranks=policy)
    assert "embedding" in caught.value.parameter
    with pytest.raises(commgrid.PolicyError):
        commgrid.Layout(8, pp=2, position_embedding_ranks=policy)


def test_an_exception_of_the_policy_itself_propagates():
    def policy(pp):
        raise KeyError("mine")
    with pytest.raises(KeyError, match="mine"):
        commgrid.Layout(8, pp=2, embedding_ranks=policy)


@pytest.mark.parametrize("kind", [None, 3, ["tp"]])
def test_a_kind_that_is_not_a_name(kind):
    layout = commgrid.Layout(8, tp=2)
    for use in (layout.groups, layout.array, lambda k: layout.group_of(k, 0)):
        with pytest.raises(commgrid.UnknownKindError, match="kind must be a kind name"):
            use(kind)


def test_results_too_large_are_refused_before_they_are_built():
    layout = commgrid.Layout(BIG)
    for use, what in ((lambda: layout.to_dict(), "to_dict()"),
                      (lambda: layout.to_dict(rank=5), "to_dict(rank=5)"),
                      (lambda: layout.group_of("dp", 5), "rank 5's dp group"),
                      (lambda: layout.group_ref("intra_dist_opt", 5), "rank 5's intra_dist_opt group"),
                      (lambda: layout.groups("tp"), 'groups("tp")'),
                      (lambda: layout.array("tp"), 'array("tp")')):
        with pytest.raises(commgrid.OverflowError, match="MiB limit") as caught:
            use()
        assert what in str(caught.value) and caught.value.parameter == "max_output_mib"
        assert isinstance(caught.value, OverflowError)  # also the built-in type
    # Small answers of the same world are fine, and the sizes are there without the members.
    assert layout.group_of("tp", 5) == [5] and layout.group_size("dp") == BIG
    assert layout.group_ref("tp", BIG - 1).members == [BIG - 1]
    with pytest.raises(commgrid.RankOutOfRangeError):
        layout.group_of("dp", BIG)  # the rank is checked first
    with pytest.raises(commgrid.InvalidValueError, match="max_output_mib must be >= 0"):
        commgrid.Layout(8).groups("tp", max_output_mib=-1)
    small = commgrid.Layout(64, tp=2)
    assert len(small.groups("tp", max_output_mib=0)) == 32  # 0: no limit
    with pytest.raises(commgrid.OverflowError):
        commgrid.Layout(1 << 22).groups("dp", max_output_mib=1)
