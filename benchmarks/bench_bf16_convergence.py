"""benchmarks/bench_bf16_convergence.py: what stochastic rounding buys a pure-bf16 run.

A character-level GPT (luminamoon.demo's model) learns the standard library's own sources; every
run starts from the same weights and sees the same batches. Runs:
- fp32-adamw:    torch AdamW, fp32 weights (the baseline)
- fp32-lumina:   LuminaMoon, fp32 weights (fp32 master weights)
- bf16-lumina:   LuminaMoon, pure bf16 (bf16 weights and moments), seeded stochastic rounding
- bf16-lumina-rtn: LuminaMoon, pure bf16, round to nearest (the control)
- bf16-adamw:    torch AdamW, pure bf16, round to nearest
Prints the final and best validation loss of each and the gap to fp32 AdamW; writes every
run's curves (train loss each step, validation loss every --eval-every steps) to --csv.

    python benchmarks/bench_bf16_convergence.py                        # GPU when present
    python benchmarks/bench_bf16_convergence.py --device cpu --quick   # a minute on 2 cores
"""
from __future__ import annotations

import argparse
import csv
import math
import os
import sys
import time

try:  # the installed package (with its compiled engine), else this tree's sources
    from luminamoon import demo
except ImportError:
    sys.path.insert(0, os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))),
                                    "python"))
    from luminamoon import demo

# (option, default, default with --quick)
SIZES = (("steps", 3000, 150), ("d-model", 256, 64), ("layers", 4, 2), ("heads", 8, 4),
         ("ctx", 128, 32), ("batch", 32, 8), ("lr", 1e-3, 1e-3), ("eval-every", 100, 50),
         ("train-bytes", 4_000_000, 300_000))
RUNS = ("fp32-adamw", "fp32-lumina", "bf16-lumina", "bf16-lumina-rtn", "bf16-adamw")


def parse_args(argv=None) -> argparse.Namespace:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--device", default="auto", help="auto (cuda when present), cuda or cpu")
    ap.add_argument("--backend", default="auto", help="LuminaMoon's backend (default auto)")
    for name, full, quick in SIZES:
        ap.add_argument(f"--{name}", type=type(full), default=None,
                        help=f"default {full} ({quick} with --quick)")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--runs", default=",".join(RUNS), help=f"comma-separated, of {RUNS}")
    ap.add_argument("--quick", action="store_true",
                    help="a small model and 150 steps (about a minute on 2 cores)")
    ap.add_argument("--csv", default=None, help="write the curves here")
    args = ap.parse_args(argv)
    for name, full, quick in SIZES:
        attr = name.replace("-", "_")
        if getattr(args, attr) is None:
            setattr(args, attr, quick if args.quick else full)
    unknown = [r for r in args.runs.split(",") if r not in RUNS]
    if unknown:
        ap.error(f"--runs: unknown {unknown}; choose from {', '.join(RUNS)}")
    if args.steps < 20:
        ap.error(f"--steps must be >= 20, got {args.steps}")
    return args


def specs(wanted):
    by_key = {
        "fp32-adamw": demo.RunSpec("fp32-adamw", "fp32", "AdamW, fp32", "adamw", "float32"),
        "fp32-lumina": demo.RunSpec("fp32-lumina", "fp32", "LuminaMoon, fp32", "luminamoon",
                                    "float32"),
        "bf16-lumina": demo.RunSpec("bf16-lumina", "bf16", "LuminaMoon, bf16 stochastic",
                                    "luminamoon", "bfloat16"),
        "bf16-lumina-rtn": demo.RunSpec("bf16-lumina-rtn", "bf16", "LuminaMoon, bf16 nearest",
                                        "luminamoon", "bfloat16", stochastic_rounding=False),
        "bf16-adamw": demo.RunSpec("bf16-adamw", "bf16", "AdamW, bf16 nearest", "adamw",
                                   "bfloat16"),
    }
    return [by_key[k] for k in wanted]


def main(argv=None) -> int:
    args = parse_args(argv)
    import torch

    device = demo.resolve_device(args.device)
    cfg = demo.Config(steps=args.steps, d_model=args.d_model, n_layer=args.layers,
                      n_head=args.heads, ctx=args.ctx, batch=args.batch, lr=args.lr,
                      warmup=max(1, min(100, args.steps // 10)), eval_every=args.eval_every,
                      train_bytes=args.train_bytes, val_bytes=max(60_000, args.train_bytes // 10))
    session = demo.Session(cfg, device, args.backend, demo.default_aot_bundle(), args.seed)
    n_params = sum(v.numel() for v in session.init_state.values())
    machine = demo.machine_line(device)
    print(f"# {machine}; torch {torch.__version__}; GPT {cfg.n_layer} layers, d_model "
          f"{cfg.d_model}, context {cfg.ctx}, {n_params:,} parameters; batch {cfg.batch}, "
          f"{cfg.steps} steps, lr {cfg.lr:g}; {len(session.train_data):,} training characters; "
          f"{time.strftime('%Y-%m-%d')}", flush=True)
    progress = demo._progress_factory()
    results = []
    for spec in specs(args.runs.split(",")):
        results.append(demo.train(session, spec, progress))
    base = next((r for r in results if r.spec.key == "fp32-adamw"), None)
    print(f"{'run':18s} {'backend':14s} {'final val':>10s} {'best val':>10s} "
          f"{'vs fp32 AdamW':>14s}")
    for r in results:
        best = min((v for v in r.val_loss if math.isfinite(v)), default=math.nan)
        gap = r.final_val - base.final_val if base is not None else math.nan
        print(f"{r.spec.key:18s} {r.backend:14s} {r.final_val:10.4f} {best:10.4f} {gap:+14.4f}")
    if args.csv:
        with open(args.csv, "w", newline="") as fh:
            w = csv.writer(fh)
            w.writerow(["run", "backend", "step", "train_loss", "val_loss"])
            for r in results:
                val = dict(zip(r.val_steps, r.val_loss))
                for step, loss in zip(r.steps, r.train_loss):
                    w.writerow([r.spec.key, r.backend, step, f"{loss:.5f}",
                                f"{val[step]:.5f}" if step in val else ""])
                if r.val_steps and r.val_steps[-1] not in r.steps:
                    w.writerow([r.spec.key, r.backend, r.val_steps[-1], "",
                                f"{r.val_loss[-1]:.5f}"])
        print(f"wrote {args.csv}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
