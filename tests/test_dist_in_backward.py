"""The step inside backward under FSDP2 (fully_shard) on two CPU ranks over gloo: FSDP2 calls
the post-accumulate-grad hooks of its sharded (DTensor) parameters once it has reduce-scattered
their gradients; the buckets (sized by the global tensors, so alike on every rank) step the
shards with S summed over the ranks. Bitwise the normal LuminaMoon step under FSDP2, fp32 and
bf16 parameters with stochastic rounding, clip on; a non-finite gradient in one rank's shard
skips that tensor on both ranks and nothing else."""
from __future__ import annotations

import pytest
import torch

from conftest import CPU_BACKENDS, bits, require, require_fsdp2_here, spawn_ranks

require("gloo")

WORLD = 2
STEPS = 3
NAN_STEP = 1  # rank 1 plants a NaN in its shard of the first layer's weight gradient
HYPER = dict(lr=1e-2, clip=1.0, seed=99)


def _model(dtype):
    torch.manual_seed(0)
    return torch.nn.Sequential(torch.nn.Linear(9, 14), torch.nn.Tanh(),
                               torch.nn.Linear(14, 5)).to(dtype)


def _worker(rank, out_path, dtype_name, bucket, backend):
    try:
        from torch.distributed.fsdp import fully_shard
    except ImportError:
        from torch.distributed._composable.fsdp import fully_shard
    from torch.distributed.device_mesh import init_device_mesh

    from luminamoon import LuminaMoon, step_in_backward

    dtype = getattr(torch, dtype_name)
    mesh = init_device_mesh("cpu", (WORLD,))

    def wrap(model):
        for layer in model:
            if isinstance(layer, torch.nn.Linear):
                fully_shard(layer, mesh=mesh)
        fully_shard(model, mesh=mesh)
        return model

    normal, hooked = wrap(_model(dtype)), wrap(_model(dtype))
    opt = LuminaMoon(normal.parameters(), backend=backend, **HYPER)
    planted = hooked[0].weight
    plant = []

    def nan_hook(p):  # registered first: runs before the step's own hook
        if plant:
            p.grad.to_local().view(-1)[0] = float("nan")

    handle = planted.register_post_accumulate_grad_hook(nan_hook)
    ib = step_in_backward(hooked, bucket_bytes=bucket, backend=backend, **HYPER)
    for step in range(STEPS):
        gen = torch.Generator().manual_seed(100 * step + rank)
        x = torch.randn(6, 9, generator=gen).to(dtype)
        plant[:] = [True] if step == NAN_STEP and rank == 1 else []
        if step != NAN_STEP:  # the normal step would skip everything: compare clean steps only
            normal(x).float().square().mean().backward()
            opt.step()
            opt.zero_grad(set_to_none=True)
        before = planted.full_tensor().clone() if step == NAN_STEP else None
        others = [p.full_tensor().clone() for p in list(hooked.parameters())[1:]]
        hooked(x).float().square().mean().backward()
        if step == NAN_STEP:
            assert torch.equal(bits(planted.full_tensor()), bits(before)), "planted tensor moved"
            moved = [not torch.equal(a, p.full_tensor()) for a, p in
                     zip(others, list(hooked.parameters())[1:])]
            assert all(moved), "a finite tensor was not stepped"
            assert int(ib.skipped_steps) == 1, int(ib.skipped_steps)
            # bring the normal run to the same parameters: step it without the planted tensor
            normal(x).float().square().mean().backward()
            normal[0].weight.grad = None
            opt.step()
            opt.zero_grad(set_to_none=True)
    handle.remove()
    same = [torch.equal(bits(a.full_tensor()), bits(b.full_tensor()))
            for a, b in zip(normal.parameters(), hooked.parameters())]
    if rank == 0:
        torch.save(same, out_path)


@pytest.mark.parametrize("dtype,bucket,backend", [
    ("float32", 0, "reference"), ("bfloat16", 10**9, "reference"),
    ("float32", 10**9, "cpu"), ("bfloat16", 0, "cpu")])
def test_fsdp2_in_backward_equals_the_normal_step(dtype, bucket, backend, tmp_path):
    require_fsdp2_here()
    if backend not in CPU_BACKENDS:
        require("native")
    out = str(tmp_path / "same.pt")
    spawn_ranks(_worker, WORLD, str(tmp_path), out, dtype, bucket, backend)
    same = torch.load(out)
    assert same and all(same), same
