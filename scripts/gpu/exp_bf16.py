"""Experiment (not part of the package): launch-shape and cache-hint variants of the bf16
AdamW-mode update (bf16 params, grads and moments, round to nearest) on one 256M tensor,
against LuminaMoon's own kernel in the same run; plus per-attribute host costs."""
import statistics
import sys
import time

import torch
import triton
import triton.language as tl

sys.path.insert(0, "python")
from luminamoon import LuminaMoon  # noqa: E402


@triton.jit
def _k(p_ptr, g_ptr, m_ptr, v_ptr, n, lr, b1, b2, eps, rbc1, rbc2, decay,
       BLOCK: tl.constexpr, HINTS: tl.constexpr, FAST: tl.constexpr):
    pid = tl.program_id(0)
    offs = pid.to(tl.int64) * BLOCK + tl.arange(0, BLOCK)
    if HINTS:
        g = tl.load(g_ptr + offs, eviction_policy="evict_first").to(tl.float32)
        m = tl.load(m_ptr + offs, eviction_policy="evict_first").to(tl.float32)
        v = tl.load(v_ptr + offs, eviction_policy="evict_first").to(tl.float32)
        p = tl.load(p_ptr + offs, eviction_policy="evict_first").to(tl.float32)
    else:
        g = tl.load(g_ptr + offs).to(tl.float32)
        m = tl.load(m_ptr + offs).to(tl.float32)
        v = tl.load(v_ptr + offs).to(tl.float32)
        p = tl.load(p_ptr + offs).to(tl.float32)
    m2 = b1 * m + (1.0 - b1) * g
    v2 = b2 * v + (1.0 - b2) * (g * g)
    ms = m2.to(tl.bfloat16)
    vs = v2.to(tl.bfloat16)
    if FAST:
        u = (ms.to(tl.float32) * rbc1) / (tl.sqrt(vs.to(tl.float32) * rbc2) + eps)
    else:
        u = tl.div_rn(ms.to(tl.float32) * rbc1, tl.sqrt_rn(vs.to(tl.float32) * rbc2) + eps)
    q = p * decay - lr * u
    if HINTS:
        tl.store(p_ptr + offs, q.to(tl.bfloat16), cache_modifier=".cs")
        tl.store(m_ptr + offs, ms, cache_modifier=".cs")
        tl.store(v_ptr + offs, vs, cache_modifier=".cs")
    else:
        tl.store(p_ptr + offs, q.to(tl.bfloat16))
        tl.store(m_ptr + offs, ms)
        tl.store(v_ptr + offs, vs)


def timeit(fn, reps=20):
    for _ in range(3):
        fn()
    torch.cuda.synchronize()
    ts = []
    for _ in range(reps):
        a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        a.record()
        fn()
        b.record()
        b.synchronize()
        ts.append(a.elapsed_time(b) * 1e3)
    return statistics.median(ts)


n = 256 * 2 ** 20
dev = "cuda"
p = torch.randn(n, device=dev, dtype=torch.bfloat16)
g = torch.randn(n, device=dev, dtype=torch.bfloat16) * 1e-2
m = torch.zeros(n, device=dev, dtype=torch.bfloat16)
v = torch.zeros(n, device=dev, dtype=torch.bfloat16)
src = torch.empty(4 * 2 ** 30, dtype=torch.uint8, device=dev)
dst = torch.empty_like(src)
copy_us = timeit(lambda: dst.copy_(src), 10)
ceiling = 2 * src.numel() / (copy_us * 1e-6) / 1e12
del src, dst
print(f"copy ceiling {ceiling:.3f} TB/s")
nbytes = 14 * n
for block, warps in ((1024, 4), (512, 2), (1024, 2), (2048, 8), (512, 4), (256, 2)):
    for hints in (0, 1):
        for fast in (0, 1):
            grid = (n // block,)
            us = timeit(lambda: _k[grid](p, g, m, v, n, 1e-3, 0.9, 0.999, 1e-8, 10.0, 1000.0, 0.99999,
                                         BLOCK=block, HINTS=hints, FAST=fast, num_warps=warps,
                                         num_stages=1, enable_fp_fusion=False))
            print(f"plain kernel B{block} w{warps} hints={hints} fast_div={fast}: {us:8.1f} us "
                  f"{nbytes / (us * 1e-6) / 1e12 / ceiling:6.1%}")
del p, g, m, v
# LuminaMoon's kernel, same run
pp = [torch.randn(n, device=dev, dtype=torch.bfloat16)]
pp[0].grad = torch.randn(n, device=dev, dtype=torch.bfloat16) * 1e-2
opt = LuminaMoon(pp, lr=1e-3, weight_decay=0.01, seed=0, clip=0.0, nonfinite="propagate",
                 stochastic_rounding=False, state_dtype=torch.bfloat16, backend="triton")
us = timeit(opt.step)
print(f"LuminaMoon single pass (bf16/bf16 rne): {us:8.1f} us {nbytes / (us * 1e-6) / 1e12 / ceiling:6.1%}")
fused = torch.optim.AdamW(pp, lr=1e-3, weight_decay=0.01, fused=True)
us_f = timeit(fused.step)
print(f"torch AdamW fused bf16: {us_f:8.1f} us; ratio {us_f / us:.3f}x")
del pp, opt, fused
torch.cuda.empty_cache()

# host: per-attribute costs over 148 parameters
import operator  # noqa: E402
params = [torch.nn.Parameter(torch.randn(64, device=dev)) for _ in range(148)]
for q in params:
    q.grad = torch.randn(64, device=dev)
plain = [torch.randn(64, device=dev) for _ in range(148)]
for q in plain:
    q.grad = torch.randn(64, device=dev)
grads = [q.grad for q in params]
G, D, DP = operator.attrgetter("grad"), operator.attrgetter("dtype"), torch.Tensor.data_ptr
for name, fn in [("grad (Parameter)", lambda: list(map(G, params))),
                 ("grad (plain tensor)", lambda: list(map(G, plain))),
                 ("data_ptr params", lambda: tuple(map(DP, params))),
                 ("data_ptr grads", lambda: tuple(map(DP, grads))),
                 ("dtype set", lambda: set(map(D, grads))),
                 ("is_", lambda: all(map(operator.is_, params, params)))]:
    k = 3000
    t0 = time.perf_counter()
    for _ in range(k):
        fn()
    print(f"host {name:22s} {(time.perf_counter() - t0) / k * 1e6:6.1f} us for 148")
