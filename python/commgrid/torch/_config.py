"""The arguments of Megatron-core's initialize_model_parallel as one value, and the core's
validation of them with Megatron's exception types."""

from dataclasses import dataclass
from typing import Callable, List, Optional

from ..errors import (ConfigError, DivisibilityError, IncompatibleError, OrderError, OverflowError,
                      as_builtin)
from ..layout import Layout


@dataclass
class InitArgs:
    """initialize_model_parallel's arguments under Megatron-core's names (the seed's and
    HEAD's), plus commgrid's ``compat`` ("seed" or "head"), ``creation``,
    ``gloo_connection``, ``gloo_device`` and ``share_identical_groups``. Each facade fills
    one from its own signature; nothing renames them on the way to the Layout."""

    compat: str = "seed"
    creation: str = "auto"
    gloo_connection: str = "auto"
    gloo_device: str = "auto"
    share_identical_groups: object = "auto"
    tensor_model_parallel_size: int = 1
    pipeline_model_parallel_size: int = 1
    virtual_pipeline_model_parallel_size: Optional[int] = None
    pipeline_model_parallel_split_rank: Optional[int] = None
    pipeline_model_parallel_comm_backend: Optional[str] = None
    use_sharp: bool = False
    context_parallel_size: int = 1
    hierarchical_context_parallel_sizes: Optional[List[int]] = None
    hybrid_context_parallel: bool = False
    expert_model_parallel_size: int = 1
    gtp_remat_size: int = 1
    expert_gtp_remat_size: int = 1
    num_distributed_optimizer_instances: int = 1
    expert_tensor_parallel_size: Optional[int] = None
    nccl_communicator_config_path: Optional[str] = None
    distributed_timeout_minutes: int = 30
    order: str = "tp-cp-ep-dp-pp"
    encoder_tensor_model_parallel_size: int = 0
    encoder_pipeline_model_parallel_size: int = 0
    get_embedding_ranks: Optional[Callable] = None
    get_position_embedding_ranks: Optional[Callable] = None
    create_gloo_process_groups: bool = True
    high_priority_stream_groups: Optional[List[str]] = None
    sharp_enabled_group: Optional[str] = None
    rank_offset: int = 0
    local_world_size: Optional[int] = None

    @property
    def head(self):
        return self.compat == "head"

    def layout_kwargs(self):
        """The keywords of the core's Layout for these arguments (the one place where
        Megatron's names become commgrid's short ones)."""
        kw = dict(tp=self.tensor_model_parallel_size, pp=self.pipeline_model_parallel_size,
                  cp=self.context_parallel_size, ep=self.expert_model_parallel_size,
                  etp=self.expert_tensor_parallel_size,
                  hcp=self.hierarchical_context_parallel_sizes or None,
                  dist_opt_instances=self.num_distributed_optimizer_instances,
                  vpp=self.virtual_pipeline_model_parallel_size, order=self.order,
                  embedding_ranks=self.get_embedding_ranks,
                  position_embedding_ranks=self.get_position_embedding_ranks)
        if self.head:
            kw.update(compat="head", gtp_remat=self.gtp_remat_size,
                      expert_gtp_remat=self.expert_gtp_remat_size,
                      hybrid_context_parallel=self.hybrid_context_parallel,
                      rank_offset=self.rank_offset, local_world_size=self.local_world_size)
        return kw


def megatron_type(error):
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


def make_layout(world_size, **kwargs):
    """The core's Layout; a bad configuration raises its commgrid error as Megatron's type."""
    try:
        return Layout(world_size, **kwargs)
    except ConfigError as e:
        builtin = megatron_type(e)
        if builtin is None:
            raise
        raise as_builtin(e, builtin).with_traceback(e.__traceback__) from None
