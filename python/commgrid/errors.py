"""commgrid's exceptions. The C++ core raises them (through the binding) with its own
one-line messages; ``parameter`` names the offending input."""

import builtins
import operator


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


class StateError(Error, RuntimeError, AssertionError):
    """A call that needs initialized parallel state came before initialization or after
    destroy, or initialization came twice. Also a RuntimeError and an AssertionError:
    Megatron-core raises one or the other in these cases (an ``assert`` in its getters,
    ``RuntimeError`` in create_all_gather_groups), and code that catches Megatron's type
    keeps working."""


_AS_BUILTIN = {}


def as_builtin(error, builtin):
    """``error`` (a commgrid error) re-made as an instance of a subclass of both its own
    class and ``builtin`` (RuntimeError, AssertionError): commgrid.torch raises a bad
    configuration this way, as the built-in type Megatron-core raises for that rule, so
    that ``except commgrid.DivisibilityError`` and ``except RuntimeError`` both catch it.
    The class keeps the commgrid name; ``parameter`` is kept."""
    cls = type(error)
    if isinstance(error, builtin):
        return error
    key = (cls, builtin)
    if key not in _AS_BUILTIN:
        _AS_BUILTIN[key] = type(cls.__name__, (cls, builtin),
                                {"__module__": cls.__module__, "__doc__": cls.__doc__})
    made = _AS_BUILTIN[key](*error.args)
    made.parameter = getattr(error, "parameter", "")
    return made


def check_int(name, value):
    """An integer argument (anything with __index__, e.g. numpy integers; not bool), as a
    Python int, for the pure-Python entry points."""
    if isinstance(value, bool):
        raise InvalidValueError(f"{name} must be an integer, got {value!r}")
    try:
        return operator.index(value)
    except TypeError:
        raise InvalidValueError(f"{name} must be an integer, got {value!r}") from None
