"""Megatron-core's initialize_model_parallel (the seed's or HEAD's) over commgrid's core:
every argument is validated, and the whole configuration by the core, before any group
exists; then create_layout_groups makes them. Also HEAD's create_all_gather_groups."""

import os
from datetime import timedelta
from functools import partial

import torch.distributed as dist

from .._state import STATE
from ..errors import IncompatibleError, InvalidValueError, StateError, as_builtin
from ._config import make_layout
from ._create import (GroupOptions, _DENSE_TWINS, _DESC, _EXPERT_TWINS, _PG_NAME, _nccl_options,
                      create_group, create_layout_groups, creation_strategies,
                      overwrite_nccl_comm_cfgs)
from ._encoder import encoder_layouts, encoder_steps
from ._gloo import resolve_gloo_connection, resolve_gloo_device
from ._policies import default_embedding_ranks_seed, default_position_embedding_ranks_seed
from ._runtime import GlobalMemoryBuffer


def _check_sharp(args):
    """HEAD's SHARP arguments; returns the SHARP group kind (None, "dp", "dp_replica")."""
    if not args.head:
        return "dp" if args.use_sharp else None
    group = args.sharp_enabled_group
    if not args.use_sharp:
        if group is not None:
            raise as_builtin(IncompatibleError("sharp_enabled_group is only valid when use_sharp is True",
                                               parameter="sharp_enabled_group"), AssertionError)
        return None
    group = group or "dp"
    if group not in ("dp", "dp_replica"):
        raise as_builtin(InvalidValueError("Invalid sharp_enabled_group",
                                           parameter="sharp_enabled_group"), AssertionError)
    if group == "dp_replica" and args.num_distributed_optimizer_instances <= 1:
        raise as_builtin(IncompatibleError(
            "dp_replica group requires num_distributed_optimizer_instances > 1",
            parameter="sharp_enabled_group"), AssertionError)
    return group


def _creation(args):
    strategies = creation_strategies()
    if args.creation == "auto":
        return strategies[0]
    if args.creation not in strategies:
        raise InvalidValueError(f"creation = {args.creation!r}: this torch offers {strategies}",
                                parameter="creation")
    return args.creation


def _layouts(args, world_size):
    """(the core's Layout, the seed's encoder split or None), validated; the seed's split
    rank selects its default embedding policies."""
    enc_tp = args.encoder_tensor_model_parallel_size
    enc_pp = args.encoder_pipeline_model_parallel_size or 0
    if enc_tp == 0 and enc_pp > 0:
        enc_tp = args.tensor_model_parallel_size
    common = args.layout_kwargs()
    split = args.pipeline_model_parallel_split_rank
    if not args.head and split is not None:
        if common["embedding_ranks"] is None:
            common["embedding_ranks"] = partial(default_embedding_ranks_seed, split_rank=split)
        if common["position_embedding_ranks"] is None:
            common["position_embedding_ranks"] = partial(default_position_embedding_ranks_seed,
                                                         split_rank=split)
    if args.head:
        return make_layout(world_size, **common), None
    if enc_tp > 0 and enc_pp > 0:
        return encoder_layouts(world_size, enc_tp, enc_pp, common)
    if enc_tp > args.tensor_model_parallel_size:
        raise as_builtin(IncompatibleError("We do not support encoders with more TP than the decoder.",
                                           parameter="encoder_tensor_model_parallel_size"), AssertionError)
    return make_layout(world_size, **common), None


def _nccl_configs(args):
    cfgs = {}
    if args.nccl_communicator_config_path is not None:
        try:
            import yaml
        except ImportError:
            raise RuntimeError("Cannot import `yaml`. Setting custom nccl communicator configs "
                               "requires the yaml package.") from None
        with open(args.nccl_communicator_config_path) as stream:
            cfgs = yaml.safe_load(stream) or {}
    for pg_name in args.high_priority_stream_groups or []:
        overwrite_nccl_comm_cfgs(cfgs, pg_name, ("is_high_priority_stream", True))
    return cfgs


def _twins(args):
    """The kinds Megatron gives a Gloo twin: none under HEAD's gtp_remat > 1, no expert ones
    under its expert_gtp_remat > 1."""
    if not args.create_gloo_process_groups or (args.head and args.gtp_remat_size > 1):
        return frozenset()
    if args.head and args.expert_gtp_remat_size > 1:
        return frozenset(_DENSE_TWINS)
    return frozenset(_DENSE_TWINS + _EXPERT_TWINS)


def initialize(args):
    """Megatron-core's initialize_model_parallel for ``args`` (an InitArgs): validates
    everything before any group exists, then creates them and fills the state."""
    if args.head:
        os.environ.pop("NCCL_COLLNET_ENABLE", None)
    sharp = _check_sharp(args)
    if not dist.is_initialized():
        raise StateError("initialize_model_parallel: torch.distributed is not initialized; "
                         "call torch.distributed.init_process_group first")
    creation = _creation(args)
    gloo_connection = resolve_gloo_connection(args.gloo_connection)
    gloo_device = resolve_gloo_device(args.gloo_device, gloo_connection)
    share = args.share_identical_groups
    if share == "auto":
        share = creation == "local"  # "megatron" makes Megatron's calls, one by one
    if not isinstance(share, bool):
        raise InvalidValueError(f"share_identical_groups = {share!r}: expected \"auto\", True "
                                "or False", parameter="share_identical_groups")
    if args.pipeline_model_parallel_comm_backend not in (None, "nccl", "ucc", "gloo"):
        raise as_builtin(InvalidValueError(
            f'"{args.pipeline_model_parallel_comm_backend}" backend for PP communication is '
            "currently not supported", parameter="pipeline_model_parallel_comm_backend"), AssertionError)
    world_size = args.local_world_size if args.head and args.local_world_size is not None \
        else dist.get_world_size()
    layout, encoder = _layouts(args, world_size)
    if STATE.initialized:
        raise StateError("data parallel group is already initialized (destroy_model_parallel first)")
    options = GroupOptions(timeout=timedelta(minutes=args.distributed_timeout_minutes),
                           pp_backend=args.pipeline_model_parallel_comm_backend,
                           gloo_twins=_twins(args), nccl_cfgs=_nccl_configs(args),
                           seed_nccl_defaults=not args.head, creation=creation, sharp=sharp,
                           head=args.head, gloo_connection=gloo_connection,
                           gloo_device=gloo_device, share_identical=share)
    rank = dist.get_rank()
    STATE.reset()
    try:
        create_layout_groups(layout, rank, options,
                             steps=encoder_steps(encoder) if encoder is not None else None)
        _fill_aliases(args, encoder)
    except BaseException:
        STATE.reset()  # nothing half-made stays behind
        raise
    v = STATE.vars
    if args.virtual_pipeline_model_parallel_size is not None:
        v["_VIRTUAL_PIPELINE_MODEL_PARALLEL_RANK"] = 0
        v["_VIRTUAL_PIPELINE_MODEL_PARALLEL_WORLD_SIZE"] = args.virtual_pipeline_model_parallel_size
    if not args.head:
        enc_pp = args.encoder_pipeline_model_parallel_size or 0
        v["_PIPELINE_MODEL_PARALLEL_SPLIT_RANK"] = args.pipeline_model_parallel_split_rank
        v["_PIPELINE_MODEL_PARALLEL_DECODER_START"] = enc_pp if enc_pp > 0 else None
    v["_GLOBAL_MEMORY_BUFFER"] = GlobalMemoryBuffer()
    STATE.layout, STATE.rank, STATE.compat, STATE.creation = layout, rank, args.compat, creation


def _fill_aliases(args, encoder):
    """The globals Megatron points at other groups beyond the core's aliases: the seed's
    encoder split with one dist-opt instance, HEAD's two intra-partial gtp_remat ones."""
    v = STATE.vars
    if encoder is not None and args.num_distributed_optimizer_instances == 1:
        v["_INTRA_PARTIAL_DATA_PARALLEL_GROUP_WITH_CP"] = v["_DATA_PARALLEL_GROUP_WITH_CP"]
        v["_INTRA_PARTIAL_DATA_PARALLEL_GROUP_WITH_CP_GLOO"] = v["_DATA_PARALLEL_GROUP_WITH_CP_GLOO"]
        v["_INTRA_PARTIAL_EXPERT_DATA_PARALLEL_GROUP"] = v["_EXPERT_DATA_PARALLEL_GROUP"]
        v["_INTRA_PARTIAL_EXPERT_DATA_PARALLEL_GROUP_GLOO"] = v["_EXPERT_DATA_PARALLEL_GROUP_GLOO"]
    if args.head:
        v["_INTRA_PARTIAL_DATA_PARALLEL_GROUP_WITH_CP_WITH_GTP_REMAT"] = (
            v["_DATA_PARALLEL_GROUP_WITH_CP_WITH_GTP_REMAT"] if args.gtp_remat_size > 1
            else v["_INTRA_PARTIAL_DATA_PARALLEL_GROUP_WITH_CP"])
        v["_INTRA_PARTIAL_EXPERT_DATA_PARALLEL_GROUP_WITH_GTP_REMAT"] = (
            v["_EXPERT_DATA_PARALLEL_GROUP_WITH_GTP_REMAT"] if args.expert_gtp_remat_size > 1
            else v["_INTRA_PARTIAL_EXPERT_DATA_PARALLEL_GROUP"])


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
    layout = make_layout(c.pop("world_size"), **c)
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

