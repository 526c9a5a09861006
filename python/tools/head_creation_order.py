#!/usr/bin/python3
"""Records the group-creation sequence of Megatron-core HEAD's real parallel_state.py.

Runs HEAD's own ``initialize_model_parallel`` (and, for ``--all-gather-groups``, its
``create_all_gather_groups`` as megatron/training/training.py calls it) under Debian's
python3-torch with torch.distributed replaced by a recorder: every ``new_group`` call is
written down (ranks in the order HEAD passes them, backend, group_desc) and nothing is
communicated. The sequence is recorded once per rank of the laid-out span and must be the
same on every one (new_group is collective: every rank makes every call); the file keeps it
once. commgrid's per-group strategy under ``--compat head`` is tested against these files
(tests/unit/test_creation_order.cpp).

Usage (the files under tests/data/head_creation_order/ were made with exactly this):

    /usr/bin/python3 python/tools/head_creation_order.py \
        --megatron-git <Megatron-LM git dir> --rev d98e8a64dd \
        --vectors tests/vectors/head --out tests/data/head_creation_order

--megatron-git is any git directory of NVIDIA/Megatron-LM (a clone or a bare mirror);
the file is read with ``git show REV:megatron/core/parallel_state.py``. The configs are the
valid golden layouts of --vectors (their "args") plus the few in EXTRA_CONFIGS below.

What is stubbed, and why none of it changes the sequence:
- torch.distributed.{is_initialized, get_world_size, get_rank, new_group}: the recorder.
  A group object answers size() and rank() (create_all_gather_groups reads them).
- megatron.core.utils: GlobalMemoryBuffer (an empty object) and is_torch_min_version, which
  answers True so that HEAD passes group_desc to new_group (it drops it on torch < 2.4;
  the recorder needs it to name the kind).
- megatron.core.inference.symmetric_memory.SymmetricMemoryManager: imported, never used by
  initialization.
- einops, when not installed (Debian 12 has no package): rearrange() for the one pattern
  HEAD's create_hierarchical_groups uses, "(l s u) -> (l u) s", as a numpy reshape and
  transpose; any other pattern is an error.
"""

import argparse
import importlib.util
import json
import os
import subprocess
import sys
import types

import numpy as np
import torch

PARALLEL_STATE = "megatron/core/parallel_state.py"

# Configs beyond the golden layouts: several HEAD features at once (hcp with hybrid cp and
# dist-opt instances, all-gather groups with a rank offset).
EXTRA_CONFIGS = {
    "x1-hcp-hybrid-distopt-ag": "--world-size 32 --pp 2 --cp 4 --hcp 2,2 --ep 2 --etp 1 "
    "--dist-opt-instances 2 --compat head --hybrid-context-parallel --all-gather-groups",
    "x2-offset-distopt-hybrid-ag": "--world-size 24 --tp 2 --cp 2 --ep 2 --etp 1 "
    "--dist-opt-instances 2 --compat head --hybrid-context-parallel --all-gather-groups "
    "--rank-offset 8 --local-world-size 16",
    "x3-egtp-ep-order": "--world-size 16 --tp 2 --pp 2 --ep 2 --order tp-ep-dp-pp "
    "--compat head --expert-gtp-remat 2",
    # The two configs that tests/backends/gloo/test_creation_order_gloo.cpp creates on 8
    # Gloo rank-threads.
    "x4-gtp-egtp-hybrid-8": "--world-size 8 --cp 2 --ep 2 --etp 1 --compat head "
    "--gtp-remat 2 --expert-gtp-remat 2 --hybrid-context-parallel",
    "x5-ag-offset-8": "--world-size 8 --tp 2 --pp 2 --ep 2 --etp 1 --compat head "
    "--all-gather-groups --rank-offset 4 --local-world-size 4",
}

# group_desc -> (commgrid kind, level). Hierarchical descs carry _L<level>; hybrid descs _<n>.
KIND_OF_DESC = {
    "GTP_WEIGHT_REMAT_GROUP": "gtp_remat",
    "DATA_PARALLEL_GROUP_WITH_CP": "dp_cp",
    "INTRA_PARTIAL_DATA_PARALLEL_GROUP_WITH_CP": "intra_dp_cp",
    "DATA_PARALLEL_GROUP": "dp",
    "DATA_PARALLEL_GROUP_WITH_GTP_REMAT": "dp_gtp_remat",
    "DATA_PARALLEL_GROUP_WITH_CP_WITH_GTP_REMAT": "dp_cp_gtp_remat",
    "CONTEXT_PARALLEL_GROUP": "cp",
    "MODEL_PARALLEL_GROUP": "mp",
    "TENSOR_MODEL_PARALLEL_GROUP": "tp",
    "PIPELINE_MODEL_PARALLEL_GROUP": "pp",
    "EMBEDDING_GROUP": "embd",
    "POSITION_EMBEDDING_GROUP": "pos_embd",
    "TENSOR_AND_DATA_PARALLEL_GROUP_WITH_CP": "tp_dp_cp",
    "TENSOR_AND_DATA_PARALLEL_GROUP": "tp_dp",
    "TENSOR_AND_CONTEXT_PARALLEL_GROUP": "tp_cp",
    "EXPERT_GTP_WEIGHT_REMAT_GROUP": "expt_gtp_remat",
    "EXPERT_MODEL_PARALLEL_GROUP": "ep",
    "EXPERT_TENSOR_PARALLEL_GROUP": "expt_tp",
    "EXPERT_TENSOR_AND_MODEL_PARALLEL_GROUP": "tp_ep",
    "EXPERT_TENSOR_MODEL_PIPELINE_PARALLEL_GROUP": "tp_ep_pp",
    "EXPERT_TENSOR_MODEL_PIPELINE_PARALLEL_GROUP_WITH_EGTP": "tp_ep_pp_with_egtp_remat",
    "EXPERT_DATA_PARALLEL_GROUP": "expt_dp",
    "EXPERT_DATA_PARALLEL_GROUP_WITH_GTP_REMAT": "expt_dp_gtp_remat",
    "INTRA_DISTRIBUTED_OPTIMIZER_INSTANCE_GROUP": "intra_dist_opt",
    "DATA_PARALLEL_GROUP_WITH_CP_AG": "dp_cp_ag",
    "EXPERT_DATA_PARALLEL_GROUP_AG": "expt_dp_ag",
    "HIERARCHICAL_CONTEXT_PARALLEL_GROUP_L": "hcp",
    "HIERARCHICAL_EXPERT_DATA_PARALLEL_GROUP_L0": "intra_expt_dp",
    "HIERARCHICAL_EXPERT_DATA_PARALLEL_GROUP_L1": "inter_dist_opt",
}


def kind_of(desc):
    """(kind, level, hybrid n) of a group_desc; the Gloo twins are named like their NCCL
    group with _GLOO inserted."""
    d = desc.replace("_GLOO", "")
    if d.startswith("HYBRID_DP_CP_GROUP_"):
        n = int(d.rsplit("_", 1)[1])
        return "hybrid_dp_cp", n.bit_length() - 2, n  # n = 2, 4, 8, ... -> level 0, 1, 2
    if d.startswith("HIERARCHICAL_CONTEXT_PARALLEL_GROUP_L"):
        return "hcp", int(d.rsplit("L", 1)[1]), None
    if d in KIND_OF_DESC:
        return KIND_OF_DESC[d], 0, None
    raise SystemExit(f"error: group_desc {desc!r} is not known to this recorder")


# ---- the stubs -----------------------------------------------------------------------


class Group:
    """What new_group hands back: size() and rank() as a torch ProcessGroup answers."""

    def __init__(self, ranks, me):
        self._ranks = sorted(ranks)
        self._me = me

    def size(self):
        return len(self._ranks)

    def rank(self):
        return self._ranks.index(self._me)


class Recorder:
    def __init__(self, world_size, rank):
        self.world_size = world_size
        self.rank = rank
        self.calls = []

    def new_group(self, ranks=None, timeout=None, backend=None, pg_options=None,
                  use_local_synchronization=False, group_desc=None):
        ranks = [int(r) for r in ranks]
        self.calls.append({"desc": group_desc, "backend": backend, "ranks": ranks})
        return Group(ranks, self.rank) if self.rank in ranks else None

    def get_world_size(self, group=None):
        return self.world_size if group is None else group.size()

    def get_rank(self, group=None):
        return self.rank if group is None else group.rank()


def rearrange(array, pattern, **sizes):
    if pattern.replace(" ", "") != "(lsu)->(lu)s":
        raise SystemExit(f"error: the einops stand-in knows only '(l s u) -> (l u) s', not {pattern!r}")
    l, s, u = sizes["l"], sizes["s"], sizes["u"]
    return np.asarray(array).reshape(l, s, u).transpose(0, 2, 1).reshape(l * u, s)


def install_stubs():
    for name in ("megatron", "megatron.core", "megatron.core.inference"):
        mod = types.ModuleType(name)
        mod.__path__ = []
        sys.modules[name] = mod
    utils = types.ModuleType("megatron.core.utils")
    utils.GlobalMemoryBuffer = type("GlobalMemoryBuffer", (), {})
    utils.is_torch_min_version = lambda version, check_equality=True: True
    sys.modules["megatron.core.utils"] = utils
    sym = types.ModuleType("megatron.core.inference.symmetric_memory")
    sym.SymmetricMemoryManager = type("SymmetricMemoryManager", (), {"destroy": staticmethod(lambda: None)})
    sys.modules["megatron.core.inference.symmetric_memory"] = sym
    try:
        import einops  # noqa: F401
    except ImportError:
        stub = types.ModuleType("einops")
        stub.rearrange = rearrange
        sys.modules["einops"] = stub


def load_parallel_state(path):
    """A fresh module from the file (fresh globals for every rank's run)."""
    spec = importlib.util.spec_from_file_location("megatron.core.parallel_state", path)
    module = importlib.util.module_from_spec(spec)
    module.__package__ = "megatron.core"
    spec.loader.exec_module(module)
    return module


# ---- configs -------------------------------------------------------------------------


def parse_args(args):
    """commgrid plan flags -> (HEAD's initialize_model_parallel kwargs, world size,
    all-gather groups, ep)."""
    kw, world, ag, i = {}, None, False, 0
    names = {
        "--tp": "tensor_model_parallel_size", "--pp": "pipeline_model_parallel_size",
        "--cp": "context_parallel_size", "--ep": "expert_model_parallel_size",
        "--etp": "expert_tensor_parallel_size", "--vpp": "virtual_pipeline_model_parallel_size",
        "--dist-opt-instances": "num_distributed_optimizer_instances",
        "--gtp-remat": "gtp_remat_size", "--expert-gtp-remat": "expert_gtp_remat_size",
        "--rank-offset": "rank_offset", "--local-world-size": "local_world_size",
    }
    while i < len(args):
        flag = args[i]
        if flag == "--hybrid-context-parallel":
            kw["hybrid_context_parallel"] = True
        elif flag == "--all-gather-groups":
            ag = True
        elif flag == "--compat":
            if args[i + 1] != "head":
                raise SystemExit(f"error: {args}: only --compat head configs are recorded")
            i += 1
        elif flag == "--world-size":
            world = int(args[i + 1])
            i += 1
        elif flag == "--order":
            kw["order"] = args[i + 1]
            i += 1
        elif flag == "--hcp":
            kw["hierarchical_context_parallel_sizes"] = [int(x) for x in args[i + 1].split(",")]
            i += 1
        elif flag in names:
            kw[names[flag]] = int(args[i + 1])
            i += 1
        else:
            raise SystemExit(f"error: flag {flag} not understood")
        i += 1
    return kw, world, ag, kw.get("expert_model_parallel_size", 1)


def record(path, args):
    kw, world, ag, ep = parse_args(args)
    offset = kw.get("rank_offset", 0)
    span = range(offset, offset + kw.get("local_world_size", world))
    sequence = None
    for rank in span:
        rec = Recorder(world, rank)
        dist = torch.distributed
        saved = {n: getattr(dist, n) for n in ("is_initialized", "get_world_size", "get_rank", "new_group")}
        dist.is_initialized = lambda: True
        dist.get_world_size = rec.get_world_size
        dist.get_rank = rec.get_rank
        dist.new_group = rec.new_group
        try:
            ps = load_parallel_state(path)
            ps.initialize_model_parallel(**kw)
            if ag:  # as megatron/training/training.py's get_model does
                ps.create_all_gather_groups(for_expert_parallelism=ep > 1)
        finally:
            for n, f in saved.items():
                setattr(dist, n, f)
        if sequence is None:
            sequence = rec.calls
        elif rec.calls != sequence:
            raise SystemExit(f"error: {args}: rank {rank} made other new_group calls than rank {span[0]}")
    return sequence, list(span)


def commgrid_config(args):
    """The config as commgrid's JSON names it ("tp", "gtp_remat", ...): the flags given."""
    config, i = {"compat": "head"}, 0
    while i < len(args):
        key = args[i][2:].replace("-", "_")
        if key in ("hybrid_context_parallel", "all_gather_groups"):
            config[key] = True
        elif key == "compat":
            i += 1
        else:
            value = args[i + 1]
            if key == "hcp":
                config[key] = [int(x) for x in value.split(",")]
            elif key == "order":
                config[key] = value
            else:
                config[key] = int(value)
            i += 1
        i += 1
    return config


def write(out_path, name, args, commit, calls, ranks_run):
    lines = []
    for c in calls:
        kind, level, n = kind_of(c["desc"])
        entry = {"kind": kind, "level": level}
        if n is not None:
            entry["n"] = n
        entry["backend"] = c["backend"]
        entry["desc"] = c["desc"]
        entry["ranks"] = c["ranks"]
        lines.append("  " + json.dumps(entry, separators=(", ", ": ")))
    head = {
        "megatron_commit": commit,
        "source": PARALLEL_STATE + ": initialize_model_parallel"
        + (" then create_all_gather_groups" if "--all-gather-groups" in args else ""),
        "args": args,
        "config": commgrid_config(args),
        "ranks_run": [ranks_run[0], ranks_run[-1]],
    }
    text = "{\n" + "".join(f" {json.dumps(k)}: {json.dumps(v)},\n" for k, v in head.items())
    text += ' "calls": [\n' + ",\n".join(lines) + "\n ]\n}\n"
    json.loads(text)  # well-formed
    with open(os.path.join(out_path, name + ".json"), "w") as f:
        f.write(text)


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--megatron-git", required=True)
    p.add_argument("--rev", default="HEAD")
    p.add_argument("--vectors", required=True, help="a directory of golden layouts (tests/vectors/head)")
    p.add_argument("--out", required=True)
    a = p.parse_args()
    commit = subprocess.check_output(["git", "-C", a.megatron_git, "rev-parse", a.rev], text=True).strip()
    source = subprocess.check_output(["git", "-C", a.megatron_git, "show", f"{a.rev}:{PARALLEL_STATE}"])
    os.makedirs(a.out, exist_ok=True)
    ps_path = os.path.join(a.out, ".parallel_state.py")
    with open(ps_path, "wb") as f:
        f.write(source)
    install_stubs()
    configs = {}
    for fname in sorted(os.listdir(a.vectors)):
        if fname.endswith(".json"):
            with open(os.path.join(a.vectors, fname)) as f:
                v = json.load(f)
            if "error" not in v:
                configs[fname[:-5]] = v["args"]
    for name, text in EXTRA_CONFIGS.items():
        configs[name] = text.split()
    try:
        for name, args in configs.items():
            calls, ranks_run = record(ps_path, args)
            write(a.out, name, args, commit, calls, ranks_run)
            print(f"{name}: {len(calls)} new_group calls, same on ranks {ranks_run[0]}..{ranks_run[-1]}")
    finally:
        os.remove(ps_path)


if __name__ == "__main__":
    main()
