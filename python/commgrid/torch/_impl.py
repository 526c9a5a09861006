"""What commgrid.torch and commgrid.torch.head share: creating the torch.distributed groups
of a layout in the creation order the C++ core gives (the seed's or HEAD's), Megatron's
bookkeeping of them (the globals of commgrid._state), destroy, and the size and rank
getters that need torch.

The groups and their creation sequence come from the core (``Layout.creation_order()``,
``Layout.group_of``, ``Layout.creation_aliases()``). Computed here, because they are
Megatron's Python-side semantics that the core does not model: which groups get a Gloo
twin, which global a group lands in (the pp list of a rank in several pipelines), the
``*_WITH_GTP_REMAT`` intra-partial aliases, and the seed's deprecated encoder/decoder split
(``_encoder_steps``), whose groups are stitched from two core-backed RankGenerators exactly
as the seed's ``generator_wrapper`` stitches them.
"""

import inspect
import operator
import os
from datetime import timedelta
from functools import partial, reduce

import torch
import torch.distributed as dist

from .._state import GLOO_GLOBAL, GROUP_GLOBAL, RANKS_GLOBAL, STATE
from .. import _commgrid
from ..errors import (ConfigError, DivisibilityError, IncompatibleError, InvalidValueError,
                      OrderError, OverflowError, StateError, as_builtin)
from ..layout import Layout
from ..rank_generator import RankGenerator

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
    params = inspect.signature(dist.new_group).parameters
    return (["local"] if "use_local_synchronization" in params else []) + ["megatron"]


def create_group(ranks=None, timeout=None, backend=None, pg_options=None,
                 use_local_synchronization=False, group_desc=None):
    """Megatron-core's create_group: ``torch.distributed.new_group`` with the keywords the
    installed torch takes (``group_desc`` and ``use_local_synchronization`` only where its
    new_group has them; a None timeout is left to torch), remembering the groups this rank
    is in for update_pg_timeout."""
    params = inspect.signature(dist.new_group).parameters
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


def _megatron_type(error):
    """The built-in type Megatron-core raises for the rule a ConfigError reports: its
    RuntimeErrors are the world-size divisibility checks (dense and expert), vpp without
    pp > 1 and an order that omits an axis; every other rule is an ``assert``. Values
    Megatron does not check at all (sizes below 1, policies) stay plain ValueErrors."""
    if isinstance(error, OrderError):
        return RuntimeError
    if isinstance(error, (DivisibilityError, OverflowError)) and error.parameter in (
            "world_size", "local_world_size", "tp", "pp", "cp", "etp", "ep", "gtp_remat",
            "expert_gtp_remat"):
        return RuntimeError
    if isinstance(error, IncompatibleError):
        return RuntimeError if error.parameter == "vpp" else AssertionError
    if isinstance(error, DivisibilityError):
        return AssertionError
    return None


def _layout(world_size, **kwargs):
    """The core's Layout; a bad configuration raises its commgrid error as Megatron's type."""
    try:
        return Layout(world_size, **kwargs)
    except ConfigError as e:
        builtin = _megatron_type(e)
        if builtin is None:
            raise
        raise as_builtin(e, builtin).with_traceback(e.__traceback__) from None


def _hierarchical(ranks, sizes, level):
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
        for sub in _hierarchical(list(ranks), sizes, level):
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


class _Creator:
    """Creates groups step by step and files this rank's into Megatron's globals."""

    def __init__(self, rank, timeout, pp_backend, twins, cfgs, seed_options, hybrid_sizes, local):
        self.rank, self.timeout, self.pp_backend = rank, timeout, pp_backend
        self.twins, self.cfgs, self.seed_options = twins, cfgs, seed_options
        self.hybrid_sizes, self.local = hybrid_sizes, local

    def step(self, kind, level, members):
        members = list(members)
        options = _nccl_options(_PG_NAME[kind], self.cfgs, self.seed_options) if self.cfgs else None
        if kind == "pp" and self.pp_backend == "ucc":
            options = None
        extra = {"use_local_synchronization": True} if self.local else {}
        group = create_group(members, timeout=self.timeout,
                             backend=self.pp_backend if kind == "pp" else None, pg_options=options,
                             group_desc=_desc(kind, level, False, self.hybrid_sizes), **extra)
        twin = None
        if kind in self.twins:
            twin = create_group(members, timeout=self.timeout, backend="gloo",
                                group_desc=_desc(kind, level, True, self.hybrid_sizes), **extra)
        if self.rank in members:
            _file(kind, level, group, twin, members, self.hybrid_sizes)


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


# ---- initialize -------------------------------------------------------------------------

def initialize(compat, world_size, *, tp, pp, vpp, pp_split_rank, pp_backend, use_sharp, cp, hcp,
               ep, etp, dist_opt_instances, nccl_config_path, timeout_minutes, order, enc_tp,
               enc_pp, embedding_ranks, position_embedding_ranks, gloo, creation,
               gtp_remat=1, expert_gtp_remat=1, hybrid_context_parallel=False, rank_offset=0,
               local_world_size=None, high_priority_stream_groups=None, sharp_enabled_group=None):
    """Megatron-core's initialize_model_parallel (the seed's or HEAD's, by ``compat``):
    validates everything before any group exists, then creates them."""
    head = compat == "head"
    if head:
        os.environ.pop("NCCL_COLLNET_ENABLE", None)
        if use_sharp:
            sharp_enabled_group = sharp_enabled_group or "dp"
            if sharp_enabled_group not in ("dp", "dp_replica"):
                raise as_builtin(InvalidValueError("Invalid sharp_enabled_group",
                                                   parameter="sharp_enabled_group"), AssertionError)
            if sharp_enabled_group == "dp_replica" and dist_opt_instances <= 1:
                raise as_builtin(IncompatibleError(
                    "dp_replica group requires num_distributed_optimizer_instances > 1",
                    parameter="sharp_enabled_group"), AssertionError)
        elif sharp_enabled_group is not None:
            raise as_builtin(IncompatibleError("sharp_enabled_group is only valid when use_sharp is True",
                                               parameter="sharp_enabled_group"), AssertionError)
    if not dist.is_initialized():
        raise StateError("initialize_model_parallel: torch.distributed is not initialized; "
                         "call torch.distributed.init_process_group first")
    strategies = creation_strategies()
    if creation == "auto":
        creation = strategies[0]
    elif creation not in strategies:
        raise InvalidValueError(f"creation = {creation!r}: this torch ({torch.__version__}) "
                                f"offers {strategies}", parameter="creation")
    if pp_backend not in (None, "nccl", "ucc", "gloo"):
        raise as_builtin(InvalidValueError(f'"{pp_backend}" backend for PP communication is currently '
                                           "not supported", parameter="pipeline_model_parallel_comm_backend"),
                         AssertionError)
    enc_pp = enc_pp or 0
    if enc_tp == 0 and enc_pp > 0:
        enc_tp = tp
    if not head and (embedding_ranks is None or position_embedding_ranks is None):
        from . import default_embedding_ranks as embd_default, default_position_embedding_ranks as pos_default
        if embedding_ranks is None and pp_split_rank is not None:
            embedding_ranks = partial(embd_default, split_rank=pp_split_rank)
        if position_embedding_ranks is None and pp_split_rank is not None:
            position_embedding_ranks = partial(pos_default, split_rank=pp_split_rank)
    common = dict(tp=tp, pp=pp, cp=cp, ep=ep, etp=etp, hcp=hcp or None,
                  dist_opt_instances=dist_opt_instances, vpp=vpp, order=order,
                  embedding_ranks=embedding_ranks, position_embedding_ranks=position_embedding_ranks)
    encoder = None
    if head:
        layout = _layout(world_size, compat="head", gtp_remat=gtp_remat, expert_gtp_remat=expert_gtp_remat,
                         hybrid_context_parallel=hybrid_context_parallel, rank_offset=rank_offset,
                         local_world_size=local_world_size, **common)
    elif enc_tp > 0 and enc_pp > 0:
        layout, encoder = _encoder_layouts(world_size, enc_tp, enc_pp, common)
    else:
        if enc_tp > tp:
            raise as_builtin(IncompatibleError("We do not support encoders with more TP than the decoder.",
                                               parameter="encoder_tensor_model_parallel_size"), AssertionError)
        layout = _layout(world_size, **common)
    if STATE.initialized:
        raise StateError("data parallel group is already initialized "
                         "(destroy_model_parallel first)")
    cfgs = {}
    if nccl_config_path is not None:
        try:
            import yaml
        except ImportError:
            raise RuntimeError("Cannot import `yaml`. Setting custom nccl communicator configs "
                               "requires the yaml package.") from None
        with open(nccl_config_path) as stream:
            cfgs = yaml.safe_load(stream) or {}
    for pg_name in high_priority_stream_groups or []:
        overwrite_nccl_comm_cfgs(cfgs, pg_name, ("is_high_priority_stream", True))

    rank = dist.get_rank()
    twins = set()
    if gloo and not (head and gtp_remat > 1):
        twins.update(_DENSE_TWINS)
        if not (head and expert_gtp_remat > 1):
            twins.update(_EXPERT_TWINS)
    STATE.reset()
    v = STATE.vars
    creator = _Creator(rank, timedelta(minutes=timeout_minutes), pp_backend, twins, cfgs,
                       not head, layout.hybrid_sizes(), creation == "local")
    # SHARP (NCCL CollNet) applies to the first communicators made while
    # NCCL_COLLNET_ENABLE=1: the dp_cp groups ("dp") or the inter-instance groups
    # ("dp_replica", HEAD); after them a barrier makes NCCL create them, as Megatron does.
    sharp = (sharp_enabled_group if head else "dp") if use_sharp else None
    sharp_kinds = {"dp": ("dp_cp", "intra_dp_cp"),
                   "dp_replica": ("expt_dp", "intra_expt_dp", "inter_dist_opt")}.get(sharp, ())
    try:
        if encoder is not None:
            steps = _encoder_steps(encoder)
        elif creation == "local":
            steps = _own_steps(layout, rank)
        else:
            steps = layout.creation_order()
        aliases = layout.creation_aliases() if encoder is None else []
        phase = "before"  # of the SHARP groups
        for kind, level, _index, members in steps:
            if phase == "before" and kind in sharp_kinds and (sharp == "dp" or kind != "expt_dp"):
                if head:
                    os.environ["NCCL_COLLNET_ENABLE"] = "1"
                phase = "in"
            elif phase == "in" and kind not in sharp_kinds:
                _sharp_barrier(sharp)
                phase = "after"
            creator.step(kind, level, members)
        if phase == "in":
            _sharp_barrier(sharp)
        for alias, parent in aliases:
            v[GROUP_GLOBAL[alias]] = v[GROUP_GLOBAL[parent]]
            if alias in GLOO_GLOBAL and parent in GLOO_GLOBAL:
                v[GLOO_GLOBAL[alias]] = v[GLOO_GLOBAL[parent]]
            if parent in STATE.ranks:
                STATE.ranks[alias] = STATE.ranks[parent]
        if encoder is not None and dist_opt_instances == 1:
            v["_INTRA_PARTIAL_DATA_PARALLEL_GROUP_WITH_CP"] = v["_DATA_PARALLEL_GROUP_WITH_CP"]
            v["_INTRA_PARTIAL_DATA_PARALLEL_GROUP_WITH_CP_GLOO"] = v["_DATA_PARALLEL_GROUP_WITH_CP_GLOO"]
            v["_INTRA_PARTIAL_EXPERT_DATA_PARALLEL_GROUP"] = v["_EXPERT_DATA_PARALLEL_GROUP"]
            v["_INTRA_PARTIAL_EXPERT_DATA_PARALLEL_GROUP_GLOO"] = v["_EXPERT_DATA_PARALLEL_GROUP_GLOO"]
        if head:
            v["_INTRA_PARTIAL_DATA_PARALLEL_GROUP_WITH_CP_WITH_GTP_REMAT"] = (
                v["_DATA_PARALLEL_GROUP_WITH_CP_WITH_GTP_REMAT"] if gtp_remat > 1
                else v["_INTRA_PARTIAL_DATA_PARALLEL_GROUP_WITH_CP"])
            v["_INTRA_PARTIAL_EXPERT_DATA_PARALLEL_GROUP_WITH_GTP_REMAT"] = (
                v["_EXPERT_DATA_PARALLEL_GROUP_WITH_GTP_REMAT"] if expert_gtp_remat > 1
                else v["_INTRA_PARTIAL_EXPERT_DATA_PARALLEL_GROUP"])
    except BaseException:
        STATE.reset()  # nothing half-made stays behind
        raise
    if vpp is not None:
        v["_VIRTUAL_PIPELINE_MODEL_PARALLEL_RANK"] = 0
        v["_VIRTUAL_PIPELINE_MODEL_PARALLEL_WORLD_SIZE"] = vpp
    if not head:
        v["_PIPELINE_MODEL_PARALLEL_SPLIT_RANK"] = pp_split_rank
        v["_PIPELINE_MODEL_PARALLEL_DECODER_START"] = enc_pp if enc_pp > 0 else None
    v["_GLOBAL_MEMORY_BUFFER"] = GlobalMemoryBuffer()
    STATE.layout, STATE.rank, STATE.compat, STATE.creation = layout, rank, compat, creation


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
    # "local": only this rank's groups, every kind in one fixed order (so two members never
    # wait on each other), aliases not created.
    aliased = {alias for alias, _ in layout.creation_aliases()}
    for kind in layout.kinds():
        if kind in aliased or kind in ("dp_cp_ag", "expt_dp_ag"):
            continue
        for level in range(layout.levels(kind)):
            members = layout.group_of(kind, rank, level)
            if members is not None:
                yield kind, level, None, members


# ---- the seed's encoder/decoder split -------------------------------------------------

class _Encoder:
    """The seed's encoder/decoder split: the generators of the encoder's dense grid on ranks
    [0, E) and of the decoder's dense and expert grids on [E, W), the sizes, the policies."""

    def __init__(self, **fields):
        self.__dict__.update(fields)


def _encoder_layouts(world_size, enc_tp, enc_pp, common):
    tp, pp, cp = common["tp"], common["pp"], common["cp"]
    if enc_tp > tp:
        raise as_builtin(IncompatibleError("We do not support encoders with more TP than the decoder.",
                                           parameter="encoder_tensor_model_parallel_size"), AssertionError)
    total = enc_tp * enc_pp * cp + tp * pp * cp
    if world_size % total:
        raise as_builtin(DivisibilityError(f"world_size ({world_size}) is not divisible by {total}",
                                           parameter="world_size"), RuntimeError)
    if common["hcp"]:
        raise InvalidValueError("hierarchical_context_parallel_sizes with an encoder split "
                                "(encoder_pipeline_model_parallel_size > 0) is not supported by "
                                "commgrid.torch", parameter="hcp")
    dp = world_size // total
    enc_world = enc_tp * enc_pp * cp * dp
    # Each part is a layout of its own: the core validates the decoder's rules on its ranks.
    decoder = _layout(world_size - enc_world, **common)
    _layout(enc_world, tp=enc_tp, pp=enc_pp, cp=cp, order=common["order"])
    etp = common["etp"] or tp
    edp = (world_size - enc_world) // (etp * common["ep"] * pp)
    n = common["dist_opt_instances"]
    if n > 1 and edp != dp:
        # The seed splits every expert-dp group into [edp / n, n], the encoder's (its dense
        # dp groups, of dp ranks) too; Megatron fails there (einops), commgrid refuses first.
        raise as_builtin(IncompatibleError(
            f"num_distributed_optimizer_instances = {n} with an encoder split needs the expert "
            f"dp size ({edp}) to equal the dp size ({dp}): the seed splits the encoder's dp "
            "groups like the expert dp groups", parameter="dist_opt_instances"), AssertionError)
    order = common["order"]
    return decoder, _Encoder(
        enc=RankGenerator(enc_tp, 1, dp, enc_pp, cp, order, 0),
        dec=RankGenerator(tp, 1, dp, pp, cp, order, enc_world),
        expert=RankGenerator(etp, common["ep"], edp, pp, 1, order, enc_world),
        n=n, dp=dp, cp=cp, edp=edp, embd=common["embedding_ranks"],
        pos=common["position_embedding_ranks"])


def _stitched(gens, token, expert=False):
    # The seed's generator_wrapper: pp pairs one encoder group with several decoder groups,
    # tp-pp concatenates the encoder's and the decoder's groups one to one, every other
    # token lists the encoder's groups, then the decoder's.
    d = (gens.expert if expert else gens.dec).get_ranks(token)
    e = gens.enc.get_ranks(token)
    if token == "pp":
        rep, remain = divmod(len(d), len(e))
        e_ind, e_rep = 0, rep + int(0 < remain)
        out = []
        for y in d:
            out.append(e[e_ind] + y)
            e_rep -= 1
            if e_rep == 0:
                e_ind += 1
                e_rep = rep + int(e_ind < remain)
        return out
    if token == "tp-pp":
        if len(e) != len(d):
            raise as_builtin(IncompatibleError("the encoder's and the decoder's tp-pp groups differ in "
                                               "number", parameter="encoder_tensor_model_parallel_size"),
                             AssertionError)
        return [x + y for x, y in zip(e, d)]
    return e + d


def _encoder_steps(gens):
    from . import default_embedding_ranks, default_position_embedding_ranks
    n = gens.n
    for i, g in enumerate(_stitched(gens, "dp")):
        yield "dp", 0, i, g
    intra = gens.dp * gens.cp // n
    for i, g in enumerate(_stitched(gens, "dp-cp")):
        yield "dp_cp", 0, i, g
        if n > 1:
            for k in range(n):
                yield "intra_dp_cp", 0, i * n + k, g[k * intra:(k + 1) * intra]
    for i, g in enumerate(_stitched(gens, "cp")):
        yield "cp", 0, i, g
    for token, kind in (("tp-pp", "mp"), ("tp", "tp")):
        for i, g in enumerate(_stitched(gens, token)):
            yield kind, 0, i, g
    embd = gens.embd or default_embedding_ranks
    pos = gens.pos or default_position_embedding_ranks
    for i, g in enumerate(_stitched(gens, "pp")):
        yield "pp", 0, i, g
        yield "embd", 0, i, list(embd(g))
        yield "pos_embd", 0, i, list(pos(g))
    for token, kind in (("tp-dp-cp", "tp_dp_cp"), ("tp-dp", "tp_dp"), ("tp-cp", "tp_cp")):
        for i, g in enumerate(_stitched(gens, token)):
            yield kind, 0, i, g
    for token, kind in (("ep", "ep"), ("tp", "expt_tp"), ("tp-ep", "tp_ep"), ("tp-ep-pp", "tp_ep_pp")):
        for i, g in enumerate(_stitched(gens, token, expert=True)):
            yield kind, 0, i, g
    intra_e = gens.edp // n
    for i, g in enumerate(_stitched(gens, "dp", expert=True)):
        yield "expt_dp", 0, i, g
        if n > 1:
            for level, kind in enumerate(("intra_expt_dp", "inter_dist_opt")):
                for sub in _hierarchical(g, [intra_e, n], level):
                    yield kind, 0, None, sub
    acc, count = [], 0
    for g in _stitched(gens, "tp-ep-pp", expert=True):
        count += 1
        acc.extend(g)
        if count % intra_e == 0:
            yield "intra_dist_opt", 0, None, acc
            acc = []


# ---- all-gather groups (HEAD) -------------------------------------------------------------

def create_all_gather_groups(for_expert_parallelism=False, timeout=None, nccl_comm_cfgs=None):
    """Megatron-core HEAD's create_all_gather_groups: second communicators over the dp_cp
    groups (and, with ``for_expert_parallelism`` and ep > 1, the expert dp groups) for
    all-gather / reduce-scatter overlap; returns this rank's two (the second None when not
    created). Collective. As HEAD, they are laid out with the default order and no rank
    offset from the sizes of this rank's groups, and kept nowhere but in the result."""
    if not STATE.initialized:
        raise StateError("create_all_gather_groups() requires parallel state to be initialized. "
                         "Call initialize_model_parallel() first.")
    c = dict(STATE.layout.config)
    c.pop("dp"), c.pop("expert_dp")
    c.update(compat="head", all_gather_groups=True, hcp=c["hcp"] or None)
    layout = _layout(c.pop("world_size"), **c)
    kinds = ["dp_cp_ag"] + (["expt_dp_ag"] if for_expert_parallelism and layout.has_kind("expt_dp_ag") else [])
    rank = dist.get_rank()
    mine = {"dp_cp_ag": None, "expt_dp_ag": None}
    cfgs = nccl_comm_cfgs or {}
    for kind, level, _index, members in layout.creation_order(kinds):
        group = create_group(members, timeout=timeout,
                             pg_options=_nccl_options(_PG_NAME[kind], cfgs, False) if cfgs else None,
                             group_desc=_DESC[kind])
        if rank in members:
            mine[kind] = group
    return mine["dp_cp_ag"], mine["expt_dp_ag"]


# ---- destroy ------------------------------------------------------------------------------

def destroy():
    """Megatron's destroy_model_parallel: destroys the Gloo twins this rank holds and forgets
    every group and all state (Megatron leaves some globals, e.g. the global-rank lists,
    behind; commgrid resets them all)."""
    c10d = dist.distributed_c10d
    # torch >= 2.0 keeps its group map in _world, 1.13 in a module global.
    world = getattr(c10d, "_world", None)
    pg_map = world.pg_map if world is not None else getattr(c10d, "_pg_map", {})
    seen = set()
    for name in GLOO_GLOBAL.values():
        group = STATE.vars[name]
        if group is not None and id(group) not in seen and dist.is_initialized() and group in pg_map:
            seen.add(id(group))
            dist.destroy_process_group(group)
    STATE.reset()


# ---- sizes and ranks (Megatron's set_* overrides win) -----------------------------------------

def torch_ready():
    return dist.is_available() and dist.is_initialized()


def size_of(group):
    return dist.get_world_size(group=group)


def rank_in(group):
    return dist.get_rank(group=group)


def update_pg_timeout(timeout, pg=None):
    """Megatron-core HEAD's update_pg_timeout: sets the timeout of ``pg`` (None: every group
    this rank created through commgrid and the default group) where torch can
    (``distributed_c10d._set_pg_timeout``, torch >= 2.2; older torch: nothing to do)."""
    c10d = dist.distributed_c10d
    if not hasattr(c10d, "_set_pg_timeout"):
        return
    dist.barrier(pg)
    for group in (STATE.vars["_global_process_group_list"] or [None]) if pg is None else [pg]:
        c10d._set_pg_timeout(timeout, group)


class GlobalMemoryBuffer:
    """Megatron-core's GlobalMemoryBuffer: one reusable buffer per (name, dtype), grown when a
    request needs more; ``get_tensor`` returns a view of its first elements in the asked
    shape. On the current CUDA device when there is one, else on the CPU. Callers must not
    use two tensors of the same name at once."""

    def __init__(self):
        self.buffer = {}

    def get_tensor(self, tensor_shape, dtype, name, mem_alloc_context=None):
        needed = reduce(operator.mul, tensor_shape, 1)
        key = (name, dtype)
        if key not in self.buffer or self.buffer[key].numel() < needed:
            device = torch.cuda.current_device() if torch.cuda.is_available() else "cpu"
            if mem_alloc_context is None:
                self.buffer[key] = torch.empty(needed, dtype=dtype, device=device, requires_grad=False)
            else:
                with mem_alloc_context():
                    self.buffer[key] = torch.empty(needed, dtype=dtype, device=device,
                                                   requires_grad=False)
        return self.buffer[key][0:needed].view(*tensor_shape)


# ---- Megatron's module globals as module attributes ---------------------------------------

def expose_globals(module_name, names):
    """Makes Megatron's globals ``names`` attributes of the module: reading one reads the
    state, assigning one assigns the state (the getters follow), as with Megatron's module.
    Other attributes behave as usual."""
    import sys
    import types

    names = frozenset(names)

    class ParallelStateModule(types.ModuleType):
        def __getattr__(self, name):
            if name in names:
                return STATE.vars[name]
            raise AttributeError(f"module {module_name!r} has no attribute {name!r}")

        def __setattr__(self, name, value):
            if name in names:
                STATE.vars[name] = value
            else:
                super().__setattr__(name, value)

        def __delattr__(self, name):
            if name in names:
                STATE.vars[name] = None
            else:
                super().__delattr__(name)

        def __dir__(self):
            return sorted(set(super().__dir__()) | names)

    sys.modules[module_name].__class__ = ParallelStateModule
