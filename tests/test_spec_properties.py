"""Properties of TDCLM (docs/tdclm.md) that hold whatever the data: soft clip, bounds,
non-finite policies; and the reference against a float64 transcription of the spec."""
from __future__ import annotations

import math

import numpy as np
import pytest
import torch

from conftest import assert_bitwise_equal, dtype_id
from luminamoon import LuminaMoon

F32 = np.float32


def _f32(x):
    return float(F32(x))


def spec_step_f64(p, g, m, v, p0, t, *, lr, betas, eps, wd, clip, bound_mode, bound, maximize):
    """One TDCLM step in float64 from the spec's formulas (hyperparameters as float32)."""
    b1, b2, eps, lr, wd, clip, bound = map(_f32, (betas[0], betas[1], eps, lr, wd, clip, bound))
    p, g, m, v = (x.double() for x in (p, g, m, v))
    s = -1.0 if maximize else 1.0
    bc1 = 1 - b1 ** t
    bc2 = 1 - b2 ** t
    gs = s * g
    m2 = b1 * m + (1 - b1) * gs
    v2 = b2 * v + (1 - b2) * gs * gs
    u = (m2 / bc1) / (torch.sqrt(v2 / bc2) + eps)
    if clip > 0:
        tau = clip * math.sqrt((u * u).sum().item() / max(u.numel(), 1))
        u = tau * torch.tanh(u / tau) if tau > 0 else torch.zeros_like(u)
    q = p * (1 - lr * wd) - lr * u
    if bound_mode != "none":
        p0 = p0.double()
        r = torch.full_like(p0, bound) if bound_mode == "abs" else bound * torch.sqrt(p0 * p0 + _f32(1e-4))
        q = torch.minimum(torch.maximum(q, p0 - r), p0 + r)
    return q, m2, v2, u


SPEC_CASES = [
    ("clip", dict(clip=1.0, bound_mode="none")),
    ("clip-tight", dict(clip=0.3, bound_mode="none", weight_decay=0.1)),
    ("abs", dict(clip=2.0, bound_mode="abs", bound=0.05)),
    ("rel", dict(clip=0.0, bound_mode="rel", bound=0.02, maximize=True)),
]


@pytest.mark.parametrize("shape", [(6, 42), (431,), (1,)], ids=["6x42", "431", "1"])
@pytest.mark.parametrize("case", SPEC_CASES, ids=[c[0] for c in SPEC_CASES])
def test_reference_matches_float64_spec(case, shape):
    """Each step of the reference (float32) matches the spec evaluated in float64, from the
    same state, to float32 rounding of the update."""
    _, kw = case
    hyper = dict(lr=5e-2, betas=(0.9, 0.99), eps=1e-8, weight_decay=0.01, maximize=False,
                 bound=1.0)
    hyper.update(kw)
    gen = torch.Generator().manual_seed(4)
    p = torch.nn.Parameter(torch.randn(shape, generator=gen))
    opt = LuminaMoon([p], backend="reference", nonfinite="skip", seed=0,
                     **hyper)
    p0 = p.detach().clone()
    for t in range(1, 8):
        g = torch.randn(shape, generator=gen) * (1 + 10 * (torch.rand(shape, generator=gen) < 0.05))
        p.grad = g
        before = p.detach().clone()
        st = opt.state[p]
        m = st["exp_avg"].clone() if st else torch.zeros(shape)
        v = st["exp_avg_sq"].clone() if st else torch.zeros(shape)
        q64, m64, v64, _ = spec_step_f64(
            before, g, m, v, p0, t, lr=hyper["lr"], betas=hyper["betas"], eps=hyper["eps"],
            wd=hyper["weight_decay"], clip=hyper["clip"], bound_mode=hyper["bound_mode"],
            bound=hyper["bound"], maximize=hyper["maximize"])
        opt.step()
        # The update lr*u is about 5e-2; float32 rounding of p (|p| < 5) is below 5e-7.
        upd_err = (p.detach().double() - q64).abs().max().item()
        assert upd_err <= 1e-6 * max(1.0, before.abs().max().item()), (t, upd_err)
        # Moments: three float32 roundings of the terms beta*m and (1-beta)*g (which may cancel).
        b1, b2 = _f32(hyper["betas"][0]), _f32(hyper["betas"][1])
        m_terms = b1 * m.double().abs() + (1 - b1) * g.double().abs()
        v_terms = b2 * v.double() + (1 - b2) * g.double() ** 2
        assert bool(((st["exp_avg"].double() - m64).abs() <= 3 * 2**-24 * m_terms).all())
        assert bool(((st["exp_avg_sq"].double() - v64).abs() <= 3 * 2**-24 * v_terms).all())


def test_soft_clip_never_exceeds_tau():
    """With wd = 0, |p_new - p| = lr * |u_hat| <= lr * tau per element, tau from the float64
    spec; and clipping does cut the outliers (a run without clip moves them further)."""
    shape = (2000,)
    gen = torch.Generator().manual_seed(8)
    clip, lr = 0.5, 1e-2
    p = torch.nn.Parameter(torch.randn(shape, generator=gen))
    q = torch.nn.Parameter(p.detach().clone())
    opt = LuminaMoon([p], lr=lr, weight_decay=0.0, clip=clip, backend="reference", seed=1)
    noclip = LuminaMoon([q], lr=lr, weight_decay=0.0, clip=0.0, backend="reference", seed=1)
    for t in range(1, 6):
        g = torch.randn(shape, generator=gen)
        g[::97] *= 1e3  # outliers: their u stands far above the RMS
        p.grad, q.grad = g.clone(), g.clone()
        st = opt.state[p]
        m = st["exp_avg"].clone() if st else torch.zeros(shape)
        v = st["exp_avg_sq"].clone() if st else torch.zeros(shape)
        _, _, _, u_unclipped = spec_step_f64(p.detach(), g, m, v, None, t, lr=lr, betas=(0.9, 0.999),
                                             eps=1e-8, wd=0.0, clip=0.0, bound_mode="none",
                                             bound=1.0, maximize=False)
        tau = _f32(clip) * math.sqrt((u_unclipped ** 2).mean().item())
        before = p.detach().double()
        opt.step()
        step = (p.detach().double() - before).abs()
        # Slack: float32 rounding of p (|p| < 6: 2**-21) and of tau (relative 1e-6).
        assert step.max().item() <= _f32(lr) * tau * (1 + 1e-6) + 2**-21
        if t == 1:
            q_before = q.detach().double()
        noclip.step()
        if t == 1:
            free = (q.detach().double() - q_before).abs()
            assert free.max().item() > 1.5 * step.max().item()


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=dtype_id)
@pytest.mark.parametrize("mode,bound", [("abs", 0.01), ("rel", 0.02)])
def test_bounds_hold(mode, bound, dtype):
    """|p - p0| <= r_i after many large steps; float32 exactly (up to the float32 rounding of
    p0 +- r), bf16 up to one bf16 ulp of p (stochastic rounding may land past the edge)."""
    gen = torch.Generator().manual_seed(3)
    p = torch.nn.Parameter(torch.randn(500, generator=gen).to(dtype))
    p0 = p.detach().double().clone()
    opt = LuminaMoon([p], lr=0.1, clip=0.0, bound_mode=mode, bound=bound, backend="reference")
    for _ in range(20):
        p.grad = torch.randn(500, generator=gen).to(dtype)
        opt.step()
    r = torch.full_like(p0, _f32(bound)) if mode == "abs" else _f32(bound) * torch.sqrt(p0 * p0 + _f32(1e-4))
    dist = (p.detach().double() - p0).abs()
    # One ulp of the stored value (|p| <= |p0| + r; an ulp at x is at most 2 * |x| * 2**-mant).
    ulp = (p0.abs() + r) * (2.0 ** -22 if dtype == torch.float32 else 2.0 ** -6) + 1e-30
    assert bool((dist <= r + ulp).all())
    # The bound is active: many elements sit on it (an lr of 0.1 moves them further).
    assert int((dist >= r * 0.99).sum()) > 100
    assert torch.equal(opt.state[p]["p_init"].double(), p0)


def _make_opt(dtype, nonfinite, bound_mode="rel", state_dtype=torch.float32, seed=0):
    gen = torch.Generator().manual_seed(seed)
    a = torch.nn.Parameter(torch.randn(40, 3, generator=gen).to(dtype))
    b = torch.nn.Parameter(torch.randn(17, generator=gen).to(dtype))
    c = torch.nn.Parameter(torch.randn(5, generator=gen))
    opt = LuminaMoon([{"params": [a, b]}, {"params": [c], "clip": 0.0}], lr=1e-2,
                     nonfinite=nonfinite, bound_mode=bound_mode, bound=0.5,
                     state_dtype=state_dtype, backend="reference", seed=seed)
    return opt, [a, b, c], gen


def _snapshot(opt, params):
    snap = [p.detach().clone() for p in params]
    for p in params:
        for key in ("exp_avg", "exp_avg_sq", "p_init", "step"):
            if key in opt.state[p]:
                snap.append(opt.state[p][key].clone())
    return snap


def _grads(params, gen, bad=None):
    for i, p in enumerate(params):
        g = torch.randn(p.shape, generator=gen).to(p.dtype)
        if bad is not None and i == bad[0]:
            g.view(-1)[bad[1]] = bad[2]
        p.grad = g


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=dtype_id)
@pytest.mark.parametrize("bad", [(0, 7, float("nan")), (2, 0, float("inf")), (1, 3, float("-inf"))],
                         ids=["nan-in-group0", "inf-in-group1", "neginf"])
def test_skip_changes_nothing_and_counts(dtype, bad):
    opt, params, gen = _make_opt(dtype, "skip", state_dtype=torch.bfloat16 if dtype == torch.bfloat16 else torch.float32)
    for _ in range(2):
        _grads(params, gen)
        opt.step()
    before = _snapshot(opt, params)
    _grads(params, gen, bad=bad)
    opt.step()
    after = _snapshot(opt, params)
    for i, (x, y) in enumerate(zip(before, after)):
        assert_bitwise_equal(x, y, f"item {i}")
    assert int(opt.skipped_steps) == 1
    _grads(params, gen)
    opt.step()  # a good step applies again, as step 3
    assert int(opt.skipped_steps) == 1
    assert all(int(opt.state[p]["step"]) == 3 for p in params)
    assert not torch.equal(params[0].detach(), before[0])


def test_skip_on_the_first_step_leaves_p_init_and_counters():
    opt, params, gen = _make_opt(torch.float32, "skip")
    before = [p.detach().clone() for p in params]
    _grads(params, gen, bad=(1, 0, float("nan")))
    opt.step()
    for p, b in zip(params, before):
        assert torch.equal(p.detach(), b)
        assert int(opt.state[p]["step"]) == 0
        assert torch.equal(opt.state[p]["p_init"], b)
        assert not bool(opt.state[p]["exp_avg"].any())
    assert int(opt.skipped_steps) == 1


def test_raise_names_the_parameter_and_changes_nothing():
    opt, params, gen = _make_opt(torch.float32, "raise")
    _grads(params, gen)
    opt.step()
    before = _snapshot(opt, params)
    _grads(params, gen, bad=(2, 1, float("nan")))
    with pytest.raises(FloatingPointError, match=r"parameter 2 \(param group 1, index 0\).*nonfinite='skip'"):
        opt.step()
    for x, y in zip(before, _snapshot(opt, params)):
        assert_bitwise_equal(x, y)
    # The first offending parameter in optimizer order is named.
    _grads(params, gen, bad=(1, 1, float("inf")))
    params[2].grad[0] = float("nan")
    with pytest.raises(FloatingPointError, match=r"parameter 1 \(param group 0, index 1\)"):
        opt.step()


def test_propagate_behaves_like_adamw():
    p = torch.nn.Parameter(torch.ones(4))
    ref = torch.nn.Parameter(torch.ones(4))
    opt = LuminaMoon([p], nonfinite="propagate", clip=0.0, backend="reference")
    adamw = torch.optim.AdamW([ref])
    for x in (p, ref):
        x.grad = torch.tensor([1.0, float("nan"), 2.0, float("inf")])
    opt.step()
    adamw.step()
    assert torch.equal(torch.isnan(p.detach()), torch.isnan(ref.detach()))
    assert int(opt.skipped_steps) == 0 and int(opt.state[p]["step"]) == 1


def test_maximize_equals_minimizing_the_negated_gradient():
    gen = torch.Generator().manual_seed(6)
    init = torch.randn(300, generator=gen).to(torch.bfloat16)
    a, b = torch.nn.Parameter(init.clone()), torch.nn.Parameter(init.clone())
    oa = LuminaMoon([a], maximize=True, bound_mode="abs", bound=0.1, seed=3, backend="reference")
    ob = LuminaMoon([b], maximize=False, bound_mode="abs", bound=0.1, seed=3, backend="reference")
    for _ in range(4):
        g = torch.randn(300, generator=gen).to(torch.bfloat16)
        a.grad, b.grad = g, -g
        oa.step()
        ob.step()
    assert_bitwise_equal(a.detach(), b.detach())


def test_same_inputs_same_bits():
    """The reference is deterministic run to run (S included)."""
    outs = []
    for _ in range(2):
        opt, params, gen = _make_opt(torch.bfloat16, "skip", seed=9)
        for _ in range(3):
            _grads(params, gen)
            opt.step()
        outs.append(_snapshot(opt, params))
    for x, y in zip(*outs):
        assert_bitwise_equal(x, y)


def test_nonfinite_in_a_propagate_group_does_not_skip_other_groups():
    """The skip decision is made from the groups with nonfinite='skip'."""
    a = torch.nn.Parameter(torch.ones(3))
    b = torch.nn.Parameter(torch.ones(3))
    opt = LuminaMoon([{"params": [a]}, {"params": [b], "nonfinite": "propagate"}],
                     clip=1.0, backend="reference")
    a.grad = torch.ones(3)
    b.grad = torch.tensor([1.0, float("nan"), 1.0])
    opt.step()
    assert int(opt.skipped_steps) == 0
    assert bool((a.detach() < 1).all())
    assert bool(torch.isnan(b.detach()).any())
