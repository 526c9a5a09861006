"""A drop-in for Megatron-core's ``RankGenerator`` whose groups come from the C++ core."""

from . import _commgrid
from .errors import IncompatibleError, InvalidValueError, OrderError, check_int

# Megatron's name_to_size order: the sequence in which omitted axes are appended (HEAD adds
# gtp_remat last).
_NAMES = ("tp", "pp", "dp", "ep", "cp")
_HEAD_NAMES = _NAMES + ("gtp_remat",)


class RankGenerator:
    """``RankGenerator(tp, ep, dp, pp, cp, order, rank_offset=0, gtp_remat=1,
    compat="seed")``: ``get_ranks(token)`` returns what Megatron-core's does (the same lists
    in the same order) for every input Megatron accepts, e.g. ``get_ranks("tp-dp")``.

    ``compat="seed"`` (the default) is the seed's RankGenerator (five axes). ``compat="head"``
    is HEAD's: a sixth axis ``gtp_remat`` (token ``gtp_remat``; appended last when the order
    omits it), the attribute ``gtp_remat`` and ``get_gtp_ranks(gtp_remat_size)``. Under
    head an order with ``gtp_remat`` but without ``tp`` is an :class:`commgrid.OrderError`
    (HEAD's substring test finds "tp" in "gtp_remat", never adds the tp axis, and its
    ``get_ranks("tp")`` then fails with ``'tp' is not in list``).

    Differences, all on input Megatron mishandles: sizes below 1, unknown or repeated
    tokens in ``order`` and ``ep > 1 and cp > 1`` raise :class:`commgrid.ConfigError`
    subclasses (ValueError) instead of ZeroDivisionError, KeyError, wrong groups or an
    AssertionError; an axis of size > 1 missing from the order raises
    :class:`commgrid.OrderError` instead of RuntimeError.
    """

    def __init__(self, tp, ep, dp, pp, cp, order, rank_offset=0, gtp_remat=1, compat="seed"):
        if compat not in ("seed", "head"):
            raise InvalidValueError(f'compat: expected "seed" or "head", got {compat!r}',
                                    parameter="compat")
        self._head = compat == "head"
        names = _HEAD_NAMES if self._head else _NAMES
        self.tp = check_int("tp", tp)
        self.ep = check_int("ep", ep)
        self.dp = check_int("dp", dp)
        self.pp = check_int("pp", pp)
        self.cp = check_int("cp", cp)
        gtp_remat = check_int("gtp_remat", gtp_remat)
        if self._head:
            self.gtp_remat = gtp_remat
        elif gtp_remat != 1:
            raise IncompatibleError(f"gtp_remat = {gtp_remat} requires compat head (compat=\"head\")",
                                    parameter="gtp_remat")
        self.rank_offset = check_int("rank_offset", rank_offset)
        self.name_to_size = {"tp": self.tp, "pp": self.pp, "dp": self.dp, "ep": self.ep,
                             "cp": self.cp}
        if self._head:
            self.name_to_size["gtp_remat"] = self.gtp_remat
        for name in names:
            if self.name_to_size[name] < 1:
                raise InvalidValueError(f"{name} must be >= 1, got {self.name_to_size[name]}",
                                        parameter=name)
        if self.ep > 1 and self.cp > 1:
            raise IncompatibleError(
                f"ep = {self.ep} and cp = {self.cp}: a RankGenerator has either an ep or a cp axis "
                "(cp belongs to the dense grid, ep to the expert grid)")
        self.world_size = self.tp * self.dp * self.pp * self.cp * self.ep
        if self._head:
            self.world_size *= self.gtp_remat
        # Megatron lower-cases the order; the core validates its tokens.
        lowered = order.lower()
        given = len(lowered.split("-"))
        if self._head:
            tokens = _commgrid.head_order(lowered)
            if "gtp_remat" not in lowered.split("-"):  # head_order injected it; HEAD's
                tokens = [t for t in tokens if t != "gtp_remat"]  # RankGenerator does not
            tokens = tokens[:given]
            if "tp" not in tokens and "gtp_remat" in tokens:
                raise OrderError(f'order "{order}" has "gtp_remat" but no "tp"; Megatron-core HEAD '
                                 'would take the "tp" in "gtp_remat" for the tp axis and never add '
                                 "it (its get_ranks(\"tp\") then fails); add tp to the order",
                                 parameter="order")
        else:
            tokens = _commgrid.resolve_order(lowered)[:given]
        for name in names:
            if name not in tokens and self.name_to_size[name] != 1:
                raise OrderError(f'order "{order}" omits "{name}", but {name} = '
                                 f"{self.name_to_size[name]}; add \"{name}\" to the order",
                                 parameter="order")
        # As Megatron: the order's tokens, then the omitted axes in its name_to_size order.
        full = list(tokens) + [n for n in names if n not in tokens]
        self.order = "-".join(full)
        self.ordered_size = [self.name_to_size[t] for t in full]
        self._order = full

    def get_mask(self, order, token):
        """Megatron's mask: for each token of ``order``, whether ``token`` names it."""
        ordered = order.split("-")
        mask = [False] * len(ordered)
        for t in token.split("-"):
            if t not in ordered:
                raise OrderError(f'token "{t}" is not an axis of order "{order}"')
            mask[ordered.index(t)] = True
        return mask

    def get_ranks_array(self, token):
        """``get_ranks(token)`` as a 2-D numpy int64 array (groups x group size)."""
        mask = self.get_mask(self.order, token)
        masked = [a for a, m in zip(self._order, mask) if m]
        if self._head:  # six axes: the core's N-dimensional grid, offset included
            return _commgrid.named_grid_groups(self.ordered_size, self._order, masked,
                                               self.rank_offset)
        groups = _commgrid.grid_groups(self.name_to_size, self._order, masked)
        if self.rank_offset > 0:
            groups += self.rank_offset
        return groups

    def get_ranks(self, token):
        """Every group of the axes in ``token`` ("tp", "tp-dp", ...; their order inside the
        token does not matter), as lists of global ranks, in Megatron's order."""
        return self.get_ranks_array(token).tolist()

    def get_gtp_ranks(self, gtp_remat_size):
        """HEAD's GTP weight-sharding groups, ``get_ranks("gtp_remat")`` (singletons when the
        size is 1); ``gtp_remat_size`` must equal the generator's (HEAD asserts it)."""
        if not self._head:
            raise IncompatibleError('get_gtp_ranks requires compat head (compat="head")',
                                    parameter="compat")
        if check_int("gtp_remat_size", gtp_remat_size) != self.gtp_remat:
            raise IncompatibleError(f"gtp_remat_size {gtp_remat_size} != the generator's gtp_remat "
                                    f"axis size {self.gtp_remat}", parameter="gtp_remat_size")
        return self.get_ranks("gtp_remat")


def head_order(order, expert=False):
    """Megatron-core HEAD's order for its dense (``expert=False``) or expert RankGenerator:
    the tokens of ``order`` with ``gtp_remat`` injected after ``tp`` (expert: after ``ep``)
    unless given (HEAD's ``_inject_gtp_remat_axis``), then the omitted axes in HEAD's
    sequence, joined by "-". From the core (ParallelConfig::head_order)."""
    return "-".join(_commgrid.head_order(order, expert))


def generate_masked_orthogonal_rank_groups(world_size, parallel_size, mask):
    """Megatron-core's function of the same name, from the core: every group of the masked
    axes of a grid with sizes ``parallel_size`` (innermost first, at most five axes)."""
    if len(parallel_size) != len(mask) or not 1 <= len(parallel_size) <= 5:
        raise InvalidValueError(f"parallel_size {list(parallel_size)} and mask {list(mask)} "
                                "need the same length, 1 to 5")
    # The core's grid has five named axes; give the sizes their names in order and pad
    # with axes of size 1, which change no group.
    names = ["tp", "cp", "ep", "dp", "pp"]
    sizes = {n: 1 for n in names}
    for n, s in zip(names, parallel_size):
        sizes[n] = check_int("parallel_size", s)
    product = 1
    for s in parallel_size:
        product *= s
    if product != world_size:
        raise InvalidValueError(f"world_size {world_size} is not the product of parallel_size "
                                f"{list(parallel_size)} = {product}")
    masked = [n for n, m in zip(names, mask) if m]
    return _commgrid.grid_groups(sizes, names, masked).tolist()
