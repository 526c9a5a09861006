"""torch.distributed groups from commgrid.torch: 8 Gloo processes on this machine, eight
checks: two seed layouts (tp 2 pp 2 ep 2 with Gloo twins; pp 2 cp 2 hcp [1,2], two dist-opt
instances, vpp 2), two HEAD layouts through commgrid.torch.head (gtp_remat 2, cp 2, ep 2,
hybrid cp; cp 2 ep 2 with the all-gather groups; ProcessGroupCollection), the seed's encoder
split against
Megatron's own record, HyperCommGrid.create_pg, the Gloo connection modes (eager
connects a rank's pairs at creation, lazy at first use), and the Gloo device modes and
identical-group sharing. The checks run in torch_worker.py; this
test starts the ranks and reads reports."""

import os
import time

import pytest

from rank_procs import run_ranks

torch = pytest.importorskip("torch", reason="python3-torch is not installed")
if not torch.distributed.is_available() or not torch.distributed.is_gloo_available():
    pytest.skip("this torch has no torch.distributed Gloo backend", allow_module_level=True)

WORLD = 8
WORKER = os.path.join(os.path.dirname(__file__), "torch_worker.py")


def test_every_group_of_two_layouts_on_8_gloo_ranks(tmp_path):
    if not os.environ.get("COMMGRID_CLI"):
        pytest.skip("COMMGRID_CLI (the commgrid command, whose plan the groups are checked "
                    "against) is not set; ctest sets it")
    init_file = tmp_path / "rendezvous"
    start = time.monotonic()
    reports = run_ranks(tmp_path, WORKER, WORLD, [init_file])
    for r in reports:
        # Every rank checked its groups of every kind in both layouts.
        assert len(r["checks"]) == 8 and all(c >= 20 for c in r["checks"][:4]), r
        assert r["checks"][4] >= 5 and r["checks"][5] == 3, r
        assert r["checks"][6] == len(r["gloo_connections"]) >= 1, r
        assert r["checks"][7] == len(r["gloo_devices"]) + 2, r
    # Every rank made the same number of new_group calls (with the "local" strategy too):
    # torch names later groups by that count.
    assert len({tuple(r["creation_calls"][:5]) for r in reports}) == 1, reports
    print(f"8 ranks, 2 layouts: {time.monotonic() - start:.1f} s; checks per rank "
          f"{reports[0]['checks']}; new_group calls per rank {reports[0]['creation_calls']}; "
          f"torch {reports[0]['torch']}")
