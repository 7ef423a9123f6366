"""demo/runs.py: the demo's runs: one training run per optimizer and dtype, and the step timings."""
from __future__ import annotations

import math
import re
import statistics
import time
from dataclasses import dataclass, field
from typing import Callable, List, Optional, Sequence, Tuple

from .config import Config
from .data import CharVocab, stdlib_sources
from ..bench import state_nbytes
from .model import make_model_class

# --------------------------------------------------------------------------------------------
# runs
# --------------------------------------------------------------------------------------------


def cpu_engine_backend():
    """The compiled CPU engine's backend class, or None where the native module is not built:
    the one place the demo looks for it (the step panel's rows and ``--threads`` both ask)."""
    try:
        from ..optimizer.backends.cpu import CpuBackend
    except ImportError:
        return None
    return CpuBackend


def _after_warmup(samples: List[float], warmup: int) -> List[float]:
    """The samples after the first ``warmup`` (all of them when the run was shorter)."""
    return samples[warmup:] or samples


@dataclass
class RunSpec:
    key: str
    panel: str  # "fp32", "bf16" or "faults"
    label: str
    optimizer: str  # "adamw" or "luminamoon"
    dtype: str  # "float32" or "bfloat16"
    inject: bool = False
    state: str = ""  # LuminaMoon's moments: "" (as dtype) or "q8"
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
    step_seconds: List[float] = field(default_factory=list)  # a whole training step each
    tokens_per_step: int = 0
    skipped: int = 0
    nan_from: Optional[int] = None  # first step whose weights are NaN
    weights_finite: bool = True
    state_bytes: float = math.nan  # the optimizer's state a parameter element (bench.state_nbytes)
    note: str = ""  # why the run did not run, when it did not

    @property
    def final_val(self) -> float:
        return self.val_loss[-1] if self.val_loss else math.nan

    def tokens_per_s(self, warmup: int) -> float:
        """Training throughput after the first ``warmup`` steps (which pay for kernel
        compilation and cold caches, once per run)."""
        samples = _after_warmup(self.step_seconds, warmup)
        seconds = sum(samples)
        return self.tokens_per_step * len(samples) / seconds if seconds > 0 else math.nan

    def opt_ms(self, warmup: int) -> float:
        samples = _after_warmup(self.opt_seconds, warmup)
        return 1e3 * statistics.median(samples) if samples else math.nan


def run_specs(cfg: Config) -> List[RunSpec]:
    specs = [
        RunSpec("fp32-adamw", "fp32", "AdamW, fp32", "adamw", "float32", color="C0"),
        RunSpec("fp32-lumina", "fp32", "LuminaMoon, fp32", "luminamoon", "float32", color="C3"),
        # q8 moments: one byte a moment and element (tensors of >= 4096 elements), fp32 weights
        RunSpec("q8-lumina", "fp32", "LuminaMoon, fp32, q8 moments", "luminamoon", "float32",
                state="q8", color="C2", style="-."),
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

        from .. import LuminaMoon

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
        engine = cpu_engine_backend()
        if (self.cpu_threads and self.device.type == "cpu" and backend in ("auto", "cpu")
                and engine is not None):  # without the engine "auto" falls back to the reference
            backend = engine(num_threads=self.cpu_threads)
        state_dtype = "q8" if spec.state == "q8" else getattr(torch, spec.state or spec.dtype)
        return LuminaMoon(params, lr=cfg.lr, betas=cfg.betas, weight_decay=cfg.weight_decay,
                          state_dtype=state_dtype, seed=self.seed,
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


def q8_blocker(session: Session) -> Optional[str]:
    """None where the backend of the training runs steps q8 moments itself; else why not.
    ("auto" would hand the q8 tensors to the reference backend, an oracle far slower than the
    demo's time allows; a session on the reference backend runs every run there alike.)"""
    import torch

    name = session.backend
    if name == "auto":
        name = available_backends(session.device, session.aot_bundle)[0]
    if name == "reference":
        return None
    p = torch.zeros(4096, device=session.device, requires_grad=True)
    p.grad = torch.ones_like(p)
    spec = RunSpec("probe", "", "", "luminamoon", "float32", state="q8")
    try:
        session.make_optimizer(spec, [p], backend=name).step()
    except Exception as exc:  # noqa: BLE001 - the reason is the run's note
        why = re.split(r" \(|; |\n", str(exc), maxsplit=1)[0]
        return (f"not run: {type(exc).__name__}: {why} (the reference backend steps q8 moments, "
                f"far slower than this demo's time allows: --backend reference runs every run "
                f"there)")
    return None


def train(session: Session, spec: RunSpec, progress_factory: Callable) -> RunResult:
    import torch
    import torch.nn.functional as F

    cfg = session.cfg
    result = RunResult(spec, tokens_per_step=cfg.batch * cfg.ctx)
    if spec.state == "q8":
        result.note = q8_blocker(session) or ""
        if result.note:
            return result
    model = session.fresh_model(spec.dtype)
    params = dict(model.named_parameters())
    opt = session.make_optimizer(spec, list(params.values()))
    cuda = session.device.type == "cuda"
    losses = torch.full((cfg.steps,), math.nan, device=session.device)
    spikes, poisoned, nan_step = set(cfg.spike_range), cfg.poison_range, cfg.nan_step
    bar = progress_factory(total=cfg.steps, desc=f"{spec.label:<38}")
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
        allocated = torch.cuda.memory_allocated(session.device) if cuda and step == 0 else 0
        t0 = time.perf_counter()
        opt.step()
        session.sync()
        t1 = time.perf_counter()
        if step == 0:  # the first step creates the state: on CUDA what the allocator gained
            used = (torch.cuda.memory_allocated(session.device) - allocated if cuda
                    else state_nbytes(opt))
            result.state_bytes = used / sum(p.numel() for p in params.values())
        result.opt_seconds.append(t1 - t0)
        losses[step] = loss.detach()
        result.step_seconds.append(t1 - start)
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
    The fast optimizers take their steps in turns (one each a round); the reference backend, an
    oracle and not a fast path, gets a quarter of the steps, after them.
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
        # every optimizer steps its own copy; the fast ones take their timed steps in turns,
        # one step each a round, so that a machine whose speed drifts (a shared or throttled
        # CPU) moves all of them alike; the slow reference after them, alone
        live = []
        failed = {}
        for name, make in candidates:
            params = [p.detach().clone().requires_grad_() for p in model.parameters()]
            try:
                live.append((name, params, make(params), []))
            except Exception as exc:  # a backend that cannot run here is reported, not fatal
                failed[name] = f"{type(exc).__name__}: {exc}"
                live.append((name, params, None, []))

        def timed_step(params, opt) -> float:
            for p, g in zip(params, grads):
                p.grad = g.clone()
            session.sync()
            t0 = time.perf_counter()
            opt.step()
            session.sync()
            return time.perf_counter() - t0

        def take_rounds(entries, warmup: int, steps: int) -> None:
            """warmup + steps rounds of one step of each entry; the timed ones after warmup."""
            for i in range(warmup + steps):
                for name, params, opt, samples in entries:
                    if name in failed:
                        continue
                    try:
                        dt = timed_step(params, opt)
                    except Exception as exc:  # noqa: BLE001 - reported in the table
                        failed[name] = f"{type(exc).__name__}: {exc}"
                        continue
                    if i >= warmup:
                        samples.append(dt)

        take_rounds([e for e in live if "reference" not in e[0]], cfg.bench_warmup,
                    cfg.bench_steps)
        take_rounds([e for e in live if "reference" in e[0]], min(2, cfg.bench_warmup),
                    max(3, cfg.bench_steps // 4))
        for name, _params, _opt, samples in live:
            if name in failed:
                rows.append(StepTiming(name, dtype, math.nan, failed[name]))
            else:
                rows.append(StepTiming(name, dtype, 1e3 * statistics.median(samples)))
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
    elif device.type == "cpu" and cpu_engine_backend() is not None:
        names.append("cpu")
    names.append("reference")
    return names
