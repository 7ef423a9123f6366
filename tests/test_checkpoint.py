"""state_dict -> torch.save -> torch.load -> load_state_dict continues bitwise."""
from __future__ import annotations

import io

import pytest
import torch

from conftest import assert_bitwise_equal
from luminamoon import LuminaMoon

CASES = [
    ("fp32", dict(dtype=torch.float32, kw=dict())),
    ("bf16-sr-rel", dict(dtype=torch.bfloat16, kw=dict(bound_mode="rel", bound=0.1))),
    ("bf16-bf16state-abs", dict(dtype=torch.bfloat16,
                                kw=dict(state_dtype=torch.bfloat16, bound_mode="abs", bound=0.05))),
    ("fp16-clip0", dict(dtype=torch.float16, kw=dict(clip=0.0, nonfinite="propagate"))),
]


def _model(dtype, seed=0):
    gen = torch.Generator().manual_seed(seed)
    return [torch.nn.Parameter(torch.randn(s, generator=gen).to(dtype)) for s in [(6, 42), (131,), (1,)]]


def _grads(params, step):
    gen = torch.Generator().manual_seed(1000 + step)
    for p in params:
        p.grad = torch.randn(p.shape, generator=gen).to(p.dtype)
    if step == 3:  # a skipped step in the middle: the counter must survive the checkpoint
        params[1].grad[0] = float("nan")


def _opt(params, kw, seed=None):
    groups = [{"params": params[:2]}, {"params": params[2:], "lr": 3e-2, "clip": 1.0}]
    return LuminaMoon(groups, lr=1e-2, backend="reference", seed=seed, **kw)


@pytest.mark.parametrize("case", CASES, ids=[c[0] for c in CASES])
def test_resume_is_bitwise(case):
    _, spec = case
    dtype, kw = spec["dtype"], spec["kw"]
    # The run that never stops.
    straight = _model(dtype)
    opt = _opt(straight, kw)
    for step in range(8):
        _grads(straight, step)
        opt.step()
    # The run that stops after 5 steps, saves model and optimizer, and resumes elsewhere.
    first = _model(dtype)
    opt1 = _opt(first, kw, seed=opt.seed)
    for step in range(5):
        _grads(first, step)
        opt1.step()
    buf = io.BytesIO()
    torch.save({"model": [p.detach() for p in first], "opt": opt1.state_dict()}, buf)
    buf.seek(0)
    saved = torch.load(buf)  # weights_only: the state dict holds only plain types
    resumed = [torch.nn.Parameter(t.clone()) for t in saved["model"]]
    opt2 = _opt(resumed, kw)  # draws a new seed; the loaded one replaces it
    opt2.load_state_dict(saved["opt"])
    assert opt2.seed == opt.seed
    for p in resumed:
        state = opt2.state[p]
        assert state["exp_avg"].dtype == kw.get("state_dtype", torch.float32)
        assert state["exp_avg_sq"].dtype == kw.get("state_dtype", torch.float32)
        if "bound_mode" in kw:
            assert state["p_init"].dtype == p.dtype
    for step in range(5, 8):
        _grads(resumed, step)
        opt2.step()
    for a, b in zip(straight, resumed):
        assert_bitwise_equal(a.detach(), b.detach())
        for key in ("exp_avg", "exp_avg_sq", "step", "p_init"):
            if key in opt.state[a]:
                assert_bitwise_equal(opt.state[a][key], opt2.state[b][key], key)
    expected_skips = 0 if kw.get("nonfinite") == "propagate" else 1
    assert int(opt2.skipped_steps) == int(opt.skipped_steps) == expected_skips


def test_load_does_not_alias_the_given_state_dict():
    params = _model(torch.float32)
    opt = _opt(params, {})
    _grads(params, 0)
    opt.step()
    sd = opt.state_dict()
    other = _model(torch.float32)
    opt2 = _opt(other, {})
    opt2.load_state_dict(sd)
    _grads(other, 1)
    opt2.step()
    assert not torch.equal(opt2.state[other[0]]["exp_avg"], opt.state[params[0]]["exp_avg"])
    assert int(opt.state[params[0]]["step"]) == 1


def test_missing_p_init_is_reported_and_reset_p_init_repairs():
    params = _model(torch.float32)
    opt = _opt(params, {})
    _grads(params, 0)
    opt.step()
    sd = opt.state_dict()
    for group in sd["param_groups"]:  # the run continues with a bound
        group["bound_mode"] = "rel"
    opt2 = _opt([torch.nn.Parameter(p.detach().clone()) for p in params], {})
    opt2.load_state_dict(sd)
    ps = [p for g in opt2.param_groups for p in g["params"]]
    _grads(ps, 1)
    before = [p.detach().clone() for p in ps]
    with pytest.raises(ValueError, match=r"parameter 0 \(param group 0, index 0\) has no 'p_init'.*reset_p_init\(\)"):
        opt2.step()
    assert all(torch.equal(p.detach(), b) for p, b in zip(ps, before))
    opt2.reset_p_init()
    opt2.step()
    for p, b in zip(ps, before):
        assert torch.equal(opt2.state[p]["p_init"], b)
        assert not torch.equal(p.detach(), b)


def test_load_rejects_a_state_dict_of_another_model():
    params = _model(torch.float32)
    opt = _opt(params, {})
    _grads(params, 0)
    opt.step()
    sd = opt.state_dict()
    gen = torch.Generator().manual_seed(0)
    wrong = [torch.nn.Parameter(torch.randn(s, generator=gen)) for s in [(42, 6), (131,), (1,)]]
    opt2 = _opt(wrong, {})
    with pytest.raises(ValueError, match=r"'exp_avg' for parameter 0 has shape \(6, 42\)"):
        opt2.load_state_dict(sd)
    assert len(opt2.state) == 0
