"""Optimizer-step benchmark: LuminaMoon's Triton backend against torch.optim.AdamW and the
peers a user would pick for the job (torchao's AdamW with bf16 stochastic rounding, optimi's
AdamW; for q8 moments torchao's and bitsandbytes' AdamW8bit), where they are installed (a peer
that cannot run here gets a row that says why).

For each case (a set of parameter shapes and dtypes), mode and implementation it measures:
- us/step: device time of one ``optimizer.step()`` (CUDA events, median over the timed steps);
- bytes/step by the TDCLM byte count (docs/tdclm.md, README here), and the effective TB/s;
- the fraction of a device-to-device copy ceiling measured in the same run (a 4 GiB copy,
  bytes read + written);
- state B/param: what the optimizer's state holds a parameter element, measured: on CUDA
  torch.cuda.memory_allocated after the first step (the state exists) minus before it; on CPU
  the bytes of the state tensors' storages (not the allocator's view);
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
from typing import Callable, Dict, List, Optional, Sequence, Tuple, Union

import torch

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(os.path.dirname(HERE), "python"))

from luminamoon import LuminaMoon  # noqa: E402
from luminamoon.bench import state_nbytes  # noqa: E402
from luminamoon.kernels import quant  # noqa: E402

F32, BF16 = torch.float32, torch.bfloat16
Q8 = quant.Q8  # state_dtype "q8"
State = Union[torch.dtype, str]  # a moments' storage: a dtype or "q8"


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


def mixed_shapes() -> List[Tuple[int, ...]]:
    """0.77 M elements in 6 tensors, for CPU runs of q8 moments: rows of 768 (three q8 blocks),
    of 300 (a partial block a row), a 1-D tensor with a partial last block, one of exactly 4096
    elements (the smallest that keeps q8 moments) and two smaller (float32 moments)."""
    return [(512, 768), (768,), (1000, 300), (70001,), (3, 1000), (4096,)]


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
        BenchCase("small-mixed", tuple(mixed_shapes()), F32, True),
        BenchCase("small-mixed", tuple(mixed_shapes()), BF16, True),
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
    # q8 moments (docs/tdclm.md, "Quantized moments (q8)"): one-byte codes and a float32 scale
    # a block of 256; the AdamW-equivalent step (beside torchao's and bitsandbytes' AdamW8bit)
    # and the default TDCLM step
    "adamw-q8": dict(clip=0.0, bound_mode="none", nonfinite="propagate", state_dtype=Q8),
    "clip-q8": dict(clip=4.0, bound_mode="none", nonfinite="skip", state_dtype=Q8),
}
# Modes run by default (the others on request with --modes).
DEFAULT_MODES = ("adamw", "clip", "clip-rel")


def _accesses(clip: float, bound_mode: str, nonfinite: str) -> Tuple[int, int, int]:
    """(p, g, moment) accesses an element makes in one step, by the spec's count.

    Pass 2 (or the single pass) reads g, p, m, v and writes p, m, v; pass 1 reads g, m, v when
    clip > 0, or only g when it runs for the skip flag alone; a bound reads p_init.
    """
    p, g, s = 2, 1, 4
    if clip > 0:
        g, s = g + 1, s + 2
    elif nonfinite == "skip":
        g += 1
    if bound_mode != "none":
        p += 1
    return p, g, s


def _moment_bytes(state: State, numel: int, scales: int) -> float:
    """Bytes of one read (or write) of a moment: q8 codes 1 B an element, its scales 4 B each."""
    return numel + 4 * scales if state == Q8 else numel * torch.empty((), dtype=state).itemsize


def bytes_per_element(param: torch.dtype, grad: torch.dtype, state: State,
                      clip: float, bound_mode: str, nonfinite: str) -> float:
    """Bytes each element moves in one step, by the spec's count (q8: whole blocks of 256).
    fp32: 28 single, 40 two-pass (+4 bounded); bf16 params+grads with fp32 moments: 22 and 32;
    bf16 params+grads with q8 moments: 10.06 and 14.09 (codes 1 B, scales 4/256 B each way)."""
    return step_bytes([(256,)], param, grad, [(state, 1)], clip, bound_mode, nonfinite) / 256


def step_bytes(shapes: Sequence[Tuple[int, ...]], param: torch.dtype, grad: torch.dtype,
               states: Sequence[Tuple[State, int]], clip: float, bound_mode: str,
               nonfinite: str) -> float:
    """Bytes one step moves over tensors of ``shapes`` whose moments are ``states`` (storage,
    scales a moment), by the spec's count: under q8 the tensors below the size rule keep float32
    moments and a row whose length 256 does not divide has a partial block's scale."""
    pa, ga, sa = _accesses(clip, bound_mode, nonfinite)
    p, g = (torch.empty((), dtype=d).element_size() for d in (param, grad))
    total = 0.0
    for shape, (state, scales) in zip(shapes, states):
        n = math.prod(shape)
        total += n * (pa * p + ga * g) + sa * _moment_bytes(state, n, scales)
    return total


def moment_storage(impl: str, shape: Tuple[int, ...], param: torch.dtype,
                   state: State) -> Tuple[State, int]:
    """(storage, scales a moment) of a tensor's moments under ``impl``, each by its own rule:
    LuminaMoon's q8 needs >= 4096 elements and keeps float32 below (blocks of 256 along a row);
    torchao's AdamW8bit needs >= 4096 elements and 256 | n (1-D blocks) and keeps the parameter
    dtype otherwise; bitsandbytes' needs >= 4096 (1-D blocks) and keeps float32 otherwise."""
    n = math.prod(shape)
    if impl == "torchao-adamw8bit":
        return (Q8, n // 256) if n >= 4096 and n % 256 == 0 else (param, 0)
    if impl == "bnb-adamw8bit":
        return (Q8, -(-n // 256)) if n >= 4096 else (F32, 0)
    if state == Q8:
        return (Q8, math.prod(quant.scale_shape(shape))) if quant.q8_eligible(n) else (F32, 0)
    return state, 0


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
    """(optimizer, (param, grad, state) dtypes, hyperparameters used for the byte count); the
    state is a dtype or "q8"."""
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
    if impl == "torchao-adamw8bit":
        # torchao's 8-bit AdamW (optim/subclass_8bit.py): blocks of 256, its defaults (bf16
        # params stored rounded to nearest); each parameter's step is a torch.compile'd function
        from torchao.optim import AdamW8bit

        opt = AdamW8bit(params, lr=1e-3, weight_decay=0.01)
        return opt, (p.dtype, p.dtype, Q8), dict(MODES["adamw"])
    if impl == "bnb-adamw8bit":
        # bitsandbytes' blockwise 8-bit AdamW (its CUDA kernels): blocks of 256, tensors below
        # 4096 elements keep float32 moments (its default min_8bit_size)
        from bitsandbytes.optim import AdamW8bit

        opt = AdamW8bit(params, lr=1e-3, weight_decay=0.01)
        return opt, (p.dtype, p.dtype, Q8), dict(MODES["adamw"])
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


# the peers' Python packages
PEER_MODULES = {"torchao-": "torchao", "optimi-": "optimi", "bnb-": "bitsandbytes"}
# 8-bit AdamW: timed beside LuminaMoon's AdamW mode with q8 moments, on CUDA
Q8_PEERS = ("torchao-adamw8bit", "bnb-adamw8bit")


def _importable(module: str) -> Optional[str]:
    """None, or why ``module`` does not import here."""
    import importlib

    try:
        importlib.import_module(module)
    except Exception as exc:  # noqa: BLE001 - a peer's import may fail in its own ways
        return f"{module} does not import: {type(exc).__name__}: {str(exc).splitlines()[0]}"
    return None


def impls_for(case: BenchCase, mode: str, device: torch.device, chosen: Sequence[str]
              ) -> List[Tuple[str, Optional[str]]]:
    """(implementation, None or why it cannot run here) for each one timed beside ``mode``."""
    out = []
    for impl in chosen:
        if impl == "luminamoon-reference" and not case.small:
            continue  # far too slow at this size
        if impl.startswith(("torch-", "optimi-")) and mode not in _torch_modes(case):
            continue  # AdamW is the baseline of the AdamW-equivalent modes only
        if impl == "torchao-adamw-bf16sr" and (case.param_dtype != BF16 or mode != "adamw-bf16m"):
            continue  # beside the same work: bf16 params and moments, stochastic rounding
        if impl in Q8_PEERS and mode != "adamw-q8":
            continue  # beside the same work: AdamW with 8-bit moments in blocks of 256
        if impl == "torch-adamw-fused" and device.type != "cuda":
            continue
        if impl == "luminamoon-triton" and device.type != "cuda":
            continue
        if impl.startswith("optimi-") and device.type != "cuda":
            continue
        why = "needs CUDA (the 8-bit peers are timed on the GPU)" if (
            impl in Q8_PEERS and device.type != "cuda") else None
        for prefix, module in PEER_MODULES.items():
            if why is None and impl.startswith(prefix):
                why = _importable(module)
        out.append((impl, why))
    return out


def _torch_modes(case: BenchCase) -> Tuple[str, ...]:
    """Modes torch.optim.AdamW is measured beside: "adamw", and for bf16 params also
    "adamw-bf16m-rne", the same work as torch's (it keeps bf16 moments for bf16 params and
    rounds to nearest), so the ratio comes from one run."""
    return ("adamw", "adamw-bf16m-rne") if case.param_dtype == BF16 else ("adamw",)


IMPLS = ["luminamoon-triton", "torch-adamw-fused", "torch-adamw-foreach", "torchao-adamw-bf16sr",
         "optimi-adamw", "torchao-adamw8bit", "bnb-adamw8bit", "luminamoon-reference"]


def run_one(case: BenchCase, mode: str, impl: str, device: torch.device, steps: int,
            warmup: int, new_grads: bool) -> Tuple[Timing, float, float]:
    """(timing, B/elem by the spec's count, state bytes a parameter element) of ``impl`` in
    ``mode``. The state is measured around the first step, which creates it (then warm-up and
    timed steps follow): on CUDA the allocator's bytes in use after it minus before it, on CPU
    the storages of opt.state."""
    params = make_params(case, device)
    opt, dtypes, hp = build(impl, mode, params)
    before = alternating_grads(params) if new_grads else None
    sync = (lambda: torch.cuda.synchronize(device)) if device.type == "cuda" else (lambda: None)
    sync()
    allocated = torch.cuda.memory_allocated(device) if device.type == "cuda" else 0
    if before is not None:
        before()
    opt.step()
    sync()
    state = (torch.cuda.memory_allocated(device) - allocated if device.type == "cuda"
             else state_nbytes(opt))
    t = time_steps(opt.step, device, steps, warmup, before)
    param, grad, state_dtype = dtypes
    storage = [moment_storage(impl, shape, param, state_dtype) for shape in case.shapes]
    nbytes = step_bytes(case.shapes, param, grad, storage, hp["clip"], hp["bound_mode"],
                        hp["nonfinite"])
    return t, nbytes / case.numel, state / case.numel


def q8_summary(rows: List[dict]) -> List[str]:
    """For each case with LuminaMoon q8 rows: their fraction of the copy ceiling, and the
    AdamW mode's speed against the faster 8-bit peer."""
    lines = []
    for case in dict.fromkeys(r["case"] for r in rows):
        timed = {(r["mode"], r["impl"]): r for r in rows if r["case"] == case and r["us_per_step"]}
        ours = {m: r for (m, i), r in timed.items() if m in ("adamw-q8", "clip-q8")
                and i.startswith("luminamoon-") and i != "luminamoon-reference"}
        if not ours:
            continue
        parts = [f"{m} {r['impl']} {100 * float(r['ceiling_fraction']):.1f}% of the ceiling"
                 for m, r in ours.items() if r["ceiling_fraction"] != "nan"]
        peers = [timed[("adamw-q8", i)] for i in Q8_PEERS if ("adamw-q8", i) in timed]
        if "adamw-q8" in ours and peers:
            best = min(peers, key=lambda r: float(r["us_per_step"]))
            ratio = float(best["us_per_step"]) / float(ours["adamw-q8"]["us_per_step"])
            parts.append(f"adamw-q8 {ratio:.2f}x the speed of {best['impl']}")
        if parts:
            lines.append(f"q8 {case}: " + "; ".join(parts))
    return lines


# ------------------------------------------------------------------------------------------
# Main
# ------------------------------------------------------------------------------------------
def _device_name(device: torch.device) -> str:
    return torch.cuda.get_device_name(device) if device.type == "cuda" else "cpu"


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
    header = (f"{'case':<18} {'mode':<15} {'impl':<22} {'us/step':>10} {'B/elem':>7} "
              f"{'TB/s':>7} {'ceil%':>6} {'host us':>9} {'(mean)':>8} {'state B/p':>9}")
    print(header)
    print("-" * len(header))
    if device.type != "cuda":
        print("(state B/p on CPU: the bytes of the state tensors' storages, not the allocator's)")
    rows = []
    for case in cases:
        for mode in modes:
            for impl, why in impls_for(case, mode, device, chosen):
                row = dict(device=dev_name, torch=torch_v, triton=triton_v, date=date,
                           case=case.label, tensors=len(case.shapes), numel=case.numel,
                           new_grads=int(args.new_grads), mode=mode, impl=impl, us_per_step="",
                           bytes_per_elem="", tbps="", ceiling_fraction="",
                           ceiling_tbps=f"{ceiling:.4f}", host_us="", host_mean_us="",
                           state_bytes_per_param="", state_bytes_from="", note="")
                rows.append(row)
                if why is None:
                    try:
                        t, bpe, state = run_one(case, mode, impl, device, steps, args.warmup,
                                                args.new_grads)
                    except Exception as exc:  # an implementation that cannot run here: say why
                        why = f"failed: {type(exc).__name__}: {str(exc).strip()}"
                    gc.collect()
                    if device.type == "cuda":
                        torch.cuda.empty_cache()
                if why is not None:
                    print(f"{case.label:<18} {mode:<15} {impl:<22} {why}")
                    row["note"] = why
                    continue
                tbps = bpe * case.numel / (t.us * 1e-6) / 1e12
                frac = tbps / ceiling if ceiling == ceiling else float("nan")
                print(f"{case.label:<18} {mode:<15} {impl:<22} {t.us:>10.1f} {bpe:>7.2f} "
                      f"{tbps:>7.3f} {100 * frac:>5.1f}% {t.host_us:>9.1f} "
                      f"{t.host_mean_us:>8.1f} {state:>9.3f}")
                row.update(us_per_step=f"{t.us:.2f}", bytes_per_elem=f"{bpe:.4f}",
                           tbps=f"{tbps:.4f}", ceiling_fraction=f"{frac:.4f}",
                           host_us=f"{t.host_us:.2f}", host_mean_us=f"{t.host_mean_us:.2f}",
                           state_bytes_per_param=f"{state:.4f}",
                           state_bytes_from="allocator" if device.type == "cuda" else "storage")
    for line in q8_summary(rows):
        print(line)
    if rows and not append_csv(out, list(rows[0]), [list(r.values()) for r in rows]):
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
