"""Megatron-core's group collections (megatron/core/process_groups_config.py): the seed's
two (ModelCommProcessGroups, GradCommProcessGroups: fields unset until assigned) and HEAD's
ProcessGroupCollection (fields None until assigned), with their exact behaviour. They read
the state that commgrid.torch fills, through Megatron's getters (commgrid._groups); no torch
is imported here."""

from dataclasses import dataclass, field, fields
from functools import partial
from typing import Any, Dict, List, Optional

from . import _groups as g
from ._state import STATE


def _read_state(name):
    # The seed reads parallel_state's getters with check_initialized=False: a kind that
    # was not built, or has no group containing this rank, reads as None.
    return STATE.group(name)


def _set_from_kwargs(obj, kwargs):
    names = [f.name for f in fields(obj)]
    for key in kwargs:
        if key in names:
            setattr(obj, key, kwargs[key])
        else:
            raise ValueError(f"Unknown attribute: {key}")


def _from_state(cls, required_pgs):
    all_pgs = {f.name for f in fields(cls)}
    if required_pgs is None:
        required_pgs = list(all_pgs)
    invalid_pgs = [pg for pg in required_pgs if pg not in all_pgs]
    if invalid_pgs:
        raise ValueError(f"Invalid process groups requested: {invalid_pgs}")
    return cls(**{pg: _read_state(pg) for pg in required_pgs})


@dataclass
class ModelCommProcessGroups:
    """The groups a model's layers use. Construct with any subset of the fields as
    keywords (an unknown one raises ``ValueError("Unknown attribute: ...")``), assign
    fields later, or fill from the state with :meth:`use_mpu_process_groups`. A field
    never set does not exist (reading it raises AttributeError)."""

    tp: Any = field(init=False)
    pp: Any = field(init=False)
    mp: Any = field(init=False)
    embd: Any = field(init=False)
    pos_embd: Any = field(init=False)
    cp: Any = field(init=False)
    tp_cp: Any = field(init=False)
    hcp: List[Any] = field(init=False)
    ep: Any = field(init=False)
    expt_tp: Any = field(init=False)
    tp_ep: Any = field(init=False)
    tp_ep_pp: Any = field(init=False)
    expt_dp: Any = field(init=False)

    def __init__(self, **kwargs):
        _set_from_kwargs(self, kwargs)

    @classmethod
    def use_mpu_process_groups(cls, required_pgs: Optional[List[str]] = None):
        """The requested fields (all when None) from commgrid.torch's state; a kind this
        rank has no group of (or that was not built) becomes None. Names that are not
        fields raise ``ValueError("Invalid process groups requested: [...]")`` before
        anything is read; fields not requested stay unset."""
        return _from_state(cls, required_pgs)


@dataclass
class GradCommProcessGroups:
    """The groups gradient reduction and the distributed optimizer use. As in the seed,
    ``GradCommProcessGroups()`` has every field unset; commgrid also accepts the fields as
    keywords and offers ``use_mpu_process_groups`` (the seed has neither for this class)."""

    dp: Any = field(init=False)
    dp_cp: Any = field(init=False)
    expt_dp: Any = field(init=False)
    intra_dp_cp: Any = field(init=False)
    intra_expt_dp: Any = field(init=False)
    inter_dist_opt: Any = field(init=False)

    def __init__(self, **kwargs):
        _set_from_kwargs(self, kwargs)

    @classmethod
    def use_mpu_process_groups(cls, required_pgs: Optional[List[str]] = None):
        """As ModelCommProcessGroups.use_mpu_process_groups, for the six gradient groups."""
        return _from_state(cls, required_pgs)


# HEAD's use_mpu_process_groups: each field from the getter Megatron reads it with.
_HEAD_SOURCES = {
    "tp": partial(g.get_tensor_model_parallel_group, check_initialized=False),
    "pp": partial(g.get_pipeline_model_parallel_group, check_initialized=False),
    "mp": partial(g.get_model_parallel_group, check_initialized=False),
    "embd": partial(g.get_embedding_group, check_initialized=False),
    "pos_embd": partial(g.get_position_embedding_group, check_initialized=False),
    "cp": partial(g.get_context_parallel_group, check_initialized=False),
    "tp_cp": partial(g.get_tensor_and_context_parallel_group, check_initialized=False),
    "hcp": partial(g.get_hierarchical_context_parallel_groups, check_initialized=False),
    "ep": partial(g.get_expert_model_parallel_group, check_initialized=False),
    "expt_tp": partial(g.get_expert_tensor_parallel_group, check_initialized=False),
    "tp_ep": partial(g.get_expert_tensor_and_model_parallel_group, check_initialized=False),
    "tp_ep_pp": partial(g.get_expert_tensor_model_pipeline_parallel_group_head, check_initialized=False),
    "tp_ep_pp_with_egtp_remat": partial(g.get_expert_tensor_model_pipeline_parallel_group_head,
                                        check_initialized=False, with_egtp_remat=True),
    "tp_dp_cp": partial(g.get_tensor_and_data_parallel_group_head, check_initialized=False,
                        with_context_parallel=True),
    # As HEAD: the data-parallel fields are read with the "is initialized" check.
    "dp": partial(g.get_data_parallel_group_head, with_gtp_remat=False),
    "dp_cp": partial(g.get_data_parallel_group_head, with_context_parallel=True, with_gtp_remat=False),
    "dp_cp_gtp_remat": partial(g.get_data_parallel_group_head, with_context_parallel=True),
    "dp_cp_ag": lambda: None,
    "gtp_remat": partial(g.get_gtp_weight_remat_group, check_initialized=False),
    "expt_gtp_remat": partial(g.get_expert_gtp_weight_remat_group, check_initialized=False),
    "expt_dp": partial(g.get_expert_data_parallel_group_head, check_initialized=False,
                       with_gtp_remat=False),
    "expt_dp_gtp_remat": partial(g.get_expert_data_parallel_group_head, check_initialized=False),
    "expt_dp_ag": lambda: None,
    "intra_dp_cp": partial(g.get_data_parallel_group_head, with_context_parallel=True,
                           with_gtp_remat=False, partial_data_parallel=True),
    "intra_expt_dp": partial(g.get_expert_data_parallel_group_head, check_initialized=False,
                             with_gtp_remat=False, partial_expert_data_parallel=True),
    "inter_dist_opt": partial(g.get_inter_distributed_optimizer_instance_group, check_initialized=False),
    "intra_dist_opt": partial(g.get_intra_distributed_optimizer_instance_group, check_initialized=False),
}


@dataclass
class ProcessGroupCollection:
    """Megatron-core HEAD's ProcessGroupCollection (d98e8a64dd): one collection of every
    group a model, its gradients and the optimizer use. Construct with any subset of the
    fields as keywords (an unknown one raises ``ValueError("Unknown attribute: ...")``) or
    assign them later; a field never set reads as None (an undeclared name still raises
    AttributeError). ``repr`` lists the fields that are set and not None with their sizes."""

    tp: Any = field(init=False)
    pp: Any = field(init=False)
    mp: Any = field(init=False)
    embd: Any = field(init=False)
    pos_embd: Any = field(init=False)
    cp: Any = field(init=False)
    tp_cp: Any = field(init=False)
    hcp: List[Any] = field(init=False)
    ep: Any = field(init=False)
    expt_tp: Any = field(init=False)
    tp_ep: Any = field(init=False)
    tp_ep_pp: Any = field(init=False)
    tp_ep_pp_with_egtp_remat: Any = field(init=False)
    tp_dp_cp: Any = field(init=False)
    dp: Any = field(init=False)
    dp_cp: Any = field(init=False)
    dp_cp_gtp_remat: Any = field(init=False)
    dp_cp_ag: Any = field(init=False)
    gtp_remat: Any = field(init=False)
    expt_gtp_remat: Any = field(init=False)
    expt_dp: Any = field(init=False)
    expt_dp_gtp_remat: Any = field(init=False)
    expt_dp_ag: Any = field(init=False)
    intra_dp_cp: Any = field(init=False)
    intra_expt_dp: Any = field(init=False)
    inter_dist_opt: Any = field(init=False)
    intra_dist_opt: Any = field(init=False)

    def __init__(self, **kwargs):
        _set_from_kwargs(self, kwargs)

    def __getattr__(self, name):
        # Only reached for names not set on the instance: a declared field reads as None.
        if name in _PGC_FIELDS:
            return None
        raise AttributeError(f"'ProcessGroupCollection' object has no attribute '{name}'")

    def __repr__(self):
        active = []
        for f in fields(self):
            if f.name not in vars(self) or getattr(self, f.name) is None:
                continue
            pg = getattr(self, f.name)
            size = [x.size() for x in pg] if isinstance(pg, list) else pg.size()
            active.append(f"{f.name}({size})")
        return f"ProcessGroupCollection({', '.join(active)})" if active else "ProcessGroupCollection(empty)"

    @classmethod
    def use_mpu_process_groups(cls, required_pgs: Optional[List[str]] = None):
        """The requested fields (all when None) from commgrid.torch's state, each read as
        HEAD reads it: dp, dp_cp, dp_cp_gtp_remat and intra_dp_cp need the state to be
        initialized (``StateError``, an AssertionError, otherwise); every other field is None
        where the group does not exist; dp_cp_ag and expt_dp_ag are always None (they come
        from create_all_gather_groups). Names that are not fields raise
        ``ValueError("Invalid process groups requested: [...]")`` before anything is read."""
        names = _PGC_FIELDS
        if required_pgs is None:
            required_pgs = list(names)
        invalid = [pg for pg in required_pgs if pg not in names]
        if invalid:
            raise ValueError(f"Invalid process groups requested: {invalid}")
        return cls(**{pg: _HEAD_SOURCES[pg]() for pg in required_pgs})

    @staticmethod
    def is_gtp_remat_active(process_group_dict: Dict) -> bool:
        """Whether a gtp_remat or expt_gtp_remat group of the dict spans more than one rank."""
        return any(pg is not None and pg.size() > 1 for pg in
                   (process_group_dict.get("gtp_remat_group"),
                    process_group_dict.get("expt_gtp_remat_group")))

    @staticmethod
    def setup_process_groups_for_optimizer(pg_collection, model_chunks, use_gloo_process_groups=True):
        """HEAD's helper: the optimizer's groups, from the state (``pg_collection`` None) or
        from the collection with HEAD's checks and fallbacks; a dict keyed as HEAD's."""
        return _optimizer_groups(pg_collection, model_chunks, use_gloo_process_groups)

    @staticmethod
    def setup_process_groups_for_ddp(pg_collection, config, ddp_config):
        """HEAD's helper: DDP's groups, from the state (``pg_collection`` None) or from the
        collection (a missing expt_dp becomes a one-rank group, as in HEAD)."""
        return _ddp_groups(pg_collection, config, ddp_config)


_PGC_FIELDS = frozenset(f.name for f in fields(ProcessGroupCollection))


def _model_config(model):
    # Megatron's get_model_config: the first `config` found unwrapping `.module`.
    while not hasattr(model, "config") and hasattr(model, "module"):
        model = model.module
    return model.config


def _required(pg_set, name, why=""):
    if name not in pg_set:
        raise ValueError(f"{name} process group is required but not provided in pg_collection{why}")


_SET_NONE = ". Please explicitly set it to None if you don't need it."


def _optimizer_groups(pgc, model_chunks, use_gloo):
    ddp_config = getattr(model_chunks[0], "ddp_config", None)
    if pgc is None:
        dp_cp = g.get_data_parallel_group_head(with_context_parallel=True, with_gtp_remat=False)
        out = {
            "dp_group": g.get_data_parallel_group_head(with_gtp_remat=False),
            "dp_cp_group": dp_cp,
            "intra_dp_cp_group": g.get_data_parallel_group_head(
                with_context_parallel=True, with_gtp_remat=False, partial_data_parallel=True),
            "expt_dp_group": g.get_expert_data_parallel_group_head(with_gtp_remat=False),
            "intra_expt_dp_group": g.get_expert_data_parallel_group_head(
                with_gtp_remat=False, partial_expert_data_parallel=True),
            "gtp_remat_group": g.get_gtp_weight_remat_group(check_initialized=False),
            "expt_gtp_remat_group": g.get_expert_gtp_weight_remat_group(check_initialized=False),
        }
        intra_dist_opt = g.get_intra_distributed_optimizer_instance_group()
        # Gloo groups do not exist under gtp_remat (HEAD builds none there).
        if use_gloo and not ProcessGroupCollection.is_gtp_remat_active(out):
            gloo = (g.get_data_parallel_group_gloo(with_context_parallel=True, partial_data_parallel=True),
                    g.get_expert_data_parallel_group_gloo(partial_expert_data_parallel=True))
        else:
            gloo = (None, None)
        inter = None
        if ddp_config is not None and ddp_config.num_distributed_optimizer_instances > 1:
            inter = g.get_inter_distributed_optimizer_instance_group()
        out.update(mp_group=g.get_model_parallel_group(),
                   expt_tp_pp_group=g.get_expert_tensor_model_pipeline_parallel_group_head(),
                   expt_tp_pp_with_egtp_remat_group=g.get_expert_tensor_model_pipeline_parallel_group_head(
                       with_egtp_remat=True),
                   inter_dist_opt_group=inter, intra_dist_opt_group=intra_dist_opt,
                   intra_dp_cp_group_gloo=gloo[0], intra_expt_dp_group_gloo=gloo[1])
        return _ordered_optimizer_dict(out)
    pg_set = vars(pgc)
    _required(pg_set, "dp")
    dp = pgc.dp
    if "dp_cp" in pg_set:
        dp_cp = pgc.dp_cp
    elif getattr(_model_config(model_chunks[0]), "context_parallel_size", 1) == 1:
        dp_cp = dp
    else:
        raise ValueError("dp_cp process group is required when context_parallel_size > 1 "
                         "but not provided in pg_collection")
    if "expt_dp" not in pg_set:
        raise ValueError("expt_dp process group is required but not provided in pg_collection"
                         + _SET_NONE)
    expt_dp = pgc.expt_dp
    if ddp_config is not None:
        if ddp_config.num_distributed_optimizer_instances == 1:
            intra_dp_cp, intra_expt_dp, inter = dp_cp, expt_dp, None
        else:
            if not all(n in pg_set for n in ("intra_dp_cp", "intra_expt_dp", "inter_dist_opt",
                                             "intra_dist_opt")):
                raise ValueError("intra_dp_cp, intra_expt_dp, inter_dist_opt, and intra_dist_opt "
                                 "process groups are required when using multiple optimizer "
                                 "instances (>1) but not provided in pg_collection")
            intra_dp_cp, intra_expt_dp, inter = pgc.intra_dp_cp, pgc.intra_expt_dp, pgc.inter_dist_opt
        if ddp_config.use_distributed_optimizer:
            if "intra_dist_opt" not in pg_set:
                raise ValueError("intra_dist_opt process group is required but not provided in "
                                 "pg_collection" + _SET_NONE)
            intra_dist_opt = pgc.intra_dist_opt
        else:
            intra_dist_opt = None
    else:
        intra_dp_cp, intra_expt_dp, inter, intra_dist_opt = dp_cp, expt_dp, None, None
    for name in ("mp", "tp_ep_pp"):
        if name not in pg_set:
            raise ValueError(f"{name} process group is required but not provided in pg_collection"
                             + _SET_NONE)
    if use_gloo:
        raise ValueError("Gloo process groups are not supported when pg_collection is "
                         "provided. Please set use_gloo_process_groups to False.")
    return _ordered_optimizer_dict({
        "dp_group": dp, "dp_cp_group": dp_cp, "intra_dp_cp_group": intra_dp_cp,
        "expt_dp_group": expt_dp, "intra_expt_dp_group": intra_expt_dp,
        "gtp_remat_group": pgc.gtp_remat, "expt_gtp_remat_group": pgc.expt_gtp_remat,
        "mp_group": pgc.mp, "expt_tp_pp_group": pgc.tp_ep_pp,
        "expt_tp_pp_with_egtp_remat_group": (pgc.tp_ep_pp_with_egtp_remat
                                             if "tp_ep_pp_with_egtp_remat" in pg_set else pgc.tp_ep_pp),
        "inter_dist_opt_group": inter, "intra_dist_opt_group": intra_dist_opt,
        "intra_dp_cp_group_gloo": None, "intra_expt_dp_group_gloo": None})


_OPTIMIZER_KEYS = ("dp_group", "dp_cp_group", "intra_dp_cp_group", "expt_dp_group",
                   "intra_expt_dp_group", "gtp_remat_group", "expt_gtp_remat_group", "mp_group",
                   "expt_tp_pp_group", "expt_tp_pp_with_egtp_remat_group", "inter_dist_opt_group",
                   "intra_dist_opt_group", "intra_dp_cp_group_gloo", "intra_expt_dp_group_gloo")


def _ordered_optimizer_dict(d):
    return {k: d[k] for k in _OPTIMIZER_KEYS}


def _ddp_groups(pgc, config, ddp_config):
    if pgc is None:
        return {
            "dp_group": g.get_data_parallel_group_head(with_gtp_remat=False),
            "dp_cp_group": g.get_data_parallel_group_head(with_context_parallel=True, with_gtp_remat=False),
            "intra_dp_cp_group": g.get_data_parallel_group_head(
                with_context_parallel=True, with_gtp_remat=False, partial_data_parallel=True),
            "expt_dp_group": g.get_expert_data_parallel_group_head(with_gtp_remat=False),
            "intra_expt_dp_group": g.get_expert_data_parallel_group_head(
                with_gtp_remat=False, partial_expert_data_parallel=True),
            "tp_group": g.get_tensor_model_parallel_group(),
            "gtp_remat_group": g.get_gtp_weight_remat_group(check_initialized=False),
            "pp_group": g.get_pipeline_model_parallel_group(),
            "ep_group": g.get_expert_model_parallel_group(),
            "expt_gtp_remat_group": g.get_expert_gtp_weight_remat_group(check_initialized=False),
            "inter_dist_opt_group": (g.get_inter_distributed_optimizer_instance_group()
                                     if ddp_config.num_distributed_optimizer_instances > 1 else None),
            "intra_dist_opt_group": (g.get_intra_distributed_optimizer_instance_group()
                                     if ddp_config.use_distributed_optimizer else None),
        }
    pg_set = vars(pgc)
    _required(pg_set, "dp")
    out = {"dp_group": pgc.dp}
    if "dp_cp" in pg_set:
        out["dp_cp_group"] = pgc.dp_cp
    elif getattr(config, "context_parallel_size", 1) == 1:
        out["dp_cp_group"] = out["dp_group"]
    else:
        raise ValueError("dp_cp process group is required when context_parallel_size > 1 "
                         "but not provided in pg_collection")
    if pgc.expt_dp is not None:
        out["expt_dp_group"] = pgc.expt_dp
    else:
        import torch.distributed as dist  # only this fallback creates a group
        out["expt_dp_group"] = dist.new_group(ranks=[dist.get_rank()])
    if ddp_config.num_distributed_optimizer_instances == 1:
        out.update(intra_dp_cp_group=out["dp_cp_group"], intra_expt_dp_group=out["expt_dp_group"],
                   inter_dist_opt_group=None)
    else:
        if not all(n in pg_set for n in ("intra_dp_cp", "intra_expt_dp", "inter_dist_opt")):
            raise ValueError("intra_dp_cp, intra_expt_dp, and inter_dist_opt process groups are "
                             "required when using multiple optimizer instances (>1) but not "
                             "provided in pg_collection")
        out.update(intra_dp_cp_group=pgc.intra_dp_cp, intra_expt_dp_group=pgc.intra_expt_dp,
                   inter_dist_opt_group=pgc.inter_dist_opt)
    if not all(n in pg_set for n in ("tp", "pp", "ep")):
        raise ValueError("tp, pp and ep process groups are required but not provided in pg_collection")
    out.update(tp_group=pgc.tp, pp_group=pgc.pp, ep_group=pgc.ep,
               gtp_remat_group=pgc.gtp_remat, expt_gtp_remat_group=pgc.expt_gtp_remat)
    return out


def resolve_gtp_remat_group(pg_collection, is_expert):
    """HEAD's resolve_gtp_remat_group: the collection's gtp_remat (expert: expt_gtp_remat)
    group when the collection carries the field, else the state's."""
    attr = "expt_gtp_remat" if is_expert else "gtp_remat"
    if pg_collection is not None and attr in vars(pg_collection):
        return getattr(pg_collection, attr)
    return getattr(ProcessGroupCollection.use_mpu_process_groups([attr]), attr)


@dataclass
class MultiModuleProcessGroupCollection:
    """HEAD's collection per module of a multi-module pipeline (e.g. an encoder and the
    language model on one rank): ``module_pgs`` maps names to ProcessGroupCollections."""

    module_pgs: Dict[str, ProcessGroupCollection]
    language_model_module_name: Optional[str] = None

    def __post_init__(self):
        if not self.module_pgs:
            raise ValueError("module_pgs dict cannot be empty")
        if (self.language_model_module_name is not None
                and self.language_model_module_name not in self.module_pgs):
            raise ValueError(f"language_model_module_name '{self.language_model_module_name}' not "
                             f"found in module_pgs keys: {list(self.module_pgs.keys())}")

    def get_language_model_collection(self):
        if self.language_model_module_name is None:
            raise ValueError("No language model specified for this collection")
        return self.module_pgs[self.language_model_module_name]

    def get_language_model_cp_size(self):
        return self.get_language_model_collection().cp.size()

    def has_language_model(self):
        return self.language_model_module_name is not None

    def get_module_collection(self, module_name):
        if module_name not in self.module_pgs:
            raise ValueError(f"Module '{module_name}' not found in collections. "
                             f"Available: {list(self.module_pgs.keys())}")
        return self.module_pgs[module_name]

    def __len__(self):
        return len(self.module_pgs)

    def __getitem__(self, module_name):
        return self.module_pgs[module_name]

    def __iter__(self):
        return iter(self.module_pgs.values())

    def keys(self):
        return self.module_pgs.keys()

    def values(self):
        return self.module_pgs.values()

    def items(self):
        return self.module_pgs.items()

    def __repr__(self):
        lm = (f", language_model_module_name='{self.language_model_module_name}'"
              if self.language_model_module_name else "")
        return f"MultiModuleProcessGroupCollection(modules=[{', '.join(self.module_pgs)}]{lm})"
