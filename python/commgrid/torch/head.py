"""commgrid.torch.head: a drop-in for Megatron-core HEAD's ``megatron.core.parallel_state``
(d98e8a64dd): HEAD's functions with HEAD's arguments (gtp_remat, hybrid context
parallelism, all-gather groups, rank offsets), HEAD's module globals as attributes, and the
groups in HEAD's creation order from commgrid's C++ core. It shares its state with
commgrid.torch: groups made by either are seen by both and by the collections.
"""

import warnings

import torch.distributed as dist

from .. import _groups as _g
from .._state import HEAD_GLOBALS, STATE
from ..errors import StateError
from ..rank_generator import RankGenerator, generate_masked_orthogonal_rank_groups  # noqa: F401
from . import _init, _runtime
from ._api import *  # noqa: F401,F403  (what HEAD kept of the seed; redefined below where it differs)
from ._api import _in_embedding_group, _override, _ready_or_zero, _set_global_memory_buffer  # noqa: F401
from ._config import InitArgs
from ._create import (create_group, create_hierarchical_groups,  # noqa: F401
                      create_hybrid_dp_cp_groups, creation_strategies, get_nccl_options,
                      overwrite_nccl_comm_cfgs)
from ._gloo import gloo_connections, gloo_devices  # noqa: F401
from ._init import create_all_gather_groups  # noqa: F401
from ._mesh import device_mesh  # noqa: F401
from ._policies import default_embedding_ranks_head as default_embedding_ranks  # noqa: F401
from ._policies import default_position_embedding_ranks_head as default_position_embedding_ranks  # noqa: F401
from ._runtime import GlobalMemoryBuffer, update_pg_timeout  # noqa: F401

_V = STATE.vars


def initialize_model_parallel(
    tensor_model_parallel_size=1,
    pipeline_model_parallel_size=1,
    virtual_pipeline_model_parallel_size=None,
    pipeline_model_parallel_comm_backend=None,
    use_sharp=False,
    context_parallel_size=1,
    hierarchical_context_parallel_sizes=None,
    hybrid_context_parallel=False,
    expert_model_parallel_size=1,
    gtp_remat_size=1,
    expert_gtp_remat_size=1,
    num_distributed_optimizer_instances=1,
    expert_tensor_parallel_size=None,
    nccl_communicator_config_path=None,
    distributed_timeout_minutes=30,
    order="tp-cp-ep-dp-pp",
    get_embedding_ranks=None,
    get_position_embedding_ranks=None,
    create_gloo_process_groups=True,
    high_priority_stream_groups=None,
    sharp_enabled_group=None,
    rank_offset=0,
    local_world_size=None,
    *,
    creation="auto",
    gloo_connection="auto",
    gloo_device="auto",
    share_identical_groups="auto",
):
    """Creates this rank's torch.distributed group of every kind of Megatron-core HEAD's
    initialize_model_parallel (HEAD's arguments, in its order), in HEAD's creation order.
    Collective over the default group; validates the whole configuration first."""
    given = dict(locals())  # the arguments, under HEAD's names: one InitArgs
    _init.initialize(InitArgs(compat="head", **given))


def _inject_gtp_remat_axis(order_str, after="tp"):
    """HEAD's order for its dense (``after="tp"``) or expert (``after="ep"``) RankGenerator:
    ``gtp_remat`` inserted after that axis unless the order has it (from the core's
    ParallelConfig::head_order, without the omitted axes it appends)."""
    from .. import _commgrid
    tokens = order_str.split("-")
    if "gtp_remat" in tokens:
        return order_str
    return "-".join(_commgrid.head_order(order_str, after == "ep")[:len(tokens) + 1])


get_data_parallel_group = _g.get_data_parallel_group_head
get_tensor_and_data_parallel_group = _g.get_tensor_and_data_parallel_group_head
get_expert_tensor_model_pipeline_parallel_group = _g.get_expert_tensor_model_pipeline_parallel_group_head
get_expert_data_parallel_group = _g.get_expert_data_parallel_group_head
get_intra_distributed_optimizer_instance_group = _g.get_intra_distributed_optimizer_instance_group
get_inter_distributed_optimizer_instance_group = _g.get_inter_distributed_optimizer_instance_group


def get_data_parallel_world_size(with_context_parallel=False, with_gtp_remat=True,
                                 partial_data_parallel=False):
    """HEAD: the size of the dp group (default: with gtp_remat, replicate dp x gtp_remat)."""
    return _override("_MPU_DATA_PARALLEL_WORLD_SIZE", lambda: _ready_or_zero(lambda: _runtime.size_of(
        get_data_parallel_group(with_context_parallel, with_gtp_remat, partial_data_parallel))))


def get_data_parallel_rank(with_context_parallel=False, with_gtp_remat=True, partial_data_parallel=False):
    return _override("_MPU_DATA_PARALLEL_RANK", lambda: _ready_or_zero(lambda: _runtime.rank_in(
        get_data_parallel_group(with_context_parallel, with_gtp_remat, partial_data_parallel))))


def get_expert_data_parallel_rank(with_gtp_remat=True, partial_expert_data_parallel=False):
    return _ready_or_zero(lambda: _runtime.rank_in(get_expert_data_parallel_group(
        with_gtp_remat=with_gtp_remat, partial_expert_data_parallel=partial_expert_data_parallel)))


def get_expert_data_parallel_world_size(with_gtp_remat=True, partial_expert_data_parallel=False):
    return _ready_or_zero(lambda: _runtime.size_of(get_expert_data_parallel_group(
        with_gtp_remat=with_gtp_remat, partial_expert_data_parallel=partial_expert_data_parallel)))


def set_virtual_pipeline_model_parallel_rank(rank):
    warnings.warn("set_virtual_pipeline_model_parallel_rank in global scope is deprecated. "
                  "Pass vp_stage explicitly to is_pipeline_first_stage, is_pipeline_last_stage, etc.",
                  DeprecationWarning)
    _V["_VIRTUAL_PIPELINE_MODEL_PARALLEL_RANK"] = rank


def _vp_stage_needed(vp_stage):
    if vp_stage is None:
        raise StateError("vp_stage must be passed if virtual pipeline is enabled")


def is_pipeline_first_stage(ignore_virtual=True, vp_stage=None):
    """HEAD: with virtual pipelining and ``ignore_virtual=False``, the stage asked for is
    ``vp_stage`` (required)."""
    if not ignore_virtual and get_virtual_pipeline_model_parallel_world_size() is not None:
        _vp_stage_needed(vp_stage)
        if vp_stage != 0:
            return False
    return get_pipeline_model_parallel_rank() == 0


def is_pipeline_last_stage(ignore_virtual=True, vp_stage=None):
    vpp = get_virtual_pipeline_model_parallel_world_size()
    if not ignore_virtual and vpp is not None:
        _vp_stage_needed(vp_stage)
        if vp_stage != vpp - 1:
            return False
    return get_pipeline_model_parallel_rank() == get_pipeline_model_parallel_world_size() - 1


def is_rank_in_embedding_group(ignore_virtual=True, vp_stage=None):
    if ignore_virtual:
        ranks = _V["_EMBEDDING_GLOBAL_RANKS"]
        return ranks is not None and dist.get_rank() in ranks
    return _in_embedding_group(lambda: is_pipeline_first_stage(False, vp_stage),
                               lambda: is_pipeline_last_stage(False, vp_stage))


def get_all_ranks():
    ranks = [get_tensor_model_parallel_rank(), get_gtp_weight_remat_rank(), get_data_parallel_rank(),
             get_context_parallel_rank(), get_pipeline_model_parallel_rank(),
             get_expert_model_parallel_rank()]
    return "_".join(str(x or 0) for x in ranks)


_runtime.expose_globals(__name__, HEAD_GLOBALS)
