"""q8 moments (state_dtype "q8") in the Triton kernels against the reference backend, on CPU
tensors in Triton's interpreter (as tests/test_triton_kernels.py runs its kernels: on its own
the file switches the interpreter on; in a session that also holds compiled-Triton tests its
tests run in a child process).

The codebook helpers (kernels/quant_tl.py) against kernels/quant.py bit for bit, then whole
steps of the triton backend against the reference: scales equal within float32 rounding of
m'/v', codes equal except where the stochastic decision sits within float32 rounding of its
edge, parameters within the float rounding the other backend tests allow; run to run bitwise;
a skipped step changes nothing. Sizes are small: the interpreter runs one program at a time.
"""
import os
import subprocess
import sys


def _only_this_file_requested() -> bool:
    paths = [a.split("::")[0] for a in sys.argv[1:] if not a.startswith("-")
             and (a.split("::")[0].endswith(".py") or os.path.isdir(a))]
    here = os.path.abspath(__file__)
    return bool(paths) and all(os.path.abspath(p) == here for p in paths)


if "triton" not in sys.modules and _only_this_file_requested():
    os.environ.setdefault("TRITON_INTERPRET", "1")

import dataclasses  # noqa: E402

import numpy as np  # noqa: E402
import pytest  # noqa: E402
import torch  # noqa: E402

from conftest import bits, has, needs, require, requires_triton  # noqa: E402
from cases import BF16, F32, Case, assert_storage_close  # noqa: E402
from luminamoon.kernels import quant  # noqa: E402
from luminamoon.optimizer import rng  # noqa: E402
from luminamoon.optimizer._groups import LaunchGroup  # noqa: E402

IN_PROCESS = has("interpreted triton")
in_process = needs("interpreted triton")

if IN_PROCESS:
    import triton
    import triton.language as tl

    from luminamoon.kernels import quant_tl
    from luminamoon.optimizer.backends._tables import _programs, build_table
    from luminamoon.optimizer.backends.reference import ReferenceBackend, _TensorStep
    from luminamoon.optimizer.backends.triton import TritonBackend

pytestmark = [pytest.mark.triton, requires_triton]


def test_interpreted_suite_in_child_process():
    require("no interpreted triton")
    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    env = dict(os.environ, TRITON_INTERPRET="1")
    env["PYTHONPATH"] = os.pathsep.join(
        [os.path.join(root, "python")] + ([env["PYTHONPATH"]] if env.get("PYTHONPATH") else []))
    proc = subprocess.run(
        [sys.executable, "-m", "pytest", "-q", "-x", "-p", "no:cacheprovider",
         os.path.abspath(__file__)],
        cwd=root, env=env, capture_output=True, text=True, timeout=1800)
    assert proc.returncode == 0, ("interpreted q8 kernel tests failed in the child process:\n"
                                  + proc.stdout[-8000:] + proc.stderr[-4000:])


# ------------------------------------------------------------------------------------------
# The codebook helpers, bit for bit
# ------------------------------------------------------------------------------------------
if IN_PROCESS:

    @triton.jit
    def _values_kernel(codes_ptr, m_ptr, v_ptr, N: tl.constexpr):
        i = tl.arange(0, N)
        c = tl.load(codes_ptr + i)
        tl.store(m_ptr + i, quant_tl._cm(c))
        tl.store(v_ptr + i, quant_tl._cv(c))

    @triton.jit
    def _codes_kernel(y_ptr, w_ptr, out_ptr, SIGNED: tl.constexpr, N: tl.constexpr):
        i = tl.arange(0, N)
        y = tl.load(y_ptr + i)
        w = tl.load(w_ptr + i)
        if SIGNED:
            tl.store(out_ptr + i, quant_tl._code_m(y, w))
        else:
            tl.store(out_ptr + i, quant_tl._code_v(y, w))


def test_reciprocal_constants_are_the_float32_quotients():
    """fl(1/127) and fl(1/255) as the contract writes them (0x3C010204, 0x3B808081)."""
    require("interpreted triton")
    f = np.float32
    for value, quotient, hexbits in ((quant_tl._INV127, f(1) / f(127), 0x3C010204),
                                     (quant_tl._INV255, f(1) / f(255), 0x3B808081)):
        x = np.float32(float(getattr(value, "value", value)))
        assert x == quotient and int(x.view(np.uint32)) == hexbits


@in_process
def test_codebook_values_bitwise():
    codes = torch.arange(256, dtype=torch.int32)
    m = torch.empty(256, dtype=torch.float32)
    v = torch.empty(256, dtype=torch.float32)
    _values_kernel[(1,)](codes, m, v, N=256)
    assert torch.equal(bits(m), bits(quant.codebook(True)))
    assert torch.equal(bits(v), bits(quant.codebook(False)))


def _bracket_inputs(signed: bool) -> torch.Tensor:
    """Every codebook value, its float32 neighbours, the midpoints and random values in the
    codebook's range (signed: [-1, 1], else [0, 1]), as a multiple of 1024."""
    table = quant.codebook(signed)
    up = torch.nextafter(table, torch.tensor(2.0))
    down = torch.nextafter(table, torch.tensor(-2.0))
    mids = (table[1:] + table[:-1]) * 0.5
    gen = torch.Generator().manual_seed(3 if signed else 4)
    rand = torch.rand(2048, generator=gen)
    rand = rand * 2 - 1 if signed else rand
    small = torch.logspace(-38, 0, 500, dtype=torch.float64).float()
    small = torch.cat([small, -small]) if signed else small
    y = torch.cat([table, up, down, mids, rand, small, torch.tensor([0.0, 1.0, -1.0])])
    y = y[(y >= (-1.0 if signed else 0.0)) & (y <= 1.0)]
    pad = -y.numel() % 1024
    return torch.cat([y, torch.zeros(pad)])


@in_process
@pytest.mark.parametrize("signed", [True, False], ids=["m", "v"])
def test_bracket_and_decision_match_quant(signed):
    """_code_m/_code_v: the largest code with C[lo] <= y and the stochastic decision, as
    quant.quantize gives them (scale 1: y = x), for words 0, 65535 and random ones."""
    y = _bracket_inputs(signed)
    n = y.numel()
    gen = torch.Generator().manual_seed(5)
    table = quant.codebook(signed)
    zero = quant.zero_code(signed)
    for words in (torch.zeros(n, dtype=torch.int32), torch.full((n,), 65535, dtype=torch.int32),
                  torch.randint(0, 65536, (n,), generator=gen, dtype=torch.int32)):
        out = torch.empty(n, dtype=torch.int32)
        for s in range(0, n, 1024):
            _codes_kernel[(1,)](y[s:s + 1024], words[s:s + 1024], out[s:s + 1024],
                                SIGNED=int(signed), N=1024)
        want = quant.quantize(y, torch.ones(n), table, words.to(torch.int64), zero)
        assert torch.equal(out.to(torch.uint8), want), int((out.to(torch.uint8) != want).sum())


# ------------------------------------------------------------------------------------------
# Whole steps against the reference backend
# ------------------------------------------------------------------------------------------
SEED = 0x51D_2026


def _q8_group(shapes, param_dtype, grad_dtype, hyper, data_seed=0, start_step=2):
    """A launch group of q8 tensors (codes from random moments, rounded to nearest)."""
    gen = torch.Generator().manual_seed(data_seed)
    params, ms, vs, sms, svs, rows, p0s = [], [], [], [], [], [], []
    for shape in shapes:
        r, k = quant.block_rows(shape)
        n = r * k
        p = torch.randn(shape, generator=gen)
        params.append(p.to(param_dtype))
        p0s.append((p + 0.03 * torch.randn(shape, generator=gen)).to(param_dtype))
        for signed, codes, scales in ((True, ms, sms), (False, vs, svs)):
            x = torch.randn(n, generator=gen) * 0.1
            x = x if signed else x * x
            x *= 10.0 ** torch.randint(-3, 1, (n,), generator=gen)
            if len(shapes) > 1 and shape is shapes[1]:
                x[:min(256, k)] = 0.0  # an all-zero block
            sc = quant.block_scales(x, r, k)
            codes.append(quant.quantize_nearest(x, quant.expand_scales(sc, r, k),
                                                quant.codebook(signed),
                                                quant.zero_code(signed)).reshape(shape))
            scales.append(sc.reshape(quant.scale_shape(shape)).contiguous())
        rows.append((r, k))
    n = len(shapes)
    group = LaunchGroup(
        device=torch.device("cpu"), param_dtype=param_dtype, grad_dtype=grad_dtype,
        state_dtype=quant.Q8, hyper=hyper, lr=1e-2, seed=SEED, params=params, grads=[],
        exp_avgs=ms, exp_avg_sqs=vs, p_inits=p0s if hyper.bound_mode else None,
        steps=[torch.tensor(start_step, dtype=torch.int64) for _ in range(n)],
        param_indices=[2 * j + 1 for j in range(n)], elem_offsets=[0] * n,
        global_numels=[int(np.prod(s)) for s in shapes], exp_avg_scales=sms,
        exp_avg_sq_scales=svs, q8_rows=rows)
    group.grads = _grads(group, data_seed + 1)
    return group


def _grads(group, seed, nonfinite_at=None):
    gen = torch.Generator().manual_seed(seed)
    out = []
    for p in group.params:
        g = torch.randn(p.shape, generator=gen) * 10.0 ** torch.randint(-3, 1, p.shape,
                                                                          generator=gen)
        out.append(g.to(group.grad_dtype))
    if len(out) > 1:
        out[1].view(-1)[:min(256, group.q8_rows[1][1])] = 0.0  # keeps the zero block zero
    if nonfinite_at is not None:
        j, i = nonfinite_at
        out[j].view(-1)[i] = float("nan")
    return out


def _clone(group):
    def c(lst):
        return None if lst is None else [t.clone() for t in lst]
    return dataclasses.replace(
        group, params=c(group.params), grads=c(group.grads), exp_avgs=c(group.exp_avgs),
        exp_avg_sqs=c(group.exp_avg_sqs), p_inits=c(group.p_inits), steps=c(group.steps),
        exp_avg_scales=c(group.exp_avg_scales), exp_avg_sq_scales=c(group.exp_avg_sq_scales),
        stats=None, cache={})


_STATE = ("params", "exp_avgs", "exp_avg_sqs", "exp_avg_scales", "exp_avg_sq_scales", "steps")


def _copy(src, dst):
    for name in _STATE + ("grads",):
        for a, b in zip(getattr(src, name), getattr(dst, name)):
            b.copy_(a)


def _step(backend, group):
    found_inf = torch.zeros((), dtype=torch.int32)
    group.stats = None
    if group.hyper.needs_pass1:
        backend.pass1(group, found_inf)
    backend.pass2(group, found_inf)
    backend.commit(group, found_inf)
    return int(found_inf)


def _margins(group, j, signed):
    """|T - frac| of every element of tensor j's next store (the decision's distance from its
    edge, as tests/test_q8.py computes it), from the reference's float32 m' or v'."""
    ts = _TensorStep(group, j)
    m_new, v_new, _ = ts.moments_and_direction()
    x = (m_new if signed else v_new).double()
    rows, k = group.q8_rows[j]
    table = quant.codebook(signed).double()
    scales = quant.expand_scales(quant.block_scales(x, rows, k), rows, k)
    y = torch.nan_to_num(x / scales, nan=0.0)
    lo = (torch.searchsorted(table, y, right=True) - 1).clamp(0, 255)
    hi = (lo + 1).clamp(max=255)
    frac = torch.where(hi > lo, (y - table[lo]) / (table[hi] - table[lo]), 0 * y)
    stream = rng.STREAM_Q8_EXP_AVG if signed else rng.STREAM_Q8_EXP_AVG_SQ
    index = torch.arange(x.numel(), dtype=torch.int64)
    words = rng.random_words(group.seed, group.steps[j] + 1, group.param_indices[j], index,
                             stream)
    return ((words.double() + 0.5) / 65536 - frac).abs()


def _assert_matches_reference(got, want, margins, what):
    for j in range(len(want.params)):
        assert_storage_close(got.params[j], want.params[j], f"{what}: param {j}")
        for name, signed in (("exp_avg", True), ("exp_avg_sq", False)):
            gs, ws = getattr(got, name + "_scales")[j], getattr(want, name + "_scales")[j]
            assert torch.equal(torch.isnan(gs), torch.isnan(ws)), f"{what}: {name} scale NaNs"
            torch.testing.assert_close(gs, ws, rtol=2.0 ** -22, atol=0.0, equal_nan=True,
                                       msg=f"{what}: {name} scales of tensor {j}")
            gc = getattr(got, name + "s")[j].reshape(-1)
            wc = getattr(want, name + "s")[j].reshape(-1)
            differ = gc != wc
            assert bool((margins[j][signed][differ] < 1e-5).all()), (
                f"{what}: {name} codes of tensor {j} differ at {int(differ.sum())} elements, "
                f"not all at a decision edge")
        assert int(got.steps[j]) == int(want.steps[j]), what


Q8_SHAPES = {
    "rows256": ((8, 512),),
    "short-last-block": ((16, 300),),
    "1d": ((5000,),),
    "rows-under-256": ((64, 100),),
    "rows-odd": ((45, 101),),
    "several": ((8, 512), (20, 260), (4100,)),
}


# every shape with fp32 and bf16 parameters; bf16 parameters with fp32 gradients (only the
# gradient's load differs) on the several-tensor group
Q8_STEP_CASES = [pytest.param(shapes, p, g, id=f"{name}-{dt}")
                 for name, shapes in Q8_SHAPES.items()
                 for p, g, dt in ((F32, F32, "fp32"), (BF16, BF16, "bf16"), (BF16, F32, "bf16-fp32g"))
                 if dt != "bf16-fp32g" or name == "several"]


@in_process
@pytest.mark.parametrize("clip", [0.0, 1.0], ids=["adamw", "clip"])
@pytest.mark.parametrize("shapes,param_dtype,grad_dtype", Q8_STEP_CASES)
def test_triton_q8_step_matches_reference(shapes, param_dtype, grad_dtype, clip):
    hyper = Case(param_dtype, grad_dtype, F32, clip=clip, nonfinite="propagate").hyper()
    ref = _q8_group(shapes, param_dtype, grad_dtype, hyper)
    tri = _clone(ref)
    for step in range(2):
        margins = [(_margins(ref, j, True), _margins(ref, j, False))
                   for j in range(len(ref.params))]
        _step(ReferenceBackend(), ref)
        _step(TritonBackend(), tri)
        _assert_matches_reference(tri, ref, margins, f"step {step}")
        # the next step from the same state (a code at an edge may differ)
        ref.grads = _grads(ref, 10 + step)
        _copy(ref, tri)


@in_process
@pytest.mark.parametrize("bound_mode", [1, 2], ids=["abs", "rel"])
def test_triton_q8_bounded_matches_reference(bound_mode):
    hyper = Case(BF16, BF16, F32, clip=1.0, bound_mode=bound_mode, nonfinite="skip").hyper()
    ref = _q8_group(Q8_SHAPES["several"], BF16, BF16, hyper)
    tri = _clone(ref)
    margins = [(_margins(ref, j, True), _margins(ref, j, False)) for j in range(3)]
    _step(ReferenceBackend(), ref)
    _step(TritonBackend(), tri)
    _assert_matches_reference(tri, ref, margins, f"bound {bound_mode}")


@in_process
@pytest.mark.parametrize("clip", [0.0, 1.0], ids=["adamw", "clip"])
def test_triton_q8_is_bitwise_run_to_run(clip):
    hyper = Case(BF16, BF16, F32, clip=clip).hyper()
    a = _q8_group(Q8_SHAPES["several"], BF16, BF16, hyper)
    b = _clone(a)
    _step(TritonBackend(), a)
    _step(TritonBackend(), b)
    for name in _STATE:
        for x, y in zip(getattr(a, name), getattr(b, name)):
            assert torch.equal(bits(x), bits(y)), name


@in_process
@pytest.mark.parametrize("clip", [0.0, 1.0], ids=["adamw", "clip"])
def test_triton_q8_skip_changes_nothing(clip):
    hyper = Case(BF16, BF16, F32, clip=clip, nonfinite="skip").hyper()
    group = _q8_group(Q8_SHAPES["several"], BF16, BF16, hyper)
    group.grads = _grads(group, 7, nonfinite_at=(2, 4099))
    before = {name: [t.clone() for t in getattr(group, name)] for name in _STATE}
    assert _step(TritonBackend(), group) == 1
    for name, tensors in before.items():
        for j, (old, new) in enumerate(zip(tensors, getattr(group, name))):
            assert torch.equal(bits(old), bits(new)), f"skipped step changed {name}[{j}]"


@in_process
@pytest.mark.parametrize("clip", [0.0, 1.0], ids=["adamw", "clip"])
def test_triton_q8_propagate_nonfinite_matches_reference(clip):
    """A NaN gradient under nonfinite="propagate": its block's scales NaN, its codes the zero
    codes, as the reference stores them."""
    hyper = Case(F32, F32, F32, clip=clip, nonfinite="propagate").hyper()
    ref = _q8_group(Q8_SHAPES["short-last-block"], F32, F32, hyper)
    ref.grads = _grads(ref, 7, nonfinite_at=(0, 310))
    tri = _clone(ref)
    margins = [(_margins(ref, 0, True), _margins(ref, 0, False))]
    _step(ReferenceBackend(), ref)
    _step(TritonBackend(), tri)
    _assert_matches_reference(tri, ref, margins, "propagate")
    assert torch.isnan(tri.exp_avg_scales[0][1, 0]) and torch.isnan(tri.exp_avg_sq_scales[0][1, 0])
    assert bool((tri.exp_avgs[0][1, :256] == quant.zero_code(True)).all())


@in_process
def test_table_counts_whole_q8_blocks():
    """build_table: cols 18-20 hold the scales' addresses and K; a q8 tensor owns
    ceil(rows * nb / 4) programs of 1024 (4 q8 blocks each)."""
    hyper = Case(F32, F32, F32).hyper()
    group = _q8_group(((64, 100), (8, 512), (5000,)), F32, F32, hyper)
    host = build_table(group, 1024)
    want = [_programs(n, k, 1024) for n, k in ((6400, 100), (4096, 512), (5000, 5000))]
    assert want == [16, 4, 5]  # 64 rows of one block; 16 blocks; 20 blocks
    assert host.nblocks == sum(want)
    assert host.table[:, 7].tolist() == [0, 16, 20]
    assert host.table[:, 20].tolist() == [100, 512, 5000]
    assert host.table[:, 18].tolist() == [s.data_ptr() for s in group.exp_avg_scales]
    assert host.table[:, 19].tolist() == [s.data_ptr() for s in group.exp_avg_sq_scales]


def test_root_estimates_stay_within_a_quarter_code():
    """The bracket estimate e = floor(z - 1/2) is lo or lo - 1 while the root is within 1/2
    code of its value: the cube root's estimate (kernels/quant_tl.py, _cbrt_estimate, here in
    numpy float32) and the fourth root's (two square roots) stay within a quarter code over
    [0, 1], leaving room for the hardware's exp2 and square root (a few ulps)."""
    require("interpreted triton")
    f = np.float32
    gen = np.random.default_rng(0)
    a = np.concatenate([gen.random(1_000_000).astype(f),
                        (10.0 ** gen.uniform(-38, 0, 1_000_000)).astype(f),
                        quant.codebook(False).numpy(), np.abs(quant.codebook(True).numpy())])
    b = np.maximum(a, f(float(quant_tl._TINY.value))).view(np.int32)
    x = ((b & 0x007FFFFF) | 0x3F800000).view(f) - f(1)
    c1, c2, c3 = (f(float(c.value)) for c in (quant_tl._L1, quant_tl._L2, quant_tl._L3))
    log2 = ((b >> 23) - 127).astype(f) + x * (c1 + x * (c2 + x * c3))
    cbrt = np.exp2(log2 * f(0.3333333432674408)).astype(np.float64)
    assert 128 * np.abs(cbrt - np.cbrt(a.astype(np.float64))).max() < 0.25
    fourth = np.sqrt(np.sqrt(a)).astype(np.float64)
    assert 255 * np.abs(fourth - a.astype(np.float64) ** 0.25).max() < 0.25
