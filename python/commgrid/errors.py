"""commgrid's exceptions. The C++ core raises them (through the binding) with its own
one-line messages; ``parameter`` names the offending input."""

import builtins


class Error(Exception):
    """Base of every error commgrid raises on purpose."""


class ConfigError(Error, ValueError):
    """A user-supplied value is invalid. ``parameter`` names it ("tp", "order", "rank")."""

    parameter = ""

    def __init__(self, message="", parameter=None):
        super().__init__(message)
        if parameter is not None:
            self.parameter = parameter


class InvalidValueError(ConfigError):
    """A size or count is out of range (``tp must be >= 1, got 0``)."""


class OrderError(ConfigError):
    """The order string is malformed, or omits an axis whose size is not 1."""


class DivisibilityError(ConfigError):
    """A size does not divide what it must divide."""


class IncompatibleError(ConfigError):
    """Sizes that are each valid but do not fit together."""


class OverflowError(ConfigError, builtins.OverflowError):  # noqa: A001 - the core's name
    """A product of sizes, or the world size, exceeds what ranks can address."""


class PolicyError(ConfigError):
    """An embedding policy returned an invalid group."""


class RankOutOfRangeError(ConfigError):
    """A rank argument outside [0, world size)."""


class UnknownKindError(ConfigError):
    """A group kind name commgrid does not know, or one the layout does not have."""


class StateError(Error, RuntimeError):
    """A call that needs initialized parallel state came before initialization or after
    destroy, or initialization came twice."""
