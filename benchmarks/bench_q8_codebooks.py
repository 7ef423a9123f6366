"""benchmarks/bench_q8_codebooks.py: the q8 codebooks chosen by measurement, and q8's state bytes.

1. Quality: the demo's model and data (luminamoon.demo: the character-level GPT on the standard
   library's sources, its lr schedule and clip) trained on the CPU from the same initial
   weights, batches and seed with float32 moments (the baseline) and with q8 moments under
   each candidate codebook pair of kernels/quant.py (CANDIDATES), all on the reference backend
   (the only one that steps q8 so far; the float32 baseline too, so that only the moments'
   storage differs). Prints the validation loss of each run at every evaluation and the final
   one against the baseline, and writes both as CSV rows.
2. Memory: the state bytes a parameter of GPT-2 small and Llama-like shapes, from the
   allocator's view: the sum of untyped_storage().nbytes() over every state tensor the
   optimizer creates (codes, scales, step counters), for float32, bfloat16 and q8 moments.

    PYTHONPATH=python python benchmarks/bench_q8_codebooks.py --steps 400 \
        --csv benchmarks/results/2026-12-06-q8-codebooks.csv
"""
from __future__ import annotations

import argparse
import csv
import datetime
import math
import os
import platform
import sys
import time

import torch
import torch.nn.functional as F

from luminamoon import LuminaMoon
from luminamoon.demo.config import Config
from luminamoon.demo.runs import Session
from luminamoon.kernels import quant
from luminamoon.optimizer.backends.reference import ReferenceBackend


def fidelity(opt, maps, seed: int):
    """How well each codebook pair keeps real moments: the float32 moments ``opt`` holds after
    training, quantized once as a step stores them (block scales, stochastic rounding with a
    fixed stream), then decoded. Returns {map: (relative RMS error of m, of v, of the Adam
    direction m / (sqrt(v) + eps), fraction of nonzero m and of nonzero v decoded as 0)}."""
    from luminamoon.optimizer import rng

    out = {}
    for name in maps:
        err = {"m": [0.0, 0.0], "v": [0.0, 0.0], "u": [0.0, 0.0]}
        zeros = {"m": [0, 0], "v": [0, 0]}
        for k, (p, state) in enumerate(opt.state.items()):
            if not quant.q8_eligible(p.numel()):
                continue
            rows, kk = quant.block_rows(p.shape)
            decoded = {}
            for key, signed, stream in (("m", True, 3), ("v", False, 4)):
                x = state["exp_avg" if signed else "exp_avg_sq"].reshape(-1).float()
                scales = quant.expand_scales(quant.block_scales(x, rows, kk), rows, kk)
                table = quant.codebook(signed, name)
                words = rng.stream_words(rng.rounding_seed(seed, 1, k), 0, x.numel(), stream,
                                         "cpu")
                codes = quant.quantize(x, scales, table, words, quant.zero_code(signed, name))
                y = quant.dequantize(codes, scales, table)
                decoded[key] = (x, y)
                err[key][0] += float(((y - x).double() ** 2).sum())
                err[key][1] += float((x.double() ** 2).sum())
                zeros[key][0] += int(((x != 0) & (y == 0)).sum())
                zeros[key][1] += int((x != 0).sum())
            (m, mq), (v, vq) = decoded["m"], decoded["v"]
            u, uq = m / (v.sqrt() + 1e-8), mq / (vq.sqrt() + 1e-8)
            err["u"][0] += float(((uq - u).double() ** 2).sum())
            err["u"][1] += float((u.double() ** 2).sum())
        out[name] = tuple(math.sqrt(a / b) for a, b in err.values()) + tuple(
            a / max(1, b) for a, b in zeros.values())
    return out


def train(session: Session, state_dtype, codebooks, backend):
    cfg = session.cfg
    model = session.fresh_model("float32")
    opt = LuminaMoon(model.parameters(), lr=cfg.lr, betas=cfg.betas,
                     weight_decay=cfg.weight_decay, clip=cfg.clip, state_dtype=state_dtype,
                     seed=session.seed,
                     backend=ReferenceBackend(codebooks) if backend == "reference" else backend)
    vals = [(0, session.evaluate(model))]
    start = time.perf_counter()
    for step in range(cfg.steps):
        for group in opt.param_groups:
            group["lr"] = cfg.lr_at(step)
        x, y = session.batch(session.train_data, session.batch_offsets[step])
        loss = F.cross_entropy(model(x).flatten(0, 1), y.flatten())
        opt.zero_grad(set_to_none=True)
        loss.backward()
        opt.step()
        if (step + 1) % cfg.eval_every == 0 or step + 1 == cfg.steps:
            vals.append((step + 1, session.evaluate(model)))
    return vals, time.perf_counter() - start, opt


# (name, [(shape, count)]): GPT-2 small (124M: HF Conv1D weights are (in, out)) and a Llama-like
# model (TinyLlama 1.1B's shapes, 2 of its 22 layers: rows of 2048 and 5632 = 22 * 256).
SHAPES = {
    "gpt2-small": [((50257, 768), 1), ((1024, 768), 1)] + [
        (s, 12) for s in ((768,), (768,), (768, 2304), (2304,), (768, 768), (768,), (768,),
                          (768,), (768, 3072), (3072,), (3072, 768), (768,))] + [((768,), 2)],
    "llama-like": [((32000, 2048), 2)] + [
        (s, 2) for s in ((2048, 2048), (256, 2048), (256, 2048), (2048, 2048), (5632, 2048),
                         (5632, 2048), (2048, 5632), (2048,), (2048,))] + [((2048,), 1)],
}


def state_bytes(shapes, state_dtype):
    """(state bytes a parameter, bytes of the q8-eligible tensors' state a parameter of them)."""
    params = [torch.nn.Parameter(torch.empty(shape, dtype=torch.bfloat16))
              for shape, count in shapes for _ in range(count)]
    opt = LuminaMoon(params, state_dtype=state_dtype, seed=0, backend="reference")
    group = opt.param_groups[0]
    total = eligible = eligible_params = 0
    for p in params:
        opt._init_state(p, group)  # the optimizer's own state creation
        seen = set()
        nbytes = 0
        for t in opt.state[p].values():
            if isinstance(t, torch.Tensor):
                storage = t.untyped_storage()
                if storage.data_ptr() not in seen:
                    seen.add(storage.data_ptr())
                    nbytes += storage.nbytes()
        total += nbytes
        if quant.q8_eligible(p.numel()):
            eligible += nbytes
            eligible_params += p.numel()
    n = sum(p.numel() for p in params)
    return total / n, eligible / max(1, eligible_params), n


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--steps", type=int, default=400)
    ap.add_argument("--seed", type=int, default=1234)
    ap.add_argument("--maps", default=",".join(quant.CANDIDATES),
                    help="the q8 codebook candidates to train with (kernels/quant.py)")
    ap.add_argument("--no-baseline", action="store_true", help="leave out the float32 run")
    ap.add_argument("--baseline-backend", default="reference",
                    help="backend of the float32 run ('auto': the CPU engine, faster; the "
                         "same update to float32 rounding)")
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--csv", default=None)
    ap.add_argument("--skip-memory", action="store_true")
    args = ap.parse_args()
    torch.set_num_threads(args.threads)
    meta = dict(date=datetime.date.today().isoformat(), machine=platform.processor() or
                platform.machine(), python=platform.python_version(), torch=torch.__version__,
                threads=torch.get_num_threads())
    rows = []
    if not args.skip_memory:
        for name, shapes in SHAPES.items():
            for state_dtype in (torch.float32, torch.bfloat16, "q8"):
                per_param, per_eligible, n = state_bytes(shapes, state_dtype)
                label = str(state_dtype).replace("torch.", "")
                print(f"state bytes  {name:<11} {label:<9} {per_param:.4f} B/param "
                      f"(q8-eligible tensors {per_eligible:.4f}; {n} params)", flush=True)
                rows.append(dict(kind="state_bytes", model=name, state_dtype=label,
                                 codebooks="", step="", value=f"{per_param:.5f}",
                                 extra=f"eligible={per_eligible:.5f};params={n}"))
    cfg = Config(steps=args.steps)
    session = Session(cfg, "cpu", "reference", None, args.seed)
    runs = [] if args.no_baseline else [("float32", torch.float32, None, args.baseline_backend)]
    runs += [(f"q8 {m}", "q8", m, "reference") for m in args.maps.split(",") if m]
    results = {}
    for label, state_dtype, codebooks, backend in runs:
        vals, seconds, opt = train(session, state_dtype, codebooks, backend)
        results[label] = vals
        if label == "float32":
            baseline_opt = opt
        print(f"{label:<16} final val {vals[-1][1]:.4f}  ({seconds:.0f} s)", flush=True)
        for step, val in vals:
            rows.append(dict(kind="val_loss", model="demo", state_dtype=str(state_dtype)
                             .replace("torch.", ""), codebooks=codebooks or "", step=step,
                             value=f"{val:.5f}",
                             extra=f"seconds={seconds:.1f};backend={backend};steps={cfg.steps}"))
    if "float32" in results:
        maps = list(quant.CANDIDATES)
        print(f"\nmoments of the float32 run after {cfg.steps} steps, stored once as q8:")
        print(f"{'codebooks':<12} {'rms err m':>10} {'rms err v':>10} {'rms err u':>10} "
              f"{'m -> 0':>8} {'v -> 0':>8}")
        for name, (em, ev, eu, zm, zv) in fidelity(baseline_opt, maps,
                                                   args.seed).items():
            print(f"{name:<12} {em:10.5f} {ev:10.5f} {eu:10.5f} {zm:8.2%} {zv:8.2%}")
            rows.append(dict(kind="fidelity", model="demo", state_dtype="q8", codebooks=name,
                             step=cfg.steps, value=f"{eu:.6f}",
                             extra=f"rms_m={em:.6f};rms_v={ev:.6f};m_to_0={zm:.6f};"
                                   f"v_to_0={zv:.6f}"))
    base = results["float32"][-1][1] if "float32" in results else math.nan
    print(f"\n{'run':<16} {'final val':>9} {'vs fp32':>9} {'mean val (2nd half)':>20}")
    for label, vals in results.items():
        half = [v for s, v in vals if s >= cfg.steps // 2]
        print(f"{label:<16} {vals[-1][1]:9.4f} {100 * (vals[-1][1] / base - 1):+8.2f}% "
              f"{sum(half) / len(half):20.4f}")
    if args.csv:
        new = not os.path.exists(args.csv)
        with open(args.csv, "a", newline="") as fh:
            fields = list(meta) + ["kind", "model", "state_dtype", "codebooks", "step", "value",
                                   "extra"]
            writer = csv.DictWriter(fh, fieldnames=fields)
            if new:
                writer.writeheader()
            for row in rows:
                writer.writerow({**meta, **row})
    return 0 if all(math.isfinite(v[-1][1]) for v in results.values()) else 1


if __name__ == "__main__":
    sys.exit(main())
