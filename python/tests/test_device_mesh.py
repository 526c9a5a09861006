"""commgrid.torch.device_mesh on 4 Gloo processes (tp 2 x dp 2, ep 2): the mesh's groups are
commgrid's (the same objects), its mesh is init_device_mesh's, DTensor redistribute works on
each dimension, and one training step with FSDP2 over "dp" and tensor parallel over "tp"
equals the same step over init_device_mesh (device_mesh_worker.py runs on each rank). Bad
dimensions and a too-old torch are refused with errors naming them."""

import json
import os
import subprocess
import sys
import time

import pytest

torch = pytest.importorskip("torch", reason="torch is not installed (scripts/install-venv)")

from commgrid.torch._version import check_torch  # noqa: E402

WORLD = 4
WORKER = os.path.join(os.path.dirname(__file__), "device_mesh_worker.py")


def test_too_old_torch_is_named():
    with pytest.raises(ImportError, match=r"commgrid.torch.device_mesh needs torch >= 2.6, but this "
                                          r"is torch 2.5.1"):
        check_torch("2.5.1", "commgrid.torch.device_mesh")
    with pytest.raises(ImportError, match=r"needs torch >= 2.6, but this is torch 1.13.1"):
        check_torch("1.13.1")
    check_torch("2.15.0+cu132")
    check_torch("2.6.0a0")


def test_device_mesh_on_4_gloo_ranks(tmp_path):
    files = [(tmp_path / f"rank{r}.out", tmp_path / f"rank{r}.err") for r in range(WORLD)]
    procs = []
    for r, (out_file, err_file) in enumerate(files):
        with open(out_file, "w") as out, open(err_file, "w") as err:
            procs.append(subprocess.Popen([sys.executable, WORKER, str(r), str(WORLD),
                                           str(tmp_path / "rendezvous")], stdout=out, stderr=err))
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
    assert all(r["redistributed"] == 3 and r["params"] == 4 for r in reports), reports
