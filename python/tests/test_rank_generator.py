"""commgrid.RankGenerator returns what Megatron-core's RankGenerator returns (the
Megatron-style reference here) for random sizes, orders, tokens and offsets."""

import itertools
import random

import pytest

import commgrid
import megatron_style

AXES = ["tp", "cp", "ep", "dp", "pp"]


def all_tokens():
    for n in range(1, 6):
        for combo in itertools.combinations(AXES, n):
            yield "-".join(combo)


def test_random_generators_match_megatron_for_every_token():
    rng = random.Random(1)
    for _ in range(40):
        sizes = {a: rng.choice([1, 1, 2, 3, 4]) for a in AXES}
        sizes[rng.choice(["ep", "cp"])] = 1  # a generator has ep or cp, never both
        order = AXES[:]
        rng.shuffle(order)
        # Megatron allows leaving out axes of size 1 (they are appended).
        order = [a for a in order if sizes[a] > 1 or rng.random() < 0.6]
        order_text = "-".join(order) or "tp"  # all sizes 1: any one token will do
        offset = rng.choice([0, 0, 5])
        args = dict(tp=sizes["tp"], ep=sizes["ep"], dp=sizes["dp"], pp=sizes["pp"],
                    cp=sizes["cp"], order=order_text, rank_offset=offset)
        ours, ref = commgrid.RankGenerator(**args), megatron_style.Generator(**args)
        assert ours.world_size == ref.world_size
        for token in all_tokens():
            parts = token.split("-")
            rng.shuffle(parts)  # the order inside a token does not matter
            shuffled = "-".join(parts)
            assert ours.get_ranks(shuffled) == ref.get_ranks(token), (args, token)


def test_megatron_attributes():
    g = commgrid.RankGenerator(tp=2, ep=1, dp=2, pp=2, cp=1, order="TP-DP-PP")
    assert g.order == "tp-dp-pp-ep-cp"  # lower-cased, omitted axes appended
    assert g.ordered_size == [2, 2, 2, 1, 1] and g.world_size == 8
    assert g.get_mask(g.order, "tp-pp") == [True, False, True, False, False]
    assert g.get_ranks("dp") == [[0, 2], [1, 3], [4, 6], [5, 7]]
    assert commgrid.RankGenerator(2, 1, 2, 2, 1, "tp-dp-pp", rank_offset=8).get_ranks("tp")[0] == [8, 9]
    arr = g.get_ranks_array("tp-dp")
    assert arr.shape == (2, 4) and arr.tolist() == g.get_ranks("tp-dp")


def test_numpy_integer_sizes():
    import numpy as np
    g = commgrid.RankGenerator(tp=np.int64(2), ep=1, dp=np.int32(2), pp=1, cp=1, order="tp-dp")
    assert g.get_ranks("dp") == [[0, 2], [1, 3]] and type(g.world_size) is int
    with pytest.raises(commgrid.InvalidValueError, match="tp must be an integer"):
        commgrid.RankGenerator(tp=2.0, ep=1, dp=1, pp=1, cp=1, order="tp")


def test_errors():
    with pytest.raises(commgrid.OrderError, match='omits "ep", but ep = 2'):
        commgrid.RankGenerator(tp=1, ep=2, dp=1, pp=1, cp=1, order="tp-dp-pp")
    with pytest.raises(commgrid.OrderError, match='unknown token "xx"'):
        commgrid.RankGenerator(tp=1, ep=1, dp=1, pp=1, cp=1, order="tp-xx")
    with pytest.raises(commgrid.OrderError, match="appears twice"):
        commgrid.RankGenerator(tp=2, ep=1, dp=1, pp=1, cp=1, order="tp-dp-tp")
    with pytest.raises(commgrid.IncompatibleError, match="ep = 2 and cp = 2"):
        commgrid.RankGenerator(tp=1, ep=2, dp=1, pp=1, cp=2, order="tp-cp-ep-dp-pp")
    with pytest.raises(commgrid.InvalidValueError, match="dp must be >= 1, got 0"):
        commgrid.RankGenerator(tp=1, ep=1, dp=0, pp=1, cp=1, order="tp-dp")
    g = commgrid.RankGenerator(tp=2, ep=1, dp=1, pp=1, cp=1, order="tp-dp")
    with pytest.raises(ValueError, match='token "TP"'):  # Megatron: ValueError too
        g.get_ranks("TP")


def test_generate_masked_orthogonal_rank_groups():
    from commgrid.rank_generator import generate_masked_orthogonal_rank_groups as gen
    rng = random.Random(3)
    for _ in range(30):
        sizes = [rng.choice([1, 2, 3]) for _ in range(rng.randint(1, 5))]
        mask = [rng.random() < 0.5 for _ in sizes]
        world = 1
        for s in sizes:
            world *= s
        assert gen(world, sizes, mask) == megatron_style.masked_groups(world, sizes, mask)
    with pytest.raises(commgrid.InvalidValueError):
        gen(8, [2, 2], [True, False])
