"""commgrid: the communication groups of N-dimensional parallel training, as Megatron-core
builds them, computed by commgrid's C++ core.

- :class:`Layout`: every group of every kind of a configuration (lists or numpy arrays).
- :class:`RankGenerator`: a drop-in for Megatron-core's ``RankGenerator``.
- :class:`ModelCommProcessGroups`, :class:`GradCommProcessGroups`: the seed's collections.
- ``commgrid.torch`` (imports torch): torch.distributed groups and Megatron's
  parallel_state getters.
"""

from .errors import (ConfigError, DivisibilityError, Error, IncompatibleError,
                     InvalidValueError, OrderError, OverflowError, PolicyError,
                     RankOutOfRangeError, StateError, UnknownKindError)
from ._commgrid import DEFAULT_ORDER, MAX_WORLD_SIZE, GroupRef, kind_names
from .layout import Layout
from .rank_generator import RankGenerator
from .collections import GradCommProcessGroups, ModelCommProcessGroups

__version__ = "0.1.0"

__all__ = [
    "Layout", "RankGenerator", "GroupRef", "ModelCommProcessGroups", "GradCommProcessGroups",
    "kind_names", "DEFAULT_ORDER", "MAX_WORLD_SIZE",
    "Error", "ConfigError", "InvalidValueError", "OrderError", "DivisibilityError",
    "IncompatibleError", "OverflowError", "PolicyError", "RankOutOfRangeError",
    "UnknownKindError", "StateError",
]
