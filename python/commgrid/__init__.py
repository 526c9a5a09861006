"""commgrid: the communication groups of N-dimensional parallel training, as Megatron-core
builds them, computed by commgrid's C++ core.

- :class:`Layout`: every group of every kind of a configuration (lists or numpy arrays).
- :class:`RankGenerator`: a drop-in for Megatron-core's ``RankGenerator``.
- :class:`ModelCommProcessGroups`, :class:`GradCommProcessGroups`: the seed's collections;
  :class:`ProcessGroupCollection`: HEAD's.
- :class:`HyperCommGrid`: Megatron-core HEAD's N-dimensional grid of process groups.
- ``commgrid.torch`` (imports torch): a drop-in for the seed's ``megatron.core.parallel_state``;
  ``commgrid.torch.head``: for HEAD's.
"""

from .errors import (ConfigError, DivisibilityError, Error, IncompatibleError,
                     InvalidValueError, OrderError, OverflowError, PolicyError,
                     RankOutOfRangeError, StateError, UnknownKindError)
from ._commgrid import DEFAULT_ORDER, MAX_WORLD_SIZE, GroupRef, kind_names
from .layout import Layout
from .rank_generator import RankGenerator
from .collections import (GradCommProcessGroups, ModelCommProcessGroups,
                          MultiModuleProcessGroupCollection, ProcessGroupCollection)
from .hyper_comm_grid import HyperCommGrid

__version__ = "0.1.0"

__all__ = [
    "Layout", "RankGenerator", "GroupRef", "ModelCommProcessGroups", "GradCommProcessGroups",
    "ProcessGroupCollection", "MultiModuleProcessGroupCollection", "HyperCommGrid",
    "kind_names", "DEFAULT_ORDER", "MAX_WORLD_SIZE",
    "Error", "ConfigError", "InvalidValueError", "OrderError", "DivisibilityError",
    "IncompatibleError", "OverflowError", "PolicyError", "RankOutOfRangeError",
    "UnknownKindError", "StateError",
]
