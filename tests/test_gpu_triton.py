"""Triton backend on a CUDA GPU, against the reference backend at realistic sizes.

Marker ``gpu``: every test here is skipped without CUDA (and without Triton). The first part
of the file holds the case builders and comparisons that the CPU tests
(tests/test_triton_kernels.py, under TRITON_INTERPRET=1) and benchmarks/bench_step.py share;
it imports neither triton nor the kernels, so importing it never decides how Triton runs.
"""
from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass
from typing import List, Optional, Tuple

import pytest
import torch

from conftest import ODD_SHAPES, bits, requires_triton

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
    def id(self) -> str:
        parts = [f"p{DT[self.param_dtype]}-g{DT[self.grad_dtype]}-s{DT[self.state_dtype]}",
                 f"clip{self.clip:g}", BOUND_NAMES[self.bound_mode], self.nonfinite,
                 "sr" if self.sr else "rne"]
        if self.maximize:
            parts.append("max")
        if len(self.shapes) != len(ODD_SHAPES):
            parts.append(f"n{len(self.shapes)}")
        if not isinstance(self.lr, float):
            parts.append(f"lr-{self.lr}")
        if self.offsets:
            parts.append("sharded")
        return "-".join(parts)

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


def compare_with_reference(backend, case: Case, device, steps: Optional[int] = None,
                           data_seed: int = 0) -> None:
    """``steps`` steps of ``case`` on ``backend`` and on the reference, each step started from
    the same state (the backend's), compared after every step."""
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


# ------------------------------------------------------------------------------------------
# GPU tests
# ------------------------------------------------------------------------------------------

_HAS_CUDA = torch.cuda.is_available()
pytestmark = [
    pytest.mark.gpu,
    requires_triton,
    pytest.mark.skipif(not _HAS_CUDA, reason="needs a CUDA GPU"),
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


def _backend():
    from luminamoon.optimizer.backends.triton import TritonBackend

    return TritonBackend()


@pytest.mark.parametrize("case", GPU_CASES, ids=lambda c: c.id)
def test_matches_reference(case):
    compare_with_reference(_backend(), case, "cuda")


@pytest.mark.parametrize("case", [GPU_CASES[1], GPU_CASES[5]], ids=lambda c: c.id)
def test_bitwise_run_to_run(case):
    backend = _backend()
    a = make_group(case, "cuda")
    b = clone_group(a)
    for s in range(3):
        if s:
            a.grads = new_grads(a, 50 + s)
            b.grads = [g.clone() for g in a.grads]
        run_step(backend, a)
        run_step(backend, b)
    for name in ("params", "exp_avgs", "exp_avg_sqs", "steps"):
        for j, (x, y) in enumerate(zip(getattr(a, name), getattr(b, name))):
            assert torch.equal(bits(x), bits(y)), f"{name}[{j}] differs between two runs"
    if a.stats is not None:
        assert torch.equal(bits(a.stats), bits(b.stats))


def test_nonfinite_skip_leaves_everything_bitwise():
    case = Case(BF16, BF16, F32, clip=1.0, bound_mode=2, nonfinite="skip", shapes=GPU_SHAPES)
    group = make_group(case, "cuda")
    backend = _backend()
    run_step(backend, group)
    for value in (float("nan"), float("inf")):
        group.grads = new_grads(group, 7, nonfinite_at=(9, 12345), value=value)
        before = snapshot(group)
        found = run_step(backend, group)
        assert int(found) == 1
        assert_unchanged(group, before, f"skip on {value}")


def test_tensor_over_2_31_elements():
    """bf16 param + grad with fp32 moments, 2**31 + 4099 elements (~26 GB): a few slices
    checked against the reference computed on those slices."""
    n = 2 ** 31 + 4099
    free, _ = torch.cuda.mem_get_info()
    if free < 30 * 2 ** 30:
        pytest.skip(f"needs ~30 GiB of free GPU memory, {free / 2 ** 30:.1f} GiB free")
    case = Case(BF16, BF16, F32, clip=1.0, nonfinite="skip", shapes=((n,),))
    dev = torch.device("cuda")
    gen = torch.Generator(device=dev).manual_seed(3)
    p = torch.randn(n, generator=gen, device=dev, dtype=torch.float32).to(BF16)
    g = torch.randn(n, generator=gen, device=dev, dtype=torch.float32).to(BF16)
    m = torch.randn(n, generator=gen, device=dev) * 0.1
    v = torch.rand(n, generator=gen, device=dev) * 0.01
    slices = [(0, 4096), (2 ** 31 - 2048, 2 ** 31 + 2048), (n - 3000, n)]
    saved = [(p[a:b].clone(), g[a:b].clone(), m[a:b].clone(), v[a:b].clone()) for a, b in slices]
    group = LaunchGroup(dev, BF16, BF16, F32, case.hyper(), 1e-2, 777, [p], [g], [m], [v], None,
                        [torch.tensor(5, dtype=torch.int64, device=dev)], [4], [0], [n])
    run_step(_backend(), group)
    # S over the whole tensor decides tau; the reference slices use the Triton S so that the
    # comparison isolates the elementwise update (S itself is checked in test_matches_reference)
    s_total = group.stats[0].clone()
    for (a, b), (p0, g0, m0, v0) in zip(slices, saved):
        ref = LaunchGroup(dev, BF16, BF16, F32, case.hyper(), 1e-2, 777, [p0], [g0], [m0], [v0],
                          None, [torch.tensor(5, dtype=torch.int64, device=dev)], [4], [a], [n])
        ref.stats = s_total.reshape(1)
        flag = torch.zeros((), dtype=torch.int32, device=dev)
        ReferenceBackend().pass2(ref, flag)
        assert_storage_close(p[a:b], ref.params[0], f"param slice {a}:{b}")
        assert_storage_close(m[a:b], ref.exp_avgs[0], f"exp_avg slice {a}:{b}")
        assert_storage_close(v[a:b], ref.exp_avg_sqs[0], f"exp_avg_sq slice {a}:{b}")


def test_current_device_differs_from_params():
    if torch.cuda.device_count() < 2:
        pytest.skip("needs 2 GPUs")
    case = Case(BF16, BF16, F32, clip=1.0, nonfinite="skip", shapes=GPU_SHAPES[:5])
    backend = _backend()
    with torch.cuda.device(0):
        compare_with_reference(backend, case, "cuda:1")
    with torch.cuda.device(1):
        compare_with_reference(backend, case, "cuda:0")
        # two groups on two GPUs stepped back to back with cuda:1 current
        g0, g1 = make_group(case, "cuda:0"), make_group(case, "cuda:1")
        r0, r1 = clone_group(g0), clone_group(g1)
        for grp in (g0, g1):
            run_step(backend, grp)
        for grp in (r0, r1):
            run_step(ReferenceBackend(), grp)
        assert_groups_close(g0, r0, "cuda:0 group")
        assert_groups_close(g1, r1, "cuda:1 group")


def test_jit_and_ahead_of_time_compile_to_the_same_code():
    """The JIT's compiled kernel (as launched) and the AOT builder's triton.compile call (every
    pointer divisible by 16, no integer specialisation) give the same PTX."""
    import triton

    from luminamoon.aot import builder, compat
    from luminamoon.kernels import launch, rounding
    from luminamoon.optimizer.backends.triton import TritonBackend

    case = Case(BF16, BF16, F32, clip=1.0, bound_mode=2, nonfinite="skip", shapes=GPU_SHAPES[:4])
    group = make_group(case, "cuda")
    run_step(TritonBackend(), group)
    st = group.cache["triton"]
    major, minor = torch.cuda.get_device_capability()
    for name, launcher in st.launchers.items():
        ck = launcher.compiled_kernel
        assert ck is not None, f"{name}: the JIT kept no compiled kernel"
        v = launcher.variant
        plan = builder.plan_kernel(v.spec)
        src = compat.make_ast_source(plan.fn, plan.source_spec(v.constexpr_dict()),
                                     compat.detect_api())
        aot = triton.compile(src, target=compat.gpu_target(major * 10 + minor),
                             options=builder.compile_options(plan, v))
        assert aot.asm["ptx"] == ck.asm["ptx"], f"{v.key()}: JIT and AOT PTX differ"


def test_direct_launch_and_jit_launch_agree_bitwise(monkeypatch):
    from luminamoon.kernels import launch, rounding
    from luminamoon.optimizer.backends.triton import TritonBackend

    case = Case(BF16, BF16, BF16, clip=1.0, bound_mode=2, nonfinite="skip", shapes=GPU_SHAPES)
    results = []
    for direct in (True, False):
        monkeypatch.setattr(launch, "_DIRECT_LAUNCH", direct and launch._direct_launch_supported())
        monkeypatch.setattr(launch, "_LAUNCHERS", {})
        group = make_group(case, "cuda")
        backend = TritonBackend()
        for s in range(3):
            if s:
                group.grads = new_grads(group, 60 + s)
            run_step(backend, group)
        launchers = group.cache["triton"].launchers.values()
        if direct and launch._direct_launch_supported():
            assert all(launcher.direct for launcher in launchers)
        if not direct:
            assert not any(launcher.direct for launcher in launchers)
        results.append(group)
    for name in ("params", "exp_avgs", "exp_avg_sqs", "steps"):
        for j, (x, y) in enumerate(zip(getattr(results[0], name), getattr(results[1], name))):
            assert torch.equal(bits(x), bits(y)), f"{name}[{j}]: direct and JIT launches differ"


def test_optimizer_commit_last_equals_commit_and_torch_ops(monkeypatch):
    """The optimizer's step ends in the commit_last kernel (step counters, skipped_steps +=
    flag, flag = 0); the same steps with that kernel refused (two torch ops after the commit
    instead) give the same bits, the same counts, and a clear flag after every step."""
    from luminamoon import LuminaMoon
    from luminamoon.kernels import launch, rounding
    from luminamoon.optimizer.backends.triton import TritonBackend

    real = TritonBackend.commit_last
    runs = []
    for use_kernel in (True, False):
        used = []

        def commit_last(self, group, found_inf, skipped, _use=use_kernel):
            used.append(real(self, group, found_inf, skipped) if _use else False)
            return used[-1]

        monkeypatch.setattr(TritonBackend, "commit_last", commit_last)
        gen = torch.Generator(device="cuda").manual_seed(8)
        params = [torch.nn.Parameter(torch.randn(s, device="cuda", generator=gen))
                  for s in ((4099,), (33, 65), (1,))]
        opt = LuminaMoon(params, lr=1e-2, clip=1.0, nonfinite="skip", seed=3, backend="triton")
        for step in range(6):
            for p in params:
                p.grad = torch.randn(p.shape, device="cuda", generator=gen)
            if step in (2, 3):
                params[step - 1].grad.view(-1)[0] = float("nan")
            opt.step()
            assert [int(f) for f in opt._flags.values()] == [0], f"flag after step {step}"
        assert used == [use_kernel] * 6
        assert int(opt.skipped_steps) == 2
        assert [int(opt.state[p]["step"]) for p in params] == [4, 4, 4]
        runs.append([p.detach().clone() for p in params])
    for j, (a, b) in enumerate(zip(*runs)):
        assert torch.equal(bits(a), bits(b)), f"param {j}: commit_last and commit differ"


def test_tensor_lr_followed_through_new_tensors_and_new_storage():
    """The launches hand over addresses, not tensors: an lr given as a new tensor every step,
    or moved to new storage in place (set_), is still the lr the kernels read: the steps equal
    those of the same lrs given as floats, bitwise."""
    from luminamoon import LuminaMoon

    lrs = [1e-2, 3e-3, 7e-3, 5e-4]
    runs = []
    for mode in ("float", "new tensor", "set_"):
        gen = torch.Generator(device="cuda").manual_seed(2)
        params = [torch.nn.Parameter(torch.randn(s, device="cuda", generator=gen))
                  for s in ((2049,), (17, 3))]
        lr_t = torch.tensor(lrs[0], device="cuda")
        opt = LuminaMoon(params, lr=lrs[0] if mode == "float" else lr_t, clip=1.0, seed=4,
                         backend="triton")
        for step, lr in enumerate(lrs):
            for p in params:
                p.grad = torch.randn(p.shape, device="cuda", generator=gen)
            if mode == "float":
                opt.param_groups[0]["lr"] = lr
            elif mode == "new tensor":
                opt.param_groups[0]["lr"] = torch.tensor(lr, device="cuda")
            else:
                lr_t.set_(torch.tensor(lr, device="cuda").untyped_storage(), 0, ())
            opt.step()
        torch.cuda.synchronize()
        runs.append([p.detach().clone() for p in params])
    for j in range(2):
        assert torch.equal(bits(runs[0][j]), bits(runs[1][j])), f"param {j}: new tensors"
        assert torch.equal(bits(runs[0][j]), bits(runs[2][j])), f"param {j}: set_"


def test_compiled_bf16_round_to_nearest_is_torchs_rounding_bitwise():
    """The compiled round-to-nearest-even (the hardware conversion) gives torch's bfloat16 bits
    for every class of float32: zeros, subnormals, ties in both directions, the largest finite
    values (rounding up to inf) and inf; NaN with any payload stays NaN."""
    import triton
    import triton.language as tl

    from luminamoon.kernels import launch, rounding
    from luminamoon.optimizer.backends.triton import TritonBackend

    @triton.jit
    def _rne_kernel(x_ptr, y_ptr, n, BLOCK: tl.constexpr):
        offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
        x = tl.load(x_ptr + offs, mask=offs < n, other=0.0)
        tl.store(y_ptr + offs, rounding._to_bf16(x, 0, 0), mask=offs < n)

    gen = torch.Generator().manual_seed(5)
    random_bits = torch.randint(-2 ** 31, 2 ** 31, (1 << 22,), generator=gen, dtype=torch.int64)
    special = []
    for sign in (0, 0x80000000):
        for exp in (0x00000000, 0x00800000, 0x3F800000, 0x7F000000, 0x7F800000):
            for low in (0, 1, 0x7FFF, 0x8000, 0x8001, 0xFFFF, 0x10000, 0x18000, 0x17FFF,
                        0x7FFFFF, 0x7F8000, 0x400000):
                special.append(sign | exp | low)
    words = torch.cat([torch.tensor(special, dtype=torch.int64), random_bits])
    words = words & 0xFFFFFFFF
    x = torch.where(words >= 2 ** 31, words - 2 ** 32, words).to(torch.int32)
    x = x.view(torch.float32).cuda()
    y = torch.empty(x.numel(), dtype=torch.bfloat16, device="cuda")
    _rne_kernel[(triton.cdiv(x.numel(), 1024),)](x, y, x.numel(), BLOCK=1024)
    # torch's rounding; a NaN's payload is not part of the contract (torch stores 0x7FFF on
    # CUDA and other patterns on CPUs): NaN in, some NaN out
    expected = x.cpu().to(torch.bfloat16).cuda()
    nan = torch.isnan(x)
    assert int(nan.sum()) > 1000 and bool(torch.isnan(y[nan]).all()), "a NaN did not stay NaN"
    x, y, expected = x[~nan], y[~nan], expected[~nan]
    diff = (bits(y) != bits(expected)).nonzero()
    assert diff.numel() == 0, (
        f"{diff.numel()} values round differently, first input bits "
        f"{int(x.view(torch.int32)[diff[0]]) & 0xFFFFFFFF:#010x}: "
        f"{int(bits(y)[diff[0]]):#06x} vs torch {int(bits(expected)[diff[0]]):#06x}")
