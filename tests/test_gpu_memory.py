"""The step inside backward and CPU offload on a CUDA GPU (marker ``gpu``).

1. step_in_backward with the triton backend (and aot, where a bundle is given) is bitwise the
   normal step: same losses, same parameters (fp32 and bf16 parameters, clip on).
2. Its peak memory is lower than the normal step's by at least the gradients' size (less the
   buckets in flight), on a model whose activations are small beside its gradients.
3. offload (the CPU engine steps host copies) is bitwise the same math done by hand (gradients
   to the host, LuminaMoon(backend="cpu") there, parameters back), with and without the step in
   backward, and within float32 rounding of the normal triton step; it keeps no optimizer
   state on the GPU.
4. A larger model (1.07 B parameters, fp32: its state alone 8.6 GB) trains with offload and the
   step in backward, its GPU peak below params + activations + a few buckets.
"""
from __future__ import annotations

import pytest
import torch

from conftest import require

pytestmark = pytest.mark.gpu

require("cuda", "compiled triton")  # the normal step on CUDA runs the triton backend

from luminamoon import LuminaMoon, offload, step_in_backward  # noqa: E402

KW = dict(lr=1e-3, seed=11, clip=1.0)
DEV = torch.device("cuda")


def _mlp(width, depth, dtype=torch.float32, seed=0):
    torch.manual_seed(seed)
    layers = []
    for _ in range(depth):
        layers += [torch.nn.Linear(width, width), torch.nn.GELU()]
    layers.append(torch.nn.LayerNorm(width))
    return torch.nn.Sequential(*layers).to(device=DEV, dtype=dtype)


def _batches(width, n, dtype, rows=4):
    gen = torch.Generator(device=DEV).manual_seed(1)
    return [(torch.randn(rows, width, device=DEV, generator=gen, dtype=dtype),
             torch.randn(rows, width, device=DEV, generator=gen, dtype=dtype)) for _ in range(n)]


def _loss(model, x, y):
    return ((model(x).float() - y.float()) ** 2).mean()


def _normal(model, opt, data):
    out = []
    for x, y in data:
        loss = _loss(model, x, y)
        loss.backward()
        opt.step()
        opt.zero_grad()
        out.append(loss.item())
    return out


def _hooked(model, runner, data):
    out = []
    for x, y in data:
        loss = _loss(model, x, y)
        loss.backward()
        runner.step()
        out.append(loss.item())
    if hasattr(runner, "wait"):
        runner.wait()
    return out


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=["fp32", "bf16"])
@pytest.mark.parametrize("backend", ["triton", "aot"])
def test_in_backward_is_bitwise_the_normal_step(backend, dtype, request):
    if backend == "aot":
        bundle = request.getfixturevalue("aot_bundle")
        kw = dict(backend="aot", aot_bundle=bundle)
    else:
        kw = dict(backend="triton")
    m1, m2 = _mlp(256, 4, dtype), _mlp(256, 4, dtype)
    data = _batches(256, 5, dtype)
    opt = LuminaMoon(m1.parameters(), **kw, **KW)
    ib = step_in_backward(m2, bucket_bytes=300_000, **kw, **KW)
    assert _normal(m1, opt, data) == _hooked(m2, ib, data)
    assert all(torch.equal(a, b) for a, b in zip(m1.parameters(), m2.parameters()))


def _peak(fn, *args) -> int:
    torch.cuda.synchronize()
    torch.cuda.reset_peak_memory_stats()
    fn(*args)
    torch.cuda.synchronize()
    return torch.cuda.max_memory_allocated()


def test_in_backward_saves_the_gradients():
    width, depth, bucket = 2048, 8, 4 * 2**20
    data = _batches(width, 3, torch.float32)
    grads = 0
    # held at once: the bucket being stepped (a weight of 16.8 MB is a bucket of its own), the
    # one before it (kept until its finite flags are read, one bucket later), the gradient
    # autograd writes meanwhile, and one for the allocator's rounding
    margin = 4 * width * width * 4
    peaks = {}
    for mode in ("normal", "in_backward"):
        model = _mlp(width, depth)
        grads = sum(p.numel() * 4 for p in model.parameters())
        if mode == "normal":
            opt = LuminaMoon(model.parameters(), **KW)
            _normal(model, opt, data[:1])  # state created
            peaks[mode] = _peak(_normal, model, opt, data[1:])
        else:
            ib = step_in_backward(model, bucket_bytes=bucket, **KW)
            _hooked(model, ib, data[:1])
            peaks[mode] = _peak(_hooked, model, ib, data[1:])
        del model
        torch.cuda.empty_cache()
    assert peaks["normal"] - peaks["in_backward"] >= grads - margin, (peaks, grads)


def _by_hand(model, host_opt, hosts, data):
    """The math offload does, written out: grads to the host, the CPU engine, params back."""
    out = []
    for x, y in data:
        loss = _loss(model, x, y)
        loss.backward()
        for p, h in zip(model.parameters(), hosts):
            h.grad = p.grad.to("cpu", h.dtype)
            p.grad = None
        host_opt.step()
        host_opt.zero_grad()
        with torch.no_grad():
            for p, h in zip(model.parameters(), hosts):
                p.copy_(h)
        out.append(loss.item())
    return out


@pytest.mark.parametrize("in_backward", [False, True], ids=["step", "in-backward"])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=["fp32", "bf16"])
def test_offload_is_the_cpu_engine_step(in_backward, dtype):
    m1, m2, m3 = (_mlp(512, 4, dtype) for _ in range(3))
    data = _batches(512, 5, dtype)
    hosts = [p.detach().cpu().clone() for p in m1.parameters()]
    host_opt = LuminaMoon(hosts, backend="cpu", **KW)
    l1 = _by_hand(m1, host_opt, hosts, data)
    off = offload(m2, in_backward=in_backward, bucket_bytes=1 << 20, **KW)
    l2 = _hooked(m2, off, data)
    assert l1 == l2
    assert all(torch.equal(a, b) for a, b in zip(m1.parameters(), m2.parameters()))
    # against the normal step on the GPU (triton): within float32 rounding, not bitwise
    opt = LuminaMoon(m3.parameters(), backend="triton", **KW)
    l3 = _normal(m3, opt, data)
    tol = 1e-5 if dtype == torch.float32 else 2e-2
    assert l3 == pytest.approx(l2, rel=tol)


def test_offload_keeps_no_state_on_the_gpu():
    width, depth = 2048, 8
    data = _batches(width, 3, torch.float32)
    peaks = {}
    for mode in ("normal", "offload"):
        model = _mlp(width, depth)
        state = sum(p.numel() * 8 for p in model.parameters())
        if mode == "normal":
            opt = LuminaMoon(model.parameters(), **KW)
            _normal(model, opt, data[:1])
            peaks[mode] = _peak(_normal, model, opt, data[1:])
        else:
            off = offload(model, in_backward=True, bucket_bytes=4 << 20, **KW)
            _hooked(model, off, data[:1])
            peaks[mode] = _peak(_hooked, model, off, data[1:])
            off.remove()
        del model
        torch.cuda.empty_cache()
    # offload holds the gradients waiting for their copy (at most inflight_buckets = 4 buckets
    # of 4 MiB, and at least one: a weight of 16.8 MB is a bucket of its own), the one being
    # copied, the one autograd writes meanwhile, and one for the allocator's rounding
    margin = 5 * (4 << 20) + 4 * width * width * 4
    assert peaks["normal"] - peaks["offload"] >= state - margin, (peaks, state)


def test_a_larger_model_trains_with_offload():
    width, depth = 8192, 16  # 16 x 67.1 M = 1.07 B parameters, fp32: 4.3 GB, state 8.6 GB
    model = _mlp(width, depth)
    params = sum(p.numel() * 4 for p in model.parameters())
    off = offload(model, in_backward=True, **KW)
    data = _batches(width, 3, torch.float32)
    torch.cuda.reset_peak_memory_stats()
    losses = _hooked(model, off, data)
    peak = torch.cuda.max_memory_allocated()
    assert all(torch.isfinite(torch.tensor(losses)))
    # params, a few layers' gradients in flight (each weight of 268 MB is a bucket of its own;
    # inflight_buckets bounds them), activations
    assert peak < params + 4 * width * width * 4 + 256 * 2**20, (peak, params)
    assert int(off.optimizer.state[off.optimizer.param_groups[0]["params"][0]]["step"]) == 3


@pytest.mark.parametrize("runner", ["in_backward", "offload-in-backward"])
def test_a_nonfinite_gradient_skips_only_its_tensor_on_the_gpu(runner):
    model = _mlp(256, 3)
    bad = model[2].weight
    handle = bad.register_hook(lambda g: g * float("nan"))
    if runner == "in_backward":
        run = step_in_backward(model, bucket_bytes=10**9, **KW)
    else:
        run = offload(model, in_backward=True, bucket_bytes=10**9, **KW)
    before = {n: p.detach().clone() for n, p in model.named_parameters()}
    x, y = _batches(256, 1, torch.float32)[0]
    _loss(model, x, y).backward()
    if hasattr(run, "wait"):
        run.wait()
    handle.remove()
    for n, p in model.named_parameters():
        assert torch.equal(p, before[n]) == (p is bad), n
    assert int(run.skipped_steps) == 1
