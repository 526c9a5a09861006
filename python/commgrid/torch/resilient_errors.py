"""The errors of commgrid.torch's resilient driver (commgrid.torch.resilient), raised by the
binding of the C++ driver with its one-line messages."""

from ..errors import Error


class RecoveryError(Error, RuntimeError):
    """The job cannot go on: the same message on every process (the job's end)."""


class NoSpareError(RecoveryError):
    """A dead rank found no spare and the world could not shrink."""


class StateLostError(RecoveryError):
    """Every holder of some rank's state died (its replicas, or it and its buddy)."""


class StateProviderError(RecoveryError):
    """The program's state provider (state_dict, load_state_dict) raised; the message names
    the process, the call, the step and the exception."""


class BackendError(Error, RuntimeError):
    """A communication failure that no recovery handled (the driver's own world)."""


class FencedError(BackendError):
    """This process was declared dead (it was stopped for longer than the job's timeout) and
    may not rejoin."""


class PeerFailure(RuntimeError):
    """A collective of the epoch failed because a peer died or left (torch's Gloo error, or a
    DistError): the driver starts a recovery. Raised inside the loop's callbacks; the
    program does not catch it."""


class TorchTooOldError(ImportError):
    """The installed torch cannot abort and destroy an epoch's process groups."""
