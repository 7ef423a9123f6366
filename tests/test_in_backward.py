"""The step inside backward (luminamoon.step_in_backward): bitwise the normal step where no
gradient is non-finite (bucketing changes no bits: per-tensor reductions, rounding keyed on k and
the element index), clipping, accumulation, the per-tensor non-finite policy, lr schedulers,
state dict resume; on every backend that steps CPU tensors here."""
from __future__ import annotations

import copy
import warnings

import pytest
import torch

from conftest import CPU_BACKENDS
from luminamoon import InBackward, LuminaMoon, step_in_backward

BUCKETS = [0, 600, 10**9]  # one bucket per gradient, a few, one for the whole backward


class Tiny(torch.nn.Module):
    """Five parameter tensors of different sizes, a tied use (the weight used twice); with
    ``hidden`` >= 64, b's weight is large enough for q8 moments (numel >= 4096)."""

    def __init__(self, dtype=torch.float32, hidden=16):
        super().__init__()
        self.a = torch.nn.Linear(8, hidden)
        self.b = torch.nn.Linear(hidden, hidden)
        self.norm = torch.nn.LayerNorm(hidden)
        self.c = torch.nn.Linear(hidden, 4, bias=False)
        self.to(dtype)

    def forward(self, x):
        h = torch.nn.functional.gelu(self.a(x))
        h = self.norm(self.b(h) + self.b(h).tanh())
        return self.c(h)


def _model(dtype=torch.float32, hidden=16) -> Tiny:
    torch.manual_seed(0)
    return Tiny(dtype, hidden)


def _data(n=6, dtype=torch.float32):
    gen = torch.Generator().manual_seed(1)
    return [(torch.randn(5, 8, generator=gen).to(dtype), torch.randn(5, 4, generator=gen).to(dtype))
            for _ in range(n)]


def _loss(model, x, y):
    return ((model(x).float() - y.float()) ** 2).mean()


def _train_normal(model, opt, data, k=1):
    losses = []
    for i, (x, y) in enumerate(data):
        loss = _loss(model, x, y)
        loss.backward()
        losses.append(loss.item())
        if (i + 1) % k == 0:
            opt.step()
            opt.zero_grad()
    return losses


def _train_in_backward(model, ib, data):
    losses = []
    for x, y in data:
        loss = _loss(model, x, y)
        loss.backward()
        losses.append(loss.item())
    return losses


def _same(m1, m2):
    return all(torch.equal(a, b) for a, b in zip(m1.parameters(), m2.parameters()))


KW = dict(lr=1e-2, seed=3, clip=1.0)


@pytest.mark.parametrize("bucket", BUCKETS)
@pytest.mark.parametrize("backend", CPU_BACKENDS)
@pytest.mark.parametrize("dtype,state", [(torch.float32, torch.float32),
                                         (torch.bfloat16, torch.float32),
                                         (torch.float32, torch.bfloat16)],
                         ids=["fp32", "bf16-params", "bf16-state"])
def test_bitwise_equal_to_the_normal_step(backend, bucket, dtype, state):
    m1, m2 = _model(dtype), _model(dtype)
    _check_bitwise_equal(m1, m2, backend, bucket, dtype, state)


@pytest.mark.parametrize("backend", CPU_BACKENDS)
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=["fp32", "bf16-params"])
def test_q8_moments_bitwise_equal_to_the_normal_step(backend, dtype):
    m1, m2 = _model(dtype, hidden=80), _model(dtype, hidden=80)
    ib = _check_bitwise_equal(m1, m2, backend, 0, dtype, "q8")
    assert ib.state[m2.b.weight]["exp_avg"].dtype == torch.uint8  # q8 codes
    assert ib.state[m2.a.weight]["exp_avg"].dtype == torch.float32  # below the size rule


def _check_bitwise_equal(m1, m2, backend, bucket, dtype, state):
    data = _data(dtype=dtype)
    opt = LuminaMoon(m1.parameters(), backend=backend, state_dtype=state, **KW)
    ib = step_in_backward(m2, backend=backend, state_dtype=state, bucket_bytes=bucket, **KW)
    l1 = _train_normal(m1, opt, data)
    l2 = _train_in_backward(m2, ib, data)
    assert l1 == l2
    assert _same(m1, m2)
    assert all(p.grad is None for p in m2.parameters())  # freed in backward
    for p1, p2 in zip(m1.parameters(), m2.parameters()):
        s1, s2 = opt.state[p1], ib.state[p2]
        assert int(s1["step"]) == int(s2["step"]) == len(data)
        assert set(s1) == set(s2)
        for key in s1:
            assert torch.equal(s1[key], s2[key]), key
    return ib


@pytest.mark.parametrize("backend", CPU_BACKENDS)
def test_clipping_acts_and_matches(backend):
    """A small clip changes the update (so it is applied inside backward) and gives the normal
    step's bits."""
    runs = {}
    for clip in (0.05, 0.0):
        m1, m2 = _model(), _model()
        opt = LuminaMoon(m1.parameters(), backend=backend, lr=1e-2, seed=3, clip=clip)
        ib = step_in_backward(m2, backend=backend, lr=1e-2, seed=3, clip=clip, bucket_bytes=600)
        data = _data(3)
        assert _train_normal(m1, opt, data) == _train_in_backward(m2, ib, data)
        assert _same(m1, m2)
        runs[clip] = [p.detach().clone() for p in m2.parameters()]
    assert not all(torch.equal(a, b) for a, b in zip(runs[0.05], runs[0.0]))


@pytest.mark.parametrize("backend", CPU_BACKENDS)
@pytest.mark.parametrize("how", ["argument", "context"])
def test_accumulation_steps_on_the_last_backward(backend, how):
    k = 3
    m1, m2 = _model(), _model()
    data = _data(6)
    opt = LuminaMoon(m1.parameters(), backend=backend, **KW)
    l1 = _train_normal(m1, opt, data, k=k)
    if how == "argument":
        ib = step_in_backward(m2, backend=backend, bucket_bytes=600, accumulate_steps=k, **KW)
        l2 = _train_in_backward(m2, ib, data)
    else:
        ib = step_in_backward(m2, backend=backend, bucket_bytes=600, **KW)
        l2 = []
        for i, (x, y) in enumerate(data):
            loss = _loss(m2, x, y)
            if (i + 1) % k:
                with ib.accumulate():
                    loss.backward()
                assert all(p.grad is not None for p in m2.parameters())  # kept, accumulating
            else:
                loss.backward()
            l2.append(loss.item())
    assert l1 == l2
    assert _same(m1, m2)
    assert all(int(ib.state[p]["step"]) == len(data) // k for p in m2.parameters())


@pytest.mark.parametrize("backend", CPU_BACKENDS)
def test_a_parameter_reached_only_while_accumulating_is_stepped_at_the_end(backend):
    """A gradient accumulated earlier whose parameter the stepping backward does not reach is
    stepped when that backward ends, as the normal step would step it."""
    m1, m2 = _model(), _model()
    opt = LuminaMoon(m1.parameters(), backend=backend, **KW)
    ib = step_in_backward(m2, backend=backend, bucket_bytes=600, accumulate_steps=2, **KW)
    x, y = _data(1)[0]
    for m, step in ((m1, opt.step), (m2, None)):
        _loss(m, x, y).backward()
        (m.a(x).sum() * 0.1).backward()  # reaches only m.a
        if step:
            step()
    assert _same(m1, m2)
    assert int(ib.state[m2.c.weight]["step"]) == 1


@pytest.mark.parametrize("backend", CPU_BACKENDS)
@pytest.mark.parametrize("bucket", [0, 10**9])
def test_a_nonfinite_gradient_skips_only_its_tensor(backend, bucket):
    m1, m2 = _model(), _model()
    x, y = _data(1)[0]
    bad = m2.b.weight
    handle = bad.register_hook(lambda g: g * float("nan"))
    ib = step_in_backward(m2, backend=backend, bucket_bytes=bucket, **KW)
    before = bad.detach().clone()
    _loss(m2, x, y).backward()
    handle.remove()
    assert torch.equal(bad, before)
    assert bad.grad is None
    assert int(ib.skipped_steps) == 1
    assert int(ib.state[bad]["step"]) == 0 if bad in ib.state and ib.state[bad] else True
    # every other tensor took the normal step without the skipped one
    opt = LuminaMoon([p for n, p in m1.named_parameters() if n != "b.weight"],
                     backend=backend, **KW)
    _loss(m1, x, y).backward()
    m1.b.weight.grad = None
    opt.step()
    for (n, p1), p2 in zip(m1.named_parameters(), m2.parameters()):
        if n != "b.weight":
            assert torch.equal(p1, p2), n
    # the next clean backward steps everything, the skipped tensor from its first step
    _loss(m2, x, y).backward()
    assert int(ib.state[bad]["step"]) == 1
    assert int(ib.skipped_steps) == 1


@pytest.mark.parametrize("backend", CPU_BACKENDS)
def test_nonfinite_raise_leaves_the_hooks_usable(backend):
    model = _model()
    ib = step_in_backward(model, backend=backend, nonfinite="raise", bucket_bytes=0, **KW)
    x, y = _data(1)[0]
    handle = model.c.weight.register_hook(lambda g: g * float("inf"))
    before = model.c.weight.detach().clone()
    with pytest.raises(FloatingPointError, match="non-finite gradient"):
        _loss(model, x, y).backward()
    handle.remove()
    assert torch.equal(model.c.weight, before)
    model.zero_grad()
    _loss(model, x, y).backward()  # a clean backward after the failed one steps everything
    assert all(int(ib.state[p]["step"]) >= 1 for p in model.parameters())


@pytest.mark.parametrize("backend", CPU_BACKENDS)
def test_state_dict_resume_is_bitwise(backend):
    data = _data(6)
    ref, model = _model(), _model()
    ib_ref = step_in_backward(ref, backend=backend, bucket_bytes=600, **KW)
    _train_in_backward(ref, ib_ref, data)
    ib = step_in_backward(model, backend=backend, bucket_bytes=600, **KW)
    _train_in_backward(model, ib, data[:3])
    saved_model = copy.deepcopy(model.state_dict())
    saved_opt = copy.deepcopy(ib.state_dict())
    resumed = _model()
    resumed.load_state_dict(saved_model)
    ib2 = step_in_backward(resumed, backend=backend, bucket_bytes=600, lr=1.0, seed=99)
    ib2.load_state_dict(saved_opt)
    _train_in_backward(resumed, ib2, data[3:])
    assert _same(ref, resumed)
    # the state loaded through the optimizer itself (new state tensors under cached buckets)
    ib.optimizer.load_state_dict(saved_opt)
    _train_in_backward(model, ib, data[3:])
    assert _same(ref, model)
    # and a normal LuminaMoon loads the same state dict
    other = LuminaMoon(_model().parameters(), backend=backend)
    other.load_state_dict(saved_opt)


@pytest.mark.parametrize("backend", CPU_BACKENDS)
def test_lr_scheduler_drives_the_optimizer(backend):
    m1, m2 = _model(), _model()
    opt = LuminaMoon(m1.parameters(), backend=backend, **KW)
    ib = step_in_backward(m2, backend=backend, bucket_bytes=600, **KW)
    s1 = torch.optim.lr_scheduler.StepLR(opt, step_size=1, gamma=0.5)
    s2 = torch.optim.lr_scheduler.StepLR(ib.optimizer, step_size=1, gamma=0.5)
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # no "lr_scheduler.step() before optimizer.step()"
        for x, y in _data(4):
            _loss(m1, x, y).backward()
            opt.step()
            opt.zero_grad()
            s1.step()
            _loss(m2, x, y).backward()
            ib.step()
            s2.step()
    assert ib.param_groups[0]["lr"] == opt.param_groups[0]["lr"] == KW["lr"] * 0.5**4
    assert _same(m1, m2)


def test_takes_an_optimizer_and_param_groups():
    model = _model()
    opt = LuminaMoon([{"params": model.a.parameters(), "lr": 0.0},
                      {"params": list(model.b.parameters()) + list(model.norm.parameters())
                       + list(model.c.parameters())}], backend="reference", **KW)
    ib = step_in_backward(opt, bucket_bytes=0)
    assert isinstance(ib, InBackward) and ib.optimizer is opt
    before = model.a.weight.detach().clone()
    x, y = _data(1)[0]
    _loss(model, x, y).backward()
    assert torch.equal(model.a.weight, before)  # lr 0: weight decay and update are zero
    assert int(opt.state[model.a.weight]["step"]) == 1
    assert not torch.equal(model.c.weight, _model().c.weight)


def test_remove_takes_the_hooks_off():
    model = _model()
    ib = step_in_backward(model, backend="reference", **KW)
    ib.remove()
    before = [p.detach().clone() for p in model.parameters()]
    x, y = _data(1)[0]
    _loss(model, x, y).backward()
    assert all(p.grad is not None for p in model.parameters())
    assert all(torch.equal(a, b) for a, b in zip(before, model.parameters()))


@pytest.mark.parametrize("kwargs,match", [
    (dict(bucket_bytes=-1), "bucket_bytes must be an int >= 0"),
    (dict(accumulate_steps=0), "accumulate_steps must be an int >= 1"),
    (dict(lr=-1.0), "lr"),
])
def test_refusals_name_the_value(kwargs, match):
    with pytest.raises(ValueError, match=match):
        step_in_backward(_model(), **kwargs)


def test_an_optimizer_with_keywords_is_refused():
    opt = LuminaMoon(_model().parameters())
    with pytest.raises(ValueError, match="set them on the optimizer"):
        step_in_backward(opt, lr=0.1)


@pytest.mark.parametrize("backend", CPU_BACKENDS)
@pytest.mark.parametrize("bucket", [0, 600])
def test_flags_read_one_bucket_late_as_on_a_gpu(backend, bucket):
    """On a GPU each bucket's finite flags are read at the next bucket (lag 1): a bucket with a
    non-finite gradient is first skipped whole on the device, then its finite tensors are
    stepped from the gradients kept until then. Forced here on CPU tensors: the same result."""
    m1, m2 = _model(), _model()
    x, y = _data(1)[0]
    results = []
    for model in (m1, m2):
        handle = model.b.weight.register_hook(lambda g: g * float("nan"))
        ib = step_in_backward(model, backend=backend, bucket_bytes=bucket, **KW)
        if model is m2:
            ib._lag = 1
        _loss(model, x, y).backward()
        handle.remove()
        _loss(model, x, y).backward()
        results.append(int(ib.skipped_steps))
        assert not ib._stepper.pending
    assert results == [1, 1]
    assert _same(m1, m2)


@pytest.mark.parametrize("backend", CPU_BACKENDS)
def test_a_backward_that_failed_elsewhere_does_not_break_the_next(backend):
    m1, m2 = _model(), _model()
    data = _data(3)
    opt = LuminaMoon(m1.parameters(), backend=backend, **KW)
    ib = step_in_backward(m2, backend=backend, bucket_bytes=0, **KW)

    def boom(g):
        raise RuntimeError("boom")

    x, y = data[0]
    handle = m2.a.weight.register_hook(boom)  # fails after the later layers were stepped
    with pytest.raises(RuntimeError, match="boom"):
        _loss(m2, x, y).backward()
    handle.remove()
    m2.zero_grad()
    stepped = [bool(ib.state[p]) and int(ib.state[p]["step"]) == 1 for p in m2.parameters()]
    assert any(stepped) and not all(stepped)  # the later layers were, m2.a.weight was not
    # bring the normal run to the same point: step the same parameters once
    _loss(m1, x, y).backward()
    for p, was in zip(m1.parameters(), stepped):
        if not was:
            p.grad = None
    opt.step()
    opt.zero_grad()
    assert _same(m1, m2)
    assert _train_normal(m1, opt, data[1:]) == _train_in_backward(m2, ib, data[1:])
    assert _same(m1, m2)
