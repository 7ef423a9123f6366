"""kernels/rounding.py: the random streams and the rounding to storage dtypes, as @triton.jit
helpers of the TDCLM kernels (docs/tdclm.md, "Rounding to storage dtypes" and "Random streams").

The same bits as luminamoon.optimizer.rng (the reference) and the C++ engine's cpu_kernels.
"""
import os

import triton
import triton.language as tl

# Kernels run in Triton's interpreter (TRITON_INTERPRET=1, read by Triton at decoration): some
# helpers then take a formula the interpreter runs instead of a hardware instruction.
INTERPRET = os.environ.get("TRITON_INTERPRET", "0") not in ("", "0")


@triton.jit
def _splitmix64(z):
    """splitmix64 on uint64 (wrapping arithmetic), as in docs/tdclm.md."""
    z = z + 0x9E3779B97F4A7C15
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9
    z = (z ^ (z >> 27)) * 0x94D049BB133111EB
    return z ^ (z >> 31)


@triton.jit
def _seed_bits(seed):
    """The seed's 64 bits as uint64 (seed is the int64 two's complement)."""
    # "+ 0" and the int64 cast: the interpreter hands an argument below 2**32 over as 32-bit
    # data (int32, or uint32 typed int64), which they widen; compiled, both fold away.
    return (seed + 0).to(tl.int64).to(tl.uint64, bitcast=True)


@triton.jit
def _seed_tk(seed, t, k):
    """seed_tk = splitmix64(splitmix64(seed + t) + k), uint64; seed is the int64 two's complement."""
    z = _splitmix64(_seed_bits(seed) + t.to(tl.int64).to(tl.uint64, bitcast=True))
    return _splitmix64(z + k.to(tl.int64).to(tl.uint64, bitcast=True))


@triton.jit
def _philox4x32_10(key, c0, c1, c2, c3):
    """Philox4x32-10 of counter (c0, c1, c2, c3) (uint32) under the uint64 key: the function of
    tl.philox(key, c0, c1, c2, c3, 10), the same bits, with each round's two products taken as
    64-bit products of 32-bit words (one wide multiply each, where tl.philox takes a high and a
    low multiply: 99 against 106 SASS instructions an element for bf16 params and moments,
    benchmarks/results/2026-12-01-sass-2.csv). Used where every tensor is 16-bit: see WIDE in
    _stream_words16."""
    k0 = (key & 0xFFFFFFFF).to(tl.uint32)
    k1 = ((key >> 32) & 0xFFFFFFFF).to(tl.uint32)
    for _ in tl.static_range(10):
        pa = c0.to(tl.uint64) * 0xD2511F53
        pb = c2.to(tl.uint64) * 0xCD9E8D57
        n0 = (pb >> 32).to(tl.uint32) ^ c1 ^ k0
        n2 = (pa >> 32).to(tl.uint32) ^ c3 ^ k1
        c1 = pb.to(tl.uint32)
        c3 = pa.to(tl.uint32)
        c0 = n0
        c2 = n2
        k0 = k0 + 0x9E3779B9
        k1 = k1 + 0xBB67AE85
    return c0, c1, c2, c3


@triton.jit
def _philox(key, c0, c1, c2, c3, WIDE: tl.constexpr):
    """Philox4x32-10 of (c0, c1, c2, c3) under key: _philox4x32_10 when WIDE, else tl.philox."""
    if WIDE:
        return _philox4x32_10(key, c0, c1, c2, c3)
    else:
        return tl.philox(key, c0, c1, c2, c3, 10)


@triton.jit
def _pick_half(w0, w1, w2, w3, p):
    """(W_{p>>1} >> (16 * (p & 1))) & 0xFFFF for positions p in 0..7 of a group of eight."""
    w = p >> 1
    word = tl.where(w >= 2, tl.where(w == 3, w3, w2), tl.where(w == 1, w1, w0))
    return (word >> ((p & 1) * 16)) & 0xFFFF


@triton.jit
def _stream_words16(key, g0, STREAM: tl.constexpr, BLOCK: tl.constexpr, ALIGNED: tl.constexpr,
                    WIDE: tl.constexpr = 1):
    """R16(i, STREAM) for the BLOCK consecutive global indices i = g0 .. g0 + BLOCK - 1
    (rounding stream format 2, docs/tdclm.md), as the [BLOCK/8, 8] tile the kernels work on:
    uint32 values below 2**16.

    ALIGNED (g0 a multiple of 8, every unsharded tensor): row r is the group j = g0/8 + r and
    one Philox call serves it; a thread holding a row's elements computes its words once. Else
    (a shard that starts inside a group) each row straddles two groups, takes two calls, and
    each element picks its word from the one it falls in. The kernels take the two paths in
    separate branches, so neither shapes the other's register layout.

    WIDE picks _philox4x32_10 (the kernels whose every tensor is 16-bit) or tl.philox (the
    others, the same bits: with 32-bit tensors in the block, Triton 3.8 and later lay the
    wide products' rows out apart from the elements' and convert between the two through
    shared memory)."""
    G: tl.constexpr = BLOCK // 8
    g0 = g0.to(tl.int64)
    j = (g0 >> 3) + tl.arange(0, G)[:, None].to(tl.int64)
    lo = j.to(tl.uint32)
    hi = (j >> 32).to(tl.uint32)
    zero = lo * 0
    w0, w1, w2, w3 = _philox(key, lo, hi, zero + STREAM, zero, WIDE)
    c = tl.arange(0, 8)[None, :]
    if ALIGNED:
        return _pick_half(w0, w1, w2, w3, c)
    else:
        s = (g0 & 7).to(tl.int32)
        p = (s + c) & 7
        j1 = j + 1
        lo1 = j1.to(tl.uint32)
        hi1 = (j1 >> 32).to(tl.uint32)
        b0, b1, b2, b3 = _philox(key, lo1, hi1, zero + STREAM, zero, WIDE)
        return tl.where(s + c >= 8, _pick_half(b0, b1, b2, b3, p), _pick_half(w0, w1, w2, w3, p))


if INTERPRET:

    @triton.jit
    def _to_bf16_rne(x):
        return _to_bf16_bits(x, 0, 0)

else:

    @triton.jit
    def _to_bf16_rne(x):
        """float32 -> bfloat16, round to nearest even: the hardware conversion (cvt.rn.bf16.f32,
        two values an instruction); the same bits as _to_bf16_bits(x, 0, 0) for every input but
        NaN, which becomes a NaN (0x7FFF) here. (A NaN's payload is not part of the contract:
        torch itself stores 0x7FFF on CUDA, and other patterns on CPUs.)"""
        return x.to(tl.bfloat16, fp_downcast_rounding="rtne")


@triton.jit
def _to_bf16_bits(x, R, SR: tl.constexpr):
    """float32 -> bfloat16: stochastic with the 16-bit values R when SR (finite x), else round to
    nearest even.

    Done on the bits (the same integer operations compiled and interpreted): x adds R under
    SR, or 0x7FFF + lsb for round-to-nearest-even, and keeps the upper half. That is also
    right for +-inf (the upper half is unchanged) and for a carry out of the largest finite
    value (inf, as rounding asks); only NaN, whose payload an addition could carry into the
    sign, is set apart: it becomes 0x7FC0 (any NaN would do: docs/internals.md).
    """
    bits = x.to(tl.uint32, bitcast=True)
    if SR:
        add = R
    else:
        add = 0x7FFF + ((bits >> 16) & 1)
    out = tl.where(x != x, 0x7FC0, (bits + add) >> 16)
    return out.to(tl.uint16).to(tl.bfloat16, bitcast=True)


@triton.jit
def _to_bf16(x, R, SR: tl.constexpr):
    """float32 -> bfloat16: stochastic with word R when SR, else round to nearest even."""
    if SR:
        return _to_bf16_bits(x, R, 1)
    else:
        return _to_bf16_rne(x)


@triton.jit
def _to_storage(x, DTYPE: tl.constexpr, SR: tl.constexpr, key, g0, STREAM: tl.constexpr,
                BLOCK: tl.constexpr, ALIGNED: tl.constexpr, WIDE: tl.constexpr = 1):
    """Round float32 x (the BLOCK elements from global index g0 on) to its storage dtype
    (step 8 of docs/internals.md); returns that dtype. WIDE: _stream_words16's."""
    if DTYPE == 0:
        return x
    elif DTYPE == 1:
        if SR:
            return _to_bf16(x, _stream_words16(key, g0, STREAM, BLOCK, ALIGNED, WIDE), 1)
        else:
            return _to_bf16(x, 0, 0)
    else:
        return x.to(tl.float16)


@triton.jit
def _storage_to_f32(x, DTYPE: tl.constexpr):
    if DTYPE == 1:
        return (x.to(tl.uint16, bitcast=True).to(tl.uint32) << 16).to(tl.float32, bitcast=True)
    else:
        return x.to(tl.float32)


