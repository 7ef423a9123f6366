"""q8 moments on the cpu backend (the C++ engine, engine/cpu_quant.cpp and cpu_q8.cpp) against
the reference backend (docs/tdclm.md, "Quantized moments (q8)"): each step started from the same
state, the block scales within float32 rounding of m' and v', the codes equal except where the
stochastic decision's margin is within float32 rounding; a resumed run bitwise equal to an
unbroken one; a skipped step changing nothing; the backend "auto" picks for q8 groups on CPU."""
from __future__ import annotations

import io
import math

import pytest
import torch

from cases import F32_ATOL, F32_RTOL, assert_storage_close
from conftest import import_or_skip

_luminav = import_or_skip("luminamoon._luminav", "native")

from luminamoon import LuminaMoon  # noqa: E402
from luminamoon.kernels import quant  # noqa: E402
from luminamoon.optimizer import rng  # noqa: E402

pytestmark = pytest.mark.native

# 1-D, rows whose length 256 divides, rows of a short last block (257, 300), a 4-D weight, and
# tensors below the size rule (float32 moments, a group of their own)
SHAPES = [(5000,), (64, 256), (2, 3, 32, 32), (17, 257), (20, 300), (63, 64), (10,)]
Q8_KEYS = ("exp_avg", "exp_avg_scale", "exp_avg_sq", "exp_avg_sq_scale")
# The decision compares fl(T * gap) with fl(y - C[lo]): a margin below a few float32 roundings of
# y (or of the gap, where larger) can fall either way when y or the moment it comes from is one
# rounding apart.
TIE_ROUNDINGS = 2.0 ** -21


def _params(shapes, seed, dtype=torch.float32):
    gen = torch.Generator().manual_seed(seed)
    return [torch.nn.Parameter(torch.randn(s, generator=gen).to(dtype)) for s in shapes]


def _grads(params, seed, scale=1e-2):
    gen = torch.Generator().manual_seed(seed)
    for p in params:
        p.grad = (torch.randn(p.shape, generator=gen) * scale).to(p.dtype)


def _pair(shapes, data_seed, dtype=torch.float32, **kw):
    a = _params(shapes, data_seed, dtype)
    b = [torch.nn.Parameter(p.detach().clone()) for p in a]
    return (a, LuminaMoon(a, state_dtype="q8", backend="cpu", **kw),
            b, LuminaMoon(b, state_dtype="q8", backend="reference", **kw))


def _near_ties(p, index, state, grad, opt, key, signed, new_scales):
    """Elements whose stochastic decision the reference takes within TIE_ROUNDINGS: m' (or v')
    recomputed from the stored state and the gradient as the spec says, normalised by the new
    scales, against the threshold of its R16 word."""
    group = opt.param_groups[0]
    b1, b2 = (float(torch.tensor(b, dtype=torch.float32)) for b in group["betas"])
    rows, k = quant.block_rows(p.shape)
    table = quant.codebook(signed)
    old = quant.dequantize(state[key], quant.expand_scales(state[key + "_scale"], rows, k), table)
    g = grad.reshape(-1).to(torch.float32)
    if signed:
        x = old * b1 + g * float(torch.tensor(1.0, dtype=torch.float32) - b1)
    else:
        x = old * b2 + (g * g) * float(torch.tensor(1.0, dtype=torch.float32) - b2)
    scales = quant.expand_scales(new_scales, rows, k)
    y = x * quant.block_reciprocals(scales)
    y = torch.where(x.abs() == scales, torch.sign(x), y)
    lo = (torch.searchsorted(table, y, right=True) - 1).clamp(0, 255)
    hi = (lo + 1).clamp(max=255)
    t = int(state["step"]) + 1
    key_words = rng.rounding_seed(int(group["seed"]), t, index)
    stream = rng.STREAM_Q8_EXP_AVG if signed else rng.STREAM_Q8_EXP_AVG_SQ
    words = rng.stream_words(key_words, 0, p.numel(), stream, p.device)
    gap = table[hi] - table[lo]
    draw = ((words.to(torch.float32) + 0.5) * (1.0 / 65536.0)) * gap
    return (draw - (y - table[lo])).abs() <= TIE_ROUNDINGS * torch.maximum(y.abs(), gap)


def _sync_state(src_params, src_opt, dst_params, dst_opt):
    """dst's params and state <- src's (so that each step starts from the same state)."""
    with torch.no_grad():
        for ps, pd in zip(src_params, dst_params):
            pd.copy_(ps)
            for key, value in src_opt.state[ps].items():
                dst_opt.state[pd][key].copy_(value)


CONFIGS = {
    "default": dict(),
    "clip-off-rel-bound": dict(clip=0.0, bound_mode="rel", bound=0.05),
    "maximize-propagate": dict(maximize=True, nonfinite="propagate", weight_decay=0.0),
    "bf16-params": dict(stochastic_rounding=True),
    "single-pass": dict(clip=0.0, nonfinite="propagate"),  # no pass 1 at all
}


@pytest.mark.parametrize("name", sorted(CONFIGS))
def test_cpu_steps_q8_as_the_reference(name):
    kw = CONFIGS[name]
    dtype = torch.bfloat16 if name == "bf16-params" else torch.float32
    a, opt_a, b, opt_b = _pair(SHAPES, 1, dtype, seed=5, **kw)
    for s in range(4):
        if s:
            _sync_state(a, opt_a, b, opt_b)
        _grads(a, 10 + s)
        for pa, pb in zip(a, b):
            pb.grad = pa.grad.clone()
        before = {pa: {k: v.clone() for k, v in opt_a.state[pa].items()} for pa in a if s}
        opt_a.step()
        opt_b.step()
        assert [x.name for x in opt_a._plan.backends] == ["cpu", "cpu"]
        for j, (pa, pb) in enumerate(zip(a, b)):
            what = f"{name} step {s + 1} tensor {j} {tuple(pa.shape)}"
            assert_storage_close(pa.detach(), pb.detach(), what)
            sa, sb = opt_a.state[pa], opt_b.state[pb]
            if pa.numel() < quant.MIN_NUMEL:
                for key in ("exp_avg", "exp_avg_sq"):
                    torch.testing.assert_close(sa[key], sb[key], rtol=F32_RTOL, atol=F32_ATOL)
                continue
            for key, signed in (("exp_avg", True), ("exp_avg_sq", False)):
                # the block scales: max |m'| (|v'|), within float32 rounding
                torch.testing.assert_close(sa[key + "_scale"], sb[key + "_scale"],
                                           rtol=2.0 ** -23, atol=0.0, msg=f"{what}: {key} scales")
                differ = (sa[key] != sb[key]).reshape(-1)
                state = before[pa] if s else {
                    key: torch.full_like(sa[key], quant.zero_code(signed)),
                    key + "_scale": torch.zeros_like(sa[key + "_scale"]), "step": 0}
                ties = _near_ties(pa, j, state, pa.grad, opt_a, key, signed, sb[key + "_scale"])
                assert float(ties.double().mean()) < 1e-2, f"{what}: {key}: ties are rare"
                assert bool((ties | ~differ).all()), (
                    f"{what}: {int((differ & ~ties).sum())} {key} codes differ away from a tie")


def test_resume_is_bitwise():
    a = _params(SHAPES, 2)
    opt_a = LuminaMoon(a, state_dtype="q8", seed=11, backend="cpu")
    for s in (1, 2, 3):
        _grads(a, s)
        opt_a.step()
    buf = io.BytesIO()
    torch.save(opt_a.state_dict(), buf)
    buf.seek(0)
    b = [torch.nn.Parameter(p.detach().clone()) for p in a]
    opt_b = LuminaMoon(b, state_dtype="q8", seed=5, backend="cpu")
    opt_b.load_state_dict(torch.load(buf))
    for s in (4, 5):
        _grads(a, s)
        _grads(b, s)
        opt_a.step()
        opt_b.step()
    for pa, pb in zip(a, b):
        assert torch.equal(pa, pb)
        for key, value in opt_a.state[pa].items():
            assert torch.equal(value, opt_b.state[pb][key]), key


def test_a_skipped_step_changes_nothing_and_propagate_stores_a_nan_scale():
    params = _params(SHAPES[:2], 3)
    opt = LuminaMoon(params, state_dtype="q8", seed=2, backend="cpu")
    _grads(params, 1)
    opt.step()
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
    opt2 = LuminaMoon(params, state_dtype="q8", seed=2, nonfinite="propagate", backend="cpu")
    _grads(params, 3)
    params[1].grad[5, 7] = math.inf
    opt2.step()
    st = opt2.state[params[1]]
    assert math.isnan(st["exp_avg_scale"][5, 0].item())
    assert bool(torch.isfinite(st["exp_avg_scale"][4]).all())
    assert bool((st["exp_avg"][5] == quant.zero_code(True)).all())


def test_auto_steps_q8_groups_on_the_cpu_engine():
    params = _params([(64, 128), (10,)], 4)
    _grads(params, 1)
    opt = LuminaMoon(params, state_dtype="q8", seed=1, backend="auto")
    opt.step()
    by_kind = {str(g.state_dtype): b.name for g, b in zip(opt._plan.groups, opt._plan.backends)}
    assert by_kind == {"q8": "cpu", "torch.float32": "cpu"}

