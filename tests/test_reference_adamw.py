"""With clip=0, bound "none" and nonfinite "propagate", TDCLM is AdamW (docs/tdclm.md).

The reference backend must match torch.optim.AdamW over 20 steps to float32 rounding.
"""
from __future__ import annotations

import numpy as np
import pytest
import torch

from conftest import ODD_SHAPES, SHAPE_IDS, normwise_rel_error
from luminamoon import LuminaMoon

STEPS = 20
# Max normwise relative error after 20 float32 steps: both sides round every operation to
# float32 (and AdamW uses betas in float64 where TDCLM rounds them to float32 first).
MAX_REL_ERR = 1e-6

ADAMW_MODE = dict(clip=0.0, bound_mode="none", nonfinite="propagate", backend="reference")

CASES = [
    # id, optimizer kwargs shared by both (lr, betas, eps, weight_decay, maximize)
    ("defaults", dict(lr=1e-3, weight_decay=0.01)),
    ("big-lr-wd", dict(lr=3e-2, betas=(0.8, 0.99), eps=1e-6, weight_decay=0.1)),
    ("no-decay", dict(lr=1e-2, weight_decay=0.0)),
    ("maximize", dict(lr=1e-2, weight_decay=0.05, maximize=True)),
    ("beta1-zero", dict(lr=1e-2, betas=(0.0, 0.9))),
]


TDCLM_DEFAULTS = dict(lr=1e-3, betas=(0.9, 0.999), eps=1e-8, weight_decay=0.01)


def _make_params(shapes, seed=0):
    gen = torch.Generator().manual_seed(seed)
    return [torch.randn(s, generator=gen) for s in shapes]


def _f32(value):
    """Hyperparameters as TDCLM uses them: rounded once to float32 (docs/internals.md)."""
    if isinstance(value, tuple):
        return tuple(_f32(v) for v in value)
    if isinstance(value, float):
        return float(np.float32(value))
    return value


def _f32_group(d):
    return {k: (v if k == "params" else _f32(v)) for k, v in d.items()}


def _run_pair(shapes, kwargs, groups_fn=None, scheduler_fn=None, seed=0, round_hyper=True):
    """Step LuminaMoon and AdamW side by side on the same gradients; return both.

    With ``round_hyper`` AdamW gets the float32-rounded hyperparameters TDCLM computes with,
    so that moments are comparable too (beta2 = 0.999 rounds to 0.99900001, which moves
    1 - beta2, and so v, by 1.3e-5 relative).
    """
    init = _make_params(shapes, seed)
    ours = [torch.nn.Parameter(t.clone()) for t in init]
    theirs = [torch.nn.Parameter(t.clone()) for t in init]
    ours_groups = groups_fn(ours) if groups_fn else ours
    theirs_groups = groups_fn(theirs) if groups_fn else theirs
    ref_kwargs = dict(kwargs)
    if round_hyper:
        ref_kwargs = _f32_group({**TDCLM_DEFAULTS, **kwargs})
        if groups_fn:
            theirs_groups = [_f32_group(g) for g in theirs_groups]
    opt = LuminaMoon(ours_groups, **kwargs, **ADAMW_MODE)
    ref = torch.optim.AdamW(theirs_groups, **ref_kwargs, foreach=False)
    scheds = [scheduler_fn(o) for o in (opt, ref)] if scheduler_fn else []
    gen = torch.Generator().manual_seed(seed + 1)
    for _ in range(STEPS):
        for a, b in zip(ours, theirs):
            g = torch.randn(a.shape, generator=gen) * 3
            a.grad = g.clone()
            b.grad = g.clone()
        opt.step()
        ref.step()
        for s in scheds:
            s.step()
    return opt, ref, ours, theirs


def _assert_close(opt, ref, ours, theirs, moments=True):
    for i, (a, b) in enumerate(zip(ours, theirs)):
        err = normwise_rel_error(a, b)
        assert err <= MAX_REL_ERR, f"param {i} {tuple(a.shape)}: rel err {err:.3g}"
        if a.numel() and moments:
            for ka, kb in (("exp_avg", "exp_avg"), ("exp_avg_sq", "exp_avg_sq")):
                e = normwise_rel_error(opt.state[a][ka], ref.state[b][kb])
                assert e <= MAX_REL_ERR, f"param {i} {ka}: rel err {e:.3g}"
        assert int(opt.state[a]["step"]) == int(ref.state[b]["step"]) == STEPS


@pytest.mark.parametrize("shape", ODD_SHAPES, ids=SHAPE_IDS)
@pytest.mark.parametrize("case", CASES, ids=[c[0] for c in CASES])
def test_matches_adamw(case, shape):
    _, kwargs = case
    _assert_close(*_run_pair([shape], kwargs))


@pytest.mark.parametrize("case", CASES, ids=[c[0] for c in CASES])
def test_matches_adamw_with_unrounded_hyperparameters(case):
    """The user's view: AdamW with the very same (float64) hyperparameters. Parameters still
    agree to 1e-6; moments move with 1 - beta2 and are compared in the tests above."""
    _, kwargs = case
    _assert_close(*_run_pair([(6, 42), (131,)], kwargs, round_hyper=False), moments=False)


def test_matches_adamw_many_tensors_one_group():
    _assert_close(*_run_pair(ODD_SHAPES + [(64, 33), (5,)], dict(lr=1e-2, weight_decay=0.02)))


def test_matches_adamw_param_groups():
    def groups(params):
        return [
            {"params": params[:2], "lr": 2e-2, "weight_decay": 0.0},
            {"params": params[2:4], "betas": (0.5, 0.95), "eps": 1e-5},
            {"params": params[4:], "maximize": True, "weight_decay": 0.3},
        ]

    _assert_close(*_run_pair([(6, 42), (7,), (123,), (3, 3), (431,), (1,)],
                             dict(lr=1e-3, weight_decay=0.01), groups_fn=groups))


@pytest.mark.parametrize("sched", ["StepLR", "LambdaLR"])
def test_matches_adamw_under_lr_scheduler(sched):
    def make(opt):
        if sched == "StepLR":
            return torch.optim.lr_scheduler.StepLR(opt, step_size=3, gamma=0.5)
        return torch.optim.lr_scheduler.LambdaLR(opt, lambda e: 1.0 / (1 + e))

    opt, ref, ours, theirs = _run_pair([(6, 42), (17,)], dict(lr=2e-2), scheduler_fn=make)
    _assert_close(opt, ref, ours, theirs)
    # The scheduler really changed lr (both optimizers saw the same schedule).
    ours_lr, ref_lr = opt.param_groups[0]["lr"], ref.param_groups[0]["lr"]
    assert ours_lr < 2e-2 and abs(ours_lr - ref_lr) <= 1e-7 * ours_lr


def test_tensor_lr_equals_float_lr_bitwise():
    """A 0-dim tensor lr (on any device, any float dtype) gives the float lr's bits."""
    init = _make_params([(6, 42), (5,)])
    results = []
    for lr in (1e-2, torch.tensor(1e-2, dtype=torch.float64), torch.tensor(1e-2)):
        params = [torch.nn.Parameter(t.clone()) for t in init]
        opt = LuminaMoon(params, lr=lr, seed=1, **ADAMW_MODE)
        gen = torch.Generator().manual_seed(7)
        for _ in range(5):
            for p in params:
                p.grad = torch.randn(p.shape, generator=gen)
            opt.step()
        results.append([p.detach().clone() for p in params])
    for other in results[1:]:
        for a, b in zip(results[0], other):
            assert torch.equal(a, b)


def test_tensor_lr_with_scheduler_matches_adamw():
    """A scheduler writing into a tensor lr (in place) is followed without a rebuild."""
    init = _make_params([(33,)])
    ours = [torch.nn.Parameter(init[0].clone())]
    theirs = [torch.nn.Parameter(init[0].clone())]
    opt = LuminaMoon(ours, lr=torch.tensor(1e-2), **ADAMW_MODE)
    ref = torch.optim.AdamW(theirs, lr=1e-2, foreach=False)
    s1 = torch.optim.lr_scheduler.StepLR(opt, step_size=2, gamma=0.3)
    s2 = torch.optim.lr_scheduler.StepLR(ref, step_size=2, gamma=0.3)
    gen = torch.Generator().manual_seed(3)
    for _ in range(STEPS):
        g = torch.randn(33, generator=gen)
        ours[0].grad, theirs[0].grad = g.clone(), g.clone()
        opt.step()
        ref.step()
        s1.step()
        s2.step()
    assert isinstance(opt.param_groups[0]["lr"], torch.Tensor)
    assert normwise_rel_error(ours[0], theirs[0]) <= MAX_REL_ERR


# ---------------------------------------------------------------------------------------------
# The reference's sqrt is the IEEE one on every CPU (torch's own CPU sqrt is not, on some)
# ---------------------------------------------------------------------------------------------
def _sqrt_cases() -> torch.Tensor:
    gen = torch.Generator().manual_seed(5)
    every_exponent = torch.randint(1, 0x7F800000, (400_000,), dtype=torch.int32, generator=gen)
    specials = torch.tensor([0.0, -0.0, float("inf"), float("-inf"), float("nan"), -1.0, 1.0,
                             2.0, 4.0, 0.25, 1.4e-45, 1.1754942e-38, 1.17549435e-38, 3.4028235e38])
    return torch.cat([every_exponent.view(torch.float32), torch.rand(100_000, generator=gen),
                      specials])


def _ieee_sqrt_bits(x: torch.Tensor) -> np.ndarray:
    with np.errstate(invalid="ignore"):
        root = np.sqrt(x.numpy())  # numpy's float32 sqrt: the hardware's IEEE instruction
    return np.where(np.isnan(root), np.int32(0x7FC00000), root.view(np.int32))


def _bits_nan_canonical(t: torch.Tensor) -> np.ndarray:
    a = t.numpy()
    return np.where(np.isnan(a), np.int32(0x7FC00000), a.view(np.int32))


def test_sqrt_rn_is_the_correctly_rounded_root():
    from luminamoon.optimizer.backends.reference import sqrt_rn

    x = _sqrt_cases()
    assert np.array_equal(_bits_nan_canonical(sqrt_rn(x)), _ieee_sqrt_bits(x))


@pytest.mark.parametrize("ulps", [-2, -1, 1, 2])
def test_sqrt_rn_corrects_a_guess_off_by_ulps(monkeypatch, ulps):
    """Whatever torch's sqrt returns within two ulps, the corrected root is the IEEE one."""
    from luminamoon.optimizer.backends import reference

    x = _sqrt_cases()

    def off_by(y):  # the IEEE root (numpy's), moved by `ulps`; y >= 1 here: no sign flip
        with np.errstate(invalid="ignore"):  # the negative x of the specials
            r = torch.from_numpy(np.sqrt(y.numpy()))
        return (r.view(torch.int32) + ulps).view(torch.float32)

    monkeypatch.setattr(reference.torch, "sqrt", off_by)
    got = reference.sqrt_rn(x)
    monkeypatch.undo()
    finite_pos = (x > 0) & torch.isfinite(x)
    assert np.array_equal(_bits_nan_canonical(got[finite_pos]), _ieee_sqrt_bits(x[finite_pos]))
