"""Host cost of one optimizer step on many tiny tensors: the Python plan check and the launches.

For each tensor count and mode it builds N parameters (1 to 4096 elements each by default, as
bench_step's tiny-1000 case, or a fixed size with --numel), takes one step to build the plan,
then times with perf_counter_ns:
- step: ``optimizer.step()`` as a training loop calls it (median over --steps steps);
- check: the step's plan check alone (``LuminaMoon._take_grads``: the parameters, their
  addresses and layouts, this step's gradients), median over as many calls.
Each is printed per step and per tensor; with --repeat R the whole measurement runs R times
and the least of the R medians is printed (a shared machine's other load only adds time). On a GPU the device is synchronised every 20 steps,
outside the timed calls, so that a full launch queue never makes a step wait; nothing waits
for the device inside them. The garbage collector is off while timing.

  python benchmarks/bench_host_step.py                                   # cpu backend, 1000 and 10000 tensors
  python benchmarks/bench_host_step.py --tensors 1000 --numel 8 --modes adamw
  python benchmarks/bench_host_step.py --backend triton --device cuda    # the H200's host cost
  python benchmarks/bench_host_step.py --new-grads                       # new gradient tensors every step

It imports the installed luminamoon (with its compiled module, which the cpu backend needs);
--src DIR puts DIR (a folder holding a luminamoon package) first on the path instead.
"""
from __future__ import annotations

import argparse
import gc
import os
import platform
import statistics
import sys
import time
from typing import Dict, List

MODES: Dict[str, dict] = {
    # the single-pass kernel
    "adamw": dict(clip=0.0, bound_mode="none", nonfinite="propagate"),
    # two passes: the clip statistic and the device-side skip decision
    "clip": dict(clip=4.0, bound_mode="none", nonfinite="skip"),
    # plus the "rel" bound (p_init read)
    "clip-rel": dict(clip=4.0, bound_mode="rel", bound=1.0, nonfinite="skip"),
}


def _parse() -> argparse.Namespace:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--backend", default="cpu", help="cpu, triton, aot, reference (default cpu)")
    ap.add_argument("--device", default=None, help="cpu or cuda (default: cuda for triton/aot)")
    ap.add_argument("--tensors", default="1000,10000", help="comma-separated tensor counts")
    ap.add_argument("--numel", type=int, default=0,
                    help="elements per tensor; 0 (default): 1 to 4096, as bench_step's tiny case")
    ap.add_argument("--dtype", default="fp32", choices=("fp32", "bf16"))
    ap.add_argument("--modes", default="adamw,clip,clip-rel")
    ap.add_argument("--steps", type=int, default=300, help="timed steps (and timed checks)")
    ap.add_argument("--warmup", type=int, default=20)
    ap.add_argument("--repeat", type=int, default=1,
                    help="measure this many times, print the least median (default 1)")
    ap.add_argument("--new-grads", action="store_true",
                    help="alternate two gradient sets between steps (as zero_grad(set_to_none="
                         "True) and a backward pass can), outside the timed calls")
    ap.add_argument("--src", default=None, help="import luminamoon from this folder")
    ap.add_argument("--breakdown", action="store_true",
                    help="also time the parts of the plan check one by one (median us a step)")
    return ap.parse_args()


def _sizes(n: int, numel: int) -> List[int]:
    return [numel] * n if numel > 0 else [(37 * j) % 4096 + 1 for j in range(n)]


def _sync(torch, device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def bench(torch, LuminaMoon, *, backend: str, device, n: int, numel: int, dtype, mode: str,
          steps: int, warmup: int, new_grads: bool, breakdown: bool = False
          ) -> Dict[str, float]:
    gen = torch.Generator().manual_seed(n)
    params = [torch.nn.Parameter(torch.randn(s, generator=gen).to(device=device, dtype=dtype))
              for s in _sizes(n, numel)]
    sets = [[torch.randn(p.shape, generator=gen).to(device=device, dtype=dtype) * 1e-2
             for p in params] for _ in range(2 if new_grads else 1)]
    for p, g in zip(params, sets[0]):
        p.grad = g
    opt = LuminaMoon(params, lr=1e-4, seed=1, backend=backend, **MODES[mode])
    opt.step()  # builds the plan
    _sync(torch, device)

    def swap(k: int) -> None:
        if new_grads:
            for p, g in zip(params, sets[k % 2]):
                p.grad = g

    step_ns: List[int] = []
    check_ns: List[int] = []
    gc.collect()
    gc.disable()
    try:
        for k in range(warmup + steps):
            swap(k)
            t0 = time.perf_counter_ns()
            opt.step()
            t1 = time.perf_counter_ns()
            if k >= warmup:
                step_ns.append(t1 - t0)
            if k % 20 == 19:
                _sync(torch, device)
        _sync(torch, device)
        plan = opt._plan
        for k in range(warmup + steps):
            swap(k)
            t0 = time.perf_counter_ns()
            ok = opt._take_grads(plan)
            t1 = time.perf_counter_ns()
            plan.release_grads()
            if not ok:
                raise RuntimeError("the plan check refused an unchanged step")
            if k >= warmup:
                check_ns.append(t1 - t0)
    finally:
        gc.enable()
    parts = _breakdown(opt, plan, steps) if breakdown else {}
    step_us = statistics.median(step_ns) / 1e3
    check_us = statistics.median(check_ns) / 1e3
    return dict(step_us=step_us, check_us=check_us, step_per=step_us / n,
                check_per=check_us / n, **parts)


def _breakdown(opt, plan, steps: int) -> Dict[str, float]:
    """The plan check's parts (optimizer/_plan.py, take_grads), each timed alone over every
    launch group: what a step's check spends where. Trees without the layout guard skip it."""
    import operator

    owners_of = plan.grad_sources
    layouts = getattr(plan, "owner_layouts", None)
    grads_of = [[p.grad for p in owners] for owners in owners_of]
    data_ptr = operator.methodcaller("data_ptr")
    parts = {
        "params": lambda: [all(map(operator.is_, g["params"], items))
                           for g, (_, items) in zip(opt.param_groups, plan.param_lists)],
        "grads": lambda: [list(map(operator.attrgetter("grad"), o)) for o in owners_of],
        "dtypes": lambda: [set(map(operator.attrgetter("dtype"), g)) for g in grads_of],
        "ptrs": lambda: [tuple(map(data_ptr, o)) for o in owners_of],
        "grad_ptrs": lambda: [tuple(map(data_ptr, g)) for g in grads_of],
    }
    if layouts is not None:
        parts["layouts"] = lambda: [lay.holds(o) for lay, o in zip(layouts, owners_of)]
    records = getattr(plan, "last_grad_ptrs", None)
    if records is not None:  # trees whose check compares the addresses in one call
        parts["ptrs"] = lambda: [rec.equal(o) for rec, o in zip(plan.owner_ptrs, owners_of)]
        if all(r is not None for r in records):
            parts["grad_ptrs"] = lambda: [rec.equal(g) for rec, g in zip(records, grads_of)]
    out = {}
    if layouts is not None:  # 1: torch's TensorGuards, 0: the tuples compared in Python
        out["guard_is_torch"] = float(all(lay.guards is not None for lay in layouts))
    for name, fn in parts.items():
        ns = []
        for _ in range(steps):
            t0 = time.perf_counter_ns()
            fn()
            ns.append(time.perf_counter_ns() - t0)
        out["part_" + name] = statistics.median(ns) / 1e3
    return out


def main() -> None:
    args = _parse()
    if args.src:
        sys.path.insert(0, os.path.abspath(args.src))
    import torch

    import luminamoon
    from luminamoon import LuminaMoon

    device = torch.device(args.device or ("cuda" if args.backend in ("triton", "aot") else "cpu"))
    dtype = dict(fp32=torch.float32, bf16=torch.bfloat16)[args.dtype]
    counts = [int(x) for x in args.tensors.split(",") if x]
    modes = [m for m in args.modes.split(",") if m]
    for m in modes:
        if m not in MODES:
            raise SystemExit(f"unknown mode {m!r}; one of {', '.join(MODES)}")
    where = torch.cuda.get_device_name(device) if device.type == "cuda" else platform.processor()
    print(f"# luminamoon {os.path.dirname(luminamoon.__file__)}; torch {torch.__version__}; "
          f"{device} ({where or platform.machine()}); backend {args.backend}; {args.dtype}; "
          f"sizes {'1-4096' if args.numel <= 0 else args.numel}; "
          f"{'new' if args.new_grads else 'kept'} grads; median of {args.steps} steps"
          + (f", least of {args.repeat} runs" if args.repeat > 1 else ""))
    print(f"{'tensors':>8} {'mode':<9} {'step us':>10} {'us/tensor':>10} {'check us':>10} "
          f"{'us/tensor':>10}")
    for n in counts:
        for mode in modes:
            runs = [bench(torch, LuminaMoon, backend=args.backend, device=device, n=n,
                          numel=args.numel, dtype=dtype, mode=mode, steps=args.steps,
                          warmup=args.warmup, new_grads=args.new_grads,
                          breakdown=args.breakdown)
                    for _ in range(max(args.repeat, 1))]
            r = {k: min(x[k] for x in runs) for k in runs[0]}
            print(f"{n:>8} {mode:<9} {r['step_us']:>10.1f} {r['step_per']:>10.3f} "
                  f"{r['check_us']:>10.1f} {r['check_per']:>10.3f}", flush=True)
            parts = {k[5:]: v for k, v in r.items() if k.startswith("part_")}
            if parts:
                print("         check parts (us): "
                      + ", ".join(f"{k} {v:.1f}" for k, v in parts.items()), flush=True)
            if "guard_is_torch" in r:
                print("         layout guard: "
                      + ("torch TensorGuards" if r["guard_is_torch"] else "tuples in Python"),
                      flush=True)


if __name__ == "__main__":
    main()
