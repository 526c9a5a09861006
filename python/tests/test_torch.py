"""torch.distributed groups from commgrid.torch: 8 Gloo processes on this machine, two
layouts (tp 2 pp 2 ep 2 with Gloo twins; pp 2 cp 2 hcp [1,2], two dist-opt instances,
vpp 2). The checks run in torch_worker.py; this test starts the ranks and reads reports."""

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
    procs = [subprocess.Popen([sys.executable, WORKER, str(r), str(WORLD), str(init_file)],
                              stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
             for r in range(WORLD)]
    outputs = []
    try:
        for p in procs:
            out, err = p.communicate(timeout=240)
            outputs.append((p.returncode, out, err))
    finally:
        for p in procs:
            if p.poll() is None:
                p.kill()
    failed = [(r, rc, err[-2000:]) for r, (rc, _, err) in enumerate(outputs) if rc != 0]
    assert not failed, f"{len(failed)} ranks failed; the first: {failed[0]}"
    reports = [json.loads(out.strip().splitlines()[-1]) for _, out, _ in outputs]
    assert [r["rank"] for r in reports] == list(range(WORLD))
    for r in reports:
        # Every rank checked its groups of every kind in both layouts.
        assert len(r["checks"]) == 2 and all(c >= 20 for c in r["checks"]), r
    # torch without use_local_synchronization: every rank joins every group's creation,
    # so all ranks made the same number of new_group calls.
    assert len({tuple(r["creation_calls"]) for r in reports}) == 1, reports
    print(f"8 ranks, 2 layouts: {time.monotonic() - start:.1f} s; checks per rank "
          f"{reports[0]['checks']}; new_group calls per rank {reports[0]['creation_calls']}; "
          f"torch {reports[0]['torch']}")
