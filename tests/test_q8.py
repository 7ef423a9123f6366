"""q8 moments (docs/tdclm.md, "Quantized moments (q8)"): the codebooks, the block layout, the
stochastic requantization, and the reference backend's step, state and state dict."""
from __future__ import annotations

import io
import math
import os
import re
import warnings

import numpy as np
import pytest
import torch

from luminamoon import LuminaMoon
from luminamoon.kernels import quant
from luminamoon.optimizer import rng
from luminamoon.optimizer._groups import Hyper, TensorRef, group_tensors

from conftest import CPU_BACKENDS, import_or_skip, require

hypothesis = import_or_skip("hypothesis")
from hypothesis import given, settings  # noqa: E402
from hypothesis import strategies as st  # noqa: E402

DOCS = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "docs",
                    "tdclm.md")


# --------------------------------------------------------------------------------------------
# codebooks
# --------------------------------------------------------------------------------------------
@pytest.mark.parametrize("name", sorted(quant.CANDIDATES))
@pytest.mark.parametrize("signed", [True, False], ids=["m", "v"])
def test_codebook_properties(name, signed):
    table = quant.codebook(signed, name)
    assert table.dtype == torch.float32 and table.shape == (256,)
    assert bool((table[1:] > table[:-1]).all()), "sorted ascending, no value twice"
    values = set(table.tolist())
    assert 0.0 in values and 1.0 in values
    assert (-1.0 in values) == signed
    assert float(table[0]) == (-1.0 if signed else 0.0) and float(table[-1]) == 1.0
    assert float(table[quant.zero_code(signed, name)]) == 0.0


@pytest.mark.parametrize("name", sorted(set(quant.CANDIDATES) - set(quant.FLOAT32_FORMULAS)))
@pytest.mark.parametrize("signed", [True, False], ids=["m", "v"])
def test_codebook_float32_is_the_nearest_to_the_real_value(name, signed):
    """Computing in float64 and rounding once gives the float32 nearest to the real value: no
    value lies within 2**-40 (relative) of a float32 rounding midpoint."""
    real = np.asarray(quant.real_values(name, signed), dtype=np.float64)
    f32 = quant.codebook(signed, name).numpy().astype(np.float64)
    for r, a in zip(real, f32):
        if r == a:
            continue
        b = float(np.nextafter(np.float32(a), np.float32(math.copysign(np.inf, r - a))))
        mid = (a + b) / 2
        assert abs(r - a) <= abs(r - b)
        assert abs(r - mid) > 2.0 ** -40 * abs(r), (r, a, b)


def test_docs_table_matches_the_chosen_codebooks():
    text = open(DOCS, encoding="utf-8").read()
    block = text.split("<!-- q8-codebook-table -->")[1].split("<!-- /q8-codebook-table -->")[0]
    rows = re.findall(r"^\| (\d+) \| (\S+) \| (\S+) \|$", block, flags=re.M)
    assert len(rows) >= 8
    m, v = quant.codebook(True), quant.codebook(False)
    for code, cm, cv in rows:
        assert np.float32(cm) == m[int(code)].item(), (code, cm)
        assert np.float32(cv) == v[int(code)].item(), (code, cv)


def test_dynamic_codebook_formula_spot_values():
    """A few entries computed by hand from the docs' formula."""
    m, v = quant.codebook(True, "dynamic"), quant.codebook(False, "dynamic")
    assert m[128].item() == np.float32(0.55e-6)  # i = 0, j = 0: 1e-6 * (0.1 + 0.45)
    assert m[254].item() == np.float32(0.1 + 0.9 * 63.5 / 64)  # i = 6, j = 63
    assert v[1].item() == np.float32(1e-6 * (0.1 + 0.9 * 0.25))  # i = 0, j = 0
    assert v[254].item() == np.float32(0.1 + 0.9 * 127.5 / 128)


# --------------------------------------------------------------------------------------------
# layout, quantize, dequantize
# --------------------------------------------------------------------------------------------
@pytest.mark.parametrize("shape,rows,scales", [
    ((5000,), (1, 5000), (20,)),
    ((64, 300), (64, 300), (64, 2)),
    ((2, 3, 32, 32), (2, 3072), (2, 12)),
    ((17, 257), (17, 257), (17, 2)),
    ((4, 1024), (4, 1024), (4, 4)),
])
def test_block_rows_and_scale_shapes(shape, rows, scales):
    assert quant.block_rows(shape) == rows
    assert quant.scale_shape(shape) == scales


@settings(max_examples=40, deadline=None)
@given(rows=st.integers(1, 5), k=st.integers(1, 700), seed=st.integers(0, 2**31 - 1))
def test_block_scales_are_the_block_max(rows, k, seed):
    gen = torch.Generator().manual_seed(seed)
    x = torch.randn(rows * k, generator=gen) * torch.rand(rows * k, generator=gen) ** 4
    scales = quant.block_scales(x, rows, k)
    assert scales.shape == (rows, -(-k // 256))
    grid = x.reshape(rows, k)
    for r in range(rows):
        for b in range(scales.shape[1]):
            assert scales[r, b].item() == grid[r, 256 * b:256 * b + 256].abs().max().item()
    per_elem = quant.expand_scales(scales, rows, k).reshape(rows, k)
    assert per_elem[:, 0].tolist() == scales[:, 0].tolist()
    assert per_elem[:, -1].tolist() == scales[:, -1].tolist()


@settings(max_examples=30, deadline=None)
@given(signed=st.booleans(), n=st.integers(1, 1200), seed=st.integers(0, 2**31 - 1))
def test_quantize_picks_a_bracketing_code(signed, n, seed):
    """Every code decodes to one of the two values that bracket x (the block's max exactly);
    the nearest code is within half the gap."""
    gen = torch.Generator().manual_seed(seed)
    x = torch.randn(n, generator=gen) * torch.exp(4 * torch.randn(n, generator=gen))
    if not signed:
        x = x * x
    scales = quant.expand_scales(quant.block_scales(x, 1, n), 1, n)
    table = quant.codebook(signed)
    words = torch.randint(0, 65536, (n,), generator=gen)
    codes = quant.quantize(x, scales, table, words, quant.zero_code(signed)).to(torch.int64)
    y32 = torch.where(x.abs() == scales, torch.sign(x), x * (1.0 / scales))  # the docs' y
    y = y32.to(torch.float64)
    t64 = table.to(torch.float64)
    lo = torch.searchsorted(table, y32, right=True) - 1
    assert bool(((codes == lo) | (codes == lo + 1)).all())
    assert bool((t64[lo] <= y).all()) and bool((y <= t64[(lo + 1).clamp(max=255)]).all())
    top = x.abs() == scales
    decoded = quant.dequantize(codes.to(torch.uint8), scales, table)
    assert torch.equal(decoded[top], x[top])
    nearest = quant.quantize_nearest(x, scales, table, quant.zero_code(signed)).to(torch.int64)
    gap = (t64[(lo + 1).clamp(max=255)] - t64[lo])
    err = (t64[nearest] - y).abs()
    assert bool((err <= gap / 2 + 1e-7).all())


def test_requantization_is_unbiased():
    """The mean over many seeds of the decoded value equals x within a bound that fails for a
    rounding that always goes down or to the nearest code."""
    n, draws = 512, 600
    gen = torch.Generator().manual_seed(7)
    for signed in (True, False):
        table = quant.codebook(signed)
        x = torch.rand(n, generator=gen) * 0.02 - (0.01 if signed else 0.0)
        x[0] = 0.02  # the block max: scale
        scales = torch.full((n,), 0.02)
        total = torch.zeros(n, dtype=torch.float64)
        for d in range(draws):
            words = rng.stream_words(rng.rounding_seed(1000 + d, d + 1, 3), 0, n,
                                     rng.STREAM_Q8_EXP_AVG, "cpu")
            codes = quant.quantize(x, scales, table, words, quant.zero_code(signed))
            total += quant.dequantize(codes, scales, table).to(torch.float64)
        mean = total / draws
        y = (x / scales)
        lo = torch.searchsorted(table, y, right=True) - 1
        gap = (table[(lo + 1).clamp(max=255)] - table[lo]).to(torch.float64) * 0.02
        # Bernoulli of variance <= gap**2 / 4: 6 standard errors, plus the 2**-17 of the rule
        bound = 6 * gap / (2 * math.sqrt(draws)) + gap * 2.0 ** -16 + 1e-12
        err = (mean - x.to(torch.float64)).abs()
        assert bool((err <= bound).all()), float((err / bound).max())
        # and not merely nearest: elements far from both codes land in between on average
        mid = ((y - table[lo]) / (table[(lo + 1).clamp(max=255)] - table[lo] + 1e-30) - 0.5).abs()
        inner = mid < 0.3
        assert inner.sum() > 50
        assert bool(((mean[inner] - quant.dequantize(
            quant.quantize_nearest(x, scales, table, 0)[inner], scales[inner], table)
            .to(torch.float64)).abs() > 0).all())


# --------------------------------------------------------------------------------------------
# the optimizer on the reference backend
# --------------------------------------------------------------------------------------------
def _params(shapes, seed=0, dtype=torch.float32):
    gen = torch.Generator().manual_seed(seed)
    return [torch.nn.Parameter(torch.randn(s, generator=gen).to(dtype)) for s in shapes]


def _grads(params, seed):
    gen = torch.Generator().manual_seed(seed)
    for p in params:
        p.grad = (torch.randn(p.shape, generator=gen) * 1e-2).to(p.dtype)


SHAPES = [(5000,), (64, 300), (2, 3, 32, 32), (17, 257), (63, 64), (10,)]


def test_state_layout_and_eligibility():
    params = _params(SHAPES)
    opt = LuminaMoon(params, state_dtype="q8", seed=3, backend="reference")
    _grads(params, 1)
    opt.step()
    for p in params:
        s = opt.state[p]
        if p.numel() >= 4096:
            assert s["exp_avg"].dtype == torch.uint8 and s["exp_avg"].shape == p.shape
            assert s["exp_avg_sq"].dtype == torch.uint8 and s["exp_avg_sq"].shape == p.shape
            for key in ("exp_avg_scale", "exp_avg_sq_scale"):
                assert s[key].dtype == torch.float32
                assert s[key].shape == quant.scale_shape(p.shape)
                assert type(s[key]) is torch.Tensor
        else:  # (63, 64) has 4032 elements: float32 moments
            assert s["exp_avg"].dtype == torch.float32 and "exp_avg_scale" not in s
    kinds = sorted(str(g.state_dtype) for g in opt._plan.groups)
    assert kinds == ["q8", "torch.float32"]


def test_eligibility_reads_the_global_numel():
    hyper = Hyper(0.9, 0.999, 1e-8, 0.0, 0.0, 0, 1.0, False, "propagate", True)
    refs = []
    for k, n in enumerate((4095, 4096)):
        p = torch.zeros(n)
        s = torch.zeros((), dtype=torch.int64)
        if n >= 4096:
            q = {key: v for key, v in zip(("m", "ms", "v", "vs"),
                                          (torch.zeros(n, dtype=torch.uint8), torch.zeros(16),
                                           torch.zeros(n, dtype=torch.uint8), torch.zeros(16)))}
            refs.append(TensorRef(p, p, q["m"], q["v"], None, s, k, f"p{k}", q["ms"], q["vs"]))
        else:
            refs.append(TensorRef(p, p, torch.zeros(n), torch.zeros(n), None, s, k, f"p{k}"))
    groups = group_tensors(refs, hyper=hyper, state_dtype="q8", lr=1e-3, seed=0)
    assert [(g.state_dtype, len(g)) for g, _ in groups] == [(torch.float32, 1), ("q8", 1)]
    assert groups[1][0].q8_rows == [(1, 4096)]


def _spec_step(p, g, m_codes, m_scales, v_codes, v_scales, t, k, seed, lr, wd, b1, b2, eps):
    """One q8 step of the spec in float64 (clip 0), the random bits from rng.random_words (one
    Philox call per element). Returns (p', m' codes, m scales, v' codes, v scales, the
    decision margins of m and v)."""
    shape = p.shape
    rows, kk = quant.block_rows(shape)
    f64 = torch.float64

    def decode(codes, scales, signed):
        table = quant.codebook(signed).to(f64)
        return quant.expand_scales(scales.to(f64), rows, kk) * table[codes.reshape(-1).long()]

    gg = g.reshape(-1).to(f64)
    m = b1 * decode(m_codes, m_scales, True) + (1 - b1) * gg
    v = b2 * decode(v_codes, v_scales, False) + (1 - b2) * gg * gg
    u = (m / (1 - b1 ** t)) / (torch.sqrt(v / (1 - b2 ** t)) + eps)
    q = p.reshape(-1).to(f64) * (1 - lr * wd) - lr * u
    out = []
    index = torch.arange(p.numel(), dtype=torch.int64)
    for x, signed, stream in ((m, True, 3), (v, False, 4)):
        table = quant.codebook(signed).to(f64)
        scales = quant.block_scales(x, rows, kk)
        y = x / quant.expand_scales(scales, rows, kk)
        y = torch.where(torch.isnan(y), torch.zeros_like(y), y)
        lo = torch.searchsorted(table, y, right=True) - 1
        hi = (lo + 1).clamp(max=255)
        frac = torch.where(hi > lo, (y - table[lo]) / (table[hi] - table[lo]), 0 * y)
        thr = (rng.random_words(seed, t, k, index, stream).to(f64) + 0.5) / 65536
        codes = lo + (thr < frac).long()
        out += [codes, scales, (thr - frac).abs()]
    return q, out


def test_step_matches_a_float64_computation_of_the_spec():
    torch.manual_seed(0)
    shape = (3, 2000)
    p = torch.nn.Parameter(torch.randn(shape))
    p0 = p.detach().clone()
    lr, wd, b1, b2, eps, seed = 1e-2, 0.1, 0.9, 0.99, 1e-8, 77
    opt = LuminaMoon([p], lr=lr, betas=(b1, b2), eps=eps, weight_decay=wd, clip=0.0,
                     nonfinite="propagate", state_dtype="q8", seed=seed, backend="reference")
    s = opt.state
    codes = (torch.full(shape, quant.zero_code(True), dtype=torch.uint8), torch.zeros(3, 8),
             torch.full(shape, 0, dtype=torch.uint8), torch.zeros(3, 8))
    for t in (1, 2, 3):
        g = torch.randn(shape) * (10.0 ** torch.randint(-4, 1, shape))
        g[1, 256:512] = 0.0 if t == 1 else g[1, 256:512]  # an all-zero block at step 1
        p.grad = g
        q, (mc, ms, mm, vc, vs, vm) = _spec_step(p0, g, *codes, t, 0, seed, lr, wd, b1, b2, eps)
        opt.step()
        st_ = s[p]
        torch.testing.assert_close(p.detach().reshape(-1).double(), q, rtol=1e-5, atol=1e-7)
        torch.testing.assert_close(st_["exp_avg_scale"].double(), ms, rtol=2e-6, atol=0)
        torch.testing.assert_close(st_["exp_avg_sq_scale"].double(), vs, rtol=2e-6, atol=0)
        for got, want, margin in ((st_["exp_avg"], mc, mm), (st_["exp_avg_sq"], vc, vm)):
            differ = got.reshape(-1).long() != want
            # codes agree except where the decision sits within float32 rounding of its edge
            assert bool((margin[differ] < 1e-5).all()), int(differ.sum())
            assert int(differ.sum()) <= 3
        if t == 1:
            assert st_["exp_avg_scale"][1, 1].item() == 0.0
            assert bool((st_["exp_avg"][1, 256:512] == quant.zero_code(True)).all())
        p0 = p.detach().clone()
        codes = tuple(st_[k].clone() for k in ("exp_avg", "exp_avg_scale", "exp_avg_sq",
                                                 "exp_avg_sq_scale"))


def _run(params, opt, seeds):
    for s in seeds:
        _grads(params, s)
        opt.step()


def test_resume_is_bitwise():
    a = _params(SHAPES, 1)
    opt_a = LuminaMoon(a, state_dtype="q8", seed=11, backend="reference")
    _run(a, opt_a, [1, 2, 3])
    buf = io.BytesIO()
    torch.save(opt_a.state_dict(), buf)
    buf.seek(0)
    b = [torch.nn.Parameter(p.detach().clone()) for p in a]
    opt_b = LuminaMoon(b, state_dtype="q8", seed=5, backend="reference")
    opt_b.load_state_dict(torch.load(buf))
    _run(a, opt_a, [4, 5])
    _run(b, opt_b, [4, 5])
    for pa, pb in zip(a, b):
        assert torch.equal(pa, pb)
        for key, value in opt_a.state[pa].items():
            assert torch.equal(value, opt_b.state[pb][key]), key


@pytest.mark.parametrize("backend", CPU_BACKENDS)
def test_functional_form_steps_q8_as_the_optimizer(backend):
    from luminamoon import q8_state, tdclm

    hyper = dict(lr=1e-2, betas=(0.9, 0.99), eps=1e-8, weight_decay=0.05, clip=1.0,
                 bound_mode="rel", bound=0.5, maximize=False, nonfinite="skip",
                 stochastic_rounding=True)
    a = _params(SHAPES, 2, torch.bfloat16)
    opt = LuminaMoon(a, state_dtype="q8", seed=9, backend=backend, **hyper)
    b = [p.detach().clone() for p in a]
    p_inits = [p.clone() for p in b]
    moments = [q8_state(p) if p.numel() >= 4096 else
               (torch.zeros_like(p, dtype=torch.float32), torch.zeros_like(p, dtype=torch.float32),
                None, None) for p in b]
    m, v, ms, vs = (list(x) for x in zip(*moments))
    steps = [torch.zeros((), dtype=torch.int64) for _ in b]
    for seed in (1, 2, 3):
        _grads(a, seed)
        opt.step()
        tdclm(b, [p.grad for p in a], m, v, p_inits, steps, exp_avg_scales=ms,
              exp_avg_sq_scales=vs, seed=9, backend=backend, **hyper)
    for i, (pa, pb) in enumerate(zip(a, b)):
        assert torch.equal(pa.detach(), pb), i
        state = opt.state[pa]
        assert torch.equal(state["exp_avg"], m[i]) and torch.equal(state["exp_avg_sq"], v[i])
        if ms[i] is not None:
            assert torch.equal(state["exp_avg_scale"], ms[i])
            assert torch.equal(state["exp_avg_sq_scale"], vs[i])
    assert m[0].dtype == torch.uint8 and m[-1].dtype == torch.float32  # (10,): below the rule


def test_functional_form_refuses_q8_state_it_cannot_read():
    from luminamoon import q8_state, tdclm

    hyper = dict(lr=1e-2, betas=(0.9, 0.99), eps=1e-8, weight_decay=0.0, clip=1.0,
                 bound_mode="none", bound=0.0, maximize=False, nonfinite="skip",
                 stochastic_rounding=True, seed=1)
    p, g = torch.zeros(64, 64), torch.ones(64, 64)
    m, v, ms, vs = q8_state(p)
    step = torch.zeros((), dtype=torch.int64)
    with pytest.raises(ValueError, match="no scales were given"):
        tdclm([p], [g], [m], [v], None, [step], **hyper)
    with pytest.raises(ValueError, match="exp_avg_sq_scales has none"):
        tdclm([p], [g], [m], [v], None, [step], exp_avg_scales=[ms], **hyper)
    with pytest.raises(ValueError, match="exp_avg_scale.*must be torch.float32 of shape"):
        tdclm([p], [g], [m], [v], None, [step], exp_avg_scales=[ms[:1]],
              exp_avg_sq_scales=[vs], **hyper)
    small = torch.zeros(10)
    with pytest.raises(ValueError, match="below q8's size rule"):
        q8_state(small)
    with pytest.raises(ValueError, match="below q8's size rule.*give None"):
        tdclm([small], [torch.ones(10)], [torch.zeros(10)], [torch.zeros(10)], None, [step],
              exp_avg_scales=[ms], exp_avg_sq_scales=[vs], **hyper)
    assert torch.equal(p, torch.zeros(64, 64)) and int(step) == 0  # nothing stepped
    assert torch.equal(m, q8_state(p)[0])


def test_conversion_both_ways_warns():
    a = _params(SHAPES, 2)
    opt_f = LuminaMoon(a, seed=1, backend="reference")
    _run(a, opt_f, [1, 2])
    b = [torch.nn.Parameter(p.detach().clone()) for p in a]
    opt_q = LuminaMoon(b, state_dtype="q8", seed=1, backend="reference")
    with pytest.warns(UserWarning, match=r"moments of 4 parameter\(s\) as float32.*as q8"):
        opt_q.load_state_dict(opt_f.state_dict())
    assert opt_q.param_groups[0]["state_dtype"] == "q8"
    for pa, pb in zip(a, b):
        sf, sq = opt_f.state[pa], opt_q.state[pb]
        if pa.numel() < 4096:
            assert torch.equal(sf["exp_avg"], sq["exp_avg"])
            continue
        rows, k = quant.block_rows(pa.shape)
        for key, signed in (("exp_avg", True), ("exp_avg_sq", False)):
            scales = sq[key + "_scale"]
            assert torch.equal(scales, quant.block_scales(sf[key].reshape(-1), rows, k)
                               .reshape(scales.shape))
            per = quant.expand_scales(scales, rows, k)
            decoded = quant.dequantize(sq[key], per, quant.codebook(signed))
            table = quant.codebook(signed)
            y = sf[key].reshape(-1) / per
            lo = torch.searchsorted(table, y, right=True) - 1
            gap = (table[(lo + 1).clamp(max=255)] - table[lo]) * per
            assert bool(((decoded - sf[key].reshape(-1)).abs() <= gap / 2 * (1 + 1e-6)).all())
    _run(b, opt_q, [3])  # steps from the converted state
    c = [torch.nn.Parameter(p.detach().clone()) for p in b]
    opt_back = LuminaMoon(c, seed=1, backend="reference")
    with pytest.warns(UserWarning, match=r"as q8.*as float32"):
        opt_back.load_state_dict(opt_q.state_dict())
    for pb, pc in zip(b, c):
        sq, sf = opt_q.state[pb], opt_back.state[pc]
        assert "exp_avg_scale" not in sf and sf["exp_avg"].dtype == torch.float32
        if pb.numel() >= 4096:
            rows, k = quant.block_rows(pb.shape)
            per = quant.expand_scales(sq["exp_avg_scale"], rows, k)
            assert torch.equal(sf["exp_avg"].reshape(-1),
                               quant.dequantize(sq["exp_avg"], per, quant.codebook(True)))
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # q8 into q8: no conversion, no warning
        d = [torch.nn.Parameter(p.detach().clone()) for p in b]
        LuminaMoon(d, state_dtype="q8", seed=1).load_state_dict(opt_q.state_dict())


def test_nonfinite_skip_changes_nothing_and_propagate_gives_nan_scale():
    params = _params(SHAPES[:2], 3)
    opt = LuminaMoon(params, state_dtype="q8", seed=2, backend="reference")
    _run(params, opt, [1])
    before = [(p.detach().clone(), {k: v.clone() for k, v in opt.state[p].items()})
              for p in params]
    _grads(params, 2)
    params[1].grad[5, 7] = math.nan
    opt.step()
    assert int(opt.skipped_steps) == 1
    for p, (value, state) in zip(params, before):
        assert torch.equal(p, value)
        for key, t in state.items():
            assert torch.equal(opt.state[p][key], t), key
    opt2 = LuminaMoon(params, state_dtype="q8", seed=2, nonfinite="propagate",
                      backend="reference")
    _grads(params, 3)
    params[1].grad[5, 7] = math.inf
    opt2.step()
    scales = opt2.state[params[1]]["exp_avg_scale"]
    assert math.isnan(scales[5, 0].item()) and bool(torch.isfinite(scales[4]).all())


def test_backend_choice_for_q8():
    params = _params([(64, 128), (10,)], 4)
    _grads(params, 1)
    opt = LuminaMoon(params, state_dtype="q8", seed=1, backend="auto")
    opt.step()
    by_kind = {str(g.state_dtype): b.name for g, b in zip(opt._plan.groups, opt._plan.backends)}
    # on CPU "auto" takes the cpu engine where it loads (it steps q8 groups), else the reference
    from luminamoon.optimizer.backends import _try_instance

    assert by_kind["q8"] == ("cpu" if _try_instance("cpu") is not None else "reference")
    opt = LuminaMoon(params, state_dtype="q8", seed=1, backend="triton")
    with pytest.raises((ValueError, ImportError), match=r"q8|triton"):
        opt.step()


def test_invalid_state_dtype_is_refused():
    with pytest.raises(ValueError, match=r"state_dtype.*'q8'.*'q4'"):
        LuminaMoon(_params([(3,)]), state_dtype="q4")


def test_state_bytes_per_parameter():
    """Allocator's view (untyped storages) of the q8 state of a GPT-2 and a Llama shape."""
    for shape in ((768, 2304), (2048, 5632)):
        p = torch.nn.Parameter(torch.empty(shape, dtype=torch.bfloat16))
        opt = LuminaMoon([p], state_dtype="q8", seed=0)
        opt._init_state(p, opt.param_groups[0])
        nbytes = sum(t.untyped_storage().nbytes() for t in opt.state[p].values())
        assert nbytes / p.numel() <= 2.05
        assert nbytes == 2 * p.numel() + 2 * 4 * p.numel() // 256 + 8


def test_power_codebook_formula_spot_values():
    """Entries of the chosen codebooks worked out from the docs' float32 operations, one
    product at a time (Python floats rounded to float32 after each)."""
    f = np.float32
    m, v = quant.codebook(True, "power-3-4"), quant.codebook(False, "power-3-4")
    assert m[64].item() == -0.125  # -(64/128)**3, exact
    assert m[127].item() == -(2.0 ** -21)  # -(1/128)**3, exact
    assert m[128].item() == 0.0 and m[0].item() == -1.0 and m[255].item() == 1.0
    t = f(f(1) / f(127))
    assert m[129].item() == f(f(t * t) * t)
    t = f(f(200) * f(f(1) / f(255)))
    assert v[200].item() == f(f(t * t) * f(t * t))
    assert v[255].item() == 1.0 and v[0].item() == 0.0


@pytest.mark.parametrize("signed", [True, False], ids=["m", "v"])
def test_float32_formula_codebooks_are_near_the_real_formulas(signed):
    """The chosen codebooks, computed with float32 products, stay within 8 ulps of the real
    power laws they stand for (the measurement that chose them used the real values)."""
    real = np.asarray(quant.real_values("power-3-4", signed), dtype=np.float64)
    got = quant.codebook(signed, "power-3-4").numpy()
    want = real.astype(np.float32)
    ulps = np.abs(got.view(np.int32).astype(np.int64) - want.view(np.int32).astype(np.int64))
    assert int(ulps.max()) <= 8
    assert int((ulps > 0).sum()) > 0  # (the formulas are not the nearest values everywhere)
