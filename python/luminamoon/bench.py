"""`luminamoon bench`: time one optimizer step per available backend on this machine.

A quick look; the full suite with the bandwidth ceiling, many shapes and CSV results is
benchmarks/bench_step.py.
"""
from __future__ import annotations

import argparse
import statistics
import time
from typing import List, Optional


def _time_steps(opt, params, *, steps: int, warmup: int, sync) -> float:
    for p in params:
        p.grad = torch_randn_like(p)
    for _ in range(warmup):
        opt.step()
    sync()
    samples = []
    for _ in range(steps):
        start = time.perf_counter()
        opt.step()
        sync()
        samples.append(time.perf_counter() - start)
    return statistics.median(samples)


def state_nbytes(opt) -> int:
    """Bytes of the storages behind the tensors of ``opt.state``, each storage once (a tensor
    subclass, such as torchao's 8-bit state, through its inner tensors): what the state holds,
    not what the allocator reserved. The demo and the benchmarks measure state with it."""
    import torch

    seen, total = set(), 0

    def visit(t) -> None:
        nonlocal total
        if type(t) is not torch.Tensor and hasattr(t, "__tensor_flatten__"):
            for name in t.__tensor_flatten__()[0]:
                visit(getattr(t, name))
            return
        storage = t.untyped_storage()
        if (storage.data_ptr(), t.device) not in seen:
            seen.add((storage.data_ptr(), t.device))
            total += storage.nbytes()

    for state in opt.state.values():
        for value in state.values():
            if isinstance(value, torch.Tensor):
                visit(value)
    return total


def torch_randn_like(p):
    import torch

    return torch.randn(p.shape, device=p.device, dtype=p.dtype)


def main(argv: Optional[List[str]] = None) -> int:
    import torch

    from . import LuminaMoon

    parser = argparse.ArgumentParser(prog="luminamoon bench", description=__doc__.splitlines()[0])
    parser.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    parser.add_argument("--numel", type=int, default=None, help="elements per tensor")
    parser.add_argument("--tensors", type=int, default=8)
    parser.add_argument("--steps", type=int, default=20)
    parser.add_argument("--backends", default=None, help="comma-separated; default: all that run here")
    args = parser.parse_args(argv)

    device = torch.device(args.device)
    numel = args.numel or (1 << 22 if device.type == "cuda" else 1 << 18)
    gen = torch.Generator(device="cpu").manual_seed(0)
    base = [torch.randn(numel, generator=gen) for _ in range(args.tensors)]

    def sync():
        if device.type == "cuda":
            torch.cuda.synchronize(device)

    if args.backends:
        names = args.backends.split(",")
    else:
        names = ["reference", "cpu"] if device.type == "cpu" else ["reference", "triton"]
    print(f"device {device}, {args.tensors} tensors x {numel} float32 elements, median of {args.steps} steps")
    print(f"{'optimizer':<28} {'ms/step':>10}")
    rows = []
    for name in names:
        params = [b.clone().to(device).requires_grad_() for b in base]
        try:
            opt = LuminaMoon(params, lr=1e-3, seed=0, backend=name)
            t = _time_steps(opt, params, steps=args.steps, warmup=3, sync=sync)
        except Exception as exc:  # a backend that cannot run here is reported, not fatal
            print(f"{'LuminaMoon/' + name:<28} {'n/a':>10}  ({type(exc).__name__}: {exc})")
            continue
        rows.append((f"LuminaMoon/{name}", t))
    params = [b.clone().to(device).requires_grad_() for b in base]
    fused = device.type == "cuda"
    opt = torch.optim.AdamW(params, lr=1e-3, fused=fused) if fused else torch.optim.AdamW(params, lr=1e-3, foreach=True)
    rows.append((f"torch AdamW ({'fused' if fused else 'foreach'})",
                 _time_steps(opt, params, steps=args.steps, warmup=3, sync=sync)))
    for name, t in rows:
        print(f"{name:<28} {1e3 * t:>10.3f}")
    return 0
