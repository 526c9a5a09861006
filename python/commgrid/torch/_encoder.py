"""The seed's deprecated encoder/decoder split (``encoder_tensor_model_parallel_size``,
``encoder_pipeline_model_parallel_size``): the one layout computed in Python, because the
core does not model it (it is gone at Megatron-core HEAD). The encoder's ranks [0, E) and the
decoder's [E, W) are laid out by two of commgrid's core-backed RankGenerators (plus the
decoder's expert generator), and their groups are stitched as the seed's
``generator_wrapper`` stitches them."""

from ..errors import DivisibilityError, IncompatibleError, InvalidValueError, as_builtin
from ..rank_generator import RankGenerator
from ._config import make_layout
from ._create import hierarchical_split
from ._policies import default_embedding_ranks_seed, default_position_embedding_ranks_seed


class _Encoder:
    """The seed's encoder/decoder split: the generators of the encoder's dense grid on ranks
    [0, E) and of the decoder's dense and expert grids on [E, W), the sizes, the policies."""

    def __init__(self, **fields):
        self.__dict__.update(fields)


def encoder_layouts(world_size, enc_tp, enc_pp, common):
    tp, pp, cp = common["tp"], common["pp"], common["cp"]
    if enc_tp > tp:
        raise as_builtin(IncompatibleError("We do not support encoders with more TP than the decoder.",
                                           parameter="encoder_tensor_model_parallel_size"), AssertionError)
    total = enc_tp * enc_pp * cp + tp * pp * cp
    if world_size % total:
        raise as_builtin(DivisibilityError(f"world_size ({world_size}) is not divisible by {total}",
                                           parameter="world_size"), RuntimeError)
    if common["hcp"]:
        raise InvalidValueError("hierarchical_context_parallel_sizes with an encoder split "
                                "(encoder_pipeline_model_parallel_size > 0) is not supported by "
                                "commgrid.torch", parameter="hcp")
    dp = world_size // total
    enc_world = enc_tp * enc_pp * cp * dp
    # Each part is a layout of its own: the core validates the decoder's rules on its ranks.
    decoder = make_layout(world_size - enc_world, **common)
    make_layout(enc_world, tp=enc_tp, pp=enc_pp, cp=cp, order=common["order"])
    etp = common["etp"] or tp
    edp = (world_size - enc_world) // (etp * common["ep"] * pp)
    n = common["dist_opt_instances"]
    if n > 1 and edp != dp:
        # The seed splits every expert-dp group into [edp / n, n], the encoder's (its dense
        # dp groups, of dp ranks) too; Megatron fails there (einops), commgrid refuses first.
        raise as_builtin(IncompatibleError(
            f"num_distributed_optimizer_instances = {n} with an encoder split needs the expert "
            f"dp size ({edp}) to equal the dp size ({dp}): the seed splits the encoder's dp "
            "groups like the expert dp groups", parameter="dist_opt_instances"), AssertionError)
    order = common["order"]
    return decoder, _Encoder(
        enc=RankGenerator(enc_tp, 1, dp, enc_pp, cp, order, 0),
        dec=RankGenerator(tp, 1, dp, pp, cp, order, enc_world),
        expert=RankGenerator(etp, common["ep"], edp, pp, 1, order, enc_world),
        n=n, dp=dp, cp=cp, edp=edp, embd=common["embedding_ranks"],
        pos=common["position_embedding_ranks"])


def _stitched(gens, token, expert=False):
    # The seed's generator_wrapper: pp pairs one encoder group with several decoder groups,
    # tp-pp concatenates the encoder's and the decoder's groups one to one, every other
    # token lists the encoder's groups, then the decoder's.
    d = (gens.expert if expert else gens.dec).get_ranks(token)
    e = gens.enc.get_ranks(token)
    if token == "pp":
        rep, remain = divmod(len(d), len(e))
        e_ind, e_rep = 0, rep + int(0 < remain)
        out = []
        for y in d:
            out.append(e[e_ind] + y)
            e_rep -= 1
            if e_rep == 0:
                e_ind += 1
                e_rep = rep + int(e_ind < remain)
        return out
    if token == "tp-pp":
        if len(e) != len(d):
            raise as_builtin(IncompatibleError("the encoder's and the decoder's tp-pp groups differ in "
                                               "number", parameter="encoder_tensor_model_parallel_size"),
                             AssertionError)
        return [x + y for x, y in zip(e, d)]
    return e + d


def encoder_steps(gens):
    n = gens.n
    for i, g in enumerate(_stitched(gens, "dp")):
        yield "dp", 0, i, g
    intra = gens.dp * gens.cp // n
    for i, g in enumerate(_stitched(gens, "dp-cp")):
        yield "dp_cp", 0, i, g
        if n > 1:
            for k in range(n):
                yield "intra_dp_cp", 0, i * n + k, g[k * intra:(k + 1) * intra]
    for i, g in enumerate(_stitched(gens, "cp")):
        yield "cp", 0, i, g
    for token, kind in (("tp-pp", "mp"), ("tp", "tp")):
        for i, g in enumerate(_stitched(gens, token)):
            yield kind, 0, i, g
    embd = gens.embd or default_embedding_ranks_seed
    pos = gens.pos or default_position_embedding_ranks_seed
    for i, g in enumerate(_stitched(gens, "pp")):
        yield "pp", 0, i, g
        yield "embd", 0, i, list(embd(g))
        yield "pos_embd", 0, i, list(pos(g))
    for token, kind in (("tp-dp-cp", "tp_dp_cp"), ("tp-dp", "tp_dp"), ("tp-cp", "tp_cp")):
        for i, g in enumerate(_stitched(gens, token)):
            yield kind, 0, i, g
    for token, kind in (("ep", "ep"), ("tp", "expt_tp"), ("tp-ep", "tp_ep"), ("tp-ep-pp", "tp_ep_pp")):
        for i, g in enumerate(_stitched(gens, token, expert=True)):
            yield kind, 0, i, g
    intra_e = gens.edp // n
    for i, g in enumerate(_stitched(gens, "dp", expert=True)):
        yield "expt_dp", 0, i, g
        if n > 1:
            for level, kind in enumerate(("intra_expt_dp", "inter_dist_opt")):
                for sub in hierarchical_split(g, [intra_e, n], level):
                    yield kind, 0, None, sub
    acc, count = [], 0
    for g in _stitched(gens, "tp-ep-pp", expert=True):
        count += 1
        acc.extend(g)
        if count % intra_e == 0:
            yield "intra_dist_opt", 0, None, acc
            acc = []

