"""The process-wide parallel state that commgrid.torch fills and the collections read.

The state is Megatron-core's: the module globals of ``megatron/core/parallel_state.py``
under their own names (``_TENSOR_MODEL_PARALLEL_GROUP``, ``_MPU_TENSOR_MODEL_PARALLEL_RANK``
...), so that ``commgrid.torch`` (and ``commgrid.torch.head``) can expose them as module
attributes that read and assign exactly what the getters read. Kept free of torch so that
``import commgrid`` and the collections do not import torch.
"""

# The globals of the seed's parallel_state (8c1e094afe) and those HEAD (d98e8a64dd) adds;
# HEAD drops the two encoder/split ones.
SEED_ONLY_GLOBALS = ("_PIPELINE_MODEL_PARALLEL_DECODER_START", "_PIPELINE_MODEL_PARALLEL_SPLIT_RANK")
COMMON_GLOBALS = (
    "_TENSOR_MODEL_PARALLEL_GROUP", "_PIPELINE_MODEL_PARALLEL_GROUP", "_MODEL_PARALLEL_GROUP",
    "_EMBEDDING_GROUP", "_POSITION_EMBEDDING_GROUP", "_DATA_PARALLEL_GROUP",
    "_DATA_PARALLEL_GROUP_GLOO", "_TENSOR_AND_DATA_PARALLEL_GROUP",
    "_EXPERT_MODEL_PARALLEL_GROUP", "_EXPERT_TENSOR_PARALLEL_GROUP",
    "_EXPERT_TENSOR_AND_MODEL_PARALLEL_GROUP", "_EXPERT_TENSOR_MODEL_PIPELINE_PARALLEL_GROUP",
    "_EXPERT_DATA_PARALLEL_GROUP", "_EXPERT_DATA_PARALLEL_GROUP_GLOO",
    "_INTRA_PARTIAL_EXPERT_DATA_PARALLEL_GROUP", "_INTRA_PARTIAL_EXPERT_DATA_PARALLEL_GROUP_GLOO",
    "_INTER_PARTIAL_EXPERT_DATA_PARALLEL_GROUP", "_MPU_EXPERT_MODEL_PARALLEL_WORLD_SIZE",
    "_MPU_EXPERT_MODEL_PARALLEL_RANK", "_MPU_EXPERT_TENSOR_PARALLEL_WORLD_SIZE",
    "_MPU_EXPERT_TENSOR_PARALLEL_RANK", "_VIRTUAL_PIPELINE_MODEL_PARALLEL_RANK",
    "_VIRTUAL_PIPELINE_MODEL_PARALLEL_WORLD_SIZE", "_MPU_TENSOR_MODEL_PARALLEL_WORLD_SIZE",
    "_MPU_PIPELINE_MODEL_PARALLEL_WORLD_SIZE", "_MPU_DATA_PARALLEL_WORLD_SIZE",
    "_MPU_DATA_PARALLEL_RANK", "_MPU_TENSOR_MODEL_PARALLEL_RANK",
    "_MPU_PIPELINE_MODEL_PARALLEL_RANK", "_EMBEDDING_GLOBAL_RANKS",
    "_POSITION_EMBEDDING_GLOBAL_RANKS", "_PIPELINE_GLOBAL_RANKS", "_DATA_PARALLEL_GLOBAL_RANKS",
    "_TENSOR_MODEL_PARALLEL_GLOBAL_RANKS", "_MODEL_PARALLEL_GLOBAL_RANKS",
    "_CONTEXT_PARALLEL_GROUP", "_CONTEXT_PARALLEL_GLOBAL_RANKS",
    "_HIERARCHICAL_CONTEXT_PARALLEL_GROUPS", "_DATA_PARALLEL_GROUP_WITH_CP",
    "_DATA_PARALLEL_GROUP_WITH_CP_GLOO", "_DATA_PARALLEL_GLOBAL_RANKS_WITH_CP",
    "_INTRA_PARTIAL_DATA_PARALLEL_GROUP_WITH_CP", "_INTRA_PARTIAL_DATA_PARALLEL_GROUP_WITH_CP_GLOO",
    "_TENSOR_AND_CONTEXT_PARALLEL_GROUP", "_TENSOR_AND_DATA_PARALLEL_GROUP_WITH_CP",
    "_INTRA_DISTRIBUTED_OPTIMIZER_INSTANCE_GROUP", "_GLOBAL_MEMORY_BUFFER")
HEAD_ONLY_GLOBALS = (
    "_GTP_WEIGHT_REMAT_GROUP", "_GTP_WEIGHT_REMAT_GLOBAL_RANKS", "_EXPERT_GTP_WEIGHT_REMAT_GROUP",
    "_EXPERT_GTP_WEIGHT_REMAT_GLOBAL_RANKS", "_EXPERT_TENSOR_MODEL_PIPELINE_PARALLEL_GROUP_WITH_EGTP",
    "_EXPERT_DATA_PARALLEL_GROUP_WITH_GTP_REMAT",
    "_INTRA_PARTIAL_EXPERT_DATA_PARALLEL_GROUP_WITH_GTP_REMAT", "_EXPERT_MODEL_PARALLEL_RANKS",
    "_HYBRID_DP_CP_GROUPS", "_DATA_PARALLEL_GROUP_WITH_GTP_REMAT",
    "_DATA_PARALLEL_GROUP_WITH_CP_WITH_GTP_REMAT",
    "_INTRA_PARTIAL_DATA_PARALLEL_GROUP_WITH_CP_WITH_GTP_REMAT", "_global_process_group_list")
SEED_GLOBALS = COMMON_GLOBALS + SEED_ONLY_GLOBALS
HEAD_GLOBALS = COMMON_GLOBALS + HEAD_ONLY_GLOBALS
ALL_GLOBALS = COMMON_GLOBALS + SEED_ONLY_GLOBALS + HEAD_ONLY_GLOBALS

# commgrid's kind -> the global that holds this rank's group of it (hcp: list per level,
# hybrid_dp_cp: dict by group size, as Megatron keeps them).
GROUP_GLOBAL = {
    "tp": "_TENSOR_MODEL_PARALLEL_GROUP", "pp": "_PIPELINE_MODEL_PARALLEL_GROUP",
    "mp": "_MODEL_PARALLEL_GROUP", "embd": "_EMBEDDING_GROUP",
    "pos_embd": "_POSITION_EMBEDDING_GROUP", "dp": "_DATA_PARALLEL_GROUP",
    "dp_cp": "_DATA_PARALLEL_GROUP_WITH_CP", "intra_dp_cp": "_INTRA_PARTIAL_DATA_PARALLEL_GROUP_WITH_CP",
    "cp": "_CONTEXT_PARALLEL_GROUP", "hcp": "_HIERARCHICAL_CONTEXT_PARALLEL_GROUPS",
    "tp_dp": "_TENSOR_AND_DATA_PARALLEL_GROUP", "tp_dp_cp": "_TENSOR_AND_DATA_PARALLEL_GROUP_WITH_CP",
    "tp_cp": "_TENSOR_AND_CONTEXT_PARALLEL_GROUP", "ep": "_EXPERT_MODEL_PARALLEL_GROUP",
    "expt_tp": "_EXPERT_TENSOR_PARALLEL_GROUP", "tp_ep": "_EXPERT_TENSOR_AND_MODEL_PARALLEL_GROUP",
    "tp_ep_pp": "_EXPERT_TENSOR_MODEL_PIPELINE_PARALLEL_GROUP",
    "expt_dp": "_EXPERT_DATA_PARALLEL_GROUP", "intra_expt_dp": "_INTRA_PARTIAL_EXPERT_DATA_PARALLEL_GROUP",
    "inter_dist_opt": "_INTER_PARTIAL_EXPERT_DATA_PARALLEL_GROUP",
    "intra_dist_opt": "_INTRA_DISTRIBUTED_OPTIMIZER_INSTANCE_GROUP",
    "gtp_remat": "_GTP_WEIGHT_REMAT_GROUP", "expt_gtp_remat": "_EXPERT_GTP_WEIGHT_REMAT_GROUP",
    "dp_gtp_remat": "_DATA_PARALLEL_GROUP_WITH_GTP_REMAT",
    "dp_cp_gtp_remat": "_DATA_PARALLEL_GROUP_WITH_CP_WITH_GTP_REMAT",
    "expt_dp_gtp_remat": "_EXPERT_DATA_PARALLEL_GROUP_WITH_GTP_REMAT",
    "tp_ep_pp_with_egtp_remat": "_EXPERT_TENSOR_MODEL_PIPELINE_PARALLEL_GROUP_WITH_EGTP",
    "hybrid_dp_cp": "_HYBRID_DP_CP_GROUPS",
}
# The Gloo twins Megatron keeps (it also creates twins of inter_dist_opt and drops them).
GLOO_GLOBAL = {
    "dp": "_DATA_PARALLEL_GROUP_GLOO", "dp_cp": "_DATA_PARALLEL_GROUP_WITH_CP_GLOO",
    "intra_dp_cp": "_INTRA_PARTIAL_DATA_PARALLEL_GROUP_WITH_CP_GLOO",
    "expt_dp": "_EXPERT_DATA_PARALLEL_GROUP_GLOO",
    "intra_expt_dp": "_INTRA_PARTIAL_EXPERT_DATA_PARALLEL_GROUP_GLOO",
}
# The global-rank lists Megatron keeps.
RANKS_GLOBAL = {
    "tp": "_TENSOR_MODEL_PARALLEL_GLOBAL_RANKS", "pp": "_PIPELINE_GLOBAL_RANKS",
    "mp": "_MODEL_PARALLEL_GLOBAL_RANKS", "dp": "_DATA_PARALLEL_GLOBAL_RANKS",
    "dp_cp": "_DATA_PARALLEL_GLOBAL_RANKS_WITH_CP", "cp": "_CONTEXT_PARALLEL_GLOBAL_RANKS",
    "embd": "_EMBEDDING_GLOBAL_RANKS", "pos_embd": "_POSITION_EMBEDDING_GLOBAL_RANKS",
    "gtp_remat": "_GTP_WEIGHT_REMAT_GLOBAL_RANKS",
    "expt_gtp_remat": "_EXPERT_GTP_WEIGHT_REMAT_GLOBAL_RANKS", "ep": "_EXPERT_MODEL_PARALLEL_RANKS",
}


class ParallelState:
    """Megatron's globals (``vars``, every one None until initialized) plus commgrid's own
    bookkeeping: the layout, this rank, its members of every kind, the creation calls."""

    def __init__(self):
        self.vars = {}
        self.reset()

    def reset(self):
        # In place: the facades hold this dict.
        self.vars.clear()
        self.vars.update(dict.fromkeys(ALL_GLOBALS))
        self.vars["_HYBRID_DP_CP_GROUPS"] = {}
        self.layout = None          # commgrid.Layout of the initialized configuration
        self.rank = None            # this process's global rank
        self.compat = None          # "seed" or "head"
        self.ranks = {}             # kind -> this rank's members (hcp, hybrid: one per level)
        self.creation_calls = 0     # new_group calls this rank made
        self.creation = None        # "megatron" or "local"

    @property
    def initialized(self):
        """Megatron's is_initialized(): the dp group exists."""
        return self.vars["_DATA_PARALLEL_GROUP"] is not None

    def group(self, kind):
        """The handle of this rank's group of the kind (hcp: the list per level); None when
        it has none or the state is not initialized."""
        return self.vars.get(GROUP_GLOBAL[kind])


STATE = ParallelState()
