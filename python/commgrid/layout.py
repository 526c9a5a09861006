"""commgrid.Layout: every group of a parallel configuration, from the C++ core."""

from . import _commgrid
from .errors import InvalidValueError, UnknownKindError

# Megatron-core's keyword names (initialize_model_parallel) and commgrid's short ones.
_ALIASES = {
    "tensor_model_parallel_size": "tp",
    "pipeline_model_parallel_size": "pp",
    "context_parallel_size": "cp",
    "expert_model_parallel_size": "ep",
    "expert_tensor_parallel_size": "etp",
    "hierarchical_context_parallel_sizes": "hcp",
    "num_distributed_optimizer_instances": "dist_opt_instances",
    "virtual_pipeline_model_parallel_size": "vpp",
    "get_embedding_ranks": "embedding_ranks",
    "get_position_embedding_ranks": "position_embedding_ranks",
    # Megatron-core HEAD's (compat="head" only)
    "gtp_remat_size": "gtp_remat",
    "expert_gtp_remat_size": "expert_gtp_remat",
}

_SHORT = ("tp", "pp", "cp", "ep", "etp", "hcp", "dist_opt_instances", "vpp", "order",
          "embedding_ranks", "position_embedding_ranks",
          "compat", "gtp_remat", "expert_gtp_remat", "hybrid_context_parallel",
          "all_gather_groups", "rank_offset", "local_world_size")

# The keys of ``config`` that __repr__ shows, and the HEAD ones it adds under compat head.
_REPR_SEED = ("world_size", "tp", "pp", "cp", "ep", "etp", "hcp", "dist_opt_instances", "vpp",
              "order")
_REPR_HEAD = ("compat", "gtp_remat", "expert_gtp_remat", "hybrid_context_parallel",
              "all_gather_groups", "rank_offset", "local_world_size")

_HYBRID = "hybrid_dp_cp"


def normalize_kwargs(kwargs):
    """Maps Megatron's long keyword names to the short ones; a value given under both
    names, or an unknown name, is a TypeError (as for any Python call)."""
    out = {}
    for name, value in kwargs.items():
        short = _ALIASES.get(name, name)
        if short not in _SHORT:
            raise TypeError(f"Layout() got an unexpected keyword argument '{name}'")
        if short in out:
            raise TypeError(f"Layout() got '{short}' twice (as '{short}' and its Megatron name)")
        out[short] = value
    return out


class Layout(_commgrid.Layout):
    """Every group of a validated configuration, exactly as Megatron-core builds them.

    ``Layout(world_size, tp=1, pp=1, cp=1, ep=1, etp=None, hcp=None,
    dist_opt_instances=1, vpp=None, order="tp-cp-ep-dp-pp", compat="seed")``; with
    ``compat="head"`` the layout is Megatron-core HEAD's and takes HEAD's arguments
    ``gtp_remat=1, expert_gtp_remat=1, hybrid_context_parallel=False,
    all_gather_groups=False, rank_offset=0, local_world_size=None`` (refused under seed).
    Megatron's long names (``tensor_model_parallel_size=``, ``gtp_remat_size=`` ...) are
    accepted too, and ``embedding_ranks`` /
    ``position_embedding_ranks`` (Megatron's ``get_embedding_ranks`` ...) take a callable
    from a pipeline group's ranks to the embedding group's ranks. Invalid configurations
    raise a :class:`commgrid.ConfigError` subclass (a ``ValueError``) with the core's message.
    Building is cheap; nothing is enumerated until asked for.
    """

    def __init__(self, world_size, **kwargs):
        kw = normalize_kwargs(kwargs)
        if kw.get("hcp") is not None:
            kw["hcp"] = list(kw["hcp"])
        if "compat" in kw and not isinstance(kw["compat"], str):
            raise InvalidValueError(f'compat: expected "seed" or "head", got {kw["compat"]!r}',
                                    parameter="compat")
        for flag in ("hybrid_context_parallel", "all_gather_groups"):
            if flag in kw and not isinstance(kw[flag], bool):
                raise InvalidValueError(f"{flag}: expected True or False, got {kw[flag]!r}",
                                        parameter=flag)
        super().__init__(world_size, **kw)

    def _per_level(self, kind):
        """Whether ``kind`` without a level means one result per level (hcp, hybrid_dp_cp)."""
        self._resolve(kind, None)  # a kind name, or a typed error
        return kind in ("hcp", _HYBRID) and self.has_kind(kind)

    def _resolve(self, kind, level):
        """(kind, level) for a kind name, accepting HEAD's level names hybrid_dp_cp_<n>."""
        if not isinstance(kind, str):
            raise UnknownKindError(f"kind must be a kind name such as \"tp\", got {kind!r} "
                                   f"(the kinds: {', '.join(_commgrid.kind_names())})", parameter="kind")
        if kind.startswith(_HYBRID + "_") and self.has_kind(_HYBRID):
            names = [self.level_name(_HYBRID, lv) for lv in range(self.levels(_HYBRID))]
            if kind in names:
                if level not in (None, names.index(kind)):
                    raise InvalidValueError(f"{kind} is level {names.index(kind)}, not {level}",
                                            parameter="level")
                return _HYBRID, names.index(kind)
        return kind, 0 if level is None else level

    def groups(self, kind, level=None, *, as_array=False, max_output_mib=1024):
        """Every group of the kind in Megatron's order, as a list of lists of ints (with
        ``as_array=True``: as :meth:`array` returns them). For ``hcp`` and ``hybrid_dp_cp``
        without a level: one such list (array) per level; ``hybrid_dp_cp_<n>`` names one
        hybrid level as HEAD does. A result larger than ``max_output_mib`` (about 36 bytes a
        rank as lists, 8 as an array; 0: no limit) raises :class:`commgrid.OverflowError`
        before anything is built."""
        get = self.groups_array if as_array else self.groups_list
        if level is None and self._per_level(kind):
            return [get(kind, lv, max_output_mib) for lv in range(self.levels(kind))]
        return get(*self._resolve(kind, level), max_output_mib)

    def array(self, kind, level=None, *, max_output_mib=1024):
        """Every group of the kind as a 2-D ``numpy.int64`` array (groups x group size) over
        the core's own buffer, without a copy. Raises ``InvalidValueError`` when the kind's
        groups differ in size (custom embedding policies, a ragged hybrid_dp_cp level)."""
        return self.groups_array(*self._resolve(kind, level), max_output_mib)

    def group_of(self, kind, rank, level=None, *, max_output_mib=1024):
        """The members of ``rank``'s group of the kind (in the kind's member order), or
        ``None`` when the rank is in none. For ``hcp`` without a level: one per level. A
        group larger than ``max_output_mib`` raises :class:`commgrid.OverflowError` (use
        :meth:`group_ref` or ``group_size`` for its size and index)."""
        if level is None and self._per_level(kind):
            return [self.group_members(kind, rank, lv, max_output_mib) for lv in range(self.levels(kind))]
        kind, level = self._resolve(kind, level)
        return self.group_members(kind, rank, level, max_output_mib)

    def __repr__(self):
        if not self.initialized():
            return "commgrid.Layout(<not initialized: its construction failed>)"
        c = self.config
        keys = _REPR_SEED + (_REPR_HEAD if c.get("compat") == "head" else ())
        fields = ", ".join(f"{k}={c[k]!r}" for k in keys)
        return f"commgrid.Layout({fields})"
