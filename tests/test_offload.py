"""CPU offload (luminamoon.offload) on CPU tensors: the "device" is the CPU, so the copies are
plain copies, but the same code runs (host copies, gradient buffers, buckets, the worker
thread, the forward pre-hooks). Bitwise the normal step of the same backend, with and without
the step in backward; the skip semantics of each mode; accumulation; state dict and resume;
float32 master copies of bf16 parameters."""
from __future__ import annotations

import copy

import pytest
import torch

from conftest import CPU_BACKENDS
from luminamoon import CpuOffload, LuminaMoon, offload
from test_in_backward import KW, _data, _loss, _model, _same, _train_normal


def _train(model, off, data):
    losses = []
    for x, y in data:
        loss = _loss(model, x, y)
        loss.backward()
        off.step()
        losses.append(loss.item())
    off.wait()
    return losses


@pytest.mark.parametrize("in_backward", [False, True], ids=["step", "in-backward"])
@pytest.mark.parametrize("bucket", [0, 10**9])
@pytest.mark.parametrize("backend", CPU_BACKENDS)
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=["fp32", "bf16"])
def test_bitwise_equal_to_the_normal_step(backend, bucket, in_backward, dtype):
    m1, m2 = _model(dtype), _model(dtype)
    data = _data(5, dtype)
    opt = LuminaMoon(m1.parameters(), backend=backend, **KW)
    off = offload(m2, backend=backend, bucket_bytes=bucket, in_backward=in_backward, **KW)
    assert isinstance(off, CpuOffload)
    assert _train_normal(m1, opt, data) == _train(m2, off, data)
    assert _same(m1, m2)
    assert all(p.grad is None for p in m2.parameters())
    for p1, h in zip(m1.parameters(), off.optimizer.param_groups[0]["params"]):
        assert torch.equal(opt.state[p1]["exp_avg_sq"], off.state[h]["exp_avg_sq"])
    off.remove()


@pytest.mark.parametrize("backend", CPU_BACKENDS)
def test_params_without_a_module_wait_in_step(backend):
    m1, m2 = _model(), _model()
    data = _data(3)
    opt = LuminaMoon(m1.parameters(), backend=backend, **KW)
    off = offload(list(m2.parameters()), backend=backend, in_backward=True, bucket_bytes=600,
                  **KW)
    assert _train_normal(m1, opt, data) == _train(m2, off, data)
    assert _same(m1, m2)


@pytest.mark.parametrize("backend", CPU_BACKENDS)
def test_a_nonfinite_gradient_skips_the_whole_step_as_the_normal_step(backend):
    model = _model()
    off = offload(model, backend=backend, bucket_bytes=0, **KW)
    before = [p.detach().clone() for p in model.parameters()]
    handle = model.b.weight.register_hook(lambda g: g * float("nan"))
    x, y = _data(1)[0]
    _loss(model, x, y).backward()
    off.step()
    off.wait()
    handle.remove()
    assert all(torch.equal(a, b) for a, b in zip(before, model.parameters()))
    assert int(off.skipped_steps) == 1


@pytest.mark.parametrize("backend", CPU_BACKENDS)
def test_in_backward_skips_only_the_nonfinite_tensor(backend):
    model = _model()
    off = offload(model, backend=backend, bucket_bytes=10**9, in_backward=True, **KW)
    before = {n: p.detach().clone() for n, p in model.named_parameters()}
    handle = model.b.weight.register_hook(lambda g: g * float("nan"))
    x, y = _data(1)[0]
    _loss(model, x, y).backward()
    off.wait()
    handle.remove()
    for n, p in model.named_parameters():
        assert torch.equal(p, before[n]) == (n == "b.weight"), n
    assert int(off.skipped_steps) == 1


@pytest.mark.parametrize("in_backward", [False, True], ids=["step", "in-backward"])
@pytest.mark.parametrize("backend", CPU_BACKENDS)
def test_accumulation(backend, in_backward):
    m1, m2 = _model(), _model()
    data = _data(6)
    opt = LuminaMoon(m1.parameters(), backend=backend, **KW)
    off = offload(m2, backend=backend, accumulate_steps=3, in_backward=in_backward,
                  bucket_bytes=600, **KW)
    assert _train_normal(m1, opt, data, k=3) == _train(m2, off, data)
    assert _same(m1, m2)


@pytest.mark.parametrize("in_backward", [False, True], ids=["step", "in-backward"])
@pytest.mark.parametrize("backend", CPU_BACKENDS)
def test_q8_moments_bitwise_equal_to_the_normal_step_and_resume(backend, in_backward):
    kw = dict(KW, state_dtype="q8")
    data = _data(6, torch.bfloat16)
    m1, m2 = _model(torch.bfloat16, 80), _model(torch.bfloat16, 80)
    opt = LuminaMoon(m1.parameters(), backend=backend, **kw)
    off = offload(m2, backend=backend, in_backward=in_backward, **kw)
    assert _train_normal(m1, opt, data[:3]) == _train(m2, off, data[:3])
    assert _same(m1, m2)
    host_b = off.optimizer.param_groups[0]["params"][2]  # b.weight's host copy
    assert off.state[host_b]["exp_avg"].dtype == torch.uint8
    for p1, h in zip(m1.parameters(), off.optimizer.param_groups[0]["params"]):
        assert set(opt.state[p1]) == set(off.state[h])
        for key, value in opt.state[p1].items():
            assert torch.equal(value, off.state[h][key]), key
    saved_model, saved = copy.deepcopy(m2.state_dict()), copy.deepcopy(off.state_dict())
    resumed = _model(torch.bfloat16, 80)
    resumed.load_state_dict(saved_model)
    off2 = offload(resumed, backend=backend, in_backward=in_backward, **kw)
    off2.load_state_dict(saved)
    _train_normal(m1, opt, data[3:])
    _train(resumed, off2, data[3:])
    assert _same(m1, resumed)
    off.remove()
    off2.remove()


@pytest.mark.parametrize("in_backward", [False, True], ids=["step", "in-backward"])
@pytest.mark.parametrize("backend", CPU_BACKENDS)
def test_state_dict_resume_is_bitwise(backend, in_backward):
    data = _data(6)
    ref, model = _model(), _model()
    _train(ref, offload(ref, backend=backend, in_backward=in_backward, **KW), data)
    off = offload(model, backend=backend, in_backward=in_backward, **KW)
    _train(model, off, data[:3])
    saved_model = copy.deepcopy(model.state_dict())
    saved = copy.deepcopy(off.state_dict())
    resumed = _model()
    resumed.load_state_dict(saved_model)
    off2 = offload(resumed, backend=backend, in_backward=in_backward, lr=1.0, seed=7)
    off2.load_state_dict(saved)
    _train(resumed, off2, data[3:])
    assert _same(ref, resumed)
    # the state dict is a LuminaMoon's: the normal step continues it bitwise too
    normal = _model()
    normal.load_state_dict(saved_model)
    opt = LuminaMoon(normal.parameters(), backend=backend)
    opt.load_state_dict(saved)
    _train_normal(normal, opt, data[3:])
    assert _same(ref, normal)


@pytest.mark.parametrize("backend", CPU_BACKENDS)
def test_float32_masters_of_bf16_parameters(backend):
    """With master_weights the host keeps float32 copies, stepped as float32 parameters; the
    bf16 parameters are their round-to-nearest values; the state dict carries the masters and a
    resume continues bitwise."""
    data = _data(6, torch.bfloat16)
    ref, model = _model(torch.bfloat16), _model(torch.bfloat16)
    _train(ref, offload(ref, backend=backend, master_weights=True, **KW), data)
    off = offload(model, backend=backend, master_weights=True, **KW)
    _train(model, off, data[:3])
    hosts = off.optimizer.param_groups[0]["params"]
    assert all(h.dtype == torch.float32 for h in hosts)
    assert all(torch.equal(p, h.to(torch.bfloat16)) for p, h in zip(model.parameters(), hosts))
    assert any(not torch.equal(h, h.to(torch.bfloat16).float()) for h in hosts)  # finer than bf16
    saved_model = copy.deepcopy(model.state_dict())
    saved = copy.deepcopy(off.state_dict())
    assert all("master_param" in s for s in saved["state"].values())
    resumed = _model(torch.bfloat16)
    resumed.load_state_dict(saved_model)
    off2 = offload(resumed, backend=backend, master_weights=True, **KW)
    off2.load_state_dict(saved)
    _train(resumed, off2, data[3:])
    assert _same(ref, resumed)
    with pytest.raises(ValueError, match="master_weights=True"):
        offload(_model(torch.bfloat16), backend=backend, **KW).load_state_dict(saved)


def test_a_worker_error_surfaces_at_the_next_forward():
    model = _model()
    off = offload(model, backend="reference", in_backward=True, nonfinite="raise", **KW)
    handle = model.c.weight.register_hook(lambda g: g * float("inf"))
    x, y = _data(1)[0]
    _loss(model, x, y).backward()
    handle.remove()
    with pytest.raises(FloatingPointError, match="non-finite gradient"):
        model(x)
    off.wait()  # the error was taken: nothing left to wait for


def test_refusals():
    with pytest.raises(ValueError, match="no parameters"):
        offload([])
    model = _model()
    with pytest.raises(ValueError, match="one device"):
        offload([model.a.weight, torch.nn.Parameter(torch.zeros(2, device="meta"))])


def test_host_buffers_pack_tensors_aligned_without_overlap(monkeypatch):
    from luminamoon.optimizer import offload as mod

    monkeypatch.setattr(mod, "_CHUNK", 1024)
    specs = [((10, 3), torch.float32), ((0, 5), torch.float32), ((7,), torch.bfloat16),
             ((300,), torch.float32), ((100,), torch.float16), ((2,), torch.float32),
             ((200,), torch.float32)]
    bufs = mod.host_buffers(specs, pin=False)
    assert [(tuple(b.shape), b.dtype) for b in bufs] == [(tuple(s), d) for s, d in specs]
    spans = []
    for b in bufs:
        assert b.data_ptr() % 64 == 0 and b.is_contiguous()
        b.fill_(1)
        spans.append((b.untyped_storage().data_ptr(), b.data_ptr(),
                      b.data_ptr() + b.numel() * b.element_size()))
    for i, (si, a0, a1) in enumerate(spans):
        for sj, b0, b1 in spans[i + 1:]:
            assert si != sj or a1 <= b0 or b1 <= a0  # no two tensors share bytes
    # the 1200-byte tensor has an allocation of its own; the others fill 1024-byte chunks in
    # order (128 + 0 + 64 + 256 + 64 bytes, then the 800-byte one starts the next)
    storages = {b.untyped_storage().data_ptr() for b in bufs}
    assert len(storages) == 3
    assert bufs[6].untyped_storage().data_ptr() != bufs[5].untyped_storage().data_ptr()
    assert bufs[3].untyped_storage().nbytes() == 1216


class _FakeEvent:
    """A CUDA event's two calls the throttle makes, recorded."""

    def __init__(self, log, name, done=False):
        self.log, self.name, self.done = log, name, done

    def synchronize(self):
        self.log.append(self.name)
        self.done = True

    def query(self):
        return self.done


def test_gradient_copies_in_flight_are_bounded():
    """Backward waits for the oldest gradient copy once more than inflight_buckets *
    bucket_bytes are in flight (the GPU path; its events faked here), and never for the newest
    one; copies found done are dropped without waiting."""
    off = offload(_model(), backend="reference", bucket_bytes=100, inflight_buckets=2, **KW)
    log = []
    off._throttle(_FakeEvent(log, "a"), 100)
    off._throttle(_FakeEvent(log, "b"), 100)
    assert log == [] and off._inflight_bytes == 200  # at the limit: nobody waits
    off._throttle(_FakeEvent(log, "c"), 100)
    assert log == ["a"] and off._inflight_bytes == 200
    off._throttle(_FakeEvent(log, "d"), 500)  # one bucket alone above the limit
    assert log == ["a", "b", "c"] and off._inflight_bytes == 500
    off._throttle(_FakeEvent(log, "e", done=True), 10)
    assert log == ["a", "b", "c", "d"] and off._inflight_bytes == 0  # e was done: dropped
    with pytest.raises(ValueError, match="inflight_buckets must be an int >= 1"):
        offload(_model(), inflight_buckets=0)
