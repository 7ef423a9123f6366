"""tests/cases.py: the one declarative spec of the backend tests: cases, shapes, tolerances,
and the builders and comparisons every backend is checked with.

``CASES`` (small shapes: every backend and device) and ``GPU_CASES`` (realistic shapes: CUDA
only) are crossed with backend and device by tests/test_backends.py; the topic files and
benchmarks/bench_step.py use the builders. Importing it imports neither triton nor the kernels,
so it never decides how Triton runs.
"""
from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass
from typing import List, Optional, Tuple

import pytest
import torch

from conftest import ODD_SHAPES, bits

from luminamoon.optimizer._groups import Hyper, LaunchGroup
from luminamoon.optimizer.backends.reference import ReferenceBackend

# ------------------------------------------------------------------------------------------
# Shared: cases, groups, steps, comparisons
# ------------------------------------------------------------------------------------------

F32, BF16, F16 = torch.float32, torch.bfloat16, torch.float16
DT = {F32: "fp32", BF16: "bf16", F16: "fp16"}
BOUND_NAMES = {0: "none", 1: "abs", 2: "rel"}

# float32 storage: two correct float32 evaluations of one formula (FMA contraction, libdevice
# tanh vs torch.tanh) differ by a few ulps of values of magnitude ~1.
F32_RTOL, F32_ATOL = 1e-6, 1e-6
# A 16-bit stored value may differ from the reference only where q sits within a few float32
# ulps of a rounding edge: at most one unit in the last place, on a small fraction of elements.
MAX_EDGE_FRACTION = 0.01
# Per-tensor S: the same float32 terms summed in a different order (blocks + tree vs torch's
# pairwise sum); the relative difference is bounded by ~log2(n) * 2**-24, far below this.
STATS_RTOL = 1e-5


def f32(x: float) -> float:
    """Hyperparameters are rounded to float32 once (docs/internals.md)."""
    return float(torch.tensor(float(x), dtype=torch.float32))


@dataclass(frozen=True)
class Case:
    """One row of the matrix: dtypes, hyperparameters, shapes, steps."""

    param_dtype: torch.dtype
    grad_dtype: torch.dtype
    state_dtype: torch.dtype
    bound_mode: int = 0
    clip: float = 0.0
    maximize: bool = False
    nonfinite: str = "propagate"
    sr: bool = True
    shapes: Tuple[tuple, ...] = tuple(ODD_SHAPES)
    steps: int = 2
    lr: object = 1e-2  # a float, "tensor" (0-dim fp32 on the device) or "tensor64" (float64)
    offsets: Optional[Tuple[int, ...]] = None  # elem offsets of a sharded layout
    weight_decay: float = 0.1
    bound: float = 0.05

    @property
    def dtype_id(self) -> str:
        return f"p{DT[self.param_dtype]}-g{DT[self.grad_dtype]}-s{DT[self.state_dtype]}"

    @property
    def hyper_id(self) -> str:
        parts = [f"clip{self.clip:g}", BOUND_NAMES[self.bound_mode], self.nonfinite,
                 "sr" if self.sr else "rne"]
        if self.maximize:
            parts.append("max")
        if not isinstance(self.lr, float):
            parts.append(f"lr-{self.lr}")
        if self.offsets:
            parts.append("sharded")
        if self.steps != 2:
            parts.append(f"{self.steps}steps")
        return "-".join(parts)

    @property
    def shape_id(self) -> str:
        """"" for ODD_SHAPES, else "-<tensors>t<elements>"."""
        if self.shapes == tuple(ODD_SHAPES):
            return ""
        return f"-{len(self.shapes)}t{sum(math.prod(s) for s in self.shapes)}"

    @property
    def id(self) -> str:
        return f"{self.hyper_id}/{self.dtype_id}{self.shape_id}"

    def hyper(self) -> Hyper:
        return Hyper(beta1=f32(0.9), beta2=f32(0.999), eps=f32(1e-8),
                     weight_decay=f32(self.weight_decay), clip=f32(self.clip),
                     bound_mode=self.bound_mode, bound=f32(self.bound), maximize=self.maximize,
                     nonfinite=self.nonfinite, stochastic_rounding=self.sr)


def _lr_value(case: Case, device: torch.device):
    if case.lr == "tensor":
        return torch.tensor(1e-2, dtype=torch.float32, device=device)
    if case.lr == "tensor64":
        return torch.tensor(1e-2, dtype=torch.float64, device=device)
    return float(case.lr)


def make_group(case: Case, device, seed: int = 0x9E3779B97F4A7C15 + 12345,
               data_seed: int = 0, start_step: int = 3) -> LaunchGroup:
    """A launch group of fresh tensors for ``case`` on ``device`` (grads included)."""
    device = torch.device(device)
    gen = torch.Generator().manual_seed(data_seed)
    n = len(case.shapes)
    params, ms, vs, p0s = [], [], [], []
    for shape in case.shapes:
        p = torch.randn(shape, generator=gen)
        params.append(p.to(device=device, dtype=case.param_dtype))
        ms.append((torch.randn(shape, generator=gen) * 0.1).to(device=device,
                                                                dtype=case.state_dtype))
        vs.append((torch.rand(shape, generator=gen) * 0.01).to(device=device,
                                                               dtype=case.state_dtype))
        # p0 near p so that the bounds are active on some elements and not on others
        p0 = p + 0.03 * torch.randn(shape, generator=gen)
        p0s.append(p0.to(device=device, dtype=case.param_dtype))
    numels = [math.prod(s) for s in case.shapes]
    offsets = list(case.offsets) if case.offsets else [0] * n
    global_numels = [off + num + (7 if case.offsets else 0) for off, num in zip(offsets, numels)]
    group = LaunchGroup(
        device=device, param_dtype=case.param_dtype, grad_dtype=case.grad_dtype,
        state_dtype=case.state_dtype, hyper=case.hyper(), lr=_lr_value(case, device), seed=seed,
        params=params, grads=[], exp_avgs=ms, exp_avg_sqs=vs,
        p_inits=p0s if case.bound_mode else None,
        steps=[torch.tensor(start_step, dtype=torch.int64, device=device) for _ in range(n)],
        param_indices=[3 * j + 1 for j in range(n)], elem_offsets=offsets,
        global_numels=global_numels)
    group.grads = new_grads(group, data_seed + 1)
    return group


def new_grads(group: LaunchGroup, data_seed: int, nonfinite_at: Optional[Tuple[int, int]] = None,
              value: float = float("nan")) -> List[torch.Tensor]:
    """Fresh gradients (new tensors); ``nonfinite_at=(j, i)`` puts ``value`` at element i of j."""
    gen = torch.Generator().manual_seed(data_seed)
    grads = [torch.randn(p.shape, generator=gen).to(device=p.device, dtype=group.grad_dtype)
             for p in group.params]
    if nonfinite_at is not None:
        j, i = nonfinite_at
        grads[j].view(-1)[i] = value
    return grads


def clone_group(group: LaunchGroup) -> LaunchGroup:
    """The same group with every tensor copied (and an empty backend cache)."""
    def c(lst):
        return None if lst is None else [t.clone() for t in lst]
    lr = group.lr.clone() if isinstance(group.lr, torch.Tensor) else group.lr
    return dataclasses.replace(group, lr=lr, params=c(group.params), grads=c(group.grads),
                               exp_avgs=c(group.exp_avgs), exp_avg_sqs=c(group.exp_avg_sqs),
                               p_inits=c(group.p_inits), steps=c(group.steps), stats=None,
                               cache={})


def copy_state(src: LaunchGroup, dst: LaunchGroup) -> None:
    """dst's params, moments, p_inits, steps and grads take src's values (in place)."""
    names = ["params", "exp_avgs", "exp_avg_sqs", "steps", "grads"]
    if src.p_inits is not None:
        names.append("p_inits")
    for name in names:
        for a, b in zip(getattr(src, name), getattr(dst, name)):
            b.copy_(a)


def run_step(backend, group: LaunchGroup, found_inf: Optional[torch.Tensor] = None
             ) -> torch.Tensor:
    """One step of one group, in the order the optimizer runs it (docs/internals.md)."""
    if found_inf is None:
        found_inf = torch.zeros((), dtype=torch.int32, device=group.device)
    else:
        found_inf.zero_()
    group.stats = None
    if group.hyper.needs_pass1:
        backend.pass1(group, found_inf)
    backend.pass2(group, found_inf)
    backend.commit(group, found_inf)
    return found_inf


def snapshot(group: LaunchGroup) -> dict:
    out = {name: [t.clone() for t in getattr(group, name)]
           for name in ("params", "exp_avgs", "exp_avg_sqs", "steps")}
    if group.p_inits is not None:
        out["p_inits"] = [t.clone() for t in group.p_inits]
    return out


def assert_unchanged(group: LaunchGroup, before: dict, what: str) -> None:
    for name, tensors in before.items():
        for j, (old, new) in enumerate(zip(tensors, getattr(group, name))):
            assert torch.equal(bits(old), bits(new)), f"{what}: {name}[{j}] changed"


def _ordered_bits(t: torch.Tensor) -> torch.Tensor:
    """Bit patterns of a float tensor mapped to integers ordered like the values, so that
    adjacent representable numbers differ by exactly 1 (across zero too)."""
    b = bits(t).to(torch.int64)
    width = t.element_size() * 8
    sign = 1 << (width - 1)
    b = b & ((1 << width) - 1)
    return torch.where(b >= sign, sign - b, b)


def assert_storage_close(actual: torch.Tensor, expected: torch.Tensor, what: str) -> None:
    """Stored values: float32 within float32 rounding; bf16/fp16 at most one ulp apart, on at
    most MAX_EDGE_FRACTION of the elements (rounding-edge cases). NaN where NaN."""
    assert actual.dtype == expected.dtype and actual.shape == expected.shape, what
    if actual.numel() == 0:
        return
    a, e = actual.detach().cpu(), expected.detach().cpu()
    assert torch.equal(torch.isnan(a), torch.isnan(e)), f"{what}: NaN positions differ"
    if a.dtype == torch.float32:
        torch.testing.assert_close(a, e, rtol=F32_RTOL, atol=F32_ATOL, equal_nan=True, msg=what)
        return
    finite = ~torch.isnan(a)
    ulps = (_ordered_bits(a) - _ordered_bits(e)).abs()[finite]
    worst = int(ulps.max()) if ulps.numel() else 0
    frac = float((ulps != 0).double().mean()) if ulps.numel() else 0.0
    assert worst <= 1, f"{what}: {a.dtype} values differ by {worst} ulps (at most 1 allowed)"
    limit = max(MAX_EDGE_FRACTION, 2.0 / a.numel())
    assert frac <= limit, (f"{what}: {frac:.4f} of the {a.dtype} elements differ by one ulp; "
                           f"rounding edges alone allow {limit:.4f}")


def assert_groups_close(actual: LaunchGroup, expected: LaunchGroup, what: str) -> None:
    names = ["params", "exp_avgs", "exp_avg_sqs"]
    if actual.p_inits is not None:
        names.append("p_inits")
    for name in names:
        for j, (a, e) in enumerate(zip(getattr(actual, name), getattr(expected, name))):
            assert_storage_close(a, e, f"{what}: {name}[{j}] shape {tuple(a.shape)}")
    for j, (a, e) in enumerate(zip(actual.steps, expected.steps)):
        assert int(a) == int(e), f"{what}: step[{j}] {int(a)} != {int(e)}"


def assert_stats_close(actual: LaunchGroup, expected: LaunchGroup, what: str) -> None:
    if actual.hyper.clip <= 0:
        return
    assert actual.stats is not None and expected.stats is not None, what
    torch.testing.assert_close(actual.stats.cpu(), expected.stats.cpu(), rtol=STATS_RTOL,
                               atol=0.0, equal_nan=True, msg=f"{what}: per-tensor S")


def assert_groups_bitwise(actual: LaunchGroup, expected: LaunchGroup, what: str) -> None:
    names = ["params", "exp_avgs", "exp_avg_sqs", "steps"]
    for name in names:
        for j, (a, e) in enumerate(zip(getattr(actual, name), getattr(expected, name))):
            assert torch.equal(bits(a.cpu()), bits(e.cpu())), f"{what}: {name}[{j}] differs"


def compare_with_reference(backend, case: Case, device, steps: Optional[int] = None,
                           data_seed: int = 0, bitwise: bool = False) -> None:
    """``steps`` steps of ``case`` on ``backend`` and on the reference, each step started from
    the same state (the backend's), compared after every step: within the spec's tolerance,
    or ``bitwise``."""
    group = make_group(case, device, data_seed=data_seed)
    ref = clone_group(group)
    reference = ReferenceBackend()
    for s in range(case.steps if steps is None else steps):
        if s:
            group.grads = new_grads(group, data_seed + 100 + s)
            ref.grads = [g.clone() for g in group.grads]
            copy_state(group, ref)
        f_a = run_step(backend, group)
        f_e = run_step(reference, ref)
        what = f"{case.id} step {s + 1}"
        assert int(f_a) == int(f_e), f"{what}: found_inf {int(f_a)} != {int(f_e)}"
        assert_stats_close(group, ref, what)
        assert_groups_close(group, ref, what)
        if bitwise:
            assert_groups_bitwise(group, ref, what)



# ------------------------------------------------------------------------------------------
# The matrix: small shapes (every backend, every device) and realistic ones (CUDA only)
# ------------------------------------------------------------------------------------------
FULL_BLOCK = ((2100,),)  # one full block of 2048 and a tail: both code paths of a pass
MID_SHAPES = tuple(ODD_SHAPES) + ((3000,), (64, 65))
CASES = [
    # AdamW-equivalent single pass
    Case(F32, F32, F32),
    Case(F32, F32, F32, shapes=FULL_BLOCK + ((3, 5, 7), (1,)), steps=3),
    # clip + skip + rel bound + maximize
    Case(F32, F32, F32, clip=1.0, bound_mode=2, nonfinite="skip", maximize=True, steps=3),
    # pass 1 without the sum (clip 0, skip) and the abs bound
    Case(F32, F32, F32, clip=0.0, bound_mode=1, nonfinite="skip"),
    Case(BF16, BF16, F32, clip=1.0, bound_mode=2, nonfinite="skip", shapes=FULL_BLOCK
         + ((7,), (131,))),
    Case(BF16, BF16, F32, clip=0.0, bound_mode=0, nonfinite="propagate"),
    Case(BF16, BF16, BF16, clip=1.0, nonfinite="skip", steps=3),
    Case(BF16, BF16, BF16, sr=False),
    Case(BF16, BF16, BF16, clip=0.5, bound_mode=1, sr=False, nonfinite="raise"),
    Case(F16, F16, F32, clip=0.5, nonfinite="raise"),
    Case(F16, F16, F32, bound_mode=2),
    Case(BF16, F32, F32, bound_mode=1, lr="tensor64"),
    Case(F32, BF16, BF16, clip=2.0, bound_mode=2, lr="tensor"),
    Case(F16, F32, BF16, clip=1.0, nonfinite="skip", maximize=True),
    # a sharded layout: global indices past 2**32 (the counter's high word) and n_global > n
    Case(BF16, BF16, BF16, clip=1.0, shapes=((131,), (1000,), (7,)),
         offsets=(5, 2 ** 32 - 3, 2 ** 33 + 1)),
    # many tensors in one group
    Case(BF16, BF16, F32, clip=1.0, nonfinite="skip",
         shapes=tuple((1 + (37 * j) % 300,) for j in range(40)), steps=2),
    Case(F32, F32, F32, shapes=tuple((j % 5, 3) for j in range(40)), steps=2),
    # three steps over a few thousand elements, the configurations of the C++ engine's tests:
    # with clip 0 every operation is a correctly rounded float32 one (bitwise the reference)
    Case(F32, F32, F32, nonfinite="propagate", shapes=MID_SHAPES, steps=3),
    Case(F32, F32, F32, clip=4.0, nonfinite="skip", shapes=MID_SHAPES, steps=3),
    Case(F32, F32, F32, clip=0.5, bound_mode=1, bound=0.01, maximize=True, nonfinite="skip",
         shapes=MID_SHAPES, steps=3),
    Case(BF16, BF16, F32, clip=1.0, bound_mode=2, bound=0.02, nonfinite="raise",
         shapes=MID_SHAPES, steps=3),
    Case(F16, F16, F32, bound_mode=2, nonfinite="skip", shapes=MID_SHAPES, steps=3),
    Case(BF16, BF16, BF16, bound_mode=2, nonfinite="skip", shapes=MID_SHAPES, steps=3),
]



GPU_SHAPES = ((4096, 1024), (1000, 1000), (50257, 64), (3, 7, 129), (1,), (0,), (2048,),
              (2047,), (2049,), (123457,))
GPU_CASES = [
    Case(F32, F32, F32, shapes=GPU_SHAPES, steps=3),
    Case(F32, F32, F32, clip=1.0, bound_mode=2, nonfinite="skip", maximize=True,
         shapes=GPU_SHAPES, steps=3),
    Case(F32, F32, F32, clip=0.0, bound_mode=1, nonfinite="skip", shapes=GPU_SHAPES),
    Case(BF16, BF16, F32, clip=1.0, bound_mode=2, nonfinite="skip", shapes=GPU_SHAPES),
    Case(BF16, BF16, F32, shapes=GPU_SHAPES, lr="tensor"),
    Case(BF16, BF16, BF16, clip=1.0, nonfinite="skip", shapes=GPU_SHAPES),
    Case(BF16, BF16, BF16, sr=False, shapes=GPU_SHAPES),
    Case(F16, F16, F32, clip=0.5, nonfinite="raise", shapes=GPU_SHAPES),
    Case(BF16, F32, F32, bound_mode=1, shapes=GPU_SHAPES, lr="tensor64"),
    Case(F32, BF16, BF16, clip=2.0, bound_mode=2, shapes=GPU_SHAPES,
         offsets=tuple((2 ** 32 - 5) * (j % 2) for j in range(len(GPU_SHAPES)))),
]


