"""Megatron-core's group getters over the parallel state, without torch: the collections
read groups through them, and commgrid.torch (seed) and commgrid.torch.head export them.

Each getter has Megatron's name, arguments, defaults and messages. Where Megatron asserts,
they raise :class:`commgrid.StateError` (also an AssertionError). Getters whose arguments
differ between the seed and HEAD come in two versions, ``*_seed`` and ``*_head``; each
facade exports its own under Megatron's name.
"""

from ._state import STATE
from .errors import InvalidValueError, StateError, as_builtin


def need(name, message, check=True):
    """The global ``name``; with ``check``, StateError(message) when it is None."""
    value = STATE.vars[name]
    if check and value is None:
        raise StateError(message)
    return value


def _partial_needs_cp():
    return as_builtin(InvalidValueError("Partial DP for Optimizer needs to include CP",
                                        parameter="partial_data_parallel"), AssertionError)


def get_model_parallel_group(check_initialized=True):
    return need("_MODEL_PARALLEL_GROUP", "model parallel group is not initialized", check_initialized)


def get_tensor_model_parallel_group(check_initialized=True):
    return need("_TENSOR_MODEL_PARALLEL_GROUP", "tensor model parallel group is not initialized",
                check_initialized)


def get_pipeline_model_parallel_group(check_initialized=True):
    return need("_PIPELINE_MODEL_PARALLEL_GROUP",
                "pipeline_model parallel group is not initialized", check_initialized)


def get_data_parallel_group_seed(with_context_parallel=False, partial_data_parallel=False):
    if with_context_parallel:
        if partial_data_parallel:
            return need("_INTRA_PARTIAL_DATA_PARALLEL_GROUP_WITH_CP",
                        "Intra partial data parallel group is not initialized")
        return need("_DATA_PARALLEL_GROUP_WITH_CP",
                    "data parallel group with context parallel combined is not initialized")
    group = need("_DATA_PARALLEL_GROUP", "data parallel group is not initialized")
    if partial_data_parallel:
        raise _partial_needs_cp()
    return group


# HEAD: (with_gtp_remat, with_context_parallel, partial) -> (global, description).
_HEAD_DP = {
    (True, False, False): ("_DATA_PARALLEL_GROUP_WITH_GTP_REMAT", "data parallel group (with GTP_remat)"),
    (True, True, False): ("_DATA_PARALLEL_GROUP_WITH_CP_WITH_GTP_REMAT",
                          "data parallel group with CP (with GTP_remat)"),
    (True, True, True): ("_INTRA_PARTIAL_DATA_PARALLEL_GROUP_WITH_CP_WITH_GTP_REMAT",
                         "intra partial data parallel group with CP (with GTP_remat)"),
    (False, False, False): ("_DATA_PARALLEL_GROUP", "data parallel group"),
    (False, True, False): ("_DATA_PARALLEL_GROUP_WITH_CP", "data parallel group with CP"),
    (False, True, True): ("_INTRA_PARTIAL_DATA_PARALLEL_GROUP_WITH_CP",
                          "intra partial data parallel group with CP"),
}


def get_data_parallel_group_head(with_context_parallel=False, with_gtp_remat=True,
                                 partial_data_parallel=False):
    if partial_data_parallel and not with_context_parallel:
        raise _partial_needs_cp()
    name, what = _HEAD_DP[(bool(with_gtp_remat), bool(with_context_parallel),
                           bool(partial_data_parallel))]
    return need(name, f"{what} is not initialized")


def get_data_parallel_group_gloo(with_context_parallel=False, partial_data_parallel=False):
    if with_context_parallel:
        if partial_data_parallel:
            return need("_INTRA_PARTIAL_DATA_PARALLEL_GROUP_WITH_CP_GLOO",
                        "Intra partial data parallel group is not initialized")
        return need("_DATA_PARALLEL_GROUP_WITH_CP_GLOO",
                    "data parallel group-gloo with context parallel combined is not initialized")
    group = need("_DATA_PARALLEL_GROUP_GLOO", "data parallel group-gloo is not initialized")
    if partial_data_parallel:
        raise _partial_needs_cp()
    return group


def get_context_parallel_group(check_initialized=True):
    return need("_CONTEXT_PARALLEL_GROUP", "context parallel group is not initialized", check_initialized)


def get_context_parallel_global_ranks(check_initialized=True):
    return need("_CONTEXT_PARALLEL_GLOBAL_RANKS", "context parallel group is not initialized",
                check_initialized)


def get_hierarchical_context_parallel_groups(check_initialized=True):
    return need("_HIERARCHICAL_CONTEXT_PARALLEL_GROUPS",
                "hierarchical context parallel groups are not initialized", check_initialized)


def get_embedding_group(check_initialized=True):
    return need("_EMBEDDING_GROUP", "embedding group is not initialized", check_initialized)


def get_position_embedding_group(check_initialized=True):
    return need("_POSITION_EMBEDDING_GROUP", "position embedding group is not initialized",
                check_initialized)


def get_amax_reduction_group(with_context_parallel=False, tp_only_amax_red=False):
    name = {(True, False): "_TENSOR_AND_DATA_PARALLEL_GROUP_WITH_CP",
            (True, True): "_TENSOR_AND_CONTEXT_PARALLEL_GROUP",
            (False, False): "_TENSOR_AND_DATA_PARALLEL_GROUP",
            (False, True): "_TENSOR_MODEL_PARALLEL_GROUP"}[(bool(with_context_parallel),
                                                            bool(tp_only_amax_red))]
    return need(name, "FP8 amax reduction group is not initialized")


def get_tensor_and_data_parallel_group_seed(with_context_parallel=False):
    return get_tensor_and_data_parallel_group_head(True, with_context_parallel)


def get_tensor_and_data_parallel_group_head(check_initialized=True, with_context_parallel=False):
    name = ("_TENSOR_AND_DATA_PARALLEL_GROUP_WITH_CP" if with_context_parallel
            else "_TENSOR_AND_DATA_PARALLEL_GROUP")
    return need(name, "tensor and data parallel group is not initialized", check_initialized)


def get_tensor_and_context_parallel_group(check_initialized=True):
    return need("_TENSOR_AND_CONTEXT_PARALLEL_GROUP",
                "tensor and context parallel group is not initialized", check_initialized)


def get_expert_model_parallel_group(check_initialized=True):
    return need("_EXPERT_MODEL_PARALLEL_GROUP", "expert model parallel group is not initialized",
                check_initialized)


def get_expert_tensor_parallel_group(check_initialized=True):
    return need("_EXPERT_TENSOR_PARALLEL_GROUP", "Expert tensor parallel group is not initialized",
                check_initialized)


def get_expert_tensor_and_model_parallel_group(check_initialized=True):
    return need("_EXPERT_TENSOR_AND_MODEL_PARALLEL_GROUP",
                "Expert tensor and model parallel group is not initialized", check_initialized)


def get_expert_tensor_model_pipeline_parallel_group_seed(check_initialized=True):
    return get_expert_tensor_model_pipeline_parallel_group_head(check_initialized)


def get_expert_tensor_model_pipeline_parallel_group_head(check_initialized=True,
                                                         with_egtp_remat=False):
    if with_egtp_remat:
        return need("_EXPERT_TENSOR_MODEL_PIPELINE_PARALLEL_GROUP_WITH_EGTP",
                    "Expert tensor-model-pipeline parallel group with EGTP is not initialized",
                    check_initialized)
    return need("_EXPERT_TENSOR_MODEL_PIPELINE_PARALLEL_GROUP",
                "Expert tensor-model-pipeline parallel group is not initialized", check_initialized)


def get_expert_data_parallel_group_seed(check_initialized=True, partial_expert_data_parallel=False):
    return get_expert_data_parallel_group_head(check_initialized, False, partial_expert_data_parallel)


_HEAD_EXPT_DP = {
    (False, False): ("_EXPERT_DATA_PARALLEL_GROUP", "Expert data parallel group"),
    (False, True): ("_INTRA_PARTIAL_EXPERT_DATA_PARALLEL_GROUP", "Intra partial expert data parallel group"),
    (True, False): ("_EXPERT_DATA_PARALLEL_GROUP_WITH_GTP_REMAT",
                    "Expert data parallel group (with GTP_remat)"),
    (True, True): ("_INTRA_PARTIAL_EXPERT_DATA_PARALLEL_GROUP_WITH_GTP_REMAT",
                   "Intra partial expert data parallel group (with GTP_remat)"),
}


def get_expert_data_parallel_group_head(check_initialized=True, with_gtp_remat=True,
                                        partial_expert_data_parallel=False):
    name, what = _HEAD_EXPT_DP[(bool(with_gtp_remat), bool(partial_expert_data_parallel))]
    return need(name, f"{what} is not initialized", check_initialized)


def get_expert_data_parallel_group_gloo(partial_expert_data_parallel=False):
    if partial_expert_data_parallel:
        return need("_INTRA_PARTIAL_EXPERT_DATA_PARALLEL_GROUP_GLOO",
                    "Intra partial expert data parallel group-gloo is not initialized")
    return need("_EXPERT_DATA_PARALLEL_GROUP_GLOO", "Expert data parallel group-gloo is not initialized")


def get_intra_distributed_optimizer_instance_group(check_initialized=True):
    return need("_INTRA_DISTRIBUTED_OPTIMIZER_INSTANCE_GROUP",
                "Intra distributed optimizer instance group is not initialized", check_initialized)


def get_inter_distributed_optimizer_instance_group(check_initialized=True):
    return need("_INTER_PARTIAL_EXPERT_DATA_PARALLEL_GROUP",
                "Attention and MLP/Expert share same inter distributed optimize instance group, "
                "which has not been initialized", check_initialized)


def get_gtp_weight_remat_group(check_initialized=True):
    return need("_GTP_WEIGHT_REMAT_GROUP", "generalized tensor parallel group is not initialized",
                check_initialized)


def get_gtp_weight_remat_global_ranks(check_initialized=True):
    return need("_GTP_WEIGHT_REMAT_GLOBAL_RANKS",
                "generalized tensor parallel group is not initialized", check_initialized)


def get_expert_gtp_weight_remat_group(check_initialized=True):
    return need("_EXPERT_GTP_WEIGHT_REMAT_GROUP",
                "expert generalized tensor parallel group is not initialized", check_initialized)


def get_expert_gtp_weight_remat_global_ranks(check_initialized=True):
    return need("_EXPERT_GTP_WEIGHT_REMAT_GLOBAL_RANKS",
                "expert generalized tensor parallel group is not initialized", check_initialized)


def get_expert_model_parallel_src_rank():
    return need("_EXPERT_MODEL_PARALLEL_RANKS", "Expert model parallel group is not initialized")[0]


def get_tensor_model_parallel_src_rank():
    return need("_TENSOR_MODEL_PARALLEL_GLOBAL_RANKS", "Tensor model parallel group is not initialized")[0]


def get_model_parallel_src_rank():
    return need("_MODEL_PARALLEL_GLOBAL_RANKS", "Model parallel group is not initialized")[0]


def get_data_parallel_src_rank(with_context_parallel=False):
    if with_context_parallel:
        return need("_DATA_PARALLEL_GLOBAL_RANKS_WITH_CP",
                    "Data parallel group with context parallel combined is not initialized")[0]
    return need("_DATA_PARALLEL_GLOBAL_RANKS", "Data parallel group is not initialized")[0]
