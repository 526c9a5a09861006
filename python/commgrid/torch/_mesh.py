"""commgrid's groups as a torch DeviceMesh: ``device_mesh(("pp", "dp", "cp", "tp"))`` wraps
the groups initialize_model_parallel made (no group is created again), so DTensor, FSDP2
(fully_shard) and tensor parallel (parallelize_module) run on exactly Megatron's groups."""

import torch
import torch.distributed as dist

from .._state import STATE
from ..errors import StateError
from ._version import check_torch

# A mesh dimension -> (the layout's group kind, its coordinate name in Layout.coordinates).
_DENSE = {"pp": ("pp", "pp"), "dp": ("dp", "dp"), "cp": ("cp", "cp"), "tp": ("tp", "tp")}
_EXPERT = {"pp": ("pp", "pp"), "expt_dp": ("expt_dp", "expert_dp"), "ep": ("ep", "ep"),
           "etp": ("expt_tp", "etp")}


def _grid_of(names):
    """The grid (dense or expert) whose dimensions ``names`` are; ValueError for a name of
    neither, a repeated one, or a mix of the two grids."""
    if isinstance(names, str) or not names:
        raise ValueError(f"device_mesh: mesh_dim_names must be a non-empty tuple of names such as "
                         f"(\"dp\", \"tp\"), got {names!r}")
    seen = set()
    for name in names:
        if name in seen:
            raise ValueError(f"device_mesh: mesh dimension {name!r} is given twice in {tuple(names)}")
        seen.add(name)
        if name not in _DENSE and name not in _EXPERT:
            raise ValueError(f"device_mesh: the layout has no mesh dimension {name!r}; its dimensions "
                             f"are {sorted(_DENSE)} (dense) and {sorted(_EXPERT)} (expert)")
    if all(n in _DENSE for n in names):
        return _DENSE
    if all(n in _EXPERT for n in names):
        return _EXPERT
    dense = [n for n in names if n not in _EXPERT]
    expert = [n for n in names if n not in _DENSE]
    raise ValueError(f"device_mesh: {dense} are dimensions of the dense grid and {expert} of the "
                     "expert grid; one mesh takes the dimensions of one grid")


def _check_layout(layout):
    config = layout.config
    if config.get("gtp_remat", 1) > 1 or config.get("expert_gtp_remat", 1) > 1:
        raise ValueError("device_mesh: a layout with gtp_remat_size or expert_gtp_remat_size > 1 "
                         "has a sixth axis that no mesh dimension names; not supported")
    if config.get("rank_offset", 0) or layout.world_size != dist.get_world_size():
        raise ValueError("device_mesh: the layout covers part of the world (rank_offset or "
                         "local_world_size); a mesh needs all of it")
    if STATE.vars["_PIPELINE_MODEL_PARALLEL_DECODER_START"] is not None:
        raise ValueError("device_mesh: the seed's encoder/decoder split has no grid to make a mesh of")


def _submesh(layout, grid, names, rank):
    """This rank's mesh over ``names``: every rank that shares this rank's coordinates on the
    grid's other dimensions, placed at its coordinates on ``names``."""
    coord = {d: c for d, (_kind, c) in grid.items()}
    mine = layout.coordinates(rank)
    fixed = [coord[d] for d in grid if d not in names]
    sizes = [len(layout.group_of(grid[d][0], rank)) for d in names]
    mesh = torch.full(sizes, -1, dtype=torch.int)
    for r in range(layout.world_size):
        c = layout.coordinates(r)
        if all(c[f] == mine[f] for f in fixed):
            mesh[tuple(c[coord[d]] for d in names)] = r
    return mesh


def device_mesh(mesh_dim_names, device_type=None):
    """A ``torch.distributed.device_mesh.DeviceMesh`` over this rank's groups of the
    dimensions ``mesh_dim_names`` (any subset and order of the dense grid's "pp", "dp",
    "cp", "tp", or of the expert grid's "pp", "expt_dp", "ep", "etp"), with those
    mesh_dim_names; ``get_group(name)`` is commgrid's group of that kind (the same object:
    nothing is created). ``device_type``: "cuda" when the default group is NCCL, else "cpu".
    Needs torch >= 2.6 and initialize_model_parallel first (StateError); a dimension the
    layout does not have, or a repeated one, is a ValueError naming it."""
    from torch.distributed.device_mesh import DeviceMesh

    check_torch(torch.__version__, "commgrid.torch.device_mesh")
    grid = _grid_of(mesh_dim_names)
    names = tuple(mesh_dim_names)
    if not STATE.initialized:
        raise StateError("device_mesh: parallel state is not initialized "
                         "(call initialize_model_parallel first)")
    layout = STATE.layout
    _check_layout(layout)
    rank = dist.get_rank()
    groups = [STATE.group(grid[d][0]) for d in names]
    mesh = _submesh(layout, grid, names, rank)
    if device_type is None:
        device_type = "cuda" if dist.get_backend() == "nccl" else "cpu"
    return DeviceMesh.from_group(groups, device_type, mesh=mesh, mesh_dim_names=names)
