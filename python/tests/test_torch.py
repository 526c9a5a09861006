"""torch.distributed groups from commgrid.torch: 8 Gloo processes on this machine, six
checks: two seed layouts (tp 2 pp 2 ep 2 with Gloo twins; pp 2 cp 2 hcp [1,2], two dist-opt
instances, vpp 2), two HEAD layouts through commgrid.torch.head (gtp_remat 2, cp 2, ep 2,
hybrid cp; cp 2 ep 2 with the all-gather groups; ProcessGroupCollection), the seed's encoder
split against
Megatron's own record, and HyperCommGrid.create_pg. The checks run in torch_worker.py; this
test starts the ranks and reads reports."""

import json
import os
import subprocess
import sys
import time

import pytest

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
    # Each rank writes to files (no pipe can fill up and block it); the first rank that
    # fails stops the test at once: the others would wait for it in a collective.
    files = [(tmp_path / f"rank{r}.out", tmp_path / f"rank{r}.err") for r in range(WORLD)]
    procs = []
    for r, (out_file, err_file) in enumerate(files):
        with open(out_file, "w") as out, open(err_file, "w") as err:
            procs.append(subprocess.Popen([sys.executable, WORKER, str(r), str(WORLD),
                                           str(init_file)], stdout=out, stderr=err))
    deadline = time.monotonic() + 240
    failed = None
    try:
        while time.monotonic() < deadline:
            codes = [p.poll() for p in procs]
            failed = next((r for r, c in enumerate(codes) if c not in (None, 0)), None)
            if failed is not None or all(c == 0 for c in codes):
                break
            time.sleep(0.2)
    finally:
        for p in procs:
            if p.poll() is None:
                p.kill()
                p.wait()
    outputs = [(o.read_text(), e.read_text()) for o, e in files]
    assert failed is None, f"rank {failed} failed: {outputs[failed][1][-3000:]}"
    assert all(p.returncode == 0 for p in procs), "ranks still running after 240 s"
    reports = [json.loads(out.strip().splitlines()[-1]) for out, _ in outputs]
    assert [r["rank"] for r in reports] == list(range(WORLD))
    for r in reports:
        # Every rank checked its groups of every kind in both layouts.
        assert len(r["checks"]) == 6 and all(c >= 20 for c in r["checks"][:4]), r
        assert r["checks"][4] >= 5 and r["checks"][5] == 3, r
    # Every rank made the same number of new_group calls (with the "local" strategy too):
    # torch names later groups by that count.
    assert len({tuple(r["creation_calls"][:5]) for r in reports}) == 1, reports
    print(f"8 ranks, 2 layouts: {time.monotonic() - start:.1f} s; checks per rank "
          f"{reports[0]['checks']}; new_group calls per rank {reports[0]['creation_calls']}; "
          f"torch {reports[0]['torch']}")
