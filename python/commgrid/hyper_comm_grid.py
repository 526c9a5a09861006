"""commgrid.HyperCommGrid: Megatron-core HEAD's HyperCommGrid (megatron/core/hyper_comm_grid.py
at d98e8a64dd) over the core's N-dimensional grid (commgrid::HyperGrid).

The rank enumerations come from the core; torch.distributed is imported only when a process
group is created, destroyed or a rank is asked for (``import commgrid`` stays torch-free).
"""

import numbers
import os
from dataclasses import dataclass
from typing import List

from . import _commgrid
from .errors import ConfigError, IncompatibleError, as_builtin

_BASE = "base"  # HEAD's name of the base view (the core's "")


@dataclass
class _RankViewSpec:
    """A named factorization of the grid's ranks (HEAD's _RankViewSpec)."""

    name: str
    shape: List[int]
    dim_names: List[str]
    shared_dims: List[str]


def _dist():
    import torch.distributed as dist
    return dist


class HyperCommGrid:
    """An N-dimensional grid of ranks with named dims, innermost first (as the ``order`` of
    initialize_model_parallel), over ``[rank_offset, rank_offset + prod(shape))``.
    ``create_pg(dims)`` creates the process groups over a set of dims (once per set; again is
    a KeyError), ``get_pg(dims)`` returns them, ``get_rank_enum(dims)`` lists their ranks;
    ``register_view`` adds another factorization of the same ranks whose shared dims must
    give the base grid's groups. The world size is ``WORLD_SIZE`` from the environment, else
    torch.distributed's."""

    def __init__(self, shape, dim_names, rank_offset=0, backend=None):
        if len(shape) != len(dim_names):
            raise ValueError(f"len(shape) {shape} != len(dim_names) {dim_names}")
        if "WORLD_SIZE" in os.environ:
            world_size = int(os.environ["WORLD_SIZE"])
        elif _dist().is_initialized():
            world_size = _dist().get_world_size()
        else:
            raise RuntimeError("Cannot determine world size: WORLD_SIZE environment variable not set and "
                               "torch.distributed is not initialized. Please either set WORLD_SIZE or "
                               "initialize torch.distributed before creating HyperCommGrid.")
        if rank_offset < 0:
            raise ValueError(f"rank_offset must be non-negative, got {rank_offset}")
        try:
            self._grid = _commgrid.HyperGrid([int(s) for s in shape], list(dim_names), world_size,
                                             rank_offset)
        except IncompatibleError as e:  # HEAD raises RuntimeError for a grid that does not fit
            raise as_builtin(IncompatibleError(
                f"Grid shape {shape} is over sized with world size {world_size} and rank offset "
                f"{rank_offset} ({e})", parameter="shape"), RuntimeError) from None
        self.rank_offset = rank_offset
        self.size = self._grid.size
        self.shape = list(shape)
        self.dim_names = list(dim_names)
        self.backend = backend
        self._views = {_BASE: _RankViewSpec(_BASE, self.shape[:], self.dim_names[:], [])}
        self._pgs = {}

    # ---- views ----------------------------------------------------------------------------

    def register_view(self, name, shape, dim_names, shared_dims=None):
        """Registers another factorization of the grid's ranks under ``name``. Every shared
        dim must be a dim of both, and the shared dims (each, and all together) must give the
        base grid's groups. ValueError otherwise, with HEAD's messages."""
        if name in self._views:
            raise ValueError(f"View {name!r} is already registered")
        if len(shape) != len(dim_names):
            raise ValueError(f"len(shape) {shape} != len(dim_names) {dim_names}")
        if len(set(dim_names)) != len(dim_names):
            raise ValueError(f"View {name!r} has duplicate dim_names: {dim_names}")
        if any(not isinstance(s, numbers.Integral) or s <= 0 for s in shape):
            raise ValueError(f"View {name!r} shape must be positive ints, got {shape}")
        size = 1
        for s in shape:
            size *= int(s)
        if size != self.size:
            raise ValueError(f"View {name!r} shape {shape} has size {size}, but the grid size is {self.size}")
        shared = list(shared_dims) if shared_dims is not None else []
        if len(set(shared)) != len(shared):
            raise ValueError(f"View {name!r} has duplicate shared_dims: {shared}")
        for dim in shared:
            if dim not in self.dim_names:
                raise ValueError(f"Shared dim {dim!r} of view {name!r} is not in the base view {self.dim_names}")
            if dim not in dim_names:
                raise ValueError(f"Shared dim {dim!r} of view {name!r} is not in the view's dim_names {dim_names}")
        checks = [[d] for d in shared] + ([shared] if len(shared) > 1 else [])
        for dims in checks:
            base = self._gen_rank_enum_for(self.shape, self.dim_names, self._order_dims_for(self.dim_names, dims)[0])
            view = self._gen_rank_enum_for(list(shape), list(dim_names), self._order_dims_for(list(dim_names), dims)[0])
            if base != view:
                what = f"Shared dim {dims[0]!r} has" if len(dims) == 1 else f"Shared dims {shared!r} have"
                raise ValueError(f"{what} different membership across views: base enumeration {base} "
                                 f"!= view {name!r} enumeration {view}")
        try:
            self._grid.register_view(name, [int(s) for s in shape], list(dim_names), shared)
        except ConfigError as e:  # the core's own checks; the ones above match them
            raise ValueError(f"View {name!r}: {e}") from None
        self._views[name] = _RankViewSpec(name, list(shape), list(dim_names), shared[:])

    def _resolve_view(self, view):
        name = _BASE if view is None else view
        if name not in self._views:
            raise KeyError(f"View {name!r} is not registered. Registered views: {sorted(self._views)}")
        return self._views[name]

    # ---- dims and enumerations ---------------------------------------------------------------

    def _order_dims_for(self, dim_names, dims):
        """``dims`` ordered outermost first against ``dim_names`` (a single name as given),
        and the key HEAD stores its groups under ("dp-cp")."""
        if not isinstance(dims, list):
            ordered = [dims]
        else:
            reverse = list(dim_names)[::-1]
            ordered = [reverse[i] for i in sorted(reverse.index(d) for d in dims)]
        return ordered, "-".join(ordered)

    def _order_dims_for_view(self, view, dims):
        requested = dims if isinstance(dims, list) else [dims]
        missing = [d for d in requested if d not in view.dim_names]
        if missing:
            raise ValueError(f"{missing[0]!r} is not in view {view.name!r} with dim_names {view.dim_names}")
        return self._order_dims_for(view.dim_names, dims)

    def _gen_rank_enum(self, dims):
        """The groups over ``dims`` of the base grid, each listing its ranks with the last of
        ``dims`` fastest (HEAD's _gen_rank_enum)."""
        return self._gen_rank_enum_for(self.shape, self.dim_names, dims)

    def _gen_rank_enum_for(self, shape, dim_names, dims):
        """The groups over ``dims`` of a grid ``shape`` / ``dim_names`` at this grid's rank
        offset: the core's groups (innermost dim fastest), each group's members reordered so
        that the last of ``dims`` varies fastest, as HEAD lists them."""
        dims = list(dims)
        groups = _commgrid.named_grid_groups([int(s) for s in shape], list(dim_names), dims,
                                             self.rank_offset)
        size = dict(zip(dim_names, (int(s) for s in shape)))
        canonical = [d for d in list(dim_names)[::-1] if d in dims]  # outermost first
        if canonical != dims:
            axes = [canonical.index(d) for d in dims]
            groups = groups.reshape([len(groups)] + [size[d] for d in canonical])
            groups = groups.transpose([0] + [a + 1 for a in axes]).reshape(len(groups), -1)
        return groups.tolist()

    def _canonical_pg_key_and_enum_view(self, view, ordered_dims):
        if view.name == _BASE:
            return "-".join(ordered_dims), view, ordered_dims
        if all(d in view.shared_dims for d in ordered_dims):  # the base grid's groups
            base = self._views[_BASE]
            base_dims, base_key = self._order_dims_for_view(base, ordered_dims)
            return base_key, base, base_dims
        return (view.name, tuple(ordered_dims)), view, ordered_dims

    @staticmethod
    def _is_base_pg_key(key):
        return isinstance(key, str)

    # ---- process groups ----------------------------------------------------------------------

    def create_pg(self, dims, *, view=None, **kwargs):
        """Creates the process groups over ``dims`` (a name or a list; any order) with
        ``torch.distributed.new_subgroups_by_enumeration`` (collective: every rank of the
        world calls it), ``kwargs`` passed on (timeout, pg_options, group_desc). Returns this
        rank's group. A view's dims that are all shared reuse the base grid's groups. A set
        created before raises KeyError."""
        spec = self._resolve_view(view)
        ordered, _ = self._order_dims_for_view(spec, dims)
        key, enum_view, enum_dims = self._canonical_pg_key_and_enum_view(spec, ordered)
        if key in self._pgs:
            where = "" if self._is_base_pg_key(key) else f" for view {spec.name!r}"
            raise KeyError(f"Process group {dims}{where} has already been created. Because there is no "
                           "way to check whether options to create process group matches the first, we "
                           "error out instead of returning the process group that has already been "
                           "created before.")
        rank_enum = self._gen_rank_enum_for(enum_view.shape, enum_view.dim_names, enum_dims)
        try:
            pg, _ = _dist().new_subgroups_by_enumeration(rank_enum, backend=self.backend, **kwargs)
        except ValueError as e:
            if "CUDA" not in str(e):
                raise
            # torch < 2.0 makes subgroups only with CUDA; without it, the same groups one
            # new_group at a time (what its new_subgroups_by_enumeration does with CUDA).
            pg = self._new_groups(rank_enum, **kwargs)
        self._pgs[key] = pg
        return pg

    def _new_groups(self, rank_enum, timeout=None, pg_options=None, group_desc=None):
        import inspect
        dist = _dist()
        extra = {"timeout": timeout} if timeout is not None else {}
        if group_desc is not None and "group_desc" in inspect.signature(dist.new_group).parameters:
            extra["group_desc"] = group_desc
        rank, mine = dist.get_rank(), None
        for ranks in rank_enum:
            group = dist.new_group(ranks=ranks, backend=self.backend, pg_options=pg_options, **extra)
            if rank in ranks:
                mine = group
        return mine

    def get_pg(self, dims, *, view=None):
        """This rank's group over ``dims``, made by create_pg (KeyError before)."""
        spec = self._resolve_view(view)
        ordered, _ = self._order_dims_for_view(spec, dims)
        key, _, _ = self._canonical_pg_key_and_enum_view(spec, ordered)
        if key not in self._pgs:
            if self._is_base_pg_key(key):
                raise KeyError(f"Process group for {key} hasn't been created. Call create_pg first.")
            raise KeyError(f"Process group {dims} for view {spec.name!r} hasn't been created. "
                           "Call create_pg first.")
        return self._pgs[key]

    def get_rank_enum(self, dims, *, view=None):
        """The groups create_pg would create over ``dims`` of the view, as rank lists."""
        spec = self._resolve_view(view)
        ordered, _ = self._order_dims_for_view(spec, dims)
        return self._gen_rank_enum_for(spec.shape, spec.dim_names, ordered)

    def destroy(self):
        """Destroys every group of this grid that this rank is a member of (a group a view
        shares with the base grid once) and forgets them all."""
        dist = _dist()
        non_member = getattr(getattr(dist, "GroupMember", None), "NON_GROUP_MEMBER", None)
        done = set()
        for pg in self._pgs.values():
            if pg is not None and pg is not non_member and id(pg) not in done:
                dist.destroy_process_group(pg)
                done.add(id(pg))
        self._pgs.clear()

    def is_current_rank_in_grid(self):
        """Whether this process's rank lies in [rank_offset, rank_offset + size)."""
        rank = _dist().get_rank()
        return bool(self.rank_offset <= rank < self.rank_offset + self.size)
