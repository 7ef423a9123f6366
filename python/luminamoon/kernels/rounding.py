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
def _seed_tk(seed, t, k):
    """seed_tk = splitmix64(splitmix64(seed + t) + k), uint64; seed is the int64 two's complement."""
    # "+ 0": the interpreter hands an argument in [2**31, 2**32) over as uint32 data typed
    # int64, which the addition widens; compiled, it folds away.
    s = (seed + 0).to(tl.int64).to(tl.uint64, bitcast=True)
    z = _splitmix64(s + t.to(tl.int64).to(tl.uint64, bitcast=True))
    return _splitmix64(z + k.to(tl.int64).to(tl.uint64, bitcast=True))


@triton.jit
def _random_word(key, idx, STREAM: tl.constexpr):
    """R(i, stream): word 0 of Philox4x32-10(key, counter = (lo32(i), hi32(i), stream, 0))."""
    idx = idx.to(tl.int64)
    lo = idx.to(tl.uint32)
    hi = (idx >> 32).to(tl.uint32)
    zero = lo * 0
    r0, _r1, _r2, _r3 = tl.philox(key, lo, hi, zero + STREAM, zero, 10)
    return r0


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
    """float32 -> bfloat16: stochastic with word R when SR (finite x), else round to nearest even.

    Done on the bits (the same integer operations compiled and interpreted): finite x adds
    (R & 0xFFFF) under SR, or 0x7FFF + lsb for round-to-nearest-even, and keeps the upper half;
    +-inf keeps its upper half; NaN becomes 0x7FC0 (any NaN would do: docs/internals.md).
    """
    bits = x.to(tl.uint32, bitcast=True)
    finite = (bits & 0x7F800000) != 0x7F800000
    if SR:
        add = R & 0xFFFF
    else:
        add = 0x7FFF + ((bits >> 16) & 1)
    rounded = (bits + add) >> 16
    is_nan = (bits & 0x7FFFFFFF) > 0x7F800000
    special = tl.where(is_nan, 0x7FC0, bits >> 16)
    out = tl.where(finite, rounded, special)
    return out.to(tl.uint16).to(tl.bfloat16, bitcast=True)


@triton.jit
def _to_bf16(x, R, SR: tl.constexpr):
    """float32 -> bfloat16: stochastic with word R when SR, else round to nearest even."""
    if SR:
        return _to_bf16_bits(x, R, 1)
    else:
        return _to_bf16_rne(x)


@triton.jit
def _to_storage(x, DTYPE: tl.constexpr, SR: tl.constexpr, key, idx, STREAM: tl.constexpr):
    """Round float32 x to its storage dtype (step 8 of docs/internals.md); returns that dtype."""
    if DTYPE == 0:
        return x
    elif DTYPE == 1:
        if SR:
            return _to_bf16(x, _random_word(key, idx, STREAM), 1)
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


