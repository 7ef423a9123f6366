"""CPU offload of FSDP2 (fully_shard) parameters on two CPU ranks over gloo: the host copies are
DTensors over host shards with the parameters' mesh and placements, so the host step sums each
tensor's statistics over the ranks as the normal step does. Bitwise the normal LuminaMoon step
under FSDP2, fp32 and bf16 parameters, clip on; offload(in_backward=True) refuses DTensor
parameters by name."""
from __future__ import annotations

import pytest
import torch

from conftest import CPU_BACKENDS, bits, require, require_fsdp2_here, spawn_ranks

require("gloo")

WORLD = 2
STEPS = 3
HYPER = dict(lr=1e-2, clip=1.0, seed=7)


def _model(dtype):
    torch.manual_seed(0)
    return torch.nn.Sequential(torch.nn.Linear(9, 14), torch.nn.Tanh(),
                               torch.nn.Linear(14, 5)).to(dtype)


def _worker(rank, out_path, dtype_name, backend):
    try:
        from torch.distributed.fsdp import fully_shard
    except ImportError:
        from torch.distributed._composable.fsdp import fully_shard
    from torch.distributed.device_mesh import init_device_mesh

    from luminamoon import LuminaMoon, offload

    dtype = getattr(torch, dtype_name)
    mesh = init_device_mesh("cpu", (WORLD,))

    def wrap(model):
        for layer in model:
            if isinstance(layer, torch.nn.Linear):
                fully_shard(layer, mesh=mesh)
        fully_shard(model, mesh=mesh)
        return model

    normal, offloaded = wrap(_model(dtype)), wrap(_model(dtype))
    opt = LuminaMoon(normal.parameters(), backend=backend, **HYPER)
    try:
        offload(offloaded, in_backward=True, backend=backend, **HYPER)
        refused = ""
    except ValueError as exc:
        refused = str(exc)
    off = offload(offloaded, backend=backend, **HYPER)
    for step in range(STEPS):
        gen = torch.Generator().manual_seed(100 * step + rank)
        x = torch.randn(6, 9, generator=gen).to(dtype)
        normal(x).float().square().mean().backward()
        opt.step()
        opt.zero_grad(set_to_none=True)
        offloaded(x).float().square().mean().backward()
        off.step()
    off.wait()
    same = [torch.equal(bits(a.full_tensor()), bits(b.full_tensor()))
            for a, b in zip(normal.parameters(), offloaded.parameters())]
    # the offload's state dict loads into a LuminaMoon over the sharded parameters
    sd = off.state_dict()
    again = LuminaMoon(offloaded.parameters(), backend=backend, **HYPER)
    again.load_state_dict(sd)
    steps = [int(s["step"]) for s in again.state_dict()["state"].values()]
    if rank == 0:
        torch.save((same, refused, steps), out_path)


@pytest.mark.parametrize("dtype,backend", [("float32", "reference"), ("bfloat16", "cpu")])
def test_fsdp2_offload_equals_the_normal_step(dtype, backend, tmp_path):
    require_fsdp2_here()
    if backend not in CPU_BACKENDS:
        require("native")
    out = str(tmp_path / "same.pt")
    spawn_ranks(_worker, WORLD, str(tmp_path), out, dtype, backend)
    same, refused, steps = torch.load(out)
    assert same and all(same), same
    assert "in_backward=True" in refused and "DTensor" in refused, refused
    assert steps == [STEPS] * 4, steps
