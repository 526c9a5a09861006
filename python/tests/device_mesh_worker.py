"""One rank of test_device_mesh.py (4 Gloo processes: tp 2 x dp 2 with ep 2): commgrid's
DeviceMesh against torch's init_device_mesh. Prints one JSON line of what it checked."""

import json
import sys
from datetime import timedelta

import torch
import torch.distributed as dist
from torch.distributed.device_mesh import init_device_mesh
from torch.distributed.tensor import Replicate, Shard, distribute_tensor

import commgrid.torch as mpu


def expect(cond, what):
    if not cond:
        raise AssertionError(f"rank {dist.get_rank()}: {what}")


def check_meshes():
    mesh = mpu.device_mesh(("dp", "tp"))
    expect(mesh.mesh_dim_names == ("dp", "tp"), f"names {mesh.mesh_dim_names}")
    expect(mesh.get_group("tp") is mpu.get_tensor_model_parallel_group(), "tp group is commgrid's")
    expect(mesh.get_group("dp") is mpu.get_data_parallel_group(), "dp group is commgrid's")
    reference = init_device_mesh("cpu", (2, 2), mesh_dim_names=("dp", "tp"))
    expect(mesh.mesh.tolist() == reference.mesh.tolist(), f"mesh {mesh.mesh.tolist()}")
    four = mpu.device_mesh(("pp", "dp", "cp", "tp"))
    expect(list(four.mesh.shape) == [1, 2, 1, 2], f"4-D shape {four.mesh.shape}")
    flipped = mpu.device_mesh(("tp", "dp"))
    expect(flipped.mesh.tolist() == reference.mesh.t().tolist(), "transposed mesh")
    expert = mpu.device_mesh(("expt_dp", "ep", "etp"))
    expect(expert.get_group("ep") is mpu.get_expert_model_parallel_group(), "ep group")
    expect(expert.get_group("etp") is mpu.get_expert_tensor_parallel_group(), "etp group")
    errors = 0
    for bad, word in ((("dp", "dp"), "twice"), (("dp", "sp"), "'sp'"), (("dp", "ep"), "one grid")):
        try:
            mpu.device_mesh(bad)
        except ValueError as e:
            expect(word in str(e), f"{bad}: {e}")
            errors += 1
    expect(errors == 3, "bad dimensions must raise ValueError")
    return mesh, reference


def check_redistribute(mesh):
    """A tensor sharded on each dimension in turn, made whole again by redistribute."""
    full = torch.arange(48, dtype=torch.float32).reshape(8, 6)
    checks = 0
    for dim in range(mesh.ndim):
        placements = [Replicate()] * mesh.ndim
        placements[dim] = Shard(0)
        d = distribute_tensor(full, mesh, placements)
        coord = mesh.get_coordinate()[dim]
        expect(torch.equal(d.to_local(), full.chunk(mesh.size(dim))[coord]), f"shard on {dim}")
        whole = d.redistribute(mesh, [Replicate()] * mesh.ndim)
        expect(torch.equal(whole.to_local(), full), f"redistribute on dim {dim}")
        checks += 1
    return checks


def train_step(mesh):
    """One step of a small MLP with tensor parallel over "tp" and FSDP2 over "dp"; returns
    the full parameters after the step."""
    from torch.distributed.fsdp import fully_shard
    from torch.distributed.tensor.parallel import (ColwiseParallel, RowwiseParallel,
                                                   parallelize_module)

    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.ReLU(), torch.nn.Linear(16, 4))
    parallelize_module(model, mesh["tp"], {"0": ColwiseParallel(), "2": RowwiseParallel()})
    fully_shard(model, mesh=mesh["dp"])
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    gen = torch.Generator().manual_seed(100 + mesh.get_coordinate()[0])  # one batch per dp rank
    x = torch.randn(4, 8, generator=gen)
    loss = model(x).pow(2).sum()
    loss.backward()
    opt.step()
    return [p.full_tensor() for p in model.parameters()]


def main():
    rank, world, init_file = int(sys.argv[1]), int(sys.argv[2]), sys.argv[3]
    dist.init_process_group("gloo", init_method=f"file://{init_file}", rank=rank, world_size=world,
                            timeout=timedelta(seconds=120))
    mpu.initialize_model_parallel(tensor_model_parallel_size=2, expert_model_parallel_size=2,
                                  expert_tensor_parallel_size=1)
    mesh, reference = check_meshes()
    redistributed = check_redistribute(mesh) + check_redistribute(mpu.device_mesh(("tp",)))
    ours = train_step(mesh)
    theirs = train_step(reference)
    expect(all(torch.allclose(a, b) for a, b in zip(ours, theirs)),
           "a training step on commgrid's mesh differs from one on init_device_mesh's")
    torch.manual_seed(0)
    initial = torch.nn.Linear(8, 16)
    expect(not torch.allclose(ours[0], initial.weight), "the step changed nothing")
    mpu.destroy_model_parallel()
    dist.barrier()
    print(json.dumps({"rank": rank, "redistributed": redistributed, "params": len(ours)}))
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
