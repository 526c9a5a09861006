"""torch.distributed groups of a commgrid layout, and Megatron-core's parallel_state getters.

``initialize_model_parallel(...)`` takes Megatron-core's keyword arguments, validates the
whole configuration first (commgrid's errors, before any group exists), then creates this
rank's group of every kind on the already-initialized default process group (Gloo or
NCCL). The getters below have Megatron's names and behaviour; docs/python.md lists them.
"""

import inspect
from datetime import timedelta

import torch
import torch.distributed as dist

from ._state import STATE
from .errors import InvalidValueError, StateError
from .layout import Layout
from .rank_generator import RankGenerator, generate_masked_orthogonal_rank_groups  # noqa: F401

__all__ = ["initialize_model_parallel", "destroy_model_parallel", "creation_strategies"]

# Kinds with a Gloo twin in Megatron (create_gloo_process_groups=True).
_TWINNED = ("dp", "dp_cp", "intra_dp_cp", "expt_dp", "intra_expt_dp")


def creation_strategies():
    """The creation strategies this torch offers: "local" (new_group with
    use_local_synchronization: only members take part) when new_group has it, and
    "megatron" (every rank calls new_group for every group, in Megatron's order)."""
    params = inspect.signature(dist.new_group).parameters
    return (["local"] if "use_local_synchronization" in params else []) + ["megatron"]


def _unsupported(name, value, default):
    if value != default:
        raise InvalidValueError(f"{name} = {value!r} is not supported by commgrid.torch "
                                f"(only the default {default!r})")


def initialize_model_parallel(
    tensor_model_parallel_size=1,
    pipeline_model_parallel_size=1,
    virtual_pipeline_model_parallel_size=None,
    pipeline_model_parallel_split_rank=None,
    pipeline_model_parallel_comm_backend=None,
    use_sharp=False,
    context_parallel_size=1,
    hierarchical_context_parallel_sizes=None,
    expert_model_parallel_size=1,
    num_distributed_optimizer_instances=1,
    expert_tensor_parallel_size=None,
    nccl_communicator_config_path=None,
    distributed_timeout_minutes=30,
    order="tp-cp-ep-dp-pp",
    encoder_tensor_model_parallel_size=0,
    encoder_pipeline_model_parallel_size=0,
    get_embedding_ranks=None,
    get_position_embedding_ranks=None,
    create_gloo_process_groups=True,
    *,
    creation="auto",
):
    """Creates this rank's torch.distributed group of every kind (Megatron-core's
    initialize_model_parallel). Collective: every rank of the default group calls it
    with the same arguments. ``creation``: "auto" (the cheapest this torch offers),
    "local" or "megatron" (see creation_strategies())."""
    if not dist.is_initialized():
        raise StateError("initialize_model_parallel: torch.distributed is not initialized; "
                         "call torch.distributed.init_process_group first")
    if STATE.initialized:
        raise StateError("initialize_model_parallel: parallel state is already initialized; "
                         "destroy it first (destroy_model_parallel)")
    _unsupported("pipeline_model_parallel_split_rank", pipeline_model_parallel_split_rank, None)
    _unsupported("use_sharp", use_sharp, False)
    _unsupported("nccl_communicator_config_path", nccl_communicator_config_path, None)
    _unsupported("encoder_tensor_model_parallel_size", encoder_tensor_model_parallel_size, 0)
    _unsupported("encoder_pipeline_model_parallel_size", encoder_pipeline_model_parallel_size or 0, 0)
    strategies = creation_strategies()
    if creation == "auto":
        creation = strategies[0]
    elif creation not in strategies:
        raise InvalidValueError(f"creation = {creation!r}: this torch ({torch.__version__}) "
                                f"offers {strategies}")

    # Every rule is checked here, before any group exists (Megatron checks some late).
    layout = Layout(
        dist.get_world_size(), tp=tensor_model_parallel_size, pp=pipeline_model_parallel_size,
        cp=context_parallel_size, ep=expert_model_parallel_size,
        etp=expert_tensor_parallel_size, hcp=hierarchical_context_parallel_sizes or None,
        dist_opt_instances=num_distributed_optimizer_instances,
        vpp=virtual_pipeline_model_parallel_size, order=order,
        embedding_ranks=get_embedding_ranks, position_embedding_ranks=get_position_embedding_ranks)

    rank = dist.get_rank()
    timeout = timedelta(minutes=distributed_timeout_minutes)
    STATE.reset()
    try:
        if creation == "local":
            _create_local(layout, rank, timeout, pipeline_model_parallel_comm_backend,
                          create_gloo_process_groups)
        else:
            _create_megatron(layout, rank, timeout, pipeline_model_parallel_comm_backend,
                             create_gloo_process_groups)
    except BaseException:
        STATE.reset()
        raise
    STATE.layout = layout
    STATE.rank = rank
    STATE.creation = creation
    for kind in layout.kinds():
        STATE.ranks[kind] = layout.group_of(kind, rank)
    if virtual_pipeline_model_parallel_size is not None:
        STATE.virtual_rank = 0
        STATE.virtual_size = virtual_pipeline_model_parallel_size


def _new_group(ranks, timeout, backend=None, **extra):
    STATE.creation_calls += 1
    return dist.new_group(ranks=ranks, timeout=timeout, backend=backend, **extra)


def _create_local(layout, rank, timeout, pp_backend, gloo_twins):
    # Only a group's members create it; torch names such groups by their ranks, so every
    # rank walks the kinds in the same order and no rank waits for a non-member.
    n = layout.config["dist_opt_instances"]
    aliases = {"intra_dp_cp": "dp_cp", "intra_expt_dp": "expt_dp"} if n == 1 else {}
    for kind in layout.kinds():
        if kind in aliases:
            STATE.groups[kind] = STATE.groups.get(aliases[kind])
            if kind in _TWINNED and gloo_twins:
                STATE.gloo_groups[kind] = STATE.gloo_groups.get(aliases[kind])
            continue
        per_level = []
        for level in range(layout.levels(kind)):
            members = layout.group_of(kind, rank, level)
            if members is None:
                per_level.append(None)
                continue
            backend = pp_backend if kind == "pp" else None
            per_level.append(_new_group(members, timeout, backend, use_local_synchronization=True))
            if kind in _TWINNED and gloo_twins:
                STATE.gloo_groups[kind] = _new_group(members, timeout, "gloo",
                                                     use_local_synchronization=True)
        STATE.groups[kind] = per_level if kind == "hcp" else per_level[0]


def _create_megatron(layout, rank, timeout, pp_backend, gloo_twins):
    # Every rank calls new_group for every group of every kind, in the order of
    # Megatron-core's initialize_model_parallel, so that old torch versions (whose
    # new_group numbers groups by call count) agree on every group.
    mine = {}
    for kind in layout.kinds():
        mine[kind] = [layout.group_ref(kind, rank, lv) for lv in range(layout.levels(kind))]
        mine[kind] = [None if r is None else r.index for r in mine[kind]]

    def create(kind, index, ranks, level=0, backend=None, twin=False):
        group = _new_group(ranks, timeout, backend)
        twin_group = _new_group(ranks, timeout, "gloo") if twin and gloo_twins else None
        if mine[kind][level] == index:
            if kind == "hcp":
                STATE.groups.setdefault("hcp", [None] * layout.levels("hcp"))[level] = group
            else:
                STATE.groups[kind] = group
            if twin_group is not None:
                STATE.gloo_groups[kind] = twin_group

    n = layout.config["dist_opt_instances"]
    cp = layout.config["cp"]
    hcp = layout.config["hcp"]

    for j, g in enumerate(layout.groups("dp")):
        create("dp", j, g, twin=True)
    intra = layout.groups("intra_dp_cp")
    for j, g in enumerate(layout.groups("dp_cp")):
        create("dp_cp", j, g, twin=True)
        if n > 1:
            for i in range(j * n, (j + 1) * n):
                create("intra_dp_cp", i, intra[i], twin=True)
    if n == 1:
        STATE.groups["intra_dp_cp"] = STATE.groups.get("dp_cp")
        if gloo_twins:
            STATE.gloo_groups["intra_dp_cp"] = STATE.gloo_groups.get("dp_cp")
    hcp_groups = layout.groups("hcp") if hcp else []
    for j, g in enumerate(layout.groups("cp")):
        create("cp", j, g)
        for level, size in enumerate(hcp):
            per = cp // size
            for i in range(j * per, (j + 1) * per):
                create("hcp", i, hcp_groups[level][i], level=level)
    for kind in ("mp", "tp"):
        for j, g in enumerate(layout.groups(kind)):
            create(kind, j, g)
    embd, pos_embd = layout.groups("embd"), layout.groups("pos_embd")
    for j, g in enumerate(layout.groups("pp")):
        create("pp", j, g, backend=pp_backend)
        create("embd", j, embd[j])
        create("pos_embd", j, pos_embd[j])
    for kind in ("tp_dp_cp", "tp_dp", "tp_cp", "ep", "expt_tp", "tp_ep", "tp_ep_pp"):
        for j, g in enumerate(layout.groups(kind)):
            create(kind, j, g)
    intra_e = layout.groups("intra_expt_dp")
    inter = layout.groups("inter_dist_opt") if n > 1 else []
    s0 = layout.expert_dp // n
    for j, g in enumerate(layout.groups("expt_dp")):
        create("expt_dp", j, g, twin=True)
        if n > 1:
            for i in range(j * n, (j + 1) * n):
                create("intra_expt_dp", i, intra_e[i], twin=True)
            for i in range(j * s0, (j + 1) * s0):
                # Megatron makes Gloo twins of the inter groups too, and never uses them.
                group = _new_group(inter[i], timeout)
                if gloo_twins:
                    _new_group(inter[i], timeout, "gloo")
                if mine["inter_dist_opt"][0] == i:
                    STATE.groups["inter_dist_opt"] = group
    if n == 1:
        STATE.groups["intra_expt_dp"] = STATE.groups.get("expt_dp")
        if gloo_twins:
            STATE.gloo_groups["intra_expt_dp"] = STATE.gloo_groups.get("expt_dp")
    for j, g in enumerate(layout.groups("intra_dist_opt")):
        create("intra_dist_opt", j, g)


def destroy_model_parallel():
    """Forgets every group and all state (unlike Megatron, nothing of the old layout stays
    behind). As Megatron, destroys the Gloo twins; the other groups stay valid for
    collections that still hold them."""
    c10d = dist.distributed_c10d
    # torch >= 2.0 keeps its group map in _world, 1.13 in a module global.
    pg_map = c10d._world.pg_map if hasattr(c10d, "_world") else getattr(c10d, "_pg_map", {})
    for group in {id(g): g for g in STATE.gloo_groups.values() if g is not None}.values():
        if dist.is_initialized() and group in pg_map:
            dist.destroy_process_group(group)
    STATE.reset()


def default_embedding_ranks(pp_ranks, split_rank=None):
    """Megatron's default embedding policy: the first and last stage (one stage: itself).
    commgrid.torch rejects the deprecated split rank, so ``split_rank`` must be None."""
    if split_rank is not None:
        raise InvalidValueError("split_rank (deprecated in Megatron-core) is not supported")
    return [pp_ranks[0]] if len(pp_ranks) == 1 else [pp_ranks[0], pp_ranks[-1]]


def default_position_embedding_ranks(pp_ranks, split_rank=None):
    """Megatron's default position-embedding policy: the first stage."""
    if split_rank is not None:
        raise InvalidValueError("split_rank (deprecated in Megatron-core) is not supported")
    return [pp_ranks[0]]


# ---- state ---------------------------------------------------------------------------

def is_initialized():
    """Whether initialize_model_parallel ran (and destroy_model_parallel did not since)."""
    return STATE.initialized


def is_unitialized():
    """Deprecated in Megatron: ``not is_initialized()``."""
    return not STATE.initialized


def model_parallel_is_initialized():
    """Whether the tp, pp and dp groups exist."""
    return STATE.initialized


def _group(kind, check_initialized, message):
    if check_initialized and STATE.group(kind) is None:
        raise StateError(message)
    return STATE.group(kind)


def _ranks(kind, message):
    if not STATE.initialized or STATE.ranks.get(kind) is None:
        raise StateError(message)
    return STATE.ranks[kind]


def _torch_ready():
    return dist.is_available() and dist.is_initialized()


# ---- groups --------------------------------------------------------------------------

def get_model_parallel_group(check_initialized=True):
    return _group("mp", check_initialized, "model parallel group is not initialized")


def get_tensor_model_parallel_group(check_initialized=True):
    return _group("tp", check_initialized, "tensor model parallel group is not initialized")


def get_pipeline_model_parallel_group(check_initialized=True):
    return _group("pp", check_initialized, "pipeline_model parallel group is not initialized")


def get_data_parallel_group(with_context_parallel=False, partial_data_parallel=False):
    if with_context_parallel:
        if partial_data_parallel:
            return _group("intra_dp_cp", True, "Intra partial data parallel group is not initialized")
        return _group("dp_cp", True,
                      "data parallel group with context parallel combined is not initialized")
    group = _group("dp", True, "data parallel group is not initialized")
    if partial_data_parallel:
        raise InvalidValueError("partial_data_parallel=True needs with_context_parallel=True "
                                "(Partial DP for Optimizer needs to include CP)")
    return group


def get_data_parallel_group_gloo(with_context_parallel=False, partial_data_parallel=False):
    kind = ("intra_dp_cp" if partial_data_parallel else "dp_cp") if with_context_parallel else "dp"
    if partial_data_parallel and not with_context_parallel:
        raise InvalidValueError("partial_data_parallel=True needs with_context_parallel=True "
                                "(Partial DP for Optimizer needs to include CP)")
    group = STATE.gloo_groups.get(kind)
    if group is None:
        raise StateError(f"{kind} Gloo group is not initialized "
                         "(initialize_model_parallel with create_gloo_process_groups=True)")
    return group


def get_context_parallel_group(check_initialized=True):
    return _group("cp", check_initialized, "context parallel group is not initialized")


def get_context_parallel_global_ranks(check_initialized=True):
    if not check_initialized and not STATE.initialized:
        return None
    return _ranks("cp", "context parallel group is not initialized")


def get_hierarchical_context_parallel_groups(check_initialized=True):
    return _group("hcp", check_initialized,
                  "hierarchical context parallel groups are not initialized "
                  "(hierarchical_context_parallel_sizes not given)")


def get_embedding_group(check_initialized=True):
    return _group("embd", check_initialized, "embedding group is not initialized")


def get_position_embedding_group(check_initialized=True):
    return _group("pos_embd", check_initialized, "position embedding group is not initialized")


def get_amax_reduction_group(with_context_parallel=False, tp_only_amax_red=False):
    if with_context_parallel:
        kind = "tp_cp" if tp_only_amax_red else "tp_dp_cp"
    else:
        kind = "tp" if tp_only_amax_red else "tp_dp"
    return _group(kind, True, "FP8 amax reduction group is not initialized")


def get_tensor_and_data_parallel_group(with_context_parallel=False):
    kind = "tp_dp_cp" if with_context_parallel else "tp_dp"
    return _group(kind, True, "tensor and data parallel group is not initialized")


def get_tensor_and_context_parallel_group(check_initialized=True):
    return _group("tp_cp", check_initialized, "tensor and context parallel group is not initialized")


def get_expert_model_parallel_group(check_initialized=True):
    return _group("ep", check_initialized, "expert model parallel group is not initialized")


def get_expert_tensor_parallel_group(check_initialized=True):
    return _group("expt_tp", check_initialized, "Expert tensor parallel group is not initialized")


def get_expert_tensor_and_model_parallel_group(check_initialized=True):
    return _group("tp_ep", check_initialized,
                  "Expert tensor and model parallel group is not initialized")


def get_expert_tensor_model_pipeline_parallel_group(check_initialized=True):
    return _group("tp_ep_pp", check_initialized,
                  "Expert tensor-model-pipeline parallel group is not initialized")


def get_expert_data_parallel_group(check_initialized=True, partial_expert_data_parallel=False):
    if partial_expert_data_parallel:
        return _group("intra_expt_dp", check_initialized,
                      "Intra partial expert data parallel group is not initialized")
    return _group("expt_dp", check_initialized, "Expert data parallel group is not initialized")


def get_data_modulo_expert_parallel_group(partial_expert_data_parallel=False):
    """Deprecated in Megatron: get_expert_data_parallel_group."""
    return get_expert_data_parallel_group(partial_expert_data_parallel=partial_expert_data_parallel)


def get_expert_data_parallel_group_gloo(partial_expert_data_parallel=False):
    kind = "intra_expt_dp" if partial_expert_data_parallel else "expt_dp"
    group = STATE.gloo_groups.get(kind)
    if group is None:
        raise StateError(f"{kind} Gloo group is not initialized "
                         "(initialize_model_parallel with create_gloo_process_groups=True)")
    return group


def get_intra_distributed_optimizer_instance_group():
    return _group("intra_dist_opt", True,
                  "Intra distributed optimizer instance group is not initialized")


def get_inter_distributed_optimizer_instance_group():
    return _group("inter_dist_opt", True,
                  "inter distributed optimizer instance group is not initialized "
                  "(it exists only with num_distributed_optimizer_instances > 1)")


# ---- sizes and ranks (Megatron's set_* overrides win, as in parallel_state) ------------

def _size(key, kind_group):
    if STATE.overrides.get(key + "_size") is not None:
        return STATE.overrides[key + "_size"]
    return dist.get_world_size(group=kind_group())


def _rank(key, kind_group):
    if STATE.overrides.get(key + "_rank") is not None:
        return STATE.overrides[key + "_rank"]
    return dist.get_rank(group=kind_group())


def set_tensor_model_parallel_world_size(world_size):
    STATE.overrides["tp_size"] = world_size


def set_pipeline_model_parallel_world_size(world_size):
    STATE.overrides["pp_size"] = world_size


def set_virtual_pipeline_model_parallel_world_size(world_size):
    STATE.virtual_size = world_size


def set_tensor_model_parallel_rank(rank):
    STATE.overrides["tp_rank"] = rank


def set_pipeline_model_parallel_rank(rank):
    STATE.overrides["pp_rank"] = rank


def set_data_parallel_rank(rank):
    STATE.overrides["dp_rank"] = rank


def set_expert_model_parallel_world_size(world_size):
    STATE.overrides["ep_size"] = world_size


def set_expert_model_parallel_rank(rank):
    STATE.overrides["ep_rank"] = rank


def set_expert_tensor_parallel_world_size(world_size):
    STATE.overrides["expt_tp_size"] = world_size


def set_expert_tensor_parallel_rank(rank):
    STATE.overrides["expt_tp_rank"] = rank


def get_tensor_model_parallel_world_size():
    return _size("tp", get_tensor_model_parallel_group)


def get_tensor_model_parallel_rank():
    return _rank("tp", get_tensor_model_parallel_group)


def get_pipeline_model_parallel_world_size():
    return _size("pp", get_pipeline_model_parallel_group)


def get_pipeline_model_parallel_rank():
    return _rank("pp", get_pipeline_model_parallel_group)


def get_data_parallel_world_size(with_context_parallel=False, partial_data_parallel=False):
    if STATE.overrides.get("dp_size") is not None:
        return STATE.overrides["dp_size"]
    if not _torch_ready():
        return 0
    return dist.get_world_size(group=get_data_parallel_group(
        with_context_parallel=with_context_parallel, partial_data_parallel=partial_data_parallel))


def get_data_parallel_rank(with_context_parallel=False, partial_data_parallel=False):
    if STATE.overrides.get("dp_rank") is not None:
        return STATE.overrides["dp_rank"]
    if not _torch_ready():
        return 0
    return dist.get_rank(group=get_data_parallel_group(
        with_context_parallel=with_context_parallel, partial_data_parallel=partial_data_parallel))


def _size_or_zero(getter):
    return dist.get_world_size(group=getter()) if _torch_ready() else 0


def _rank_or_zero(getter):
    return dist.get_rank(group=getter()) if _torch_ready() else 0


def get_context_parallel_world_size():
    return _size_or_zero(get_context_parallel_group)


def get_context_parallel_rank():
    return _rank_or_zero(get_context_parallel_group)


def get_tensor_and_context_parallel_world_size():
    return _size_or_zero(get_tensor_and_context_parallel_group)


def get_tensor_and_context_parallel_rank():
    return _rank_or_zero(get_tensor_and_context_parallel_group)


def get_expert_model_parallel_world_size():
    if STATE.overrides.get("ep_size") is not None:
        return STATE.overrides["ep_size"]
    return _size_or_zero(get_expert_model_parallel_group)


def get_expert_model_parallel_rank():
    if STATE.overrides.get("ep_rank") is not None:
        return STATE.overrides["ep_rank"]
    return _rank_or_zero(get_expert_model_parallel_group)


def get_expert_tensor_parallel_world_size():
    if STATE.overrides.get("expt_tp_size") is not None:
        return STATE.overrides["expt_tp_size"]
    if STATE.group("expt_tp") is None:  # as Megatron: fall back to the tp override
        return STATE.overrides.get("tp_size")
    return dist.get_world_size(group=get_expert_tensor_parallel_group())


def get_expert_tensor_parallel_rank():
    if STATE.overrides.get("expt_tp_rank") is not None:
        return STATE.overrides["expt_tp_rank"]
    if STATE.group("expt_tp") is None:
        return STATE.overrides.get("tp_rank")
    return dist.get_rank(group=get_expert_tensor_parallel_group())


def get_expert_tensor_and_model_parallel_world_size():
    return _size_or_zero(get_expert_tensor_and_model_parallel_group)


def get_expert_tensor_and_model_parallel_rank():
    return _rank_or_zero(get_expert_tensor_and_model_parallel_group)


def get_expert_data_parallel_rank(partial_expert_data_parallel=False):
    if not _torch_ready():
        return 0
    return dist.get_rank(group=get_expert_data_parallel_group(
        partial_expert_data_parallel=partial_expert_data_parallel))


def get_expert_data_parallel_world_size(partial_expert_data_parallel=False):
    if not _torch_ready():
        return 0
    return dist.get_world_size(group=get_expert_data_parallel_group(
        partial_expert_data_parallel=partial_expert_data_parallel))


# ---- pipeline, embedding, source ranks ------------------------------------------------

def get_virtual_pipeline_model_parallel_rank():
    return STATE.virtual_rank


def set_virtual_pipeline_model_parallel_rank(rank):
    STATE.virtual_rank = rank


def get_virtual_pipeline_model_parallel_world_size():
    return STATE.virtual_size


def is_pipeline_first_stage(ignore_virtual=False):
    if not ignore_virtual and STATE.virtual_size is not None and STATE.virtual_rank != 0:
        return False
    return get_pipeline_model_parallel_rank() == 0


def is_pipeline_last_stage(ignore_virtual=False):
    if (not ignore_virtual and STATE.virtual_size is not None
            and STATE.virtual_rank != STATE.virtual_size - 1):
        return False
    return get_pipeline_model_parallel_rank() == get_pipeline_model_parallel_world_size() - 1


def is_rank_in_embedding_group(ignore_virtual=False):
    ranks = STATE.ranks.get("embd")
    rank = dist.get_rank()
    if ranks is None or rank not in ranks:
        return False
    if ignore_virtual:
        return True
    if rank == ranks[0]:
        return is_pipeline_first_stage(ignore_virtual=False)
    if rank == ranks[-1]:
        return is_pipeline_last_stage(ignore_virtual=False)
    return True


def is_rank_in_position_embedding_group():
    ranks = STATE.ranks.get("pos_embd")
    return ranks is not None and dist.get_rank() in ranks


def get_tensor_model_parallel_src_rank():
    return _ranks("tp", "Tensor model parallel group is not initialized")[0]


def get_model_parallel_src_rank():
    return _ranks("mp", "Model parallel group is not initialized")[0]


def get_data_parallel_src_rank(with_context_parallel=False):
    if with_context_parallel:
        return _ranks("dp_cp", "Data parallel group with context parallel combined is not "
                               "initialized")[0]
    return _ranks("dp", "Data parallel group is not initialized")[0]


def _pp_ranks():
    return _ranks("pp", "Pipeline parallel group is not initialized")


def get_pipeline_model_parallel_first_rank():
    return _pp_ranks()[0]


def get_pipeline_model_parallel_last_rank():
    return _pp_ranks()[get_pipeline_model_parallel_world_size() - 1]


def get_pipeline_model_parallel_next_rank():
    ranks = _pp_ranks()
    return ranks[(get_pipeline_model_parallel_rank() + 1) % get_pipeline_model_parallel_world_size()]


def get_pipeline_model_parallel_prev_rank():
    ranks = _pp_ranks()
    return ranks[(get_pipeline_model_parallel_rank() - 1) % get_pipeline_model_parallel_world_size()]


def get_all_ranks():
    ranks = [get_tensor_model_parallel_rank(), get_data_parallel_rank(),
             get_context_parallel_rank(), get_pipeline_model_parallel_rank(),
             get_expert_model_parallel_rank()]
    return "_".join(str(x or 0) for x in ranks)


def get_global_ranks(kind):
    """commgrid's addition: this rank's group of any kind as global ranks, in the kind's
    member order (hcp: one list per level); None when it has none."""
    if not STATE.initialized:
        raise StateError("get_global_ranks: parallel state is not initialized")
    return STATE.ranks.get(kind)
