"""commgrid.HyperCommGrid (HEAD's API over the core's HyperGrid) without processes: its rank
enumerations against a brute-force enumeration from coordinates, the keys, views, errors and
the process-group bookkeeping (torch.distributed's subgroup call replaced by a recorder).
Real groups on 8 Gloo ranks: test_torch.py."""

import itertools
import random

import pytest

import commgrid


def reference(shape, names, dims, offset=0):
    """Every group over ``dims``: ranks whose other coordinates agree, groups in the order of
    those coordinates (the innermost fastest), members with the last of ``dims`` fastest."""
    strides, s = {}, 1
    for n, size in zip(names, shape):
        strides[n], s = s, s * size
    size = dict(zip(names, shape))
    others = [n for n in names if n not in dims]  # innermost first

    def ranks_of(fixed):
        out = []
        for idx in itertools.product(*[range(size[d]) for d in dims]):  # last fastest
            coords = dict(fixed, **dict(zip(dims, idx)))
            out.append(offset + sum(coords[n] * strides[n] for n in names))
        return out
    groups = []
    for idx in itertools.product(*[range(size[n]) for n in reversed(others)]):
        groups.append(ranks_of(dict(zip(reversed(others), idx))))
    return groups


@pytest.fixture(autouse=True)
def world_size(monkeypatch):
    monkeypatch.setenv("WORLD_SIZE", "64")


def test_enumerations_match_the_reference_on_random_grids():
    rng = random.Random(23)
    for _ in range(60):
        n = rng.randint(1, 4)
        shape = [rng.choice([1, 2, 3]) for _ in range(n)]
        names = rng.sample(["tp", "cp", "dp", "pp", "ep", "x"], n)
        total = 1
        for v in shape:
            total *= v
        offset = rng.randint(0, 64 - total)
        grid = commgrid.HyperCommGrid(shape, names, rank_offset=offset)
        dims = rng.sample(names, rng.randint(1, n))
        assert grid._gen_rank_enum(dims) == reference(shape, names, dims, offset), (shape, names, dims)
        ordered, key = grid._order_dims_for(names, dims)
        assert key == "-".join(ordered) and ordered == [d for d in reversed(names) if d in dims]
        assert grid.get_rank_enum(dims) == reference(shape, names, ordered, offset)
        assert grid.size == total and grid.shape == shape and grid.dim_names == names


def test_a_single_name_and_its_key():
    grid = commgrid.HyperCommGrid([2, 2, 2], ["tp", "cp", "dp"])
    assert grid._order_dims_for(grid.dim_names, "cp") == (["cp"], "cp")
    assert grid._order_dims_for(grid.dim_names, ["tp", "dp"]) == (["dp", "tp"], "dp-tp")
    assert grid.get_rank_enum("cp") == [[0, 2], [1, 3], [4, 6], [5, 7]]


def test_construction_errors(monkeypatch):
    with pytest.raises(ValueError, match=r"len\(shape\) \[2, 2\] != len\(dim_names\) \['tp'\]"):
        commgrid.HyperCommGrid([2, 2], ["tp"])
    with pytest.raises(RuntimeError, match="Grid shape .* is over sized with world size 64") as caught:
        commgrid.HyperCommGrid([8, 16], ["tp", "dp"])
    assert isinstance(caught.value, commgrid.IncompatibleError)
    with pytest.raises(RuntimeError, match="is over sized"):
        commgrid.HyperCommGrid([4, 4], ["tp", "dp"], rank_offset=60)
    with pytest.raises(ValueError, match="rank_offset must be non-negative"):
        commgrid.HyperCommGrid([2], ["tp"], rank_offset=-1)
    with pytest.raises(ValueError, match="appears twice"):  # the core's own check
        commgrid.HyperCommGrid([2, 2], ["tp", "tp"])
    monkeypatch.delenv("WORLD_SIZE")
    pytest.importorskip("torch")
    with pytest.raises(RuntimeError, match="Cannot determine world size"):
        commgrid.HyperCommGrid([2], ["tp"])


def test_views():
    grid = commgrid.HyperCommGrid([2, 2, 2], ["tp", "dp", "pp"])
    shape, names = [2, 2, 2], ["expt_tp", "ep", "pp"]
    assert grid.register_view("expert", shape, names, shared_dims=["pp"]) is None
    view = grid._views["expert"]
    assert view.shape == shape and view.shape is not shape and view.shared_dims == ["pp"]
    assert grid.get_rank_enum("pp", view="expert") == grid.get_rank_enum("pp")
    assert grid.get_rank_enum(["expt_tp", "ep"], view="expert") == [[0, 1, 2, 3], [4, 5, 6, 7]]
    for args, match in [
        (("expert", [2, 4], ["ep", "x"]), "is already registered"),
        (("v", [2, 2, 2], ["ep", "x"]), r"len\(shape\).*!= len\(dim_names\)"),
        (("v", [2, 2, 2], ["ep", "ep", "x"]), "duplicate dim_names"),
        (("v", [2, 2], ["ep", "x"]), "but the grid size is 8"),
        (("v", [8, 0], ["ep", "x"]), "shape must be positive ints"),
        (("v", [4, 2], ["ep", "pp"], ["pp", "pp"]), "duplicate shared_dims"),
        (("v", [4, 2], ["ep", "q"], ["q"]), "Shared dim 'q' .* is not in the base view"),
        (("v", [4, 2], ["ep", "x"], ["pp"]), "Shared dim 'pp' .* is not in the view's dim_names"),
        (("v", [2, 4], ["pp", "ep"], ["pp"]), "Shared dim 'pp' has different membership"),
    ]:
        with pytest.raises(ValueError, match=match):
            grid.register_view(*args)
    with pytest.raises(KeyError, match="View 'nope' is not registered"):
        grid.get_rank_enum("ep", view="nope")
    with pytest.raises(ValueError, match="'ep' is not in view 'base'"):
        grid.get_rank_enum("ep")


class Subgroups:
    """torch.distributed.new_subgroups_by_enumeration's stand-in: records the enumerations."""

    def __init__(self):
        self.calls = []

    def __call__(self, ranks_per_subgroup_list, backend=None, **kwargs):
        self.calls.append((ranks_per_subgroup_list, backend, kwargs))
        return (f"group{len(self.calls)}", None)


def test_process_groups_are_created_once_and_found_by_any_order(monkeypatch):
    torch = pytest.importorskip("torch")
    sub = Subgroups()
    monkeypatch.setattr(torch.distributed, "new_subgroups_by_enumeration", sub)
    grid = commgrid.HyperCommGrid([2, 2, 2], ["tp", "cp", "dp"], backend="gloo")
    assert grid.create_pg(["tp", "cp"], group_desc="X") == "group1"
    assert sub.calls[0] == ([[0, 1, 2, 3], [4, 5, 6, 7]], "gloo", {"group_desc": "X"})
    assert grid.get_pg(["cp", "tp"]) == "group1" and list(grid._pgs) == ["cp-tp"]
    with pytest.raises(KeyError, match="has already been created"):
        grid.create_pg(["cp", "tp"])
    with pytest.raises(KeyError, match="Process group for dp hasn't been created"):
        grid.get_pg("dp")
    grid.register_view("alt", [2, 2, 2], ["a", "b", "dp"], shared_dims=["dp"])
    assert grid.create_pg("dp", view="alt") == "group2"  # shared: the base grid's group
    assert grid.get_pg("dp") == "group2" and ("alt", ("dp",)) not in grid._pgs
    assert grid.create_pg(["a", "b"], view="alt") == "group3"
    assert ("alt", ("b", "a")) in grid._pgs
    with pytest.raises(KeyError, match="for view 'alt' has already been created"):
        grid.create_pg(["b", "a"], view="alt")
    with pytest.raises(KeyError, match="for view 'alt' hasn't been created"):
        grid.get_pg("a", view="alt")


def test_destroy_skips_groups_this_rank_is_not_in(monkeypatch):
    torch = pytest.importorskip("torch")
    destroyed = []
    monkeypatch.setattr(torch.distributed, "destroy_process_group", destroyed.append)
    grid = commgrid.HyperCommGrid([2, 4], ["tp", "dp"])
    mine = object()
    grid._pgs = {"tp": mine, "dp": torch.distributed.GroupMember.NON_GROUP_MEMBER, "cp": None,
                 ("v", ("x",)): mine}
    grid.destroy()
    assert destroyed == [mine] and grid._pgs == {}


def test_is_current_rank_in_grid(monkeypatch):
    torch = pytest.importorskip("torch")
    grid = commgrid.HyperCommGrid([2, 2], ["tp", "dp"], rank_offset=4)
    for rank, inside in ((3, False), (4, True), (7, True), (8, False)):
        monkeypatch.setattr(torch.distributed, "get_rank", lambda group=None, r=rank: r)
        assert grid.is_current_rank_in_grid() is inside
