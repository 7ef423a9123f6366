#!/usr/bin/env python3
"""benchmarks/bench_cpu_step.py: LuminaMoon's C++ CPU engine (backend "cpu") against torch's
AdamW on CPU, one optimizer step timed alone.

Cases: the demo's model (`luminamoon demo`: a 2-layer GPT, 430k parameters in 29 tensors) and
one tensor of --numel elements; fp32 and bf16 parameters. LuminaMoon runs as in training (TDCLM:
clip 4, skip check, stochastic rounding for bf16) and in AdamW mode (clip 0, no skip check,
round to nearest: torch AdamW's work); with bf16 parameters also "pure bf16" (bf16 moments as
well, stochastic rounding of weights and moments: five random streams a step). Before every step
each parameter gets a fresh gradient tensor, made outside the timed region, as after
``zero_grad(set_to_none=True)`` and backward. Prints the median per case and, with --out,
appends CSV rows. The engine's vector width is the widest this CPU has, or $LUMINAV_CPU_ISA.
With --reference, the one-tensor pure-bf16 case also runs on the reference backend (the Python
oracle, --reference-steps steps) and the cpu engine's speed-up over it is printed.
"""
from __future__ import annotations

import argparse
import csv
import datetime
import os
import statistics
import sys
import time

import torch


def _demo_shapes():
    from luminamoon import demo

    session = demo.Session(demo.Config(), "cpu", "cpu", None, 0)
    return [tuple(p.shape) for p in session.fresh_model("float32").parameters()]


def _time_steps(make, shapes, dtype, steps, warmup):
    gen = torch.Generator().manual_seed(0)
    params = [torch.randn(s, generator=gen).to(dtype).requires_grad_() for s in shapes]
    grads = [(torch.randn(s, generator=gen) * 1e-3).to(dtype) for s in shapes]
    opt = make(params)
    samples = []
    for i in range(warmup + steps):
        for p, g in zip(params, grads):
            p.grad = g.clone()
        t0 = time.perf_counter()
        opt.step()
        if i >= warmup:
            samples.append(time.perf_counter() - t0)
    return 1e3 * statistics.median(samples)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--numel", type=int, default=10_000_000, help="elements of the one-tensor case")
    ap.add_argument("--steps", type=int, default=50)
    ap.add_argument("--warmup", type=int, default=5)
    ap.add_argument("--out", default=None, help="CSV file to append to")
    ap.add_argument("--reference", action="store_true",
                    help="also time the reference backend on the one-tensor pure-bf16 case")
    ap.add_argument("--reference-steps", type=int, default=5)
    ap.add_argument("--only", default=None,
                    help="run only the optimizers whose name contains this text")
    args = ap.parse_args(argv)
    if args.steps < 1 or args.numel < 1:
        ap.error(f"--steps and --numel must be >= 1, got {args.steps} and {args.numel}")

    from luminamoon import LuminaMoon
    from luminamoon import _luminav

    isa = _luminav.cpu_isa()
    cases = [("demo GPT (29 tensors)", _demo_shapes()), (f"one tensor of {args.numel:,}", [(args.numel,)])]
    optimizers = [
        ("LuminaMoon cpu", lambda ps: LuminaMoon(ps, backend="cpu")),
        ("LuminaMoon cpu, AdamW mode", lambda ps: LuminaMoon(
            ps, backend="cpu", clip=0.0, nonfinite="propagate", stochastic_rounding=False)),
        ("LuminaMoon cpu, pure bf16", lambda ps: LuminaMoon(
            ps, backend="cpu", state_dtype=torch.bfloat16)),
        ("torch AdamW fused", lambda ps: torch.optim.AdamW(ps, fused=True)),
        ("torch AdamW foreach", lambda ps: torch.optim.AdamW(ps, foreach=True)),
    ]
    from luminamoon.demo import cpu_model, usable_cores

    machine = f"{cpu_model()}, {usable_cores()} cores"
    print(f"{machine}, torch {torch.__version__}, engine width {isa}, "
          f"{datetime.date.today().isoformat()}")
    rows = []
    for label, shapes in cases:
        for dtype in (torch.float32, torch.bfloat16):
            for name, make in optimizers:
                if "pure bf16" in name and dtype != torch.bfloat16:
                    continue
                if args.only and args.only not in name:
                    continue
                ms = _time_steps(make, shapes, dtype, args.steps, args.warmup)
                rows.append((label, str(dtype).replace("torch.", ""), name, ms))
                print(f"{label:28s} {rows[-1][1]:9s} {name:28s} {ms:9.3f} ms", flush=True)
    if args.reference:
        shapes = [(args.numel,)]
        pure = {}
        for backend in ("cpu", "reference"):
            steps = args.steps if backend == "cpu" else args.reference_steps
            make = (lambda b: lambda ps: LuminaMoon(ps, backend=b, state_dtype=torch.bfloat16))(backend)
            pure[backend] = _time_steps(make, shapes, torch.bfloat16, steps, min(args.warmup, 2))
            name = f"LuminaMoon {backend}, pure bf16"
            rows.append((cases[1][0], "bfloat16", name, pure[backend]))
            print(f"{cases[1][0]:28s} {'bfloat16':9s} {name:28s} {pure[backend]:9.3f} ms", flush=True)
        print(f"pure bf16 with stochastic rounding, one tensor of {args.numel:,}: cpu engine "
              f"{pure['reference'] / pure['cpu']:.2f}x the reference", flush=True)
    if args.out:
        new = not os.path.exists(args.out)
        with open(args.out, "a", newline="") as fh:
            w = csv.writer(fh)
            if new:
                w.writerow(["date", "machine", "torch", "width", "case", "dtype", "optimizer", "ms"])
            for r in rows:
                w.writerow([datetime.date.today().isoformat(), machine, torch.__version__, isa,
                            *r[:3], f"{r[3]:.4f}"])
    return 0


if __name__ == "__main__":
    sys.exit(main())
