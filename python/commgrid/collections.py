"""The seed's two group collections (Megatron-core's process_groups_config), with the
seed's exact behaviour: dataclasses whose fields are unset until assigned."""

from dataclasses import dataclass, field, fields
from typing import Any, List, Optional

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
