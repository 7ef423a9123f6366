"""kernels/quant_tl.py: q8 moments in Triton (docs/tdclm.md, "Quantized moments (q8)"):
@triton.jit helpers of kernels/tdclm_q8.py for the codebook formulas, decoding, the bracket
search, the stochastic decision, the block maxima and the random words of a q8 tile.

The same bits as kernels/quant.py (the reference: codebooks by float32 products, no table),
with no table lookup and no division an element:

- a codebook value is computed from its code with three float32 products (C_m) or three (C_v);
- the bracket lo (the largest code with C[lo] <= y) is estimated from a cube root (from the
  bits and exp2) or a fourth root (two square roots, the hardware's approximations where
  compiled) and made exact by comparing y with
  the computed value of the neighbouring code: the estimate e = floor(z - 1/2) of the real
  position z (z = 128 + 127 y^(1/3), 128 - 128 |y|^(1/3), 255 y^(1/4)) is lo or lo - 1 as long
  as the root is within 1/2 code of its value (its error: below 0.04 codes for the cube root,
  1e-5 for the fourth root; tests/test_q8_triton.py measures it), so one
  comparison with C[e + 1] decides, and the other bracket value is one more evaluation;
- the decision T * (C[hi] - C[lo]) < y - C[lo] with T = (R16 + 1/2) 2^-16 made by bits.

A q8 tile is [32, NQB, 8]: NQB blocks of 256 elements (the middle axis: one warp a block, so a
block's maximum is reduced within its warp), each as 32 rows of eight (one Philox call a row,
as the bf16 stochastic rounding draws them; kernels/rounding.py).
"""
import triton
import triton.language as tl

from .rounding import _philox, _pick_half

# fl(1/127), fl(1/255) (the float32 quotients; tests/test_q8_triton.py checks their bits,
# 0x3C010204 and 0x3B808081) and 2**-7.
_INV127: tl.constexpr = tl.constexpr(0.007874015718698502)
_INV255: tl.constexpr = tl.constexpr(0.003921568859368563)
_TWO_M7: tl.constexpr = tl.constexpr(0.0078125)
# Below this |y| the cube root's estimate takes this value instead (any y this small lies
# between the two codes next to zero either way).
_TINY: tl.constexpr = tl.constexpr(1e-30)
# log2(1 + x) ~ x (L1 + x (L2 + x L3)) on [0, 1), within 0.0014 (a least-squares fit).
_L1: tl.constexpr = tl.constexpr(1.423495)
_L2: tl.constexpr = tl.constexpr(-0.5877728)
_L3: tl.constexpr = tl.constexpr(0.16559298)
# C_m's zero code; a NaN scale's bits (a NaN constexpr would not equal itself, which Triton
# before 3.2 takes for a global that changed between the kernels that read it).
_ZERO_M: tl.constexpr = tl.constexpr(128)
_NAN_BITS: tl.constexpr = tl.constexpr(0x7FC00000)


@triton.jit
def _cm(c):
    """C_m[c] for int32 codes c in 0..255: -(t t) t with t = (128 - c) 2^-7 below 128, 0 at
    128, (t t) t with t = (c - 128) fl(1/127) above (each product rounded, no fma)."""
    d = c - _ZERO_M
    neg = d < 0
    t = tl.abs(d).to(tl.float32) * tl.where(neg, _TWO_M7, _INV127)
    cube = (t * t) * t
    return tl.where(neg, -cube, cube)


@triton.jit
def _cv(c):
    """C_v[c] for int32 codes c in 0..255: s s with s = t t, t = c fl(1/255)."""
    t = c.to(tl.float32) * _INV255
    s = t * t
    return s * s


@triton.jit
def _cbrt_estimate(a):
    """a^(1/3) for a in [0, 1], to within 3e-4 relative: exp2(log2(a) / 3) with log2 from the
    bits (the exponent, and a cubic in the mantissa within 0.0014) and the hardware's exp2
    (libdevice's log2f would cost some twenty instructions)."""
    b = tl.maximum(a, _TINY).to(tl.int32, bitcast=True)
    x = ((b & 0x007FFFFF) | 0x3F800000).to(tl.float32, bitcast=True) - 1.0
    log2 = ((b >> 23) - 127).to(tl.float32) + x * (_L1 + x * (_L2 + x * _L3))
    return tl.exp2(log2 * 0.3333333432674408)


@triton.jit
def _decision_threshold(words):
    """T = (R16 + 1/2) 2^-16 (exact) from the 16-bit words: 1 + T by its bits, minus 1."""
    return ((words << 7) | 0x3F800040).to(tl.float32, bitcast=True) - 1.0


@triton.jit
def _decide(y, e, ca, cb_of_up, up, words):
    """The code from the bracket estimate: lo = e + up, C[lo] and C[hi] from ca = C[e + 1] and
    cb_of_up (C[min(e + 2, 255)] where up, else C[e]); code = hi iff T (C[hi] - C[lo]) < y - C[lo].
    """
    c_lo = tl.where(up, ca, cb_of_up)
    c_hi = tl.where(up, cb_of_up, ca)
    lo = e + up.to(tl.int32)
    hi = tl.minimum(lo + 1, 255)
    gap = c_hi - c_lo
    scaled = _decision_threshold(words) * gap
    above = y - c_lo
    return tl.where(scaled < above, hi, lo)


@triton.jit
def _code_m(y, words):
    """The stochastic code of m for the normalised value y in [-1, 1]."""
    r = _cbrt_estimate(tl.abs(y))
    z = 128.0 + tl.where(y < 0, -128.0, 127.0) * r
    e = tl.minimum((z - 0.5).to(tl.int32), 254)  # z - 0.5 > -1: truncation is the floor
    ca = _cm(e + 1)
    up = ca <= y
    cb = _cm(tl.where(up, tl.minimum(e + 2, 255), e))
    return _decide(y, e, ca, cb, up, words)


@triton.jit
def _code_v(y, words):
    """The stochastic code of v for the normalised value y in [0, 1]."""
    z = 255.0 * tl.sqrt(tl.sqrt(y))
    e = tl.minimum((z - 0.5).to(tl.int32), 254)
    ca = _cv(e + 1)
    up = ca <= y
    cb = _cv(tl.where(up, tl.minimum(e + 2, 255), e))
    return _decide(y, e, ca, cb, up, words)


@triton.jit
def _block_scale(x, mask):
    """Each block's scale of a [32, NQB, 8] tile, [NQB]: the largest |x| (NaN where the block
    holds a non-finite x), by an integer max of the magnitudes' bits (masked: 0)."""
    mag = x.to(tl.int32, bitcast=True) & 0x7FFFFFFF
    if mask is not None:
        mag = tl.where(mask, mag, 0)
    top = tl.max(tl.max(mag, axis=2), axis=0)
    return tl.where(top >= 0x7F800000, _NAN_BITS, top).to(tl.float32, bitcast=True)


@triton.jit
def _normalise(x, scale, SIGNED: tl.constexpr):
    """y = sign(x) where |x| = scale, else fl(x fl(1 / scale)) (one division a block); 0 where
    the scale is 0 or NaN (those elements store the zero code). Not SIGNED: x >= 0 (v')."""
    special = (scale != scale) | (scale == 0.0)
    r = tl.div_rn(1.0 + scale * 0.0, tl.where(special, 1.0, scale))
    if SIGNED:
        y = tl.where(tl.abs(x) == scale, tl.where(x < 0, -1.0, 1.0), x * r)
    else:
        y = tl.where(x == scale, 1.0, x * r)
    return tl.where(special, 0.0, y)


@triton.jit
def _q8_words(key, g0, STREAM: tl.constexpr, ALIGNED: tl.constexpr, WIDE: tl.constexpr):
    """R16(i, STREAM) of a [32, NQB, 8] tile whose block b starts at global index g0[b]
    (g0: int64 [1, NQB, 1]): rounding stream format 2, as rounding._stream_words16 draws them.
    ALIGNED: every g0 a multiple of 8 (one Philox call a row); else (a row length that 8 does
    not divide, a rare shape) two, each element picking its word from the group it falls in."""
    j = (g0 >> 3) + tl.arange(0, 32)[:, None, None].to(tl.int64)
    lo = j.to(tl.uint32)
    hi = (j >> 32).to(tl.uint32)
    zero = lo * 0
    w0, w1, w2, w3 = _philox(key, lo, hi, zero + STREAM, zero, WIDE)
    c = tl.arange(0, 8)[None, None, :]
    if ALIGNED:
        return _pick_half(w0, w1, w2, w3, c)
    else:
        s = (g0 & 7).to(tl.int32)
        p = (s + c) & 7
        j1 = j + 1
        b0, b1, b2, b3 = _philox(key, j1.to(tl.uint32), (j1 >> 32).to(tl.uint32), zero + STREAM,
                                 zero, WIDE)
        return tl.where(s + c >= 8, _pick_half(b0, b1, b2, b3, p), _pick_half(w0, w1, w2, w3, p))


@triton.jit
def _q8_programs(numel, row_len, BLOCK: tl.constexpr):
    """The programs of a tensor of ``numel`` elements: ceil(numel / BLOCK) for float moments
    (row_len 0), else ceil(rows * ceil(row_len / 256) / (BLOCK / 256)) (whole q8 blocks)."""
    k = tl.maximum(row_len, 1)
    q8 = ((numel // k) * ((k + 255) // 256) + BLOCK // 256 - 1) // (BLOCK // 256)
    return tl.where(row_len > 0, q8, (numel + BLOCK - 1) // BLOCK)
