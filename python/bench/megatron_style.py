"""A pure-Python enumeration of every group kind, written the way Megatron-core's
RankGenerator and initialize_model_parallel compute them (per group, per member: decompose
the index into digits, take inner products with strides). The benchmark's baseline and the
tests' independent oracle; it shares no code with commgrid.
"""


def _prefix_products(values):
    out = [1]
    for v in values:
        out.append(out[-1] * v)
    return out


def _digits(index, shape):
    # Mixed radix, first digit fastest; rebuilt on every call, as Megatron's decompose.
    stride = _prefix_products(shape)
    digits = [(index // d) % s for s, d in zip(shape, stride)]
    assert sum(x * y for x, y in zip(digits, stride[:-1])) == index
    return digits


def masked_groups(world_size, sizes, mask):
    """Every group of the masked axes of a grid with `sizes` (innermost first)."""
    strides = _prefix_products(sizes)
    in_shape = [s for s, m in zip(sizes, mask) if m]
    out_shape = [s for s, m in zip(sizes, mask) if not m]
    in_stride = [d for d, m in zip(strides, mask) if m]
    out_stride = [d for d, m in zip(strides, mask) if not m]
    group_size = _prefix_products(in_shape)[-1]
    groups = []
    for q in range(world_size // group_size):
        qd = _digits(q, out_shape)
        members = []
        for k in range(group_size):
            kd = _digits(k, in_shape)
            members.append(sum(x * y for x, y in zip(kd, in_stride))
                           + sum(x * y for x, y in zip(qd, out_stride)))
        groups.append(members)
    return groups


class Generator:
    """Megatron's RankGenerator: sizes by name, an order, omitted axes appended."""

    def __init__(self, tp, ep, dp, pp, cp, order, rank_offset=0):
        self.sizes = {"tp": tp, "pp": pp, "dp": dp, "ep": ep, "cp": cp}
        self.world_size = tp * ep * dp * pp * cp
        self.rank_offset = rank_offset
        tokens = order.lower().split("-")
        for name in ("tp", "pp", "dp", "ep", "cp"):
            if name not in tokens:
                assert self.sizes[name] == 1, name
                tokens.append(name)
        self.tokens = tokens

    def get_ranks(self, token):
        wanted = token.split("-")
        mask = [t in wanted for t in self.tokens]
        groups = masked_groups(self.world_size, [self.sizes[t] for t in self.tokens], mask)
        if self.rank_offset > 0:
            groups = [[r + self.rank_offset for r in g] for g in groups]
        return groups


def hierarchical(parent, sizes, level):
    """Level `level` of the hierarchical split of one parent list (Megatron's einops
    rearrange "(l s u) -> (l u) s")."""
    u = 1
    for h in sizes[:level]:
        u *= h
    s = sizes[level]
    n = len(parent) // (u * s)
    return [[parent[a * s * u + t * u + b] for t in range(s)] for a in range(n) for b in range(u)]


def all_groups(world_size, tp=1, pp=1, cp=1, ep=1, etp=None, hcp=None, dist_opt_instances=1,
               order="tp-cp-ep-dp-pp"):
    """Every kind's groups, as initialize_model_parallel builds them (default policies)."""
    etp = tp if etp is None else etp
    n = dist_opt_instances
    dp = world_size // (tp * pp * cp)
    edp = world_size // (etp * ep * pp)
    dense = Generator(tp=tp, ep=1, dp=dp, pp=pp, cp=cp, order=order)
    expert = Generator(tp=etp, ep=ep, dp=edp, pp=pp, cp=1, order=order)
    out = {}
    out["dp_cp"] = dense.get_ranks("dp-cp")
    chunk = dp * cp // n
    out["intra_dp_cp"] = [g[i * chunk:(i + 1) * chunk] for g in out["dp_cp"] for i in range(n)]
    out["dp"] = dense.get_ranks("dp")
    out["cp"] = dense.get_ranks("cp")
    if hcp:
        out["hcp"] = [[sub for g in out["cp"] for sub in hierarchical(g, hcp, lv)]
                      for lv in range(len(hcp))]
    out["mp"] = dense.get_ranks("tp-pp")
    out["tp"] = dense.get_ranks("tp")
    out["pp"] = dense.get_ranks("pp")
    out["embd"] = [[g[0], g[-1]] if len(g) > 1 else [g[0]] for g in out["pp"]]
    out["pos_embd"] = [[g[0]] for g in out["pp"]]
    out["tp_dp_cp"] = dense.get_ranks("tp-dp-cp")
    out["tp_dp"] = dense.get_ranks("tp-dp")
    out["tp_cp"] = dense.get_ranks("tp-cp")
    out["ep"] = expert.get_ranks("ep")
    out["expt_tp"] = expert.get_ranks("tp")
    out["tp_ep"] = expert.get_ranks("tp-ep")
    out["tp_ep_pp"] = expert.get_ranks("tp-ep-pp")
    out["expt_dp"] = expert.get_ranks("dp")
    split = [edp // n, n]
    out["intra_expt_dp"] = [sub for g in out["expt_dp"] for sub in hierarchical(g, split, 0)]
    if n > 1:
        out["inter_dist_opt"] = [sub for g in out["expt_dp"] for sub in hierarchical(g, split, 1)]
    per_instance = edp // n
    instances, current = [], []
    for i, g in enumerate(out["tp_ep_pp"]):
        current.extend(g)
        if (i + 1) % per_instance == 0:
            instances.append(current)
            current = []
    out["intra_dist_opt"] = instances
    return out
