"""What commgrid.torch needs of torch.distributed besides creating groups: sizes and ranks
in a group, the groups' timeouts, Megatron-core's GlobalMemoryBuffer, and Megatron's module
globals as attributes of the drop-in modules."""

import operator
from functools import reduce

import torch
import torch.distributed as dist

from .._state import STATE


def torch_ready():
    return dist.is_available() and dist.is_initialized()


def size_of(group):
    return dist.get_world_size(group=group)


def rank_in(group):
    return dist.get_rank(group=group)


def update_pg_timeout(timeout, pg=None):
    """Megatron-core HEAD's update_pg_timeout: sets the timeout of ``pg`` (None: every group
    this rank created through commgrid and the default group) where torch can
    (``distributed_c10d._set_pg_timeout``, torch >= 2.2; older torch: nothing to do)."""
    c10d = dist.distributed_c10d
    if not hasattr(c10d, "_set_pg_timeout"):
        return
    dist.barrier(pg)
    for group in (STATE.vars["_global_process_group_list"] or [None]) if pg is None else [pg]:
        c10d._set_pg_timeout(timeout, group)


class GlobalMemoryBuffer:
    """Megatron-core's GlobalMemoryBuffer: one reusable buffer per (name, dtype), grown when a
    request needs more; ``get_tensor`` returns a view of its first elements in the asked
    shape. On the current CUDA device when there is one, else on the CPU. Callers must not
    use two tensors of the same name at once."""

    def __init__(self):
        self.buffer = {}

    def get_tensor(self, tensor_shape, dtype, name, mem_alloc_context=None):
        needed = reduce(operator.mul, tensor_shape, 1)
        key = (name, dtype)
        if key not in self.buffer or self.buffer[key].numel() < needed:
            device = torch.cuda.current_device() if torch.cuda.is_available() else "cpu"
            if mem_alloc_context is None:
                self.buffer[key] = torch.empty(needed, dtype=dtype, device=device, requires_grad=False)
            else:
                with mem_alloc_context():
                    self.buffer[key] = torch.empty(needed, dtype=dtype, device=device,
                                                   requires_grad=False)
        return self.buffer[key][0:needed].view(*tensor_shape)


# ---- Megatron's module globals as module attributes ---------------------------------------

def expose_globals(module_name, names):
    """Makes Megatron's globals ``names`` attributes of the module: reading one reads the
    state, assigning one assigns the state (the getters follow), as with Megatron's module.
    Other attributes behave as usual."""
    import sys
    import types

    names = frozenset(names)

    class ParallelStateModule(types.ModuleType):
        def __getattr__(self, name):
            if name in names:
                return STATE.vars[name]
            raise AttributeError(f"module {module_name!r} has no attribute {name!r}")

        def __setattr__(self, name, value):
            if name in names:
                STATE.vars[name] = value
            else:
                super().__setattr__(name, value)

        def __delattr__(self, name):
            if name in names:
                STATE.vars[name] = None
            else:
                super().__delattr__(name)

        def __dir__(self):
            return sorted(set(super().__dir__()) | names)

    sys.modules[module_name].__class__ = ParallelStateModule
