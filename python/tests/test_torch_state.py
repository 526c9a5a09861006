"""commgrid.torch and commgrid.torch.head as drop-ins for Megatron-core's parallel_state,
without processes (torch.distributed is replaced by a recorder, as in
test_torch_creation.py): the exception types Megatron raises, the module globals, the names
of both editions, the encoder split's getters, the global memory buffer, compat="head",
create_all_gather_groups and the hybrid getters. Real groups: test_torch.py."""

import pytest

torch = pytest.importorskip("torch", reason="python3-torch is not installed")

import commgrid  # noqa: E402
import commgrid.torch as mpu  # noqa: E402
import commgrid.torch.head as head  # noqa: E402
from commgrid._state import STATE  # noqa: E402

# The public functions of Megatron-core's parallel_state at the seed (8c1e094afe) and at
# HEAD (d98e8a64dd), by name.
SEED_NAMES = """RankGenerator create_group create_hierarchical_groups default_embedding_ranks
default_position_embedding_ranks destroy_global_memory_buffer destroy_model_parallel
generate_masked_orthogonal_rank_groups get_all_ranks get_amax_reduction_group
get_context_parallel_global_ranks get_context_parallel_group get_context_parallel_rank
get_context_parallel_world_size get_data_modulo_expert_parallel_group get_data_parallel_group
get_data_parallel_group_gloo get_data_parallel_rank get_data_parallel_src_rank
get_data_parallel_world_size get_embedding_group get_expert_data_parallel_group
get_expert_data_parallel_group_gloo get_expert_data_parallel_rank
get_expert_data_parallel_world_size get_expert_model_parallel_group get_expert_model_parallel_rank
get_expert_model_parallel_world_size get_expert_tensor_and_model_parallel_group
get_expert_tensor_and_model_parallel_rank get_expert_tensor_and_model_parallel_world_size
get_expert_tensor_model_pipeline_parallel_group get_expert_tensor_parallel_group
get_expert_tensor_parallel_rank get_expert_tensor_parallel_world_size get_global_memory_buffer
get_hierarchical_context_parallel_groups get_inter_distributed_optimizer_instance_group
get_intra_distributed_optimizer_instance_group get_model_parallel_group get_model_parallel_src_rank
get_nccl_options get_pipeline_model_parallel_decoder_start get_pipeline_model_parallel_first_rank
get_pipeline_model_parallel_group get_pipeline_model_parallel_last_rank
get_pipeline_model_parallel_next_rank get_pipeline_model_parallel_prev_rank
get_pipeline_model_parallel_rank get_pipeline_model_parallel_split_rank
get_pipeline_model_parallel_world_size get_position_embedding_group
get_tensor_and_context_parallel_group get_tensor_and_context_parallel_rank
get_tensor_and_context_parallel_world_size get_tensor_and_data_parallel_group
get_tensor_model_parallel_group get_tensor_model_parallel_rank get_tensor_model_parallel_src_rank
get_tensor_model_parallel_world_size get_virtual_pipeline_model_parallel_rank
get_virtual_pipeline_model_parallel_world_size initialize_model_parallel is_initialized
is_inside_decoder is_inside_encoder is_pipeline_first_stage is_pipeline_last_stage
is_pipeline_stage_after_split is_pipeline_stage_at_split is_pipeline_stage_before_split
is_rank_in_embedding_group is_rank_in_position_embedding_group is_unitialized
model_parallel_is_initialized set_data_parallel_rank set_expert_model_parallel_rank
set_expert_model_parallel_world_size set_expert_tensor_parallel_rank
set_expert_tensor_parallel_world_size set_pipeline_model_parallel_rank
set_pipeline_model_parallel_split_rank set_pipeline_model_parallel_world_size
set_tensor_model_parallel_rank set_tensor_model_parallel_world_size
set_virtual_pipeline_model_parallel_rank set_virtual_pipeline_model_parallel_world_size""".split()
HEAD_ONLY_NAMES = """create_all_gather_groups create_hybrid_dp_cp_groups
get_expert_gtp_weight_remat_global_ranks get_expert_gtp_weight_remat_group
get_expert_gtp_weight_remat_rank get_expert_gtp_weight_remat_world_size
get_expert_model_parallel_src_rank get_gtp_weight_remat_global_ranks get_gtp_weight_remat_group
get_gtp_weight_remat_rank get_gtp_weight_remat_world_size get_hybrid_data_context_parallel_groups
overwrite_nccl_comm_cfgs update_pg_timeout""".split()
SEED_ONLY_NAMES = """get_data_modulo_expert_parallel_group get_pipeline_model_parallel_decoder_start
get_pipeline_model_parallel_split_rank is_inside_decoder is_inside_encoder
is_pipeline_stage_after_split is_pipeline_stage_at_split is_pipeline_stage_before_split
is_unitialized set_pipeline_model_parallel_split_rank""".split()


class Group:
    def __init__(self, ranks, me):
        self.ranks, self.me = sorted(ranks), me

    def size(self):
        return len(self.ranks)

    def rank(self):
        return self.ranks.index(self.me)


@pytest.fixture
def world(monkeypatch):
    """A recorder world: world(W, rank) makes torch.distributed answer as rank of W."""
    calls = []

    def make(size, rank):
        d = torch.distributed
        monkeypatch.setattr(d, "is_initialized", lambda: True)
        monkeypatch.setattr(d, "get_world_size", lambda group=None: size if group is None else group.size())
        monkeypatch.setattr(d, "get_rank", lambda group=None: rank if group is None else group.rank())

        def new_group(ranks=None, timeout=None, backend=None, pg_options=None):
            calls.append((tuple(ranks), backend))
            return Group(ranks, rank)
        monkeypatch.setattr(d, "new_group", new_group)
        return calls
    yield make
    STATE.reset()


def test_every_public_name_of_both_editions():
    assert [n for n in SEED_NAMES if not callable(getattr(mpu, n, None))] == []
    assert [n for n in SEED_NAMES + HEAD_ONLY_NAMES if n not in SEED_ONLY_NAMES
            and not callable(getattr(head, n, None))] == []
    # HEAD's module has none of the seed's encoder-split functions, as HEAD.
    assert [n for n in SEED_ONLY_NAMES if hasattr(head, n)] == []


def test_arguments_in_each_editions_order():
    import inspect
    seed = list(inspect.signature(mpu.initialize_model_parallel).parameters)
    assert seed[:4] == ["tensor_model_parallel_size", "pipeline_model_parallel_size",
                        "virtual_pipeline_model_parallel_size", "pipeline_model_parallel_split_rank"]
    assert seed[14:19] == ["encoder_tensor_model_parallel_size", "encoder_pipeline_model_parallel_size",
                           "get_embedding_ranks", "get_position_embedding_ranks",
                           "create_gloo_process_groups"]
    h = list(inspect.signature(head.initialize_model_parallel).parameters)
    assert h[3:11] == ["pipeline_model_parallel_comm_backend", "use_sharp", "context_parallel_size",
                       "hierarchical_context_parallel_sizes", "hybrid_context_parallel",
                       "expert_model_parallel_size", "gtp_remat_size", "expert_gtp_remat_size"]
    # HEAD's arguments in its order, then commgrid's own (keyword-only).
    assert h[-8:] == ["high_priority_stream_groups", "sharp_enabled_group", "rank_offset",
                      "local_world_size", "creation", "gloo_connection", "gloo_device",
                      "share_identical_groups"]
    assert list(inspect.signature(head.get_data_parallel_group).parameters) == [
        "with_context_parallel", "with_gtp_remat", "partial_data_parallel"]
    assert list(inspect.signature(head.get_tensor_and_data_parallel_group).parameters) == [
        "check_initialized", "with_context_parallel"]
    assert list(inspect.signature(mpu.get_tensor_and_data_parallel_group).parameters) == [
        "with_context_parallel"]


def test_initialize_before_init_process_group_is_an_assertion(monkeypatch):
    monkeypatch.setattr(torch.distributed, "is_initialized", lambda: False)
    for module in (mpu, head):
        with pytest.raises(AssertionError):
            module.initialize_model_parallel()
        with pytest.raises(commgrid.StateError, match="init_process_group"):
            module.initialize_model_parallel()


@pytest.mark.parametrize("kwargs, builtin, cls", [
    (dict(tensor_model_parallel_size=16), RuntimeError, commgrid.DivisibilityError),
    (dict(pipeline_model_parallel_size=16), RuntimeError, commgrid.DivisibilityError),
    (dict(tensor_model_parallel_size=8, pipeline_model_parallel_size=8), RuntimeError,
     commgrid.DivisibilityError),
    (dict(virtual_pipeline_model_parallel_size=2), RuntimeError, commgrid.IncompatibleError),
    (dict(expert_model_parallel_size=3), RuntimeError, commgrid.DivisibilityError),
    (dict(num_distributed_optimizer_instances=3), AssertionError, commgrid.DivisibilityError),
    (dict(pipeline_model_parallel_size=2, expert_model_parallel_size=2, order="tp-pp-ep-dp"),
     AssertionError, commgrid.IncompatibleError),
])
def test_bad_configs_raise_megatrons_type_and_commgrids(world, kwargs, builtin, cls):
    calls = world(8, 0)
    for module in (mpu, head):
        with pytest.raises(builtin) as caught:
            module.initialize_model_parallel(**kwargs)
        assert isinstance(caught.value, cls) and isinstance(caught.value, commgrid.ConfigError)
        assert caught.value.parameter  # the core names the parameter
    assert calls == [] and not mpu.is_initialized()  # nothing was created


def test_getters_assert_when_absent_and_after_destroy(world):
    world(8, 0)
    with pytest.raises(AssertionError, match="tensor model parallel group is not initialized"):
        mpu.get_tensor_model_parallel_group()
    mpu.initialize_model_parallel(tensor_model_parallel_size=2)
    assert mpu.get_tensor_model_parallel_group().ranks == [0, 1]
    with pytest.raises(AssertionError):  # one dist-opt instance: no inter group
        mpu.get_inter_distributed_optimizer_instance_group()
    with pytest.raises(commgrid.StateError):
        head.get_inter_distributed_optimizer_instance_group()
    assert head.get_inter_distributed_optimizer_instance_group(check_initialized=False) is None
    with pytest.raises(AssertionError, match="Partial DP for Optimizer needs to include CP"):
        mpu.get_data_parallel_group(partial_data_parallel=True)
    with pytest.raises(AssertionError, match="already initialized"):
        mpu.initialize_model_parallel(tensor_model_parallel_size=2)
    mpu.destroy_model_parallel()
    for getter in (mpu.get_tensor_model_parallel_group, mpu.get_tensor_model_parallel_src_rank,
                   mpu.get_pipeline_model_parallel_first_rank, mpu.get_global_memory_buffer):
        with pytest.raises(AssertionError):
            getter()
        with pytest.raises(commgrid.StateError):
            getter()


def test_module_globals_read_and_assign_the_state(world):
    world(8, 3)
    assert mpu._MODEL_PARALLEL_GROUP is None and head._GTP_WEIGHT_REMAT_GROUP is None
    assert "_TENSOR_MODEL_PARALLEL_GROUP" in dir(mpu)
    mpu.initialize_model_parallel(tensor_model_parallel_size=4, expert_model_parallel_size=2)
    assert mpu._TENSOR_MODEL_PARALLEL_GLOBAL_RANKS == [0, 1, 2, 3]
    assert mpu._MODEL_PARALLEL_GROUP is mpu.get_model_parallel_group()
    assert head._DATA_PARALLEL_GROUP is mpu.get_data_parallel_group()  # one state for both
    # Megatron's MoE code reassigns these and expects the getters to follow.
    mpu._MPU_TENSOR_MODEL_PARALLEL_RANK = 7
    mpu._MPU_TENSOR_MODEL_PARALLEL_WORLD_SIZE = 9
    assert mpu.get_tensor_model_parallel_rank() == 7 and mpu.get_tensor_model_parallel_world_size() == 9
    assert mpu.get_expert_tensor_parallel_rank() == 3  # its own group wins
    other = Group([0, 3], 3)
    mpu._TENSOR_MODEL_PARALLEL_GROUP = other
    assert mpu.get_tensor_model_parallel_group() is other
    mpu._MPU_TENSOR_MODEL_PARALLEL_RANK = None
    assert mpu.get_tensor_model_parallel_rank() == 1  # rank 3 in [0, 3]
    from commgrid.torch import _TENSOR_MODEL_PARALLEL_GROUP as imported
    assert imported is other
    mpu.destroy_model_parallel()
    assert mpu._MODEL_PARALLEL_GROUP is None and mpu._TENSOR_MODEL_PARALLEL_GROUP is None
    assert not mpu.is_initialized()
    with pytest.raises(AttributeError):
        mpu._NOT_A_MEGATRON_GLOBAL  # noqa: B018
    with pytest.raises(AttributeError):
        head._PIPELINE_MODEL_PARALLEL_DECODER_START  # noqa: B018  (a seed global)


def test_assigning_the_dp_group_decides_is_initialized(world):
    world(8, 0)
    mpu.initialize_model_parallel()
    assert mpu.is_initialized() and mpu.model_parallel_is_initialized()
    mpu._DATA_PARALLEL_GROUP = None
    assert not mpu.is_initialized() and not mpu.model_parallel_is_initialized()


@pytest.mark.parametrize("rank, tp_size, pipelines", [(0, 3, 2), (1, 3, 2), (2, 3, 1), (5, 5, 1)])
def test_encoder_split_getters(world, rank, tp_size, pipelines):
    # The seed's encoder split: encoder tp 3 on ranks 0-2, decoder tp 5 on ranks 3-7; the
    # encoder's ranks 0 and 1 each feed two decoder pipelines.
    world(8, rank)
    mpu.initialize_model_parallel(tensor_model_parallel_size=5, encoder_tensor_model_parallel_size=3,
                                  encoder_pipeline_model_parallel_size=1)
    assert mpu.get_tensor_model_parallel_world_size() == tp_size
    assert mpu.get_pipeline_model_parallel_decoder_start() == 1
    last = mpu.get_pipeline_model_parallel_last_rank()
    if pipelines > 1:
        assert isinstance(mpu._PIPELINE_GLOBAL_RANKS[0], list) and len(last) == pipelines
        assert mpu.get_pipeline_model_parallel_next_rank() == last
    else:
        assert isinstance(last, int)
    stage = mpu.get_pipeline_model_parallel_rank()
    assert mpu.is_inside_encoder() == (stage == 0) and mpu.is_inside_decoder() == (stage >= 1)
    assert len(mpu.get_model_parallel_group().ranks) == 8


def test_without_an_encoder_stage_zero_is_inside_the_encoder(world):
    world(8, 2)
    mpu.initialize_model_parallel(pipeline_model_parallel_size=4)
    assert mpu.get_pipeline_model_parallel_decoder_start() is None
    assert mpu.get_pipeline_model_parallel_rank() == 1
    assert not mpu.is_inside_encoder() and mpu.is_inside_decoder()
    assert mpu.is_inside_encoder(rank=0)


def test_global_memory_buffer(world):
    world(8, 0)
    mpu.initialize_model_parallel()
    buf = mpu.get_global_memory_buffer()
    a = buf.get_tensor((2, 3), torch.float32, "x")
    assert a.shape == (2, 3) and a.dtype == torch.float32
    b = buf.get_tensor((6,), torch.float32, "x")
    assert b.data_ptr() == a.data_ptr()  # the same buffer, reused
    c = buf.get_tensor((4, 4), torch.float32, "x")  # larger: a new buffer
    assert c.numel() == 16 and buf.get_tensor((3,), torch.int64, "x").dtype == torch.int64
    mpu.destroy_global_memory_buffer()
    with pytest.raises(AssertionError, match="global memory buffer is not initialized"):
        mpu.get_global_memory_buffer()


def test_compat_head_through_commgrid_torch(world):
    calls = world(8, 0)
    kwargs = dict(tensor_model_parallel_size=2, gtp_remat_size=2)
    mpu.initialize_model_parallel(compat="head", **kwargs)
    via_seed_module = list(calls)
    assert head.get_gtp_weight_remat_world_size() == 2 and mpu.get_gtp_weight_remat_rank() == 0
    assert head.get_data_parallel_world_size() == 4 and head.get_data_parallel_world_size(with_gtp_remat=False) == 2
    mpu.destroy_model_parallel()
    calls.clear()
    head.initialize_model_parallel(**kwargs)
    assert calls == via_seed_module
    head.destroy_model_parallel()
    with pytest.raises(TypeError, match="gtp_remat_size"):  # a HEAD argument needs compat="head"
        mpu.initialize_model_parallel(gtp_remat_size=2)


def test_create_all_gather_groups(world):
    with pytest.raises(RuntimeError, match="requires parallel state to be initialized"):
        head.create_all_gather_groups()
    calls = world(8, 5)
    head.initialize_model_parallel(context_parallel_size=2, expert_model_parallel_size=2)
    before = len(calls)
    dp_cp_ag, expt_ag = head.create_all_gather_groups(for_expert_parallelism=True)
    assert dp_cp_ag.ranks == head.get_data_parallel_group(with_context_parallel=True).ranks
    assert expt_ag.ranks == head.get_expert_data_parallel_group().ranks
    assert dp_cp_ag is not head.get_data_parallel_group(with_context_parallel=True)
    assert len(calls) - before == 1 + 2  # one dp_cp group of 8; two expert dp groups of 4
    pgc = commgrid.ProcessGroupCollection.use_mpu_process_groups()
    assert pgc.dp_cp_ag is None and pgc.expt_dp_ag is None


def test_hybrid_groups(world):
    world(8, 6)
    head.initialize_model_parallel(context_parallel_size=2, hybrid_context_parallel=True)
    assert head.get_hybrid_data_context_parallel_groups(group_size=2).ranks == [6, 7]
    assert head.get_hybrid_data_context_parallel_groups(group_size=4).ranks == [4, 5, 6, 7]
    assert head.get_hybrid_data_context_parallel_groups(group_size=8) is head.get_data_parallel_group(
        with_context_parallel=True, with_gtp_remat=False)
    assert sorted(head._HYBRID_DP_CP_GROUPS) == [2, 4]
    with pytest.raises(KeyError):
        head.get_hybrid_data_context_parallel_groups(group_size=16)


def test_head_getters_with_gtp_remat(world):
    world(16, 1)
    head.initialize_model_parallel(tensor_model_parallel_size=2, gtp_remat_size=2,
                                   expert_model_parallel_size=2)
    assert head.get_gtp_weight_remat_global_ranks() == [1, 3]
    assert head.get_data_parallel_group().ranks == [1, 3, 5, 7, 9, 11, 13, 15]  # with gtp_remat
    assert head.get_data_parallel_group(with_gtp_remat=False).ranks == [1, 5, 9, 13]
    # gtp_remat > 1: HEAD builds no Gloo groups at all.
    with pytest.raises(AssertionError):
        head.get_data_parallel_group_gloo()
    assert head.get_all_ranks() == "1_0_0_0_0_0"
    pgc = commgrid.ProcessGroupCollection.use_mpu_process_groups()
    assert pgc.dp.ranks == [1, 5, 9, 13] and pgc.dp_cp_gtp_remat.ranks == head.get_data_parallel_group(
        with_context_parallel=True).ranks
    assert pgc.gtp_remat is head.get_gtp_weight_remat_group()
    assert pgc.tp_ep_pp_with_egtp_remat is head.get_expert_tensor_model_pipeline_parallel_group(
        with_egtp_remat=True)


def test_head_vp_stage(world):
    world(8, 0)
    head.initialize_model_parallel(pipeline_model_parallel_size=2, virtual_pipeline_model_parallel_size=2)
    assert head.is_pipeline_first_stage()  # HEAD's default ignores the virtual stage
    with pytest.raises(AssertionError, match="vp_stage must be passed"):
        head.is_pipeline_first_stage(ignore_virtual=False)
    assert head.is_pipeline_first_stage(ignore_virtual=False, vp_stage=0)
    assert not head.is_pipeline_first_stage(ignore_virtual=False, vp_stage=1)
    assert not mpu.is_pipeline_last_stage()  # the seed's reads the virtual rank (0 of 2)
