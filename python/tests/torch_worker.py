"""One rank of the torch.distributed test (test_torch.py starts 8 of these over Gloo).

For each layout: every group of every kind this rank is in has the members that
`commgrid plan --format json --rank R` (the C++ CLI) lists, proven with an allgather of
global ranks inside the group; an allreduce over it sums what it must; the parallel_state
getters and the collections agree with the plan. Exits non-zero with a message on the
first mismatch.
"""

import json
import os
import subprocess
import sys
from datetime import timedelta

import torch
import torch.distributed as dist

import commgrid
import commgrid.torch as ps
import commgrid.torch.head as head
from commgrid._state import GLOO_GLOBAL

CLI = os.environ["COMMGRID_CLI"]


def plan_for(rank, args):
    out = subprocess.run([CLI, "plan", "--format", "json", "--rank", str(rank), "--world-size",
                          str(dist.get_world_size())] + args,
                         check=True, capture_output=True, text=True).stdout
    return json.loads(out)["groups"]


def expect(cond, what):
    if not cond:
        raise AssertionError(f"rank {dist.get_rank()}: {what}")


def check_group(kind, group, members, rank):
    """The group holds exactly `members` (communicator ranks in ascending global order)
    and an allreduce over it is right."""
    expect(group is not None, f"{kind}: no torch group, plan says {members}")
    ordered = sorted(members)
    expect(dist.get_world_size(group=group) == len(members), f"{kind}: size")
    expect(dist.get_rank(group=group) == ordered.index(rank),
           f"{kind}: group rank {dist.get_rank(group=group)}, expected {ordered.index(rank)}")
    gathered = [torch.zeros(1, dtype=torch.int64) for _ in members]
    dist.all_gather(gathered, torch.tensor([rank], dtype=torch.int64), group=group)
    got = [int(t.item()) for t in gathered]
    expect(got == ordered, f"{kind}: allgather of ranks {got}, expected {ordered}")
    t = torch.tensor([rank + 1], dtype=torch.int64)
    dist.all_reduce(t, group=group)
    expect(int(t.item()) == sum(m + 1 for m in members), f"{kind}: allreduce {int(t.item())}")


def check_layout(args, kwargs, gloo_twins):
    rank = dist.get_rank()
    ps.initialize_model_parallel(create_gloo_process_groups=gloo_twins, **kwargs)
    plan = plan_for(rank, args)
    checks = 0
    expect(sorted(plan) == sorted(ps.STATE.layout.kinds()), f"kinds {sorted(plan)}")
    for kind, members in plan.items():
        group = ps.STATE.group(kind)
        if kind == "hcp":
            expect(len(group) == len(members), "hcp levels")
            for level, (g, m) in enumerate(zip(group, members)):
                check_group(f"hcp[{level}]", g, m, rank)
                checks += 1
        elif members is None:
            expect(group is None, f"{kind}: a group, but the plan has none for this rank")
        else:
            check_group(kind, group, members, rank)
            expect(ps.get_global_ranks(kind) == members, f"{kind}: global ranks")
            checks += 1
    for kind in ("dp", "dp_cp", "intra_dp_cp", "expt_dp", "intra_expt_dp"):
        if gloo_twins:
            check_group(kind + " (gloo)", ps.STATE.vars[GLOO_GLOBAL[kind]], plan[kind], rank)
            checks += 1

    # The getters, against the plan and spec §9.
    def pos(kind):
        return sorted(plan[kind]).index(rank)

    got = {
        "tp": (ps.get_tensor_model_parallel_rank(), ps.get_tensor_model_parallel_world_size()),
        "pp": (ps.get_pipeline_model_parallel_rank(), ps.get_pipeline_model_parallel_world_size()),
        "dp": (ps.get_data_parallel_rank(), ps.get_data_parallel_world_size()),
        "dp_cp": (ps.get_data_parallel_rank(with_context_parallel=True),
                  ps.get_data_parallel_world_size(with_context_parallel=True)),
        "intra_dp_cp": (ps.get_data_parallel_rank(True, True), ps.get_data_parallel_world_size(True, True)),
        "cp": (ps.get_context_parallel_rank(), ps.get_context_parallel_world_size()),
        "tp_cp": (ps.get_tensor_and_context_parallel_rank(),
                  ps.get_tensor_and_context_parallel_world_size()),
        "ep": (ps.get_expert_model_parallel_rank(), ps.get_expert_model_parallel_world_size()),
        "expt_tp": (ps.get_expert_tensor_parallel_rank(), ps.get_expert_tensor_parallel_world_size()),
        "tp_ep": (ps.get_expert_tensor_and_model_parallel_rank(),
                  ps.get_expert_tensor_and_model_parallel_world_size()),
        "expt_dp": (ps.get_expert_data_parallel_rank(), ps.get_expert_data_parallel_world_size()),
        "intra_expt_dp": (ps.get_expert_data_parallel_rank(True),
                          ps.get_expert_data_parallel_world_size(True)),
    }
    for kind, value in got.items():
        expect(value == (pos(kind), len(plan[kind])), f"getters of {kind}: {value}")
        checks += 1
    pp = plan["pp"]
    k = pp.index(rank)
    expect(ps.get_pipeline_model_parallel_first_rank() == pp[0], "pp first rank")
    expect(ps.get_pipeline_model_parallel_last_rank() == pp[-1], "pp last rank")
    expect(ps.get_pipeline_model_parallel_next_rank() == pp[(k + 1) % len(pp)], "pp next rank")
    expect(ps.get_pipeline_model_parallel_prev_rank() == pp[(k - 1) % len(pp)], "pp prev rank")
    expect(ps.is_pipeline_first_stage(ignore_virtual=True) == (k == 0), "first stage")
    expect(ps.is_pipeline_last_stage(ignore_virtual=True) == (k == len(pp) - 1), "last stage")
    expect(ps.is_rank_in_embedding_group(ignore_virtual=True) == (plan["embd"] is not None), "in embd")
    expect(ps.is_rank_in_position_embedding_group() == (plan["pos_embd"] is not None), "in pos_embd")
    expect(ps.get_tensor_model_parallel_src_rank() == plan["tp"][0], "tp src")
    expect(ps.get_model_parallel_src_rank() == plan["mp"][0], "mp src")
    expect(ps.get_data_parallel_src_rank() == plan["dp"][0], "dp src")
    expect(ps.get_data_parallel_src_rank(with_context_parallel=True) == plan["dp_cp"][0], "dp_cp src")
    expect(ps.get_context_parallel_global_ranks() == plan["cp"], "cp global ranks")
    all_ranks = "_".join(str(pos(x)) for x in ("tp", "dp", "cp", "pp", "ep"))
    expect(ps.get_all_ranks() == all_ranks, f"get_all_ranks {ps.get_all_ranks()} != {all_ranks}")
    for (with_cp, tp_only), kind in {(True, False): "tp_dp_cp", (True, True): "tp_cp",
                                     (False, False): "tp_dp", (False, True): "tp"}.items():
        expect(ps.get_amax_reduction_group(with_cp, tp_only) is ps.STATE.group(kind), f"amax {kind}")
    vpp = kwargs.get("virtual_pipeline_model_parallel_size")
    if vpp:
        expect(ps.get_virtual_pipeline_model_parallel_rank() == 0, "vpp rank")
        expect(ps.get_virtual_pipeline_model_parallel_world_size() == vpp, "vpp size")
        expect(ps.is_pipeline_first_stage() == (k == 0), "first stage, virtual 0")
        expect(not ps.is_pipeline_last_stage(), "last stage needs the last virtual rank")
        ps.set_virtual_pipeline_model_parallel_rank(vpp - 1)
        expect(ps.is_pipeline_last_stage() == (k == len(pp) - 1), "last stage, last virtual")
        expect(not ps.is_pipeline_first_stage(), "first stage needs virtual rank 0")
    if "inter_dist_opt" in plan:
        expect(ps.get_inter_distributed_optimizer_instance_group() is ps.STATE.group("inter_dist_opt"),
               "inter dist-opt getter")
    else:
        try:
            ps.get_inter_distributed_optimizer_instance_group()
            expect(False, "inter_dist_opt with one instance must raise")
        except commgrid.StateError:
            pass

    # The collections read the same state.
    model = commgrid.ModelCommProcessGroups.use_mpu_process_groups()
    for f in ("tp", "pp", "mp", "embd", "pos_embd", "cp", "tp_cp", "ep", "expt_tp", "tp_ep",
              "tp_ep_pp", "expt_dp"):
        expect(getattr(model, f) is ps.STATE.group(f), f"ModelCommProcessGroups.{f}")
        expect((getattr(model, f) is None) == (plan[f] is None), f"ModelCommProcessGroups.{f} None")
    expect(model.hcp == ps.STATE.group("hcp"), "ModelCommProcessGroups.hcp")
    grad = commgrid.GradCommProcessGroups.use_mpu_process_groups(["dp", "inter_dist_opt"])
    expect(grad.dp is ps.get_data_parallel_group(), "GradCommProcessGroups.dp")
    expect(grad.inter_dist_opt is ps.STATE.group("inter_dist_opt"), "GradCommProcessGroups.inter")
    expect(not hasattr(grad, "dp_cp"), "unrequested field stays unset")

    try:
        ps.initialize_model_parallel(**kwargs)
        expect(False, "a second initialize must raise")
    except commgrid.StateError:
        pass
    calls = ps.STATE.creation_calls
    ps.destroy_model_parallel()
    expect(not ps.is_initialized(), "destroyed")
    expect(ps.get_tensor_model_parallel_group(check_initialized=False) is None, "tp after destroy")
    return checks, calls


def check_head(args, kwargs, all_gather):
    """HEAD's edition (commgrid.torch.head): every group against `commgrid plan --compat head`,
    the hybrid groups, create_all_gather_groups and ProcessGroupCollection."""
    rank = dist.get_rank()
    head.initialize_model_parallel(**kwargs)
    plan = plan_for(rank, args + ["--compat", "head"])
    checks = 0
    for name, members in plan.items():
        if name.startswith("hybrid_dp_cp_"):
            group = head._HYBRID_DP_CP_GROUPS.get(int(name.rsplit("_", 1)[1]))
        else:
            group = ps.STATE.group(name)
        if members is None:
            expect(group is None, f"{name}: a group, but the plan has none for this rank")
            continue
        check_group(name, group, members, rank)
        checks += 1
    expect(head.get_gtp_weight_remat_world_size() == len(plan["gtp_remat"]), "gtp_remat size")
    expect(head.get_data_parallel_world_size() == len(plan["dp_gtp_remat"]), "dp with gtp_remat")
    expect(head.get_data_parallel_world_size(with_gtp_remat=False) == len(plan["dp"]), "dp replicate")
    if all_gather:  # (HEAD's all-gather grid over-counts gtp_remat: the core refuses it there)
        dp_cp_ag, expt_dp_ag = head.create_all_gather_groups(for_expert_parallelism=True)
        check_group("dp_cp_ag", dp_cp_ag, plan["dp_cp"], rank)
        check_group("expt_dp_ag", expt_dp_ag, plan["expt_dp"], rank)
    pgc = commgrid.ProcessGroupCollection.use_mpu_process_groups()
    expect(pgc.dp is head.get_data_parallel_group(with_gtp_remat=False), "collection dp")
    expect(pgc.gtp_remat is head.get_gtp_weight_remat_group(), "collection gtp_remat")
    expect(f"gtp_remat({len(plan['gtp_remat'])})" in repr(pgc), f"collection repr {pgc!r}")
    calls = ps.STATE.creation_calls
    head.destroy_model_parallel()
    return checks + 2, calls


def check_encoder(kwargs, record):
    """The seed's encoder split: this rank's real groups hold what Megatron's own code gives
    it (the record of python/tests/data/megatron_records)."""
    rank = dist.get_rank()
    ps.initialize_model_parallel(**kwargs)
    want = record["globals"][str(rank)]
    checks = 0
    for name in ("_TENSOR_MODEL_PARALLEL_GROUP", "_DATA_PARALLEL_GROUP", "_MODEL_PARALLEL_GROUP",
                 "_EXPERT_DATA_PARALLEL_GROUP", "_PIPELINE_MODEL_PARALLEL_GROUP"):
        got, expected = getattr(ps, name), want[name]
        if isinstance(expected, dict):
            got, expected = [got], [expected]
        expect(len(got) == len(expected), f"{name}: {len(got)} groups, Megatron {len(expected)}")
        for g, e in zip(got, expected):
            check_group(name, g, e["ranks"], rank)
            checks += 1
    pipelines = want["_PIPELINE_GLOBAL_RANKS"]
    several = isinstance(pipelines[0], list)
    nexts = [p[(p.index(rank) + 1) % len(p)] for p in (pipelines if several else [pipelines])]
    expect(ps.get_pipeline_model_parallel_next_rank() == (nexts if several else nexts[0]),
           f"pp next rank {ps.get_pipeline_model_parallel_next_rank()}, Megatron's pipelines {pipelines}")
    calls = ps.STATE.creation_calls
    ps.destroy_model_parallel()
    return checks, calls


def check_hyper_comm_grid():
    """HyperCommGrid.create_pg on real ranks: each group holds get_rank_enum's members."""
    rank = dist.get_rank()
    grid = commgrid.HyperCommGrid([2, 2, 2], ["tp", "cp", "dp"])
    checks = 0
    for dims in (["tp", "cp"], "dp", ["dp", "tp"]):
        group = grid.create_pg(dims)
        members = next(m for m in grid.get_rank_enum(dims) if rank in m)
        check_group(f"grid {dims}", group, members, rank)
        checks += 1
    grid.destroy()
    return checks, 0


def _sockets(state="01"):
    """The TCP sockets this process holds in ``state`` (01: connected, the default; 0A:
    listening, one per Gloo device whether or not it connects)."""
    inodes = set()
    for fd in os.listdir("/proc/self/fd"):
        try:
            link = os.readlink(f"/proc/self/fd/{fd}")
        except OSError:  # the listing's own descriptor, closed since
            continue
        if link.startswith("socket:["):
            inodes.add(link[len("socket:["):-1])
    count = 0
    for table in ("/proc/self/net/tcp", "/proc/self/net/tcp6"):
        with open(table) as f:
            for line in f.readlines()[1:]:
                fields = line.split()
                count += fields[3] == state and fields[9] in inodes
    return count


def check_gloo_connection():
    """gloo_connection: "eager" connects every pair of the rank's groups in their
    constructors, "lazy" (auto's choice where torch has it) none until a group's first
    collective; both leave TORCH_GLOO_LAZY_INIT as it was, and a mode this torch lacks is
    an InvalidValueError naming the parameter, raised before any group exists."""
    kwargs = dict(tensor_model_parallel_size=2, pipeline_model_parallel_size=2)
    expect("TORCH_GLOO_LAZY_INIT" not in os.environ, "TORCH_GLOO_LAZY_INIT set before the check")
    opened = {}
    for mode in ps.gloo_connections():
        dist.barrier()
        before = _sockets()
        ps.initialize_model_parallel(gloo_connection=mode, share_identical_groups=False, **kwargs)
        # Counted once every rank has made its groups and before any uses one (a lazy
        # group's first collective connects its peers to this rank too).
        dist.barrier()
        opened[mode] = _sockets() - before
        expect("TORCH_GLOO_LAZY_INIT" not in os.environ,
               f"{mode}: TORCH_GLOO_LAZY_INIT left at {os.environ.get('TORCH_GLOO_LAZY_INIT')}")
        rank = dist.get_rank()
        check_group(f"tp ({mode})", ps.get_tensor_model_parallel_group(),
                    [r for r in range(dist.get_world_size()) if r // 2 == rank // 2], rank)
        ps.destroy_model_parallel()
    # This rank's groups of tp 2 x pp 2 on 8 ranks have 20 pairs and more (two Gloo contexts
    # a group): eager connects them all, lazy none of them before their first use.
    if "lazy" in opened:
        expect(opened["eager"] >= 20 and opened["lazy"] * 4 <= opened["eager"],
               f"sockets opened by the initialization: {opened}")
    try:
        ps.initialize_model_parallel(gloo_connection="sometimes", **kwargs)
        expect(False, 'gloo_connection="sometimes" must raise')
    except commgrid.InvalidValueError as e:
        expect("gloo_connection" in str(e) and "sometimes" in str(e), f"error text: {e}")
    expect(not ps.model_parallel_is_initialized(), "a refused mode left groups behind")
    return len(opened), 0


def check_gloo_sharing():
    """gloo_device: "shared" puts every Gloo group of one initialization on one device (one
    listening socket), "per_group" gives each its own (one each). share_identical_groups:
    kinds with the same rank sets get one group object (dp and dp_cp with cp 1, a Gloo twin
    and its Gloo group), which destroy_model_parallel leaves usable; False gives each kind
    its own, as Megatron. Bad values of either are InvalidValueErrors naming the parameter,
    raised before any group exists."""
    rank, world = dist.get_rank(), dist.get_world_size()
    kwargs = dict(tensor_model_parallel_size=2, pipeline_model_parallel_size=2)
    listening = {}
    for mode in ps.gloo_devices():
        dist.barrier()
        before = _sockets("0A")
        ps.initialize_model_parallel(gloo_device=mode, gloo_connection="eager",
                                     share_identical_groups=False, **kwargs)
        listening[mode] = _sockets("0A") - before
        check_group(f"dp ({mode})", ps.get_data_parallel_group(),
                    [r for r in range(world) if r % 2 == rank % 2 and r // 4 == rank // 4], rank)
        check_group(f"tp ({mode})", ps.get_tensor_model_parallel_group(),
                    [r for r in range(world) if r // 2 == rank // 2], rank)
        ps.destroy_model_parallel()
    if "shared" in listening:
        expect(listening["shared"] == 1, f"listening sockets of a shared device: {listening}")
    # tp 2 x pp 2 on 8 ranks: a rank makes 20 Gloo groups (the twins included), a device each.
    expect(listening["per_group"] >= 10, f"listening sockets, a device per group: {listening}")
    for share in (True, False):
        dist.barrier()
        ps.initialize_model_parallel(share_identical_groups=share, **kwargs)
        dp, dp_cp = ps.get_data_parallel_group(), ps.get_data_parallel_group(with_context_parallel=True)
        twin = ps.get_data_parallel_group_gloo()
        expect((dp is dp_cp) == share and (twin is dp) == share,
               f"share_identical_groups={share}: dp is dp_cp {dp is dp_cp}, twin is dp {twin is dp}")
        expect((ps.get_embedding_group() is ps.get_pipeline_model_parallel_group()) == share,
               f"share_identical_groups={share}: embd (first and last stage of 2) vs pp")
        ps.destroy_model_parallel()
        # The twin is destroyed as Megatron destroys it, unless it is dp's own group.
        t = torch.ones(1)
        if share:
            dist.all_reduce(t, group=dp)
            expect(t.item() == 2, f"dp after destroy_model_parallel: {t.item()}")
        else:
            expect(twin not in dist.distributed_c10d._world.pg_map, "an unshared twin outlived destroy")
    bad = [(dict(gloo_device="sometimes"), commgrid.InvalidValueError),
           (dict(share_identical_groups="yes"), commgrid.InvalidValueError)]
    if "shared" in ps.gloo_devices() and "lazy" in ps.gloo_connections():
        bad.append((dict(gloo_device="shared", gloo_connection="lazy"), commgrid.IncompatibleError))
    for given, error in bad:
        try:
            ps.initialize_model_parallel(**given, **kwargs)
            expect(False, f"{given} must raise")
        except error as e:
            name, value = next(iter(given.items()))
            expect(e.parameter == name and value in str(e), f"error text: {e}")
        expect(not ps.model_parallel_is_initialized(), f"{given} left groups behind")
    return len(listening) + 2, 0


def main():
    rank, world, init_file = int(sys.argv[1]), int(sys.argv[2]), sys.argv[3]
    # A bounded timeout: a rank that fails makes the others fail soon, not in 30 minutes.
    dist.init_process_group("gloo", init_method=f"file://{init_file}", rank=rank, world_size=world,
                            timeout=timedelta(seconds=120))
    # A bad config fails on every rank before any group exists: no rank waits.
    try:
        ps.initialize_model_parallel(tensor_model_parallel_size=3)
        expect(False, "tp 3 on 8 ranks must raise")
    except commgrid.DivisibilityError:
        pass
    report = []
    a = check_layout(["--tp", "2", "--pp", "2", "--ep", "2"],
                     dict(tensor_model_parallel_size=2, pipeline_model_parallel_size=2,
                          expert_model_parallel_size=2), gloo_twins=True)
    report.append(a)
    b = check_layout(["--pp", "2", "--cp", "2", "--hcp", "1,2", "--dist-opt-instances", "2",
                      "--vpp", "2"],
                     dict(pipeline_model_parallel_size=2, context_parallel_size=2,
                          hierarchical_context_parallel_sizes=[1, 2],
                          num_distributed_optimizer_instances=2,
                          virtual_pipeline_model_parallel_size=2), gloo_twins=False)
    report.append(b)
    report.append(check_head(["--cp", "2", "--ep", "2", "--etp", "1", "--gtp-remat", "2",
                              "--hybrid-context-parallel"],
                             dict(context_parallel_size=2, expert_model_parallel_size=2,
                                  expert_tensor_parallel_size=1, gtp_remat_size=2,
                                  hybrid_context_parallel=True), all_gather=False))
    report.append(check_head(["--cp", "2", "--ep", "2"],
                             dict(context_parallel_size=2, expert_model_parallel_size=2), all_gather=True))
    with open(os.path.join(os.path.dirname(__file__), "data", "megatron_records",
                           "seed-enc-tp3-etp1.json")) as f:
        record = json.load(f)
    report.append(check_encoder(record["kwargs"], record))
    report.append(check_hyper_comm_grid())
    report.append(check_gloo_connection())
    report.append(check_gloo_sharing())
    dist.barrier()
    print(json.dumps({"rank": rank, "checks": [c for c, _ in report],
                      "creation_calls": [n for _, n in report], "torch": torch.__version__,
                      "gloo_connections": ps.gloo_connections(),
                      "gloo_devices": ps.gloo_devices()}))
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
