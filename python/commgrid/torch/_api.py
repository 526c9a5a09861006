"""The parallel_state functions commgrid.torch (the seed's edition) defines and
commgrid.torch.head shares where HEAD kept them: the state tests, Megatron's group getters
(commgrid._groups), sizes and ranks with Megatron's set_* overrides, pipeline stages,
embeddings, the seed's encoder split getters, the global memory buffer, destroy."""

import inspect
import warnings

import torch.distributed as dist

from .. import _groups as _g
from .._state import STATE
from ..errors import StateError, as_builtin
from . import _runtime as _rt
from ._create import destroy_layout_groups
from ._runtime import GlobalMemoryBuffer

_V = STATE.vars


def destroy_model_parallel():
    """Megatron's destroy_model_parallel: destroys the Gloo twins as Megatron does and
    forgets every group and all state (Megatron leaves some globals behind, commgrid resets
    them all); the other groups stay usable by collections that still hold them."""
    destroy_layout_groups()


# ---- state ---------------------------------------------------------------------------------

def is_initialized():
    """Whether the data-parallel group exists (Megatron's test)."""
    return _V["_DATA_PARALLEL_GROUP"] is not None


def is_unitialized():
    """Deprecated in Megatron: ``not is_initialized()``."""
    warnings.warn("is_unitialized is deprecated, use is_initialized instead", DeprecationWarning)
    return not is_initialized()


def model_parallel_is_initialized():
    """Whether the tp, pp and dp groups exist."""
    return not (_V["_TENSOR_MODEL_PARALLEL_GROUP"] is None or _V["_PIPELINE_MODEL_PARALLEL_GROUP"] is None
                or _V["_DATA_PARALLEL_GROUP"] is None)


# ---- groups (Megatron's getters over the state; commgrid._groups) ------------------------------

get_model_parallel_group = _g.get_model_parallel_group
get_tensor_model_parallel_group = _g.get_tensor_model_parallel_group
get_pipeline_model_parallel_group = _g.get_pipeline_model_parallel_group
get_data_parallel_group = _g.get_data_parallel_group_seed
get_data_parallel_group_gloo = _g.get_data_parallel_group_gloo
get_context_parallel_group = _g.get_context_parallel_group
get_context_parallel_global_ranks = _g.get_context_parallel_global_ranks
get_hierarchical_context_parallel_groups = _g.get_hierarchical_context_parallel_groups
get_embedding_group = _g.get_embedding_group
get_position_embedding_group = _g.get_position_embedding_group
get_amax_reduction_group = _g.get_amax_reduction_group
get_tensor_and_data_parallel_group = _g.get_tensor_and_data_parallel_group_seed
get_tensor_and_context_parallel_group = _g.get_tensor_and_context_parallel_group
get_expert_model_parallel_group = _g.get_expert_model_parallel_group
get_expert_tensor_parallel_group = _g.get_expert_tensor_parallel_group
get_expert_tensor_and_model_parallel_group = _g.get_expert_tensor_and_model_parallel_group
get_expert_tensor_model_pipeline_parallel_group = _g.get_expert_tensor_model_pipeline_parallel_group_seed
get_expert_data_parallel_group = _g.get_expert_data_parallel_group_seed
get_expert_data_parallel_group_gloo = _g.get_expert_data_parallel_group_gloo
get_tensor_model_parallel_src_rank = _g.get_tensor_model_parallel_src_rank
get_model_parallel_src_rank = _g.get_model_parallel_src_rank
get_data_parallel_src_rank = _g.get_data_parallel_src_rank
# HEAD's additions that do not clash with a seed name.
get_gtp_weight_remat_group = _g.get_gtp_weight_remat_group
get_gtp_weight_remat_global_ranks = _g.get_gtp_weight_remat_global_ranks
get_expert_gtp_weight_remat_group = _g.get_expert_gtp_weight_remat_group
get_expert_gtp_weight_remat_global_ranks = _g.get_expert_gtp_weight_remat_global_ranks
get_expert_model_parallel_src_rank = _g.get_expert_model_parallel_src_rank


def get_data_modulo_expert_parallel_group(partial_expert_data_parallel=False):
    """Deprecated in Megatron: get_expert_data_parallel_group."""
    warnings.warn("get_data_modulo_expert_parallel_group is deprecated, please use "
                  "get_expert_data_parallel_group instead.", DeprecationWarning)
    return get_expert_data_parallel_group(partial_expert_data_parallel=partial_expert_data_parallel)


def get_intra_distributed_optimizer_instance_group():
    return _g.get_intra_distributed_optimizer_instance_group()


def get_inter_distributed_optimizer_instance_group():
    return _g.get_inter_distributed_optimizer_instance_group()


def get_hybrid_data_context_parallel_groups(check_initialized=True, group_size=None):
    """HEAD: this rank's hybrid dp x cp group of ``group_size`` ranks (the whole dp_cp group
    when that is its size)."""
    if get_data_parallel_world_size(with_context_parallel=True) == group_size:
        return _g.need("_DATA_PARALLEL_GROUP_WITH_CP", "data parallel group with CP is not initialized",
                       check_initialized)
    groups = _V["_HYBRID_DP_CP_GROUPS"]
    if group_size not in groups:
        # Megatron indexes its dict (a KeyError); the error is also commgrid's StateError.
        raise as_builtin(StateError(f"no hybrid data-context parallel group of size {group_size} "
                                    f"(this rank has sizes {sorted(groups)})"), KeyError)
    return groups[group_size]


# ---- sizes and ranks -------------------------------------------------------------------------

def set_tensor_model_parallel_world_size(world_size):
    _V["_MPU_TENSOR_MODEL_PARALLEL_WORLD_SIZE"] = world_size


def set_pipeline_model_parallel_world_size(world_size):
    _V["_MPU_PIPELINE_MODEL_PARALLEL_WORLD_SIZE"] = world_size


def set_virtual_pipeline_model_parallel_world_size(world_size):
    _V["_VIRTUAL_PIPELINE_MODEL_PARALLEL_WORLD_SIZE"] = world_size


def set_tensor_model_parallel_rank(rank):
    _V["_MPU_TENSOR_MODEL_PARALLEL_RANK"] = rank


def set_pipeline_model_parallel_rank(rank):
    _V["_MPU_PIPELINE_MODEL_PARALLEL_RANK"] = rank


def set_pipeline_model_parallel_split_rank(rank):
    """Deprecated in Megatron: the encoder/decoder split rank."""
    _V["_PIPELINE_MODEL_PARALLEL_SPLIT_RANK"] = rank


def get_pipeline_model_parallel_split_rank():
    return _V["_PIPELINE_MODEL_PARALLEL_SPLIT_RANK"]


def set_data_parallel_rank(rank):
    _V["_MPU_DATA_PARALLEL_RANK"] = rank


def set_expert_model_parallel_world_size(world_size):
    _V["_MPU_EXPERT_MODEL_PARALLEL_WORLD_SIZE"] = world_size


def set_expert_model_parallel_rank(rank):
    _V["_MPU_EXPERT_MODEL_PARALLEL_RANK"] = rank


def set_expert_tensor_parallel_world_size(world_size):
    _V["_MPU_EXPERT_TENSOR_PARALLEL_WORLD_SIZE"] = world_size


def set_expert_tensor_parallel_rank(rank):
    _V["_MPU_EXPERT_TENSOR_PARALLEL_RANK"] = rank


def _override(name, fallback):
    value = _V[name]
    return value if value is not None else fallback()


def get_tensor_model_parallel_world_size():
    return _override("_MPU_TENSOR_MODEL_PARALLEL_WORLD_SIZE",
                     lambda: _rt.size_of(get_tensor_model_parallel_group()))


def get_tensor_model_parallel_rank():
    return _override("_MPU_TENSOR_MODEL_PARALLEL_RANK",
                     lambda: _rt.rank_in(get_tensor_model_parallel_group()))


def get_pipeline_model_parallel_world_size():
    def size():
        group = get_pipeline_model_parallel_group()
        if isinstance(group, list):  # a rank of several pipelines (encoder split)
            sizes = {len(r) for r in _V["_PIPELINE_GLOBAL_RANKS"]}
            if len(sizes) != 1:
                raise StateError(f"this rank's pipelines differ in size: {sorted(sizes)}")
            group = group[0]
        return _rt.size_of(group)
    return _override("_MPU_PIPELINE_MODEL_PARALLEL_WORLD_SIZE", size)


def get_pipeline_model_parallel_rank():
    def rank():
        group = get_pipeline_model_parallel_group()
        if isinstance(group, list):
            me = dist.get_rank()
            stages = {r.index(me) for r in _V["_PIPELINE_GLOBAL_RANKS"] if me in r}
            if len(stages) != 1:
                raise StateError(f"rank {me} is at different stages of its pipelines: {sorted(stages)}")
            group = group[0]
        return _rt.rank_in(group)
    return _override("_MPU_PIPELINE_MODEL_PARALLEL_RANK", rank)


def _ready_or_zero(fn):
    return fn() if _rt.torch_ready() else 0


def get_data_parallel_world_size(with_context_parallel=False, partial_data_parallel=False):
    return _override("_MPU_DATA_PARALLEL_WORLD_SIZE", lambda: _ready_or_zero(
        lambda: _rt.size_of(get_data_parallel_group(with_context_parallel, partial_data_parallel))))


def get_data_parallel_rank(with_context_parallel=False, partial_data_parallel=False):
    return _override("_MPU_DATA_PARALLEL_RANK", lambda: _ready_or_zero(
        lambda: _rt.rank_in(get_data_parallel_group(with_context_parallel, partial_data_parallel))))


def get_context_parallel_world_size():
    return _ready_or_zero(lambda: _rt.size_of(get_context_parallel_group()))


def get_context_parallel_rank():
    return _ready_or_zero(lambda: _rt.rank_in(get_context_parallel_group()))


def get_tensor_and_context_parallel_world_size():
    return _ready_or_zero(lambda: _rt.size_of(get_tensor_and_context_parallel_group()))


def get_tensor_and_context_parallel_rank():
    return _ready_or_zero(lambda: _rt.rank_in(get_tensor_and_context_parallel_group()))


def get_expert_model_parallel_world_size():
    return _override("_MPU_EXPERT_MODEL_PARALLEL_WORLD_SIZE",
                     lambda: _ready_or_zero(lambda: _rt.size_of(get_expert_model_parallel_group())))


def get_expert_model_parallel_rank():
    return _override("_MPU_EXPERT_MODEL_PARALLEL_RANK",
                     lambda: _ready_or_zero(lambda: _rt.rank_in(get_expert_model_parallel_group())))


def get_expert_tensor_parallel_world_size():
    # As Megatron: without an expert tp group, the tp override (for layer tests).
    return _override("_MPU_EXPERT_TENSOR_PARALLEL_WORLD_SIZE", lambda: (
        _rt.size_of(get_expert_tensor_parallel_group()) if _V["_EXPERT_TENSOR_PARALLEL_GROUP"]
        else _V["_MPU_TENSOR_MODEL_PARALLEL_WORLD_SIZE"]))


def get_expert_tensor_parallel_rank():
    return _override("_MPU_EXPERT_TENSOR_PARALLEL_RANK", lambda: (
        _rt.rank_in(get_expert_tensor_parallel_group()) if _V["_EXPERT_TENSOR_PARALLEL_GROUP"]
        else _V["_MPU_TENSOR_MODEL_PARALLEL_RANK"]))


def get_expert_tensor_and_model_parallel_world_size():
    return _ready_or_zero(lambda: _rt.size_of(get_expert_tensor_and_model_parallel_group()))


def get_expert_tensor_and_model_parallel_rank():
    return _ready_or_zero(lambda: _rt.rank_in(get_expert_tensor_and_model_parallel_group()))


def get_expert_data_parallel_rank(partial_expert_data_parallel=False):
    return _ready_or_zero(lambda: _rt.rank_in(get_expert_data_parallel_group(
        partial_expert_data_parallel=partial_expert_data_parallel)))


def get_expert_data_parallel_world_size(partial_expert_data_parallel=False):
    return _ready_or_zero(lambda: _rt.size_of(get_expert_data_parallel_group(
        partial_expert_data_parallel=partial_expert_data_parallel)))


def _group_size_or_zero(group):
    return 0 if not _rt.torch_ready() or group is None else _rt.size_of(group)


def _group_rank_or_zero(group):
    return 0 if not _rt.torch_ready() or group is None else _rt.rank_in(group)


def get_gtp_weight_remat_world_size():
    """HEAD: the size of this rank's gtp_remat group (0 without one)."""
    return _group_size_or_zero(_V["_GTP_WEIGHT_REMAT_GROUP"])


def get_gtp_weight_remat_rank():
    return _group_rank_or_zero(_V["_GTP_WEIGHT_REMAT_GROUP"])


def get_expert_gtp_weight_remat_world_size():
    return _group_size_or_zero(_V["_EXPERT_GTP_WEIGHT_REMAT_GROUP"])


def get_expert_gtp_weight_remat_rank():
    return _group_rank_or_zero(_V["_EXPERT_GTP_WEIGHT_REMAT_GROUP"])


# ---- pipeline stages, embeddings, the encoder split ------------------------------------------

def get_virtual_pipeline_model_parallel_rank():
    return _V["_VIRTUAL_PIPELINE_MODEL_PARALLEL_RANK"]


def set_virtual_pipeline_model_parallel_rank(rank):
    _V["_VIRTUAL_PIPELINE_MODEL_PARALLEL_RANK"] = rank


def get_virtual_pipeline_model_parallel_world_size():
    return _V["_VIRTUAL_PIPELINE_MODEL_PARALLEL_WORLD_SIZE"]


def is_pipeline_first_stage(ignore_virtual=False):
    if not ignore_virtual and get_virtual_pipeline_model_parallel_world_size() is not None \
            and get_virtual_pipeline_model_parallel_rank() != 0:
        return False
    return get_pipeline_model_parallel_rank() == 0


def is_pipeline_last_stage(ignore_virtual=False):
    vpp = get_virtual_pipeline_model_parallel_world_size()
    if not ignore_virtual and vpp is not None and get_virtual_pipeline_model_parallel_rank() != vpp - 1:
        return False
    return get_pipeline_model_parallel_rank() == get_pipeline_model_parallel_world_size() - 1


def _in_embedding_group(first, last):
    ranks = _V["_EMBEDDING_GLOBAL_RANKS"]
    rank = dist.get_rank()
    if ranks is None or rank not in ranks:
        return False
    if rank == ranks[0]:
        return first()
    if rank == ranks[-1]:
        return last()
    return True


def is_rank_in_embedding_group(ignore_virtual=False):
    if ignore_virtual:
        ranks = _V["_EMBEDDING_GLOBAL_RANKS"]
        return ranks is not None and dist.get_rank() in ranks
    return _in_embedding_group(lambda: is_pipeline_first_stage(ignore_virtual=False),
                               lambda: is_pipeline_last_stage(ignore_virtual=False))


def is_rank_in_position_embedding_group():
    ranks = _V["_POSITION_EMBEDDING_GLOBAL_RANKS"]
    return ranks is not None and dist.get_rank() in ranks


def _split_side(rank, before):
    if get_pipeline_model_parallel_world_size() == 1:
        return True
    if rank is None:
        rank = get_pipeline_model_parallel_rank()
    split = _V["_PIPELINE_MODEL_PARALLEL_SPLIT_RANK"]
    if split is None:
        return True
    return rank < split if before else rank >= split


def is_pipeline_stage_before_split(rank=None):
    """Deprecated split: whether the stage runs the encoder (True without a split)."""
    return _split_side(rank, before=True)


def is_pipeline_stage_after_split(rank=None):
    """Deprecated split: whether the stage runs the decoder (True without a split)."""
    return _split_side(rank, before=False)


def is_pipeline_stage_at_split():
    rank = get_pipeline_model_parallel_rank()
    return is_pipeline_stage_before_split(rank) and is_pipeline_stage_after_split(rank + 1)


def is_inside_encoder(rank=None):
    """Whether the pipeline stage runs the encoder: with an encoder split (encoder pipeline
    stages), stages before the decoder's start; without one, stage 0 (and every stage of a
    single-stage pipeline)."""
    if get_pipeline_model_parallel_world_size() == 1:
        return True
    if rank is None:
        rank = get_pipeline_model_parallel_rank()
    start = _V["_PIPELINE_MODEL_PARALLEL_DECODER_START"]
    return rank == 0 if start is None else rank < start


def is_inside_decoder(rank=None):
    """Whether the pipeline stage runs the decoder: stages from the decoder's start (every
    stage without an encoder split)."""
    if get_pipeline_model_parallel_world_size() == 1:
        return True
    if rank is None:
        rank = get_pipeline_model_parallel_rank()
    start = _V["_PIPELINE_MODEL_PARALLEL_DECODER_START"]
    return start is None or rank >= start


def get_pipeline_model_parallel_decoder_start():
    """The first decoder stage of an encoder split (encoder_pipeline_model_parallel_size),
    or None."""
    return _V["_PIPELINE_MODEL_PARALLEL_DECODER_START"]


def _pp_ranks():
    return _g.need("_PIPELINE_GLOBAL_RANKS", "Pipeline parallel group is not initialized")


def get_pipeline_model_parallel_first_rank():
    ranks = _pp_ranks()
    if isinstance(ranks[0], list):  # several pipelines: they share the first stage
        if len({r[0] for r in ranks}) != 1:
            raise StateError(f"this rank's pipelines start at different ranks: {ranks}")
        return ranks[0][0]
    return ranks[0]


def get_pipeline_model_parallel_last_rank():
    ranks = _pp_ranks()
    last = get_pipeline_model_parallel_world_size() - 1
    return [r[last] for r in ranks] if isinstance(ranks[0], list) else ranks[last]


def _pp_neighbour(step):
    ranks = _pp_ranks()
    stage = get_pipeline_model_parallel_rank()
    size = get_pipeline_model_parallel_world_size()
    if isinstance(ranks[0], list):
        return [r[(stage + step) % size] for r in ranks]
    return ranks[(stage + step) % size]


def get_pipeline_model_parallel_next_rank():
    """The rank after this one in its pipeline (a list: one per pipeline of an encoder split)."""
    return _pp_neighbour(1)


def get_pipeline_model_parallel_prev_rank():
    """The rank before this one in its pipeline (a list: one per pipeline of an encoder split)."""
    return _pp_neighbour(-1)


def get_all_ranks():
    ranks = [get_tensor_model_parallel_rank(), get_data_parallel_rank(), get_context_parallel_rank(),
             get_pipeline_model_parallel_rank(), get_expert_model_parallel_rank()]
    return "_".join(str(x or 0) for x in ranks)


# ---- the global memory buffer --------------------------------------------------------------

def _set_global_memory_buffer():
    if _V["_GLOBAL_MEMORY_BUFFER"] is not None:
        raise StateError("global memory buffer is already initialized")
    _V["_GLOBAL_MEMORY_BUFFER"] = GlobalMemoryBuffer()


def get_global_memory_buffer():
    """The GlobalMemoryBuffer initialize_model_parallel made (attention, FSDP)."""
    return _g.need("_GLOBAL_MEMORY_BUFFER", "global memory buffer is not initialized")


def destroy_global_memory_buffer():
    _V["_GLOBAL_MEMORY_BUFFER"] = None


# ---- commgrid's additions --------------------------------------------------------------------

def get_global_ranks(kind):
    """This rank's group of any kind as global ranks in the kind's member order (hcp and
    hybrid_dp_cp: a dict level -> members); None when it has none."""
    if not STATE.initialized:
        raise StateError("get_global_ranks: parallel state is not initialized")
    return STATE.ranks.get(kind)


# The seed's functions that HEAD no longer has: commgrid.torch imports them by name.
SEED_ONLY = ("get_data_modulo_expert_parallel_group", "get_pipeline_model_parallel_decoder_start",
             "get_pipeline_model_parallel_split_rank", "is_inside_decoder", "is_inside_encoder",
             "is_pipeline_stage_after_split", "is_pipeline_stage_at_split",
             "is_pipeline_stage_before_split", "is_unitialized", "set_pipeline_model_parallel_split_rank")
# What ``from commgrid.torch._api import *`` gives both facades: every public function defined
# or re-exported here but the seed-only ones.
__all__ = sorted(name for name, value in list(globals().items())
                 if inspect.isfunction(value) and not name.startswith("_") and name not in SEED_ONLY)
