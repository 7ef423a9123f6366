"""`luminamoon demo`: what LuminaMoon is for, on a character-level transformer.

A small GPT learns to write Python, character by character, from the standard library's own
sources (nothing is downloaded). Every run of a comparison starts from the same initial weights
and sees the same batches in the same order:

  fp32       torch AdamW (the baseline) and LuminaMoon, float32 weights and moments;
  bf16       pure bfloat16 weights and moments: torch AdamW (rounds to nearest) against
             LuminaMoon with seeded stochastic rounding (and LuminaMoon rounding to nearest,
             the control that isolates the rounding);
  faults     float32, with injected faults, the same for both optimizers: three steps whose
             gradient of one layer is multiplied by 1e3; three poisoned batches (random
             characters, loss x1e3); then one step with a NaN in one gradient element. AdamW's
             weights turn NaN (its run ends there); LuminaMoon skips that step on the device.

It prints a progress bar per run and a table (validation loss, tokens/s, optimizer time per
step, skipped steps), times the optimizer step alone on this model for every LuminaMoon backend
that runs here beside torch's AdamW, and writes to --out: loss_curves.png, step_time.png,
results.md and results.csv.
"""
from __future__ import annotations

import argparse
import csv
import datetime
import math
import os
import platform
import statistics
import string
import sysconfig
import time
from dataclasses import dataclass, field
from typing import Callable, Dict, List, Optional, Sequence, Tuple

# --------------------------------------------------------------------------------------------
# configuration
# --------------------------------------------------------------------------------------------


@dataclass
class Config:
    """Everything a demo run depends on; the defaults are the full `make demo`."""

    steps: int = 600
    d_model: int = 128
    n_layer: int = 2
    n_head: int = 4
    ctx: int = 64
    batch: int = 16
    lr: float = 1e-3
    warmup: int = 30
    min_lr_ratio: float = 0.02  # cosine decay to this fraction of lr
    betas: Tuple[float, float] = (0.9, 0.99)
    weight_decay: float = 0.01
    clip: float = 4.0
    eval_every: int = 25
    eval_batches: int = 8
    train_bytes: int = 1_200_000
    val_bytes: int = 150_000
    spike_at: float = 0.3  # first spike step, as a fraction of the run
    spike_steps: int = 3
    spike_scale: float = 1e3
    spike_layer: str = "blocks.0.fc.weight"
    poison_at: float = 0.45  # first poisoned batch, as a fraction of the run
    poison_steps: int = 3
    poison_scale: float = 1e3
    nan_at: float = 0.7  # the NaN step, as a fraction of the run
    nan_param: str = "blocks.1.out.weight"
    bench_steps: int = 40
    bench_warmup: int = 5
    bench_reference: bool = True  # time the reference backend too (slow: an oracle)
    control_run: bool = True  # LuminaMoon bf16 rounding to nearest

    @property
    def spike_range(self) -> range:
        first = int(self.spike_at * self.steps)
        return range(first, first + self.spike_steps)

    @property
    def poison_range(self) -> range:
        first = int(self.poison_at * self.steps)
        return range(first, first + self.poison_steps)

    @property
    def nan_step(self) -> int:
        return int(self.nan_at * self.steps)

    def lr_at(self, step: int) -> float:
        """Linear warm-up, then cosine decay to min_lr_ratio * lr."""
        if step < self.warmup:
            return self.lr * (step + 1) / self.warmup
        frac = (step - self.warmup) / max(1, self.steps - self.warmup)
        floor = self.min_lr_ratio
        return self.lr * (floor + (1 - floor) * 0.5 * (1 + math.cos(math.pi * min(1.0, frac))))


QUICK = dict(steps=120, eval_every=20, eval_batches=4, bench_steps=15, bench_warmup=3,
             train_bytes=300_000, val_bytes=60_000, control_run=False, bench_reference=False)


# --------------------------------------------------------------------------------------------
# data: the standard library's own sources
# --------------------------------------------------------------------------------------------

UNK = "\x1a"  # every character outside printable ASCII folds into this one
_KEEP = set(string.printable) - set("\r\x0b\x0c")


def stdlib_sources(train_bytes: int, val_bytes: int) -> Tuple[str, str, List[str], List[str]]:
    """Text of the standard library's top-level modules: (train, val, train files, val files).

    The modules are the sorted ``*.py`` files directly under ``sysconfig``'s stdlib folder;
    every tenth of them (index 5, 15, ...) goes to validation, the others to training, each
    side until its byte budget is filled (the last file is cut). Deterministic for a given
    Python installation.
    """
    root = sysconfig.get_paths()["stdlib"]
    names = sorted(f for f in os.listdir(root) if f.endswith(".py"))
    parts: Dict[str, List[str]] = {"train": [], "val": []}
    used: Dict[str, List[str]] = {"train": [], "val": []}
    budget = {"train": train_bytes, "val": val_bytes}
    for i, name in enumerate(names):
        side = "val" if i % 10 == 5 else "train"
        if budget[side] <= 0:
            if budget["train"] <= 0 and budget["val"] <= 0:
                break
            continue
        with open(os.path.join(root, name), encoding="utf-8", errors="replace") as fh:
            text = fh.read()[:budget[side]]
        parts[side].append(text)
        used[side].append(name)
        budget[side] -= len(text)
    if not parts["train"] or not parts["val"]:
        raise RuntimeError(f"found too few .py files under {root} to build the demo's text")
    return "".join(parts["train"]), "".join(parts["val"]), used["train"], used["val"]


class CharVocab:
    """Characters of the training text (outside printable ASCII folded into UNK)."""

    def __init__(self, text: str):
        self.chars = sorted(set(self.fold(text)) | {UNK})
        self.index = {c: i for i, c in enumerate(self.chars)}

    @staticmethod
    def fold(text: str) -> str:
        return "".join(c if c in _KEEP else UNK for c in text)

    def encode(self, text: str):
        import torch

        unk = self.index[UNK]
        return torch.tensor([self.index.get(c, unk) for c in self.fold(text)], dtype=torch.int64)

    def __len__(self) -> int:
        return len(self.chars)


# --------------------------------------------------------------------------------------------
# the model
# --------------------------------------------------------------------------------------------


def make_model_class():
    """TinyGPT, defined on first use so that importing this module does not import torch."""
    import torch
    import torch.nn.functional as F
    from torch import nn

    def f32(t):
        # The weights may be stored in bf16; the arithmetic is float32 either way, so the runs
        # differ only in how the optimizer stores its results.
        return t if t.dtype == torch.float32 else t.float()

    class Block(nn.Module):
        def __init__(self, d: int, heads: int):
            super().__init__()
            self.heads = heads
            self.ln1 = nn.LayerNorm(d)
            self.qkv = nn.Linear(d, 3 * d)
            self.proj = nn.Linear(d, d)
            self.ln2 = nn.LayerNorm(d)
            self.fc = nn.Linear(d, 4 * d)
            self.out = nn.Linear(4 * d, d)

        def forward(self, x):
            b, t, c = x.shape
            y = F.layer_norm(x, (c,), f32(self.ln1.weight), f32(self.ln1.bias))
            qkv = F.linear(y, f32(self.qkv.weight), f32(self.qkv.bias))
            q, k, v = qkv.view(b, t, 3, self.heads, c // self.heads).permute(2, 0, 3, 1, 4)
            y = F.scaled_dot_product_attention(q, k, v, is_causal=True)
            x = x + F.linear(y.transpose(1, 2).reshape(b, t, c), f32(self.proj.weight),
                             f32(self.proj.bias))
            y = F.layer_norm(x, (c,), f32(self.ln2.weight), f32(self.ln2.bias))
            y = F.gelu(F.linear(y, f32(self.fc.weight), f32(self.fc.bias)))
            return x + F.linear(y, f32(self.out.weight), f32(self.out.bias))

    class TinyGPT(nn.Module):
        """A pre-LayerNorm GPT: token and position embeddings, n_layer blocks, a linear head."""

        def __init__(self, vocab: int, cfg: Config):
            super().__init__()
            self.tok = nn.Embedding(vocab, cfg.d_model)
            self.pos = nn.Embedding(cfg.ctx, cfg.d_model)
            self.blocks = nn.ModuleList(Block(cfg.d_model, cfg.n_head) for _ in range(cfg.n_layer))
            self.lnf = nn.LayerNorm(cfg.d_model)
            self.head = nn.Linear(cfg.d_model, vocab, bias=False)
            # GPT-2's initialisation: N(0, 0.02), residual projections scaled by 1/sqrt(2L)
            for name, p in self.named_parameters():
                if name.endswith("bias"):
                    nn.init.zeros_(p)
                elif "ln" in name:
                    nn.init.ones_(p)
                else:
                    std = 0.02 / math.sqrt(2 * cfg.n_layer) if name.endswith(
                        ("proj.weight", "out.weight")) else 0.02
                    nn.init.normal_(p, 0.0, std)

        def forward(self, idx):
            t = idx.shape[1]
            x = F.embedding(idx, f32(self.tok.weight)) + f32(self.pos.weight)[:t]
            for block in self.blocks:
                x = block(x)
            x = F.layer_norm(x, (x.shape[-1],), f32(self.lnf.weight), f32(self.lnf.bias))
            return F.linear(x, f32(self.head.weight))

    return TinyGPT


# --------------------------------------------------------------------------------------------
# runs
# --------------------------------------------------------------------------------------------


@dataclass
class RunSpec:
    key: str
    panel: str  # "fp32", "bf16" or "faults"
    label: str
    optimizer: str  # "adamw" or "luminamoon"
    dtype: str  # "float32" or "bfloat16"
    inject: bool = False
    stochastic_rounding: bool = True
    color: str = "C0"
    style: str = "-"


@dataclass
class RunResult:
    spec: RunSpec
    backend: str = ""
    steps: List[int] = field(default_factory=list)
    train_loss: List[float] = field(default_factory=list)
    val_steps: List[int] = field(default_factory=list)
    val_loss: List[float] = field(default_factory=list)
    opt_seconds: List[float] = field(default_factory=list)
    train_seconds: float = 0.0
    tokens: int = 0
    skipped: int = 0
    nan_from: Optional[int] = None  # first step whose weights are NaN
    weights_finite: bool = True

    @property
    def final_val(self) -> float:
        return self.val_loss[-1] if self.val_loss else math.nan

    @property
    def tokens_per_s(self) -> float:
        return self.tokens / self.train_seconds if self.train_seconds > 0 else math.nan

    def opt_ms(self, warmup: int) -> float:
        samples = self.opt_seconds[warmup:] or self.opt_seconds
        return 1e3 * statistics.median(samples) if samples else math.nan


def run_specs(cfg: Config) -> List[RunSpec]:
    specs = [
        RunSpec("fp32-adamw", "fp32", "AdamW, fp32", "adamw", "float32", color="C0"),
        RunSpec("fp32-lumina", "fp32", "LuminaMoon, fp32", "luminamoon", "float32", color="C3"),
        RunSpec("bf16-adamw", "bf16", "AdamW, bf16 round-to-nearest", "adamw", "bfloat16",
                color="C0"),
        RunSpec("bf16-lumina", "bf16", "LuminaMoon, bf16 stochastic rounding", "luminamoon",
                "bfloat16", color="C3"),
    ]
    if cfg.control_run:
        specs.append(RunSpec("bf16-lumina-rtn", "bf16", "LuminaMoon, bf16 round-to-nearest",
                             "luminamoon", "bfloat16", stochastic_rounding=False, color="C1",
                             style="--"))
    specs += [
        RunSpec("faults-adamw", "faults", "AdamW, fp32, faults", "adamw", "float32",
                inject=True, color="C0"),
        RunSpec("faults-lumina", "faults", "LuminaMoon, fp32, faults", "luminamoon",
                "float32", inject=True, color="C3"),
    ]
    return specs


def adamw_flavour(device) -> str:
    """'fused' where this torch has the fused AdamW kernel for ``device``, else 'foreach'."""
    import torch

    p = torch.zeros(4, device=device, requires_grad=True)
    p.grad = torch.ones_like(p)
    try:
        torch.optim.AdamW([p], lr=1e-3, fused=True).step()
        return "fused"
    except (RuntimeError, ValueError, NotImplementedError, TypeError):
        return "foreach"


class Session:
    """Data, initial weights and settings shared by every run of the demo."""

    def __init__(self, cfg: Config, device, backend: str, aot_bundle: Optional[str], seed: int,
                 cpu_threads: int = 0):
        import torch

        self.cfg, self.device, self.backend, self.aot_bundle, self.seed = (
            cfg, torch.device(device), backend, aot_bundle, seed)
        self.cpu_threads = cpu_threads  # the native cpu engine's threads; 0: one per core
        train_text, val_text, self.train_files, self.val_files = stdlib_sources(
            cfg.train_bytes, cfg.val_bytes)
        self.vocab = CharVocab(train_text)
        self.train_data = self.vocab.encode(train_text).to(self.device)
        self.val_data = self.vocab.encode(val_text).to(self.device)
        gen = torch.Generator().manual_seed(seed)
        span = cfg.ctx + 1
        self.batch_offsets = torch.randint(0, len(self.train_data) - span,
                                           (cfg.steps, cfg.batch), generator=gen)
        self.val_offsets = torch.randint(0, len(self.val_data) - span,
                                         (cfg.eval_batches, cfg.batch), generator=gen)
        # the poisoned batches: uniformly random characters
        self.poison = torch.randint(0, len(self.vocab), (cfg.poison_steps, cfg.batch, span),
                                    generator=gen).to(self.device)
        self.window = torch.arange(span, device=self.device)
        self.model_class = make_model_class()
        torch.manual_seed(seed)
        self.init_state = {k: v.detach().clone() for k, v in
                           self.model_class(len(self.vocab), cfg).state_dict().items()}
        self.adamw = adamw_flavour(self.device)

    def batch(self, data, offsets):
        rows = data[offsets.to(self.device)[:, None] + self.window]
        return rows[:, :-1], rows[:, 1:]

    def fresh_model(self, dtype):
        import torch

        model = self.model_class(len(self.vocab), self.cfg)
        model.load_state_dict(self.init_state)
        return model.to(device=self.device, dtype=getattr(torch, dtype))

    def make_optimizer(self, spec: RunSpec, params, backend: Optional[str] = None,
                       adamw_mode: bool = False):
        import torch

        from . import LuminaMoon

        cfg = self.cfg
        if spec.optimizer == "adamw":
            flavour = {self.adamw: True}
            return torch.optim.AdamW(params, lr=cfg.lr, betas=cfg.betas,
                                     weight_decay=cfg.weight_decay, **flavour)
        # AdamW mode (clip 0, non-finite gradients propagate, round to nearest): the same work
        # as torch's AdamW
        extra = (dict(clip=0.0, nonfinite="propagate", stochastic_rounding=False) if adamw_mode
                 else dict(clip=cfg.clip, stochastic_rounding=spec.stochastic_rounding))
        backend = backend or self.backend
        if self.cpu_threads and self.device.type == "cpu" and backend in ("auto", "cpu"):
            try:
                from .optimizer.native import CpuBackend

                backend = CpuBackend(num_threads=self.cpu_threads)
            except ImportError:  # no compiled engine: "auto" falls back to the reference
                pass
        return LuminaMoon(params, lr=cfg.lr, betas=cfg.betas, weight_decay=cfg.weight_decay,
                          state_dtype=getattr(torch, spec.dtype), seed=self.seed,
                          backend=backend, aot_bundle=self.aot_bundle, **extra)

    def sync(self) -> None:
        import torch

        if self.device.type == "cuda":
            torch.cuda.synchronize(self.device)

    def evaluate(self, model) -> float:
        import torch
        import torch.nn.functional as F

        total = torch.zeros((), device=self.device)
        with torch.no_grad():
            for offsets in self.val_offsets:
                x, y = self.batch(self.val_data, offsets)
                total += F.cross_entropy(model(x).flatten(0, 1), y.flatten())
        return float(total) / len(self.val_offsets)


def _backend_of(opt) -> str:
    plan = getattr(opt, "_plan", None)
    if plan is not None and plan.backends:
        return "/".join(sorted({b.name for b in plan.backends}))
    if getattr(opt, "defaults", {}).get("fused"):
        return "torch fused"
    if getattr(opt, "defaults", {}).get("foreach"):
        return "torch foreach"
    return "torch"


def train(session: Session, spec: RunSpec, progress_factory: Callable) -> RunResult:
    import torch
    import torch.nn.functional as F

    cfg = session.cfg
    model = session.fresh_model(spec.dtype)
    params = dict(model.named_parameters())
    opt = session.make_optimizer(spec, list(params.values()))
    result = RunResult(spec)
    losses = torch.full((cfg.steps,), math.nan, device=session.device)
    spikes, poisoned, nan_step = set(cfg.spike_range), cfg.poison_range, cfg.nan_step
    bar = progress_factory(total=cfg.steps, desc=f"{spec.label:<38}")
    tokens_per_step = cfg.batch * cfg.ctx
    read = 0  # train losses read back so far

    def record_eval(step: int) -> None:
        nonlocal read
        result.val_steps.append(step)
        result.val_loss.append(session.evaluate(model))
        new = losses[read:step].tolist()
        result.steps.extend(range(read, step))
        result.train_loss.extend(new)
        read = step

    record_eval(0)
    for step in range(cfg.steps):
        start = time.perf_counter()
        for group in opt.param_groups:
            group["lr"] = cfg.lr_at(step)
        x, y = session.batch(session.train_data, session.batch_offsets[step])
        loss = F.cross_entropy(model(x).flatten(0, 1), y.flatten())
        opt.zero_grad(set_to_none=True)
        if spec.inject and step in poisoned:
            # train on random characters with the loss x poison_scale; the curve keeps the
            # loss of the real batch (computed above, its graph dropped)
            loss = loss.detach()
            bad = session.poison[step - poisoned.start]
            (cfg.poison_scale * F.cross_entropy(model(bad[:, :-1]).flatten(0, 1),
                                                bad[:, 1:].flatten())).backward()
        else:
            loss.backward()
        if spec.inject:
            if step in spikes:
                params[cfg.spike_layer].grad.mul_(cfg.spike_scale)
            if step == nan_step:
                params[cfg.nan_param].grad.view(-1)[0] = math.nan
        session.sync()
        t0 = time.perf_counter()
        opt.step()
        session.sync()
        t1 = time.perf_counter()
        result.opt_seconds.append(t1 - t0)
        losses[step] = loss.detach()
        result.train_seconds += t1 - start
        result.tokens += tokens_per_step
        bar.update(1)
        done = step + 1
        if done % cfg.eval_every == 0 or done == cfg.steps:
            record_eval(done)
            bar.set_postfix_str(f"train {result.train_loss[-1]:.3f} val {result.val_loss[-1]:.3f}")
            if not math.isfinite(result.val_loss[-1]):
                break  # the weights are NaN: every later step is NaN too
    bar.close()
    result.backend = _backend_of(opt)
    result.skipped = int(opt.skipped_steps) if hasattr(opt, "skipped_steps") else 0
    result.weights_finite = all(bool(torch.isfinite(p).all()) for p in model.parameters())
    if not result.weights_finite:
        bad = [s for s, v in zip(result.steps, result.train_loss) if not math.isfinite(v)]
        result.nan_from = bad[0] if bad else result.val_steps[-1]
    return result


# --------------------------------------------------------------------------------------------
# optimizer step time, per backend
# --------------------------------------------------------------------------------------------


@dataclass
class StepTiming:
    name: str
    dtype: str
    ms: float
    note: str = ""


def time_optimizer_steps(session: Session, backends: Sequence[str]) -> List[StepTiming]:
    """Median wall time of ``opt.step()`` alone on this model's parameters, per optimizer.

    Each optimizer steps a copy of the initial weights with the gradients of one real batch;
    before every step the gradients are fresh tensors (as after ``zero_grad(set_to_none=True)``
    and a backward pass), made outside the timed region. On CUDA the device is synchronised
    before and after the step. LuminaMoon runs as in training (TDCLM: clip, skip check) on
    every backend, and in AdamW mode (clip 0, no skip check, round to nearest: torch AdamW's
    work) on the first.
    The reference backend, an oracle and not a fast path, gets a quarter of the steps.
    """
    import torch
    import torch.nn.functional as F

    cfg = session.cfg
    rows: List[StepTiming] = []
    for dtype in ("float32", "bfloat16"):
        model = session.fresh_model(dtype)
        x, y = session.batch(session.train_data, session.batch_offsets[0])
        F.cross_entropy(model(x).flatten(0, 1), y.flatten()).backward()
        grads = [p.grad.detach().clone() for p in model.parameters()]
        spec = RunSpec("bench", "bench", "", "luminamoon", dtype)
        candidates: List[Tuple[str, Callable]] = []

        def lumina(name: str, adamw_mode: bool = False) -> Callable:
            return lambda ps: session.make_optimizer(spec, ps, backend=name,
                                                     adamw_mode=adamw_mode)

        def adamw(flavour: str) -> Callable:
            return lambda ps: torch.optim.AdamW(ps, lr=cfg.lr, betas=cfg.betas,
                                                weight_decay=cfg.weight_decay, **{flavour: True})

        for name in backends:
            candidates.append((f"LuminaMoon {name}", lumina(name)))
            if name == backends[0] and name != "reference":
                candidates.append((f"LuminaMoon {name}, AdamW mode", lumina(name, True)))
        for flavour in ("fused", "foreach"):
            if flavour == "fused" and session.adamw != "fused":
                continue
            candidates.append((f"torch AdamW {flavour}", adamw(flavour)))
        for name, make in candidates:
            params = [p.detach().clone().requires_grad_() for p in model.parameters()]
            try:
                opt = make(params)
                samples = []
                slow = "reference" in name
                steps = max(3, cfg.bench_steps // 4) if slow else cfg.bench_steps
                warmup = min(2, cfg.bench_warmup) if slow else cfg.bench_warmup
                for i in range(warmup + steps):
                    for p, g in zip(params, grads):
                        p.grad = g.clone()
                    session.sync()
                    t0 = time.perf_counter()
                    opt.step()
                    session.sync()
                    if i >= warmup:
                        samples.append(time.perf_counter() - t0)
                rows.append(StepTiming(name, dtype, 1e3 * statistics.median(samples)))
            except Exception as exc:  # a backend that cannot run here is reported, not fatal
                rows.append(StepTiming(name, dtype, math.nan, f"{type(exc).__name__}: {exc}"))
    return rows


def available_backends(device, aot_bundle: Optional[str]) -> List[str]:
    """LuminaMoon's backends that can step tensors on ``device`` here, fastest first."""
    import importlib.util

    names = []
    if device.type == "cuda":
        if importlib.util.find_spec("triton") is not None:
            names.append("triton")
        if aot_bundle:
            names.append("aot")
    elif device.type == "cpu":
        try:
            from .optimizer.backends import native  # noqa: F401  (the compiled engine)

            names.append("cpu")
        except ImportError:
            pass
    names.append("reference")
    return names


# --------------------------------------------------------------------------------------------
# reporting
# --------------------------------------------------------------------------------------------


def machine_line(device) -> str:
    import torch

    if device.type == "cuda":
        where = torch.cuda.get_device_name(device)
    else:
        where = cpu_model()
    return (f"{where}, {usable_cores()} cores, torch {torch.__version__}, "
            f"{datetime.date.today().isoformat()}")


def usable_cores() -> int:
    """Cores this process may run on (its affinity mask where the OS has one)."""
    try:
        return len(os.sched_getaffinity(0))
    except (AttributeError, OSError):
        return os.cpu_count() or 1


def cpu_model() -> str:
    try:
        with open("/proc/cpuinfo") as fh:
            for line in fh:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


def fault_response(result: RunResult, first: int, until: int) -> Tuple[float, float, float]:
    """Train loss around a fault that starts at step ``first``: (mean of the 10 steps before,
    the highest of the 20 steps from it, mean of the 10 steps before first+40 or, when the
    next fault comes sooner, before ``until``)."""
    by_step = dict(zip(result.steps, result.train_loss))

    def mean(steps):
        values = [by_step[s] for s in steps if s in by_step]
        return statistics.fmean(values) if values else math.nan

    peak = [by_step[s] for s in range(first, first + 20) if s in by_step]
    end = min(first + 40, until)
    return (mean(range(max(0, first - 10), first)), max(peak) if peak else math.nan,
            mean(range(max(first, end - 10), end)))


def results_table(results: List[RunResult], cfg: Config) -> List[List[str]]:
    warm = min(10, cfg.steps // 4)
    rows = [["run", "backend", "val loss", "tokens/s", "opt ms/step", "skipped steps", "note"]]
    for r in results:
        note = ""
        if r.nan_from is not None:
            note = f"weights NaN from step {r.nan_from}"
        elif r.spec.inject:
            note = "trained through"
        rows.append([r.spec.label, r.backend, f"{r.final_val:.4f}", f"{r.tokens_per_s:,.0f}",
                     f"{r.opt_ms(warm):.3f}", str(r.skipped), note])
    return rows


def timing_table(timings: List[StepTiming]) -> List[List[str]]:
    names = list(dict.fromkeys(t.name for t in timings))
    by = {(t.name, t.dtype): t for t in timings}
    rows = [["optimizer step", "fp32 weights ms", "bf16 weights ms"]]
    for name in names:
        cells = []
        for dtype in ("float32", "bfloat16"):
            t = by.get((name, dtype))
            cells.append("n/a" if t is None or not math.isfinite(t.ms) else f"{t.ms:.3f}")
        rows.append([name] + cells)
    return rows


def format_text(rows: List[List[str]]) -> str:
    widths = [max(len(r[i]) for r in rows) for i in range(len(rows[0]))]
    lines = []
    for j, r in enumerate(rows):
        cells = [c.ljust(w) if i == 0 or j == 0 else c.rjust(w)
                 for i, (c, w) in enumerate(zip(r, widths))]
        lines.append("  ".join(cells).rstrip())
        if j == 0:
            lines.append("  ".join("-" * w for w in widths))
    return "\n".join(lines)


def _numeric(cell: str) -> bool:
    try:
        float(cell.replace(",", ""))
        return True
    except ValueError:
        return cell in ("", "n/a")


def format_markdown(rows: List[List[str]]) -> str:
    """A markdown table; columns of numbers right-aligned."""
    align = ["---:" if all(_numeric(r[i]) for r in rows[1:]) else "---"
             for i in range(len(rows[0]))]
    lines = ["| " + " | ".join(rows[0]) + " |", "|" + "|".join(align) + "|"]
    lines += ["| " + " | ".join(r) + " |" for r in rows[1:]]
    return "\n".join(lines)


def findings(results: List[RunResult], timings: List[StepTiming], cfg: Config,
             device) -> List[str]:
    """What the numbers say, in sentences computed from them."""
    by = {r.spec.key: r for r in results}
    lines = []
    a32, l32 = by.get("fp32-adamw"), by.get("fp32-lumina")
    if a32 and l32:
        lines.append(f"fp32: LuminaMoon val loss {l32.final_val:.4f}, AdamW {a32.final_val:.4f} "
                     f"({l32.final_val - a32.final_val:+.4f}).")
    a16, l16, rtn = by.get("bf16-adamw"), by.get("bf16-lumina"), by.get("bf16-lumina-rtn")
    if a16 and l16:
        text = (f"bf16 weights: stochastic rounding {l16.final_val:.4f} vs AdamW's "
                f"round-to-nearest {a16.final_val:.4f} ({l16.final_val - a16.final_val:+.4f})")
        if a32:
            text += (f"; fp32 AdamW {a32.final_val:.4f}: round-to-nearest loses "
                     f"{a16.final_val - a32.final_val:+.4f}, stochastic rounding "
                     f"{l16.final_val - a32.final_val:+.4f}")
        if rtn:
            text += f"; LuminaMoon with round-to-nearest {rtn.final_val:.4f}"
        lines.append(text + ".")
    fa, fl = by.get("faults-adamw"), by.get("faults-lumina")
    if fa and fl:
        faults = ((f"{cfg.spike_layer} gradient x{cfg.spike_scale:g}", cfg.spike_range,
                   cfg.poison_range.start),
                  (f"poisoned batches (random characters, loss x{cfg.poison_scale:g})",
                   cfg.poison_range, cfg.nan_step))
        for what, rng, until in faults:
            a, b = fault_response(fa, rng.start, until), fault_response(fl, rng.start, until)
            lines.append(f"{what}, steps {rng.start}-{rng.stop - 1}: train loss before / peak "
                         f"/ {min(40, until - rng.start)} steps later: AdamW {a[0]:.3f} / "
                         f"{a[1]:.3f} / {a[2]:.3f}, LuminaMoon {b[0]:.3f} / {b[1]:.3f} / "
                         f"{b[2]:.3f}.")
        fate = (f"AdamW's weights are NaN from step {fa.nan_from}, its run stops"
                if fa.nan_from is not None else "AdamW's weights stayed finite")
        lines.append(f"NaN gradient at step {cfg.nan_step} ({cfg.nan_param}): {fate}; "
                     f"LuminaMoon skipped {fl.skipped} step(s) on the device and ended at val "
                     f"loss {fl.final_val:.4f} (no faults: {l32.final_val:.4f}).")
    for dtype in ("float32", "bfloat16"):
        theirs = [t for t in timings if t.dtype == dtype and t.name.startswith("torch")
                  and math.isfinite(t.ms)]
        ours = [t for t in timings if t.dtype == dtype and t.name.startswith("LuminaMoon")
                and "reference" not in t.name and math.isfinite(t.ms)]
        if not theirs or not ours:
            continue
        best = min(theirs, key=lambda t: t.ms)
        parts = []
        for t in ours:
            verdict = "faster" if t.ms < best.ms else ("equal" if t.ms == best.ms else "SLOWER")
            parts.append(f"{t.name} {t.ms:.3f} ms ({t.ms / best.ms:.2f}x, {verdict})")
        lines.append(f"optimizer step, {dtype} weights on {device.type}, against {best.name} "
                     f"{best.ms:.3f} ms: " + "; ".join(parts) + ".")
    return lines


def write_csv(results: List[RunResult], timings: List[StepTiming], cfg: Config, path: str,
              machine: str) -> None:
    warm = min(10, cfg.steps // 4)
    with open(path, "w", newline="") as fh:
        w = csv.writer(fh)
        w.writerow(["kind", "name", "backend", "dtype", "val_loss", "tokens_per_s",
                    "opt_ms_per_step", "skipped_steps", "nan_from_step", "machine"])
        for r in results:
            w.writerow(["run", r.spec.label, r.backend, r.spec.dtype, f"{r.final_val:.6f}",
                        f"{r.tokens_per_s:.1f}", f"{r.opt_ms(warm):.4f}", r.skipped,
                        "" if r.nan_from is None else r.nan_from, machine])
        for t in timings:
            w.writerow(["step_time", t.name, "", t.dtype, "", "", f"{t.ms:.4f}", "", "", machine])


# --------------------------------------------------------------------------------------------
# plots
# --------------------------------------------------------------------------------------------


def _pyplot():
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        return None
    return plt


def _smooth(values: List[float], width: int) -> List[float]:
    """Trailing mean over ``width`` steps (NaN stays NaN)."""
    out, acc = [], []
    for v in values:
        acc.append(v)
        if len(acc) > width:
            acc.pop(0)
        out.append(statistics.fmean(acc) if all(math.isfinite(a) for a in acc) else math.nan)
    return out


def _log_axis(ax, lo: float, hi: float) -> None:
    """A log-scaled loss axis with plain-number ticks."""
    from matplotlib.ticker import FixedLocator, NullFormatter, ScalarFormatter

    ax.set_yscale("log")
    ax.set_ylim(lo, hi)
    ticks = [t for t in (1.6, 1.8, 2.0, 2.2, 2.5, 3.0, 3.5, 4.0, 5.0, 6.0) if lo <= t <= hi]
    ax.yaxis.set_major_locator(FixedLocator(ticks))
    ax.yaxis.set_major_formatter(ScalarFormatter())
    ax.yaxis.set_minor_formatter(NullFormatter())


def plot_losses(results: List[RunResult], cfg: Config, path: str, title: str) -> Optional[str]:
    """Four panels: fp32 runs, bf16 runs, each run's validation loss minus fp32 AdamW's, and
    the faults runs with the injected steps marked."""
    plt = _pyplot()
    if plt is None:
        return None
    fig, grid = plt.subplots(2, 2, figsize=(14, 9.5), dpi=110)
    (ax32, ax16), (axgap, axf) = grid
    width = max(1, cfg.steps // 60)
    finite = [v for r in results for v in r.val_loss + r.train_loss if math.isfinite(v)]
    lo, hi = 0.95 * min(finite), 1.05 * max(finite)

    def curves(ax, panel):
        for r in (r for r in results if r.spec.panel == panel):
            ax.plot(r.steps, _smooth(r.train_loss, width), color=r.spec.color,
                    linestyle=r.spec.style, linewidth=0.9, alpha=0.4)
            ax.plot(r.val_steps, r.val_loss, color=r.spec.color, linestyle=r.spec.style,
                    linewidth=2.0, marker="o", markersize=3,
                    label=f"{r.spec.label}: val {r.final_val:.4f}")
        ax.set_xlabel("step")
        ax.set_ylabel("cross-entropy (thin: train, smoothed; thick: validation)", fontsize=8)
        ax.grid(alpha=0.3)
        _log_axis(ax, lo, hi)

    curves(ax32, "fp32")
    ax32.set_title("fp32 weights: AdamW vs LuminaMoon")
    ax32.legend(fontsize=8, loc="upper right")
    curves(ax16, "bf16")
    ax16.set_title("pure bf16 weights and moments: how the optimizer rounds")
    ax16.legend(fontsize=8, loc="upper right")

    base = next((r for r in results if r.spec.key == "fp32-adamw"), None)
    if base is not None:
        ref = dict(zip(base.val_steps, base.val_loss))
        for r in results:
            if r.spec.panel not in ("fp32", "bf16") or r is base:
                continue
            pts = [(s, v - ref[s]) for s, v in zip(r.val_steps, r.val_loss) if s in ref]
            axgap.plot([s for s, _ in pts], [d for _, d in pts], color=r.spec.color,
                       linestyle=":" if r.spec.panel == "fp32" else r.spec.style,
                       linewidth=2.0 if r.spec.panel == "bf16" else 1.5, marker="o",
                       markersize=3, label=f"{r.spec.label}: {pts[-1][1]:+.4f}")
        axgap.axhline(0.0, color="C0", linewidth=1.5, label="AdamW, fp32 (the baseline)")
        axgap.set_title("validation loss minus AdamW fp32's (same data, seed, weights)")
        axgap.set_xlabel("step")
        axgap.set_ylabel("validation loss difference")
        axgap.grid(alpha=0.3)
        axgap.legend(fontsize=8, loc="upper left")

    curves(axf, "faults")
    s, q = cfg.spike_range, cfg.poison_range
    axf.axvspan(s.start - 0.5, s.stop - 0.5, color="orange", alpha=0.5,
                label=f"steps {s.start}-{s.stop - 1}: {cfg.spike_layer} gradient "
                      f"x{cfg.spike_scale:g}")
    axf.axvspan(q.start - 0.5, q.stop - 0.5, color="red", alpha=0.3,
                label=f"steps {q.start}-{q.stop - 1}: poisoned batches, loss x"
                      f"{cfg.poison_scale:g}")
    axf.axvline(cfg.nan_step, color="purple", linestyle=":", linewidth=1.5,
                label=f"step {cfg.nan_step}: a NaN in one gradient element")
    for r in (r for r in results if r.spec.panel == "faults"):
        if r.nan_from is not None:
            before = [v for st, v in zip(r.steps, r.train_loss) if st < r.nan_from
                      and math.isfinite(v)]
            y = _smooth(before, width)[-1] if before else hi / 1.1
            axf.plot([r.nan_from], [y], marker="X", markersize=13, color=r.spec.color,
                     linestyle="none")
            axf.annotate(f"{r.spec.label.split(',')[0]}: weights NaN\nfrom step {r.nan_from}, "
                         "run ends", (r.nan_from, y), textcoords="offset points",
                         xytext=(10, -28), color=r.spec.color, fontsize=8)
        elif r.skipped:
            axf.annotate(f"{r.spec.label.split(',')[0]}: skipped_steps = {r.skipped},\n"
                         "training goes on", (cfg.nan_step, r.final_val),
                         textcoords="offset points", xytext=(-8, 16), ha="right",
                         color=r.spec.color, fontsize=8)
    axf.set_title("fp32 with injected faults (the same in both runs)")
    axf.legend(fontsize=7, loc="lower left")
    fig.suptitle(title, fontsize=10)
    fig.tight_layout()
    fig.savefig(path)
    plt.close(fig)
    return path


def plot_step_times(timings: List[StepTiming], path: str, title: str) -> Optional[str]:
    plt = _pyplot()
    if plt is None:
        return None
    names = list(dict.fromkeys(t.name for t in timings))
    by = {(t.name, t.dtype): t.ms for t in timings}
    fig, axes = plt.subplots(1, 2, figsize=(12, 0.55 * len(names) + 1.8), dpi=110)
    for ax, dtype in zip(axes, ("float32", "bfloat16")):
        values = [by.get((n, dtype), math.nan) for n in names]
        colors = ["C3" if n.startswith("LuminaMoon") else "C0" for n in names]
        ys = range(len(names))
        ax.barh(ys, [v if math.isfinite(v) else 0 for v in values], color=colors)
        for y, v in zip(ys, values):
            ax.text(v if math.isfinite(v) else 0, y, f" {v:.3f} ms" if math.isfinite(v) else " n/a",
                    va="center", fontsize=8)
        ax.set_yticks(list(ys))
        ax.set_yticklabels(names, fontsize=8)
        ax.invert_yaxis()
        ax.set_xscale("log")
        ax.set_xlabel("opt.step() wall time, ms (median; log scale)")
        ax.set_title(f"{dtype} weights")
        ax.grid(alpha=0.3, axis="x", which="both")
        finite = [v for v in values if math.isfinite(v) and v > 0]
        if finite:
            ax.set_xlim(min(finite) / 2, max(finite) * 4)
    fig.suptitle(title, fontsize=10)
    fig.text(0.01, 0.01, "LuminaMoon <backend>: TDCLM as trained (soft clip, device-side skip "
             "check; bf16: stochastic rounding of weights and bf16 moments, one Philox4x32-10 "
             "per stored value). AdamW mode: clip 0, no skip check, round to nearest, as torch's "
             "AdamW. Fresh gradient tensors before every step; median after warm-up.",
             fontsize=7, wrap=True)
    fig.tight_layout(rect=(0, 0.05, 1, 1))
    fig.savefig(path)
    plt.close(fig)
    return path


# --------------------------------------------------------------------------------------------
# command line
# --------------------------------------------------------------------------------------------


class _PlainProgress:
    """Progress printer for when tqdm is not installed."""

    def __init__(self, total: int, desc: str = ""):
        self.total, self.n, self.desc, self.postfix = total, 0, desc, ""

    def update(self, n: int) -> None:
        self.n += n
        if self.n == self.total or self.n % max(1, self.total // 4) == 0:
            print(f"{self.desc} [{self.n:>5}/{self.total}] {self.postfix}", flush=True)

    def set_postfix_str(self, text: str) -> None:
        self.postfix = text

    def close(self) -> None:
        pass


def _progress_factory():
    try:
        from tqdm import tqdm
    except ImportError:
        return _PlainProgress
    return lambda total, desc: tqdm(total=total, desc=desc, unit="step", dynamic_ncols=True,
                                    leave=True, mininterval=0.5)


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="luminamoon demo", formatter_class=argparse.RawDescriptionHelpFormatter,
        description=__doc__.split("\n", 1)[1].strip() if __doc__ else None)
    parser.add_argument("--quick", action="store_true",
                        help=f"a short run for tests and smoke checks ({QUICK['steps']} steps, "
                             "less text, no LuminaMoon round-to-nearest control run, the "
                             "reference backend left out of the step timing): under a minute on "
                             "2 idle CPU cores")
    parser.add_argument("--steps", type=int, default=None,
                        help=f"training steps per run (default {Config.steps}, "
                             f"{QUICK['steps']} with --quick); the faults run's spikes start "
                             f"at {100 * Config.spike_at:.0f}%% of the run, its poisoned "
                             f"batches at {100 * Config.poison_at:.0f}%%, its NaN step is at "
                             f"{100 * Config.nan_at:.0f}%%")
    parser.add_argument("--device", default="auto",
                        help="where to train: 'auto' (the CUDA GPU when there is one, else the "
                             "CPU), 'cpu', 'cuda' or 'cuda:N'")
    parser.add_argument("--backend", default="auto",
                        choices=["auto", "reference", "triton", "aot", "cpu"],
                        help="LuminaMoon's backend in the training runs (default auto: triton on "
                             "CUDA, the native cpu engine on CPU); the step-time panel times "
                             "every backend that runs here regardless")
    parser.add_argument("--aot-bundle", default=None,
                        help="folder of an ahead-of-time bundle ('luminamoon aot build --out "
                             "DIR'); on CUDA it adds the aot backend to the step-time panel "
                             "(default: $LUMINAMOON_AOT_BUNDLE, else ./bundle when it holds a "
                             "manifest.json, else none)")
    parser.add_argument("--seed", type=int, default=0,
                        help="seed of the initial weights, the batch order and LuminaMoon's "
                             "rounding streams (default 0)")
    parser.add_argument("--lr", type=float, default=None,
                        help=f"peak learning rate of every run (default {Config.lr:g}; linear "
                             "warm-up, then cosine decay)")
    parser.add_argument("--out", default="demo-out",
                        help="folder for loss_curves.png, step_time.png, results.md and "
                             "results.csv (default demo-out)")
    parser.add_argument("--no-plot", action="store_true",
                        help="write the tables only, no PNGs (also what happens without "
                             "matplotlib)")
    parser.add_argument("--threads", type=int, default=None,
                        help="CPU threads of torch and of LuminaMoon's native cpu engine "
                             "(default: torch takes one per core this process may use, the "
                             "engine one per hardware thread)")
    return parser


def default_aot_bundle() -> Optional[str]:
    """$LUMINAMOON_AOT_BUNDLE, else ./bundle (where the README's build command writes one)."""
    env = os.environ.get("LUMINAMOON_AOT_BUNDLE")
    if env:
        return env
    return "bundle" if os.path.isfile(os.path.join("bundle", "manifest.json")) else None


def _load_average() -> str:
    """The 1-minute load average (other processes on the machine move every timing)."""
    try:
        return f"{os.getloadavg()[0]:.1f}"
    except (AttributeError, OSError):
        return "n/a"


def resolve_device(text: str):
    import torch

    if text == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    device = torch.device(text)
    if device.type == "cuda" and not torch.cuda.is_available():
        raise SystemExit(f"luminamoon demo: --device {text} but torch sees no CUDA device "
                         f"(torch {torch.__version__}); use --device cpu or auto")
    return device


def main(argv=None) -> int:
    args = build_parser().parse_args(argv)
    wall_start = time.perf_counter()
    load_start = _load_average()

    import torch

    cfg = Config(**QUICK) if args.quick else Config()
    if args.steps is not None:
        if args.steps < 20:
            raise SystemExit(f"luminamoon demo: --steps must be >= 20, got {args.steps}")
        cfg.steps = args.steps
        cfg.warmup = min(cfg.warmup, max(1, cfg.steps // 10))
    if args.lr is not None:
        if not args.lr > 0:
            raise SystemExit(f"luminamoon demo: --lr must be > 0, got {args.lr}")
        cfg.lr = args.lr
    if args.threads is not None and args.threads < 1:
        raise SystemExit(f"luminamoon demo: --threads must be >= 1, got {args.threads}")
    torch.set_num_threads(args.threads or usable_cores())
    device = resolve_device(args.device)
    if args.aot_bundle is None:
        args.aot_bundle = default_aot_bundle()
    if args.backend == "aot" and not args.aot_bundle:
        raise SystemExit("luminamoon demo: --backend aot needs --aot-bundle DIR (written by "
                         "'luminamoon aot build')")

    session = Session(cfg, device, args.backend, args.aot_bundle, args.seed,
                      cpu_threads=args.threads or 0)
    machine = machine_line(device)
    print(f"data: {len(session.train_data):,} training / {len(session.val_data):,} validation "
          f"characters from {len(session.train_files)} + {len(session.val_files)} standard-"
          f"library modules ({sysconfig.get_paths()['stdlib']}), vocabulary {len(session.vocab)}")
    n_params = sum(v.numel() for v in session.init_state.values())
    print(f"model: GPT, {cfg.n_layer} layers, d_model {cfg.d_model}, {cfg.n_head} heads, context "
          f"{cfg.ctx}, {n_params:,} parameters in {len(session.init_state)} tensors; batch "
          f"{cfg.batch}, {cfg.steps} steps, lr {cfg.lr:g} (warm-up {cfg.warmup}, cosine to "
          f"{cfg.min_lr_ratio:g}x), betas {cfg.betas}, weight decay {cfg.weight_decay:g}, "
          f"LuminaMoon clip {cfg.clip:g}")
    print(f"device: {device} ({machine}); torch AdamW: {session.adamw}")

    progress = _progress_factory()
    results = [train(session, spec, progress) for spec in run_specs(cfg)]
    backends = available_backends(device, args.aot_bundle)
    if not cfg.bench_reference and len(backends) > 1:
        backends.remove("reference")
    timings = time_optimizer_steps(session, backends)

    run_rows, time_rows = results_table(results, cfg), timing_table(timings)
    notes = findings(results, timings, cfg, device)
    print()
    print(format_text(run_rows))
    print()
    print(format_text(time_rows))
    print()
    for line in notes:
        print("- " + line)
    failed = [t for t in timings if t.note]
    for t in failed:
        print(f"  ({t.name}, {t.dtype}: {t.note})")

    os.makedirs(args.out, exist_ok=True)
    wall = time.perf_counter() - wall_start
    header = (f"{machine}; {cfg.steps} steps per run, {n_params:,} parameters; demo wall time "
              f"{wall:.0f} s; load average {load_start} at the start, {_load_average()} at "
              f"the end")
    with open(os.path.join(args.out, "results.md"), "w") as fh:
        fh.write(f"{header}\n\n{format_markdown(run_rows)}\n\n{format_markdown(time_rows)}\n\n")
        fh.write("\n".join("- " + line for line in notes) + "\n")
    write_csv(results, timings, cfg, os.path.join(args.out, "results.csv"), machine)
    written = [os.path.join(args.out, "results.md"), os.path.join(args.out, "results.csv")]
    if not args.no_plot:
        for png in (plot_losses(results, cfg, os.path.join(args.out, "loss_curves.png"),
                                f"char-level GPT on Python's standard library: {header}"),
                    plot_step_times(timings, os.path.join(args.out, "step_time.png"),
                                    f"optimizer step on this model ({n_params:,} parameters, "
                                    f"{len(session.init_state)} tensors), {device.type}: "
                                    f"{machine}")):
            if png:
                written.append(png)
    print(f"\n{header}")
    print(f"wrote {', '.join(written)}")
    print(f"demo wall time {time.perf_counter() - wall_start:.1f} s")
    return 0


if __name__ == "__main__":  # pragma: no cover
    raise SystemExit(main())
