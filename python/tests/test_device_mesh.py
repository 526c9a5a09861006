"""commgrid.torch.device_mesh on 4 Gloo processes (tp 2 x dp 2, ep 2): the mesh's groups are
commgrid's (the same objects), its mesh is init_device_mesh's, DTensor redistribute works on
each dimension, and one training step with FSDP2 over "dp" and tensor parallel over "tp"
equals the same step over init_device_mesh (device_mesh_worker.py runs on each rank). Bad
dimensions and a too-old torch are refused with errors naming them."""

import os

import pytest

from rank_procs import run_ranks

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
    reports = run_ranks(tmp_path, WORKER, WORLD, [tmp_path / "rendezvous"])
    assert all(r["redistributed"] == 3 and r["params"] == 4 for r in reports), reports
