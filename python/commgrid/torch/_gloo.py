"""How commgrid.torch's Gloo groups are made: when their pairs connect (``gloo_connection``)
and which Gloo device they run on (``gloo_device``), each as a scope around one creation so
that the program's own Gloo groups keep torch's defaults.

A Gloo *device* is a listening socket and an event-loop thread (Gloo's loop wakes every
10 ms whether or not anything happens). torch gives every Gloo group a device of its own, so
a rank of a Megatron layout holds some twenty loops that wake 2,000 times a second between
them; with "shared" every group of one creation runs on one device, as commgrid's C++ Gloo
backend does.
"""

import contextlib
import os

import torch
import torch.distributed as dist

from ..errors import IncompatibleError, InvalidValueError

# torch reads TORCH_GLOO_LAZY_INIT in every ProcessGroupGloo constructor (torch >= 2.8 has it;
# its Device factory takes lazy_init since then too, which is how its presence is detected).
_LAZY_ENV = "TORCH_GLOO_LAZY_INIT"


# ---- when a group's pairs connect --------------------------------------------------------

def gloo_connections():
    """The Gloo connection modes this torch offers: "lazy" (a group's pairs connect at their
    first use, torch's TORCH_GLOO_LAZY_INIT) where its Gloo backend has it, and "eager"
    (every pair of a group connects in its constructor, Megatron-core's way)."""
    doc = getattr(getattr(dist, "ProcessGroupGloo", None), "create_device", None)
    lazy = doc is not None and "lazy_init" in (doc.__doc__ or "")
    return (["lazy"] if lazy else []) + ["eager"]


def resolve_gloo_connection(mode):
    """"auto": the user's TORCH_GLOO_LAZY_INIT where it is set (then commgrid leaves it
    alone: None), else "lazy" where this torch has it, else "eager". A mode this torch does
    not offer is an InvalidValueError naming it."""
    offered = gloo_connections()
    if mode == "auto":
        return None if _LAZY_ENV in os.environ else offered[0]
    if mode not in offered:
        raise InvalidValueError(f"gloo_connection = {mode!r}: this torch ({torch.__version__}) "
                                f"offers {offered}", parameter="gloo_connection")
    return mode


@contextlib.contextmanager
def gloo_connection_scope(mode):
    """TORCH_GLOO_LAZY_INIT set for the Gloo groups made inside (mode "lazy": 1, "eager": 0;
    None: left as it is), and put back as it was afterwards: the mode applies to commgrid's
    groups, not to every Gloo group the process makes."""
    if mode is None:
        yield
        return
    before = os.environ.get(_LAZY_ENV)
    os.environ[_LAZY_ENV] = "1" if mode == "lazy" else "0"
    try:
        yield
    finally:
        if before is None:
            os.environ.pop(_LAZY_ENV, None)
        else:
            os.environ[_LAZY_ENV] = before


# ---- which device a group runs on ----------------------------------------------------------

def _gloo_plugins():
    """torch's table of backend factories when Gloo is one of them (torch 2.15 registers its
    built-in Gloo backend there), else None: then a Gloo group's device cannot be chosen
    through new_group."""
    backend = dist.Backend
    plugins = getattr(backend, "_plugins", None)
    if not isinstance(plugins, dict) or not hasattr(dist, "ProcessGroupGloo"):
        return None
    options = getattr(dist.ProcessGroupGloo, "_Options", None)
    if options is None or not hasattr(options(), "_devices"):
        return None
    ensure = getattr(backend, "_ensure_backend_registered", None)
    if ensure is not None:
        ensure("gloo")
    return plugins if "GLOO" in plugins else None


def gloo_devices():
    """The device modes this torch offers: "shared" (every Gloo group of one initialization
    on one device; its groups connect eagerly) where new_group's Gloo factory can be given
    one, and "per_group" (torch's own: a device, with its listening socket and event-loop
    thread, for every group)."""
    return (["shared"] if _gloo_plugins() is not None else []) + ["per_group"]


def resolve_gloo_device(mode, connection):
    """The device mode for ``mode`` when groups connect as ``connection`` says (a resolved
    gloo_connection; None: as TORCH_GLOO_LAZY_INIT says). torch connects a Gloo group lazily
    only on a lazy device, and two groups on one lazy device never connect (torch 2.15: their
    first collective waits forever), so a shared device connects eagerly. "auto": "shared"
    where this torch offers it and the groups connect eagerly, else "per_group". A mode this
    torch does not offer is an InvalidValueError, "shared" with lazy connection an
    IncompatibleError; both name gloo_device."""
    lazy = connection == "lazy" or (
        connection is None and os.environ.get(_LAZY_ENV, "0").lower() in ("1", "true"))
    offered = gloo_devices()
    if mode == "auto":
        return "shared" if "shared" in offered and not lazy else "per_group"
    if mode not in offered:
        raise InvalidValueError(f"gloo_device = {mode!r}: this torch ({torch.__version__}) "
                                f"offers {offered}", parameter="gloo_device")
    if mode == "shared" and lazy:
        raise IncompatibleError("gloo_device = 'shared' with lazy Gloo connection: a shared "
                                "device connects its groups eagerly; pass gloo_connection="
                                "'eager' or gloo_device='per_group'", parameter="gloo_device")
    return mode


@contextlib.contextmanager
def gloo_device_scope(mode):
    """With "shared": one Gloo device for every Gloo group made inside (new_group's Gloo
    factory replaced by one that passes it, then put back). The device lives as long as the
    last group on it."""
    plugins = _gloo_plugins() if mode == "shared" else None
    if plugins is None:
        yield
        return
    # Made eager whatever TORCH_GLOO_LAZY_INIT says (see resolve_gloo_device).
    create = dist.ProcessGroupGloo.create_default_device
    device = create(lazy_init=False) if "lazy_init" in (create.__doc__ or "") else create()
    torch_factory = plugins["GLOO"]

    def make(opts, _backend_options):
        o = dist.ProcessGroupGloo._Options()
        o._devices = [device]
        o._timeout = opts.timeout
        o._threads = 2  # as torch's factory: two worker threads a device
        if hasattr(o, "enable_reconfigure"):
            o.enable_reconfigure = opts.enable_reconfigure
        group = dist.ProcessGroupGloo(opts.store, opts.group_rank, opts.group_size, o)
        group.options.global_ranks_in_group = opts.global_ranks_in_group
        group.options.group_name = opts.group_id
        return group

    plugins["GLOO"] = dist.Backend._BackendPlugin(make, True)
    try:
        yield
    finally:
        plugins["GLOO"] = torch_factory
