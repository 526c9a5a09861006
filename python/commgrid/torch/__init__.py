"""commgrid.torch: a drop-in for Megatron-core's ``megatron.core.parallel_state`` as at the
seed's commit (8c1e094afe), over torch.distributed, with the groups and their creation
order from commgrid's C++ core. ``commgrid.torch.head`` is the same for Megatron-core HEAD
(d98e8a64dd, and megatron-core 0.19, whose parallel_state is the same file);
``initialize_model_parallel(..., compat="head", gtp_remat_size=...)`` here creates HEAD's
groups too. ``commgrid.torch.device_mesh(dims)`` gives the groups as a torch DeviceMesh.

Every public function of the seed's parallel_state is here with its arguments, defaults and
results; the module globals (``_TENSOR_MODEL_PARALLEL_GROUP``, ``_MPU_TENSOR_MODEL_PARALLEL_RANK``,
...) are module attributes that read and assign the state the getters read. Where Megatron
asserts, commgrid raises :class:`commgrid.StateError` (also an AssertionError); a bad
configuration raises the core's ConfigError subclass, made also the built-in type Megatron
raises for that rule (RuntimeError or AssertionError). docs/python.md lists what differs.
Needs torch >= 2.6 (the oldest megatron-core 0.19 accepts); the tested version is pinned in
python/requirements.txt.
"""

import torch

from ._version import check_torch

check_torch(torch.__version__)

from .._state import HEAD_ONLY_GLOBALS, SEED_GLOBALS, STATE  # noqa: E402,F401
from ..errors import InvalidValueError  # noqa: E402
from ..rank_generator import RankGenerator, generate_masked_orthogonal_rank_groups  # noqa: E402,F401
from . import _create, _init, _runtime  # noqa: E402
from ._api import *  # noqa: E402,F401,F403  (the functions both editions share)
from ._api import (_set_global_memory_buffer, get_data_modulo_expert_parallel_group,  # noqa: E402,F401
                   get_pipeline_model_parallel_decoder_start, get_pipeline_model_parallel_split_rank,
                   is_inside_decoder, is_inside_encoder, is_pipeline_stage_after_split,
                   is_pipeline_stage_at_split, is_pipeline_stage_before_split, is_unitialized,
                   set_pipeline_model_parallel_split_rank)
from ._config import InitArgs  # noqa: E402
from ._create import (create_group, create_hierarchical_groups,  # noqa: E402,F401
                      create_hybrid_dp_cp_groups, creation_strategies,
                      overwrite_nccl_comm_cfgs)
from ._gloo import gloo_connections, gloo_devices  # noqa: E402,F401
from ._init import create_all_gather_groups  # noqa: E402,F401
from ._mesh import device_mesh  # noqa: E402,F401
from .resilient import (Epoch, PeerFailure, RecoveryError, ResilientDriver, TorchTooOldError)  # noqa: E402,F401
from ._policies import default_embedding_ranks_seed as default_embedding_ranks  # noqa: E402,F401
from ._policies import (  # noqa: E402,F401
    default_position_embedding_ranks_seed as default_position_embedding_ranks)
from ._runtime import GlobalMemoryBuffer, update_pg_timeout  # noqa: E402,F401


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
    compat="seed",
    creation="auto",
    gloo_connection="auto",
    gloo_device="auto",
    share_identical_groups="auto",
    **head_arguments,
):
    """Creates this rank's torch.distributed group of every kind (Megatron-core's
    initialize_model_parallel, the seed's arguments in its order). Collective: every rank of
    the default group calls it with the same arguments. The whole configuration is validated
    before any group exists. ``compat="head"`` creates Megatron-core HEAD's groups, in HEAD's
    order, and takes HEAD's further keywords (gtp_remat_size, expert_gtp_remat_size,
    hybrid_context_parallel, high_priority_stream_groups, sharp_enabled_group, rank_offset,
    local_world_size); ``creation``: "auto" (the cheapest this torch offers), "local" or
    "megatron" (see creation_strategies()); ``gloo_connection``: "auto" (lazy where this
    torch can, unless TORCH_GLOO_LAZY_INIT is set), "lazy" or "eager" (see
    gloo_connections()); ``gloo_device``: "auto" ("shared" where this torch can and the
    connection is eager), "shared" (one Gloo device for all of commgrid's Gloo groups: they
    connect eagerly) or "per_group" (see gloo_devices());
    ``share_identical_groups``: kinds whose Gloo groups are the same rank sets share one
    group (True; "auto", the default: with creation "local") or each get their own as in
    Megatron-core (False)."""
    given = dict(locals())  # the arguments, under Megatron's names: one InitArgs
    del given["head_arguments"]
    if compat not in ("seed", "head"):
        raise InvalidValueError(f'compat: expected "seed" or "head", got {compat!r}', parameter="compat")
    if compat == "seed" and head_arguments:
        name = next(iter(head_arguments))
        raise TypeError(f"initialize_model_parallel() got an unexpected keyword argument '{name}' "
                        '(a Megatron-core HEAD argument: pass compat="head")')
    if compat == "head" and (pipeline_model_parallel_split_rank is not None
                             or encoder_tensor_model_parallel_size or encoder_pipeline_model_parallel_size):
        raise InvalidValueError("Megatron-core HEAD has no encoder split: "
                                "pipeline_model_parallel_split_rank and encoder_* need compat seed",
                                parameter="compat")
    try:
        args = InitArgs(**given, **head_arguments)
    except TypeError:
        unknown = next(n for n in head_arguments if n not in InitArgs.__dataclass_fields__)
        raise TypeError(f"initialize_model_parallel() got an unexpected keyword argument '{unknown}'") from None
    _init.initialize(args)


def get_nccl_options(pg_name, nccl_comm_cfgs):
    """The seed's get_nccl_options: ProcessGroupNCCL options for ``pg_name`` from the
    communicator configs, cga_cluster_size 4, max_ctas 32, min_ctas 1 where the entry omits
    them; None when it has no entry."""
    return _create._nccl_options(pg_name, nccl_comm_cfgs, seed_defaults=True)


_runtime.expose_globals(__name__, SEED_GLOBALS + HEAD_ONLY_GLOBALS)
