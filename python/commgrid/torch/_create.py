"""Creating the torch.distributed groups of a layout: the one place commgrid.torch makes
groups (``create_layout_groups``; a resilience driver calls it again for each epoch's world,
after ``destroy_layout_groups``), Megatron-core's group helpers (create_group,
create_hierarchical_groups, create_hybrid_dp_cp_groups, the NCCL options), and the filing
of this rank's groups into Megatron's globals (commgrid._state).

The groups and their creation sequence come from the core (``Layout.creation_order()``,
``Layout.group_of``, ``Layout.creation_aliases()``). Computed here, because they are
Megatron's Python-side semantics that the core does not model: which groups get a Gloo twin,
which global a group lands in (the pp list of a rank in several pipelines), and how torch
names a group.
"""

import inspect
import os
from dataclasses import dataclass
from datetime import timedelta
from typing import Optional

import torch
import torch.distributed as dist

from .. import _commgrid
from .._state import GLOO_GLOBAL, GROUP_GLOBAL, RANKS_GLOBAL, STATE
from ..errors import InvalidValueError
from ._gloo import gloo_connection_scope, gloo_device_scope

# Megatron's pg_name (the key of nccl_communicator_config_path's file) and group_desc per kind.
_PG_NAME = {
    "dp": "dp", "dp_cp": "dp_cp", "intra_dp_cp": "intra_dp_cp", "cp": "cp", "hcp": "hcp",
    "mp": "mp", "tp": "tp", "pp": "pp", "embd": "embd", "pos_embd": "pos_embd",
    "tp_dp_cp": "tp_dp_cp", "tp_dp": "tp_dp", "tp_cp": "tp_cp", "ep": "ep", "expt_tp": "ep_tp",
    "tp_ep": "tp_ep_mp", "tp_ep_pp": "tp_ep_pp", "expt_dp": "ep_dp", "intra_expt_dp": "intra_ep_dp",
    "inter_dist_opt": "inter_ep_dp", "intra_dist_opt": "intra_dist_opt_instance",
    "gtp_remat": "gtp_remat", "dp_gtp_remat": "gtp_remat_dp", "dp_cp_gtp_remat": "gtp_remat_dp_cp",
    "expt_gtp_remat": "expt_gtp_remat", "tp_ep_pp_with_egtp_remat": "tp_ep_gtp_remat_pp",
    "expt_dp_gtp_remat": "ep_gtp_remat_dp", "hybrid_dp_cp": "dp_cp", "dp_cp_ag": "dp_cp",
    "expt_dp_ag": "ep_dp",
}
_DESC = {
    "dp": "DATA_PARALLEL_GROUP", "dp_cp": "DATA_PARALLEL_GROUP_WITH_CP",
    "intra_dp_cp": "INTRA_PARTIAL_DATA_PARALLEL_GROUP_WITH_CP", "cp": "CONTEXT_PARALLEL_GROUP",
    "mp": "MODEL_PARALLEL_GROUP", "tp": "TENSOR_MODEL_PARALLEL_GROUP",
    "pp": "PIPELINE_MODEL_PARALLEL_GROUP", "embd": "EMBEDDING_GROUP",
    "pos_embd": "POSITION_EMBEDDING_GROUP", "tp_dp_cp": "TENSOR_AND_DATA_PARALLEL_GROUP_WITH_CP",
    "tp_dp": "TENSOR_AND_DATA_PARALLEL_GROUP", "tp_cp": "TENSOR_AND_CONTEXT_PARALLEL_GROUP",
    "ep": "EXPERT_MODEL_PARALLEL_GROUP", "expt_tp": "EXPERT_TENSOR_PARALLEL_GROUP",
    "tp_ep": "EXPERT_TENSOR_AND_MODEL_PARALLEL_GROUP",
    "tp_ep_pp": "EXPERT_TENSOR_MODEL_PIPELINE_PARALLEL_GROUP", "expt_dp": "EXPERT_DATA_PARALLEL_GROUP",
    "intra_dist_opt": "INTRA_DISTRIBUTED_OPTIMIZER_INSTANCE_GROUP",
    "gtp_remat": "GTP_WEIGHT_REMAT_GROUP", "dp_gtp_remat": "DATA_PARALLEL_GROUP_WITH_GTP_REMAT",
    "dp_cp_gtp_remat": "DATA_PARALLEL_GROUP_WITH_CP_WITH_GTP_REMAT",
    "expt_gtp_remat": "EXPERT_GTP_WEIGHT_REMAT_GROUP",
    "tp_ep_pp_with_egtp_remat": "EXPERT_TENSOR_MODEL_PIPELINE_PARALLEL_GROUP_WITH_EGTP",
    "expt_dp_gtp_remat": "EXPERT_DATA_PARALLEL_GROUP_WITH_GTP_REMAT",
    "dp_cp_ag": "DATA_PARALLEL_GROUP_WITH_CP_AG", "expt_dp_ag": "EXPERT_DATA_PARALLEL_GROUP_AG",
}
_DENSE_TWINS = ("dp", "dp_cp", "intra_dp_cp")
_EXPERT_TWINS = ("expt_dp", "intra_expt_dp", "inter_dist_opt")


def _desc(kind, level, gloo, hybrid_sizes):
    if kind == "hcp":
        return f"HIERARCHICAL_CONTEXT_PARALLEL_GROUP{'_GLOO' if gloo else ''}_L{level}"
    if kind in ("intra_expt_dp", "inter_dist_opt"):
        return f"HIERARCHICAL_EXPERT_DATA_PARALLEL_GROUP{'_GLOO' if gloo else ''}_L{int(kind == 'inter_dist_opt')}"
    if kind == "hybrid_dp_cp":
        return f"HYBRID_DP_CP_GROUP_{hybrid_sizes[level]}"
    return _DESC[kind] + ("_GLOO" if gloo else "")


# ---- group creation ---------------------------------------------------------------------

def creation_strategies():
    """The creation strategies this torch offers: "local" (new_group with
    use_local_synchronization: only members take part) when new_group has it, and
    "megatron" (every rank calls new_group for every group, in Megatron's order)."""
    return (["local"] if "use_local_synchronization" in _new_group_params() else []) + ["megatron"]


def _new_group_params():
    # The installed new_group's keyword names, read once per new_group function: reading a
    # signature costs about half a millisecond, more than a Gloo group's own Python work.
    fn = dist.new_group
    if _NEW_GROUP_PARAMS[0] is not fn:  # tests put recorders in its place
        _NEW_GROUP_PARAMS[:] = [fn, frozenset(inspect.signature(fn).parameters)]
    return _NEW_GROUP_PARAMS[1]


_NEW_GROUP_PARAMS = [None, frozenset()]

def create_group(ranks=None, timeout=None, backend=None, pg_options=None,
                 use_local_synchronization=False, group_desc=None):
    """Megatron-core's create_group: ``torch.distributed.new_group`` with the keywords the
    installed torch takes (``group_desc`` and ``use_local_synchronization`` only where its
    new_group has them; a None timeout is left to torch), remembering the groups this rank
    is in for update_pg_timeout."""
    params = _new_group_params()
    kwargs = {"ranks": ranks, "backend": backend, "pg_options": pg_options}
    if timeout is not None:
        kwargs["timeout"] = timeout
    if "group_desc" in params:
        kwargs["group_desc"] = group_desc
    if "use_local_synchronization" in params:
        kwargs["use_local_synchronization"] = use_local_synchronization
    elif use_local_synchronization:
        raise InvalidValueError(f"use_local_synchronization=True: this torch ({torch.__version__}) "
                                "has no such new_group argument", parameter="use_local_synchronization")
    group = dist.new_group(**kwargs)
    STATE.creation_calls += 1
    if STATE.vars["_global_process_group_list"] is None:
        STATE.vars["_global_process_group_list"] = [None]  # None: the default group
    if ranks is None or dist.get_rank() in ranks:
        STATE.vars["_global_process_group_list"].append(group)
    return group


def get_nccl_options(pg_name, nccl_comm_cfgs):
    """Megatron-core HEAD's get_nccl_options: ProcessGroupNCCL options for ``pg_name`` from
    the communicator configs (a dict: pg_name -> {cga_cluster_size, max_ctas, min_ctas,
    net_name, is_high_priority_stream}), or None when it has no entry. The seed fills
    cga_cluster_size 4, max_ctas 32, min_ctas 1 where an entry omits them
    (``seed_defaults=True``)."""
    return _nccl_options(pg_name, nccl_comm_cfgs, seed_defaults=False)


def _nccl_options(pg_name, cfgs, seed_defaults):
    if pg_name not in cfgs:
        return None
    cfg = cfgs[pg_name]
    options = dist.ProcessGroupNCCL.Options(
        **({} if seed_defaults else {"is_high_priority_stream": cfg.get("is_high_priority_stream", False)}))
    defaults = {"cga_cluster_size": 4, "max_ctas": 32, "min_ctas": 1} if seed_defaults else {}
    for key in ("cga_cluster_size", "max_ctas", "min_ctas", "net_name"):
        if key in cfg or key in defaults:
            setattr(options.config, key, cfg.get(key, defaults.get(key)))
    if "net_name" in cfg and cfg["net_name"].lower() not in ("ib", "socket"):
        raise RuntimeError(f"net_name ({cfg['net_name']}) is not supported."
                           "Accepted values: 'IB' or 'socket'.")
    return options


def overwrite_nccl_comm_cfgs(nccl_comm_cfgs, pg_name, key_value_pair):
    """Megatron-core HEAD's: sets nccl_comm_cfgs[pg_name][key] = value."""
    nccl_comm_cfgs.setdefault(pg_name, {})[key_value_pair[0]] = key_value_pair[1]


def hierarchical_split(ranks, sizes, level):
    """Level ``level`` of the hierarchical split of ``ranks`` (the core's, as Megatron's
    create_hierarchical_groups splits)."""
    return _commgrid.hierarchical_split([int(r) for r in ranks], [int(s) for s in sizes], level)


def create_hierarchical_groups(rank, ranks, hierarchical_group_sizes, create_gloo_process_groups=False,
                               pg_options=None, timeout=None, group_desc=None):
    """Megatron-core's create_hierarchical_groups: the groups of every level of the
    hierarchical split of ``ranks`` (collective over the world), and this rank's group of
    each level (and its Gloo twin, or None)."""
    sizes = list(hierarchical_group_sizes)
    options = pg_options if isinstance(pg_options, list) else [pg_options] * len(sizes)
    mine, mine_gloo = [], []
    for level in range(len(sizes)):
        for sub in hierarchical_split(list(ranks), sizes, level):
            group = create_group(sub, timeout=timeout, pg_options=options[level],
                                 group_desc=f"HIERARCHICAL_{group_desc}_L{level}")
            gloo = (create_group(sub, timeout=timeout, backend="gloo", pg_options=options[level],
                                 group_desc=f"HIERARCHICAL_{group_desc}_GLOO_L{level}")
                    if create_gloo_process_groups else None)
            if rank in sub:
                mine.append(group)
                mine_gloo.append(gloo)
    return mine, mine_gloo


def create_hybrid_dp_cp_groups(rank, ranks, pg_options):
    """Megatron-core HEAD's create_hybrid_dp_cp_groups: for every power of two n from 2 up
    to (not including) the largest one <= len(ranks), groups of n consecutive members of
    ``ranks`` (collective); returns this rank's group per n."""
    ranks = list(ranks)
    mine = {}
    n = 2
    top = 1 << (len(ranks).bit_length() - 1) if ranks else 1
    while n < top:
        for i in range(0, len(ranks), n):
            sub = ranks[i:i + n]
            group = create_group(sub, pg_options=pg_options, group_desc=f"HYBRID_DP_CP_GROUP_{n}")
            if rank in sub:
                mine[n] = group
        n *= 2
    return mine


@dataclass
class GroupOptions:
    """How create_layout_groups makes each group: the timeout, the pp backend, the kinds that
    get a Gloo twin, the NCCL options per group name (Megatron's nccl_communicator_config_path
    entries; ``seed_nccl_defaults``: the seed fills cga_cluster_size 4, max_ctas 32,
    min_ctas 1), the creation strategy ("local" or "megatron", see creation_strategies()),
    SHARP (None, "dp" or HEAD's "dp_replica"; ``head``: HEAD's NCCL_COLLNET_ENABLE), and how
    Gloo groups connect (``gloo_connection``: "lazy", "eager", or None: as the environment
    says; see resolve_gloo_connection()), which device they run on (``gloo_device``:
    "shared" or "per_group", see gloo_devices()), and whether kinds with the same groups
    share them (``share_identical``, see _IdenticalGroups)."""

    timeout: Optional[timedelta] = None
    pp_backend: Optional[str] = None
    gloo_twins: frozenset = frozenset()
    nccl_cfgs: Optional[dict] = None
    seed_nccl_defaults: bool = False
    creation: str = "megatron"
    sharp: Optional[str] = None
    head: bool = False
    gloo_connection: Optional[str] = None
    gloo_device: Optional[str] = None
    share_identical: bool = False


def _default_backend():
    """The default group's backend ("gloo", "nccl", "cpu:gloo,cuda:nccl", ...), or None
    without a default group."""
    try:
        return dist.get_backend()
    except (RuntimeError, ValueError):
        return None


class _IdenticalGroups:
    """With ``share_identical``: one Gloo group for every kind (and Gloo twin) whose groups are
    the same rank sets as an earlier kind's, e.g. dp and dp_cp when cp is 1, or the Gloo twins
    of a Gloo default group. A kind shares only as a whole (its partition of the ranks equals
    the earlier kind's), so every rank skips the same new_group calls and torch's count of
    them, which names local groups, stays the same on every member. Only groups that are
    Gloo alone share: an NCCL group keeps its own communicator (and stream), as Megatron's."""

    def __init__(self, enabled, partition_of):
        self._enabled = enabled
        self._gloo_default = enabled and _default_backend() == "gloo"
        self._partition_of = partition_of  # (kind, level) -> every group's members, in order
        self._number = {}  # (kind, level) -> the number of its partition
        self._partitions = {}  # partition -> its number
        self._made = {}  # (partition number, members) -> what new_group gave this rank

    def key(self, kind, level, members, backend):
        """The key of a group of (kind, level) with these members and new_group's
        ``backend``, or None when it is not shared."""
        if not self._enabled or not (backend == "gloo" or (backend is None and self._gloo_default)):
            return None
        if (kind, level) not in self._number:
            partition = tuple(tuple(m) for m in self._partition_of(kind, level))
            self._number[(kind, level)] = self._partitions.setdefault(partition, len(self._partitions))
        return self._number[(kind, level)], tuple(members)

    def made(self, key, make):
        """The group made for ``key`` before, else ``make()``'s, remembered."""
        if key is None:
            return make()
        if key not in self._made:
            self._made[key] = make()
        return self._made[key]


def _make(kind, level, members, local, options, hybrid_sizes, rank, identical):
    """One group (and its Gloo twin) of the kind, filed when this rank is a member."""
    cfgs = options.nccl_cfgs
    pg_options = _nccl_options(_PG_NAME[kind], cfgs, options.seed_nccl_defaults) if cfgs else None
    if kind == "pp" and options.pp_backend == "ucc":
        pg_options = None
    extra = {"use_local_synchronization": True} if local else {}
    backend = options.pp_backend if kind == "pp" else None
    group = identical.made(identical.key(kind, level, members, backend), lambda: create_group(
        members, timeout=options.timeout, backend=backend, pg_options=pg_options,
        group_desc=_desc(kind, level, False, hybrid_sizes), **extra))
    twin = None
    if kind in options.gloo_twins:
        twin = identical.made(identical.key(kind, level, members, "gloo"), lambda: create_group(
            members, timeout=options.timeout, backend="gloo",
            group_desc=_desc(kind, level, True, hybrid_sizes), **extra))
    if rank in members:
        _file(kind, level, group, twin, members, hybrid_sizes)


# SHARP (NCCL CollNet) applies to the first communicators made while NCCL_COLLNET_ENABLE=1:
# the dp_cp groups ("dp") or the inter-instance groups ("dp_replica", HEAD).
_SHARP_KINDS = {"dp": ("dp_cp", "intra_dp_cp"),
                "dp_replica": ("expt_dp", "intra_expt_dp", "inter_dist_opt")}


def create_layout_groups(layout, rank, options, steps=None):
    """Creates the torch.distributed groups of ``layout`` on this rank (global ``rank``) and
    files this rank's into Megatron's globals: every kind in the core's creation order
    (``options.creation`` "megatron": every rank calls new_group for every group), or only
    this rank's groups ("local", see _own_steps). ``steps`` replaces the layout's sequence
    (the seed's encoder split: ``(kind, level, index, members)``, created by every rank).
    The aliases Megatron keeps (Layout.creation_aliases()) then point at their parent's
    group. Collective over the layout's ranks; the state must be reset before."""
    hybrid_sizes = layout.hybrid_sizes()
    if steps is not None:
        steps = list(steps)
        sequence = ((k, lv, m, False) for k, lv, _i, m in steps)
        aliases = []

        def partition_of(kind, level):
            return [m for k, lv, _i, m in steps if (k, lv) == (kind, level)]
    else:
        partition_of = layout.groups
        sequence = (_own_steps(layout, rank) if options.creation == "local" else
                    ((k, lv, m, False) for k, lv, _i, m in layout.creation_order()))
        aliases = layout.creation_aliases()
    sharp_kinds = _SHARP_KINDS.get(options.sharp, ())
    phase = "before"  # of the SHARP groups
    identical = _IdenticalGroups(options.share_identical, partition_of)
    with gloo_connection_scope(options.gloo_connection), gloo_device_scope(options.gloo_device):
        for kind, level, members, local in sequence:
            if phase == "before" and kind in sharp_kinds and (options.sharp == "dp" or kind != "expt_dp"):
                if options.head:
                    os.environ["NCCL_COLLNET_ENABLE"] = "1"
                phase = "in"
            elif phase == "in" and kind not in sharp_kinds:
                _sharp_barrier(options.sharp)  # NCCL makes the SHARP groups now; then SHARP is off
                phase = "after"
            _make(kind, level, list(members), local, options, hybrid_sizes, rank, identical)
    if phase == "in":
        _sharp_barrier(options.sharp)
    v = STATE.vars
    for alias, parent in aliases:
        v[GROUP_GLOBAL[alias]] = v[GROUP_GLOBAL[parent]]
        if alias in GLOO_GLOBAL and parent in GLOO_GLOBAL:
            v[GLOO_GLOBAL[alias]] = v[GLOO_GLOBAL[parent]]
        if parent in STATE.ranks:
            STATE.ranks[alias] = STATE.ranks[parent]


def _file(kind, level, group, twin, members, hybrid_sizes):
    v = STATE.vars
    if kind == "pp":
        # As Megatron: a rank in several pipelines (the seed's encoder split) keeps a list.
        if v["_PIPELINE_MODEL_PARALLEL_GROUP"] is None:
            v["_PIPELINE_MODEL_PARALLEL_GROUP"], v["_PIPELINE_GLOBAL_RANKS"] = group, members
        elif isinstance(v["_PIPELINE_GLOBAL_RANKS"][0], list):
            v["_PIPELINE_MODEL_PARALLEL_GROUP"].append(group)
            v["_PIPELINE_GLOBAL_RANKS"].append(members)
        else:
            v["_PIPELINE_MODEL_PARALLEL_GROUP"] = [v["_PIPELINE_MODEL_PARALLEL_GROUP"], group]
            v["_PIPELINE_GLOBAL_RANKS"] = [v["_PIPELINE_GLOBAL_RANKS"], members]
        STATE.ranks.setdefault("pp", members)
    elif kind in ("hcp", "hybrid_dp_cp"):
        if kind == "hcp":
            if level == 0 or v["_HIERARCHICAL_CONTEXT_PARALLEL_GROUPS"] is None:
                v["_HIERARCHICAL_CONTEXT_PARALLEL_GROUPS"] = []
            v["_HIERARCHICAL_CONTEXT_PARALLEL_GROUPS"].append(group)
        else:
            v["_HYBRID_DP_CP_GROUPS"][hybrid_sizes[level]] = group
        per_level = STATE.ranks.setdefault(kind, {})
        per_level[level] = members
    else:
        v[GROUP_GLOBAL[kind]] = group
        if kind in RANKS_GLOBAL:
            v[RANKS_GLOBAL[kind]] = members
        STATE.ranks[kind] = members
    if twin is not None and kind in GLOO_GLOBAL:
        v[GLOO_GLOBAL[kind]] = twin


def _sharp_barrier(sharp):
    # A collective on the SHARP groups makes NCCL create them now (it creates lazily); then
    # SHARP is switched off for every later communicator.
    name = "_DATA_PARALLEL_GROUP_WITH_CP" if sharp == "dp" else "_INTER_PARTIAL_EXPERT_DATA_PARALLEL_GROUP"
    group = STATE.vars[name]
    if group is not None:
        if dist.get_backend(group) == "nccl":
            dist.barrier(group=group, device_ids=[torch.cuda.current_device()])
        else:
            dist.barrier(group=group)
    os.environ["NCCL_COLLNET_ENABLE"] = "0"


def _own_steps(layout, rank):
    """"local": this rank's own groups, made with use_local_synchronization (only members
    take part), every kind in one fixed order, aliases not created. torch names such a group
    by its ranks and the number of groups the rank made before it, which must therefore be
    the same on every member; so every rank makes exactly one new_group call per (kind,
    level) and its Gloo twin. A (kind, level) whose groups cover every rank of the layout
    once gives every rank its group. One that leaves ranks out (embd, pos_embd): a member
    makes its group with use_local_synchronization, a rank in none of its groups calls
    new_group for the kind's first group without it (torch returns at once for a
    non-member, counting the call), so every rank's count grows alike and torch's later
    new_group calls stay consistent too. A kind whose groups share a rank is made by every
    rank for each of its groups, without use_local_synchronization. Yields (kind, level,
    members, local)."""
    aliased = {alias for alias, _ in layout.creation_aliases()}
    for kind in layout.kinds():
        if kind in aliased or kind in ("dp_cp_ag", "expt_dp_ag"):
            continue
        for level in range(layout.levels(kind)):
            if layout.num_members(kind, level) == layout.world_size:
                members = layout.group_of(kind, rank, level)
                if members is not None:
                    yield kind, level, members, True
                continue
            groups = layout.groups(kind, level)
            if not groups:
                continue
            mine = [m for m in groups if rank in m]
            if sum(len(m) for m in groups) != len({r for m in groups for r in m}):
                for members in groups:  # groups that overlap: every rank makes every one
                    yield kind, level, members, False
            elif mine:
                yield kind, level, mine[0], True
            else:
                yield kind, level, groups[0], False


# ---- destroy ------------------------------------------------------------------------------

def destroy_layout_groups():
    """Megatron's destroy_model_parallel: destroys the Gloo twins this rank holds (not one that
    is also a kind's own group) and forgets every group and all state (Megatron leaves some globals, e.g. the global-rank lists,
    behind; commgrid resets them all)."""
    pg_map = dist.distributed_c10d._world.pg_map
    # A twin that is also a kind's own group (_IdenticalGroups: the twin of a Gloo group)
    # stays, as Megatron's other groups do.
    seen = {id(STATE.vars[name]) for name in GROUP_GLOBAL.values() if STATE.vars[name] is not None}
    for name in GLOO_GLOBAL.values():
        group = STATE.vars[name]
        if group is not None and id(group) not in seen and dist.is_initialized() and group in pg_map:
            seen.add(id(group))
            dist.destroy_process_group(group)
    STATE.reset()

