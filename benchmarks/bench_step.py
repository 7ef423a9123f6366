"""Optimizer-step benchmark: LuminaMoon's Triton backend against torch.optim.AdamW and the
peers a user would pick for the job (torchao's AdamW with bf16 stochastic rounding, optimi's
AdamW), where they are installed.

For each case (a set of parameter shapes and dtypes), mode and implementation it measures:
- us/step: device time of one ``optimizer.step()`` (CUDA events, median over the timed steps);
- bytes/step by the TDCLM byte count (docs/tdclm.md, README here), and the effective TB/s;
- the fraction of a device-to-device copy ceiling measured in the same run (a 4 GiB copy,
  bytes read + written);
- host us/step: perf_counter around each ``step()`` (nothing waits for the device inside it),
  the median and the mean over at least 100 steps (the timed steps for implementations slower
  than 10 ms a step); the device is synchronised every 20 steps, outside the timed calls, so
  that a full launch queue never makes a step wait.
It prints a table and appends CSV rows to benchmarks/results/<date>-<device>.csv (--out).

Run from a checkout:  PYTHONPATH=python python benchmarks/bench_step.py [--quick]
"""
from __future__ import annotations

import argparse
import csv
import datetime as _dt
import gc
import math
import os
import re
import statistics
import sys
import time
from dataclasses import dataclass
from typing import Callable, Dict, List, Optional, Sequence, Tuple

import torch

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(os.path.dirname(HERE), "python"))

from luminamoon import LuminaMoon  # noqa: E402

F32, BF16 = torch.float32, torch.bfloat16


# ------------------------------------------------------------------------------------------
# Cases: parameter shapes
# ------------------------------------------------------------------------------------------
def gpt2_124m_shapes() -> List[Tuple[int, ...]]:
    """GPT-2 small (124M): wte, wpe, 12 blocks of 12 tensors, ln_f: 148 tensors."""
    d, v, ctx = 768, 50257, 1024
    shapes = [(v, d), (ctx, d)]
    for _ in range(12):
        shapes += [(d,), (d,), (d, 3 * d), (3 * d,), (d, d), (d,),  # ln_1, attn
                   (d,), (d,), (d, 4 * d), (4 * d,), (4 * d, d), (d,)]  # ln_2, mlp
    shapes += [(d,), (d,)]
    return shapes


def llama_1b_shapes() -> List[Tuple[int, ...]]:
    """A Llama-like 1.2B model (hidden 2048, 16 layers, GQA 32/8 heads, MLP 8192, vocab
    128256, tied embeddings): 146 tensors."""
    d, kv, ff, v, layers = 2048, 512, 8192, 128256, 16
    shapes = [(v, d)]
    for _ in range(layers):
        shapes += [(d, d), (kv, d), (kv, d), (d, d), (ff, d), (ff, d), (d, ff), (d,), (d,)]
    shapes += [(d,)]
    return shapes


def tiny_shapes() -> List[Tuple[int, ...]]:
    """1000 tiny tensors of 1 to 4096 elements (biases, norms, adapters)."""
    return [((37 * j) % 4096 + 1,) for j in range(1000)]


@dataclass(frozen=True)
class BenchCase:
    name: str
    shapes: Tuple[Tuple[int, ...], ...]
    param_dtype: torch.dtype
    small: bool  # the reference backend is timed only on small cases (it is slow)

    @property
    def numel(self) -> int:
        return sum(math.prod(s) for s in self.shapes)

    @property
    def label(self) -> str:
        return f"{self.name}/{'bf16' if self.param_dtype == BF16 else 'fp32'}"


def all_cases() -> List[BenchCase]:
    big = ((256 * 2 ** 20,),)
    return [
        BenchCase("one-256M", big, F32, False),
        BenchCase("one-256M", big, BF16, False),
        BenchCase("gpt2-124m", tuple(gpt2_124m_shapes()), F32, True),
        BenchCase("gpt2-124m", tuple(gpt2_124m_shapes()), BF16, True),
        BenchCase("llama-1.2b", tuple(llama_1b_shapes()), F32, False),
        BenchCase("llama-1.2b", tuple(llama_1b_shapes()), BF16, False),
        BenchCase("tiny-1000", tuple(tiny_shapes()), F32, True),
    ]


QUICK = {"one-256M/fp32", "gpt2-124m/bf16", "tiny-1000/fp32"}

# ------------------------------------------------------------------------------------------
# Modes: hyperparameters of LuminaMoon
# ------------------------------------------------------------------------------------------
MODES: Dict[str, dict] = {
    # clip 0, no bound, non-finite propagated: the single-pass AdamW-equivalent kernel
    "adamw": dict(clip=0.0, bound_mode="none", nonfinite="propagate"),
    # the default TDCLM step: two passes (clip statistic + skip flag)
    "clip": dict(clip=4.0, bound_mode="none", nonfinite="skip"),
    # two passes plus the relative bound (reads p_init)
    "clip-rel": dict(clip=4.0, bound_mode="rel", bound=1.0, nonfinite="skip"),
    # the AdamW-equivalent step with bf16 stores rounded to nearest (no rounding words)
    "adamw-rne": dict(clip=0.0, bound_mode="none", nonfinite="propagate",
                      stochastic_rounding=False),
    # bf16 moments, as torch.optim.AdamW keeps them for bf16 params: stochastic, and nearest
    "adamw-bf16m": dict(clip=0.0, bound_mode="none", nonfinite="propagate",
                        state_dtype=BF16),
    "adamw-bf16m-rne": dict(clip=0.0, bound_mode="none", nonfinite="propagate",
                            state_dtype=BF16, stochastic_rounding=False),
    # the default TDCLM step on bf16 moments, stochastic
    "clip-bf16m": dict(clip=4.0, bound_mode="none", nonfinite="skip", state_dtype=BF16),
}
# Modes run by default (the others on request with --modes).
DEFAULT_MODES = ("adamw", "clip", "clip-rel")


def bytes_per_element(param: torch.dtype, grad: torch.dtype, state: torch.dtype,
                      clip: float, bound_mode: str, nonfinite: str) -> int:
    """Bytes each element moves in one step, by the spec's count.

    Pass 2 (or the single pass) reads g, p, m, v and writes p, m, v; pass 1 reads g, m, v when
    clip > 0, or only g when it runs for the skip flag alone; a bound reads p_init. fp32:
    28 single, 40 two-pass (+4 bounded); bf16 params+grads with fp32 moments: 22 and 32.
    """
    p, g, s = (torch.empty((), dtype=d).element_size() for d in (param, grad, state))
    total = 2 * p + g + 4 * s
    if clip > 0:
        total += g + 2 * s
    elif nonfinite == "skip":
        total += g
    if bound_mode != "none":
        total += p
    return total


# ------------------------------------------------------------------------------------------
# Timing
# ------------------------------------------------------------------------------------------
@dataclass
class Timing:
    us: float  # device time per step (median)
    host_us: float  # host time per step (median, no sync inside a step)
    host_mean_us: float  # the same, mean


def time_steps(step: Callable[[], None], device: torch.device, steps: int, warmup: int,
               before: Optional[Callable[[], None]] = None) -> Timing:
    """``before``: called before every step, outside what is timed (e.g. new gradients)."""
    sync = (lambda: torch.cuda.synchronize(device)) if device.type == "cuda" else (lambda: None)
    prepare = before if before is not None else (lambda: None)
    t0 = time.perf_counter()
    for _ in range(warmup):
        prepare()
        step()
    sync()
    slow = (time.perf_counter() - t0) / max(warmup, 1) > 0.01
    # host time: each step() alone; a sync every 20 steps, outside the timed calls, keeps the
    # launch queue from filling up (then a launch, and the step, would wait for the device)
    host = []
    for i in range(steps if slow else max(steps, 100)):
        prepare()
        t = time.perf_counter()
        step()
        host.append(time.perf_counter() - t)
        if i % 20 == 19:
            sync()
    sync()
    samples = []
    if device.type == "cuda":
        events = [(torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True))
                  for _ in range(steps)]
        for start, end in events:
            prepare()
            start.record()
            step()
            end.record()
        sync()
        samples = [start.elapsed_time(end) * 1e3 for start, end in events]
    else:
        for _ in range(steps):
            prepare()
            t = time.perf_counter()
            step()
            samples.append((time.perf_counter() - t) * 1e6)
    return Timing(us=statistics.median(samples), host_us=statistics.median(host) * 1e6,
                  host_mean_us=statistics.mean(host) * 1e6)


def append_csv(path: str, header: List[str], rows: List[list]) -> bool:
    """Appends ``rows`` to the CSV file ``path`` (with ``header`` when the file is new). A file
    whose columns differ (an older run's) is left alone: False, and a message naming --out."""
    os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
    new = not os.path.exists(path)
    if not new:
        with open(path, newline="") as f:
            have = next(csv.reader(f), [])
        if have != header:
            print(f"{path} has other columns ({','.join(have)}); not appending. Give another "
                  f"file with --out", file=sys.stderr)
            return False
    with open(path, "a", newline="") as f:
        w = csv.writer(f)
        if new:
            w.writerow(header)
        w.writerows(rows)
    print(f"appended {len(rows)} rows to {path}")
    return True


def alternating_grads(params: List[torch.Tensor]) -> Callable[[], None]:
    """A ``before`` for time_steps: every step gets other gradient tensors (two sets with the
    same values, alternating), as zero_grad(set_to_none=True) and a backward pass can give."""
    sets = [[p.grad for p in params], [p.grad.clone() for p in params]]
    turn = [0]

    def swap() -> None:
        turn[0] ^= 1
        for p, g in zip(params, sets[turn[0]]):
            p.grad = g

    return swap


def copy_ceiling_tbps(device: torch.device, nbytes: int = 4 * 2 ** 30, reps: int = 10) -> float:
    """Device-to-device copy bandwidth, bytes read + written per second (TB/s)."""
    src = torch.empty(nbytes, dtype=torch.uint8, device=device)
    dst = torch.empty_like(src)
    t = time_steps(lambda: dst.copy_(src), device, reps, 2)
    del src, dst
    return 2 * nbytes / (t.us * 1e-6) / 1e12


# ------------------------------------------------------------------------------------------
# Implementations
# ------------------------------------------------------------------------------------------
def make_params(case: BenchCase, device: torch.device) -> List[torch.Tensor]:
    gen = torch.Generator(device=device).manual_seed(0)
    params = []
    for shape in case.shapes:
        p = torch.empty(shape, device=device, dtype=case.param_dtype)
        p.normal_(generator=gen)
        p.grad = torch.empty_like(p).normal_(generator=gen).mul_(1e-2)
        params.append(p)
    return params


def build(impl: str, mode: str, params: List[torch.Tensor]):
    """(optimizer, (param, grad, state) dtypes, hyperparameters used for the byte count)."""
    p = params[0]
    if impl.startswith("luminamoon-"):
        hp = dict(MODES[mode])
        state_dtype = hp.pop("state_dtype", F32)
        opt = LuminaMoon(params, lr=1e-3, weight_decay=0.01, seed=0,
                         backend=impl.split("-", 1)[1], state_dtype=state_dtype, **hp)
        return opt, (p.dtype, p.dtype, state_dtype), hp
    if impl == "torchao-adamw-bf16sr":
        # torchao's AdamW: moments in the parameter dtype, bf16 stores rounded stochastically
        from torchao.optim import _AdamW

        opt = _AdamW(params, lr=1e-3, weight_decay=0.01, bf16_stochastic_round=True)
        return opt, (p.dtype, p.dtype, p.dtype), dict(MODES["adamw"])
    if impl == "optimi-adamw":
        # optimi's AdamW (its Triton kernels on CUDA), moments in the parameter dtype, no Kahan
        # summation: the same work as torch's
        from optimi import AdamW as OptimiAdamW

        opt = OptimiAdamW(params, lr=1e-3, weight_decay=0.01, kahan_sum=False)
        return opt, (p.dtype, p.dtype, p.dtype), dict(MODES["adamw"])
    # torch.optim.AdamW keeps its moments in the parameter dtype
    kind = impl.split("-")[-1]
    opt = torch.optim.AdamW(params, lr=1e-3, weight_decay=0.01, **{kind: True})
    return opt, (p.dtype, p.dtype, p.dtype), dict(MODES["adamw"])


def _installed(module: str) -> bool:
    import importlib.util

    return importlib.util.find_spec(module) is not None


def impls_for(case: BenchCase, mode: str, device: torch.device, chosen: Sequence[str]
              ) -> List[str]:
    out = []
    for impl in chosen:
        if impl == "luminamoon-reference" and not case.small:
            continue  # far too slow at this size
        if impl.startswith(("torch-", "optimi-")) and mode not in _torch_modes(case):
            continue  # AdamW is the baseline of the AdamW-equivalent modes only
        if impl == "torchao-adamw-bf16sr" and (case.param_dtype != BF16 or mode != "adamw-bf16m"):
            continue  # beside the same work: bf16 params and moments, stochastic rounding
        if impl.startswith("torchao-") and not _installed("torchao"):
            continue
        if impl.startswith("optimi-") and (not _installed("optimi") or device.type != "cuda"):
            continue
        if impl == "torch-adamw-fused" and device.type != "cuda":
            continue
        if impl == "luminamoon-triton" and device.type != "cuda":
            continue
        out.append(impl)
    return out


def _torch_modes(case: BenchCase) -> Tuple[str, ...]:
    """Modes torch.optim.AdamW is measured beside: "adamw", and for bf16 params also
    "adamw-bf16m-rne", the same work as torch's (it keeps bf16 moments for bf16 params and
    rounds to nearest), so the ratio comes from one run."""
    return ("adamw", "adamw-bf16m-rne") if case.param_dtype == BF16 else ("adamw",)


IMPLS = ["luminamoon-triton", "torch-adamw-fused", "torch-adamw-foreach", "torchao-adamw-bf16sr",
         "optimi-adamw", "luminamoon-reference"]


# ------------------------------------------------------------------------------------------
# Main
# ------------------------------------------------------------------------------------------
def _device_name(device: torch.device) -> str:
    if device.type == "cuda":
        return torch.cuda.get_device_name(device)
    return "cpu"


def _versions() -> Tuple[str, str]:
    try:
        import triton
        tv = triton.__version__
    except ImportError:
        tv = "none"
    return torch.__version__, tv


def main(argv: Optional[List[str]] = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    ap.add_argument("--quick", action="store_true",
                    help=f"only {', '.join(sorted(QUICK))}, fewer steps")
    ap.add_argument("--cases", default=None,
                    help="comma-separated case labels (e.g. gpt2-124m/bf16,tiny-1000/fp32)")
    ap.add_argument("--modes", default=",".join(DEFAULT_MODES))
    ap.add_argument("--impls", default=",".join(IMPLS))
    ap.add_argument("--steps", type=int, default=None, help="timed steps (default 20, quick 8)")
    ap.add_argument("--warmup", type=int, default=3)
    ap.add_argument("--new-grads", action="store_true",
                    help="give every step other gradient tensors (two sets, alternating), as "
                         "zero_grad(set_to_none=True) and backward can")
    ap.add_argument("--out", default=None, help="CSV file to append to")
    args = ap.parse_args(argv)

    device = torch.device(args.device)
    steps = args.steps or (8 if args.quick else 20)
    cases = all_cases()
    if args.cases:
        wanted = set(args.cases.split(","))
        unknown = wanted - {c.label for c in cases}
        if unknown:
            ap.error(f"unknown cases {sorted(unknown)}; known: {[c.label for c in cases]}")
        cases = [c for c in cases if c.label in wanted]
    elif args.quick:
        cases = [c for c in cases if c.label in QUICK]
    if device.type != "cuda":
        # a CPU smoke run: only the small cases make sense
        cases = [c for c in cases if c.small]
    modes = [m for m in args.modes.split(",") if m]
    for m in modes:
        if m not in MODES:
            ap.error(f"unknown mode {m!r}; known: {list(MODES)}")
    chosen = [i for i in args.impls.split(",") if i]
    for i in chosen:
        if i not in IMPLS:
            ap.error(f"unknown impl {i!r}; known: {IMPLS}")

    dev_name = _device_name(device)
    torch_v, triton_v = _versions()
    date = _dt.date.today().isoformat()
    out = args.out or os.path.join(
        HERE, "results", f"{date}-{re.sub(r'[^A-Za-z0-9.]+', '-', dev_name).strip('-')}.csv")
    ceiling = copy_ceiling_tbps(device) if device.type == "cuda" else float("nan")
    print(f"device {dev_name} | torch {torch_v} | triton {triton_v} | {date}")
    print(f"copy ceiling (4 GiB device-to-device, read+write): {ceiling:.3f} TB/s")
    if args.new_grads:
        print("every step gets other gradient tensors than the step before (--new-grads)")
    header = (f"{'case':<18} {'mode':<9} {'impl':<22} {'us/step':>10} {'B/elem':>7} "
              f"{'TB/s':>7} {'ceil%':>6} {'host us':>9} {'(mean)':>8}")
    print(header)
    print("-" * len(header))
    rows = []
    for case in cases:
        for mode in modes:
            for impl in impls_for(case, mode, device, chosen):
                params = make_params(case, device)
                try:
                    opt, dtypes, hp = build(impl, mode, params)
                    before = alternating_grads(params) if args.new_grads else None
                    t = time_steps(opt.step, device, steps, args.warmup, before)
                except Exception as exc:  # an implementation that cannot run here: say why
                    print(f"{case.label:<18} {mode:<9} {impl:<22} failed: "
                          f"{type(exc).__name__}: {exc}")
                    continue
                finally:
                    del params
                bpe = bytes_per_element(*dtypes, hp["clip"], hp["bound_mode"], hp["nonfinite"])
                tbps = bpe * case.numel / (t.us * 1e-6) / 1e12
                frac = tbps / ceiling if ceiling == ceiling else float("nan")
                print(f"{case.label:<18} {mode:<9} {impl:<22} {t.us:>10.1f} {bpe:>7d} "
                      f"{tbps:>7.3f} {100 * frac:>5.1f}% {t.host_us:>9.1f} "
                      f"{t.host_mean_us:>8.1f}")
                rows.append(dict(device=dev_name, torch=torch_v, triton=triton_v, date=date,
                                 case=case.label, tensors=len(case.shapes), numel=case.numel,
                                 new_grads=int(args.new_grads),
                                 mode=mode, impl=impl, us_per_step=f"{t.us:.2f}",
                                 bytes_per_elem=bpe, tbps=f"{tbps:.4f}",
                                 ceiling_fraction=f"{frac:.4f}",
                                 ceiling_tbps=f"{ceiling:.4f}", host_us=f"{t.host_us:.2f}",
                                 host_mean_us=f"{t.host_mean_us:.2f}"))
                del opt
                gc.collect()
                if device.type == "cuda":
                    torch.cuda.empty_cache()
    if rows and not append_csv(out, list(rows[0]), [list(r.values()) for r in rows]):
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
