"""optimizer/rng.py: the random streams of stochastic rounding, in plain PyTorch integer ops.

This module is the reference for the bits every backend draws (docs/tdclm.md, "Random
streams", format 2: one Philox call serves eight consecutive elements of one stream):

    seed_tk = splitmix64(splitmix64(seed + t) + k)      (uint64, wrapping)
    j = i >> 3,  w = (i >> 1) & 3,  h = i & 1
    (W0, W1, W2, W3) = Philox4x32-10(key = seed_tk, counter = (lo32(j), hi32(j), s, 0))
    R16(i, s) = (W_w >> (16 * h)) & 0xFFFF

torch has no unsigned 32/64-bit arithmetic that works on every device, so uint32 words are
held in int64 tensors (values in [0, 2**32)) and a uint64 is held as a pair of such words
(lo, hi). Products are formed from 16-bit halves so that no intermediate leaves the positive
int64 range: nothing here relies on signed overflow, and every right shift acts on a
non-negative value (so arithmetic and logical shifts agree).

Public helpers:
  philox4x32_10(key, c0, c1, c2, c3)     the four output words (int64 tensors of uint32)
  splitmix64(z)                          the scalar mixer on Python ints
  rounding_seed(seed, t, k)              seed_tk on Python ints
  random_words(seed, t, k, index, stream) R16 for every element index (t an int or a tensor)
  stream_words(key, first, count, stream, device)  R16 for a run of consecutive indices, one
                                         Philox call per group of eight
  round_to_bf16(x, words)                float32 -> bfloat16, stochastic where words are given
"""
from __future__ import annotations

from typing import Optional, Tuple, Union

import torch

__all__ = [
    "philox4x32_10",
    "splitmix64",
    "rounding_seed",
    "random_words",
    "stream_words",
    "round_to_bf16",
]

MASK32 = 0xFFFFFFFF
MASK64 = 0xFFFFFFFFFFFFFFFF

# Philox4x32 constants (Salmon et al., "Parallel random numbers: as easy as 1, 2, 3", SC'11),
# the same words as triton.language.random.philox_impl.
PHILOX_ROUND_A = 0xD2511F53
PHILOX_ROUND_B = 0xCD9E8D57
PHILOX_KEY_A = 0x9E3779B9
PHILOX_KEY_B = 0xBB67AE85
PHILOX_ROUNDS = 10

# splitmix64 constants (Steele, Lea, Flood, "Fast splittable pseudorandom number generators").
SPLITMIX_GAMMA = 0x9E3779B97F4A7C15
SPLITMIX_MUL1 = 0xBF58476D1CE4E5B9
SPLITMIX_MUL2 = 0x94D049BB133111EB

# Stream numbers of the counter's third word.
STREAM_PARAM = 0
STREAM_EXP_AVG = 1
STREAM_EXP_AVG_SQ = 2
# q8 moments (docs/tdclm.md, "Quantized moments (q8)"): the requantization of m and of v.
STREAM_Q8_EXP_AVG = 3
STREAM_Q8_EXP_AVG_SQ = 4

Word = Union[int, torch.Tensor]


# --------------------------------------------------------------------------------------------
# scalar (host) form
# --------------------------------------------------------------------------------------------
def splitmix64(z: int) -> int:
    """splitmix64 of a 64-bit unsigned integer (a Python int in [0, 2**64))."""
    z = (int(z) + SPLITMIX_GAMMA) & MASK64
    z = ((z ^ (z >> 30)) * SPLITMIX_MUL1) & MASK64
    z = ((z ^ (z >> 27)) * SPLITMIX_MUL2) & MASK64
    return z ^ (z >> 31)


def rounding_seed(seed: int, t: int, k: int) -> int:
    """seed_tk = splitmix64(splitmix64(seed + t) + k), all uint64 with wrap-around."""
    return splitmix64((splitmix64((int(seed) + int(t)) & MASK64) + int(k)) & MASK64)


# --------------------------------------------------------------------------------------------
# 32-bit word arithmetic on int64 tensors
# --------------------------------------------------------------------------------------------
def _mulhilo32(a: int, x: Word) -> Tuple[Word, Word]:
    """(hi32, lo32) of the 64-bit product of the constant ``a`` and the uint32 word(s) ``x``.

    ``x`` is split into 16-bit halves so that each partial product stays below 2**48.
    """
    if not isinstance(x, torch.Tensor):
        prod = (a & MASK32) * (int(x) & MASK32)
        return prod >> 32, prod & MASK32
    x_lo = x & 0xFFFF
    x_hi = x >> 16
    p_lo = x_lo * a  # < 2**48
    p_hi = x_hi * a  # < 2**48
    mid = p_lo + ((p_hi & 0xFFFF) << 16)  # < 2**49
    lo = mid & MASK32
    hi = (p_hi >> 16) + (mid >> 32)  # < 2**32
    return hi, lo


def _as_word(c: Word) -> Word:
    if isinstance(c, torch.Tensor):
        return c.to(torch.int64) & MASK32
    return int(c) & MASK32


def philox4x32_10(key, c0: Word, c1: Word, c2: Word, c3: Word) -> Tuple[Word, Word, Word, Word]:
    """Philox4x32-10: the four uint32 output words for counter (c0, c1, c2, c3).

    ``key`` is the 64-bit key as a Python int (split into lo and hi 32-bit words as
    triton.language.philox does), or a pair ``(lo, hi)`` of uint32 words that may be 0-dim
    int64 tensors (a key computed on the device). Counter words are Python ints or int64
    tensors holding uint32 values; tensors broadcast. The result words are int64 tensors
    (Python ints when every input is a Python int).
    """
    if isinstance(key, tuple):
        k0, k1 = key
    else:
        key = int(key) & MASK64
        k0, k1 = key & MASK32, key >> 32
    c0, c1, c2, c3 = (_as_word(c) for c in (c0, c1, c2, c3))
    for _ in range(PHILOX_ROUNDS):
        hi_b, lo_b = _mulhilo32(PHILOX_ROUND_B, c2)
        hi_a, lo_a = _mulhilo32(PHILOX_ROUND_A, c0)
        c0, c1, c2, c3 = hi_b ^ c1 ^ k0, lo_b, hi_a ^ c3 ^ k1, lo_a
        k0 = (k0 + PHILOX_KEY_A) & MASK32
        k1 = (k1 + PHILOX_KEY_B) & MASK32
    return c0, c1, c2, c3


# --------------------------------------------------------------------------------------------
# uint64 as (lo, hi) pairs of uint32 words held in int64 tensors (seed_tk on the device)
# --------------------------------------------------------------------------------------------
def _u64_split(z: int) -> Tuple[int, int]:
    z &= MASK64
    return z & MASK32, z >> 32


def _u64_add(a: Tuple[torch.Tensor, torch.Tensor], b: Tuple[Word, Word]):
    lo = a[0] + b[0]
    hi = (a[1] + b[1] + (lo >> 32)) & MASK32
    return lo & MASK32, hi


def _u64_xorshift(a, s: int):
    """a ^ (a >> s) for 0 < s < 32."""
    lo, hi = a
    shifted_lo = (lo >> s) | ((hi << (32 - s)) & MASK32)
    shifted_hi = hi >> s
    return lo ^ shifted_lo, hi ^ shifted_hi


def _u64_mul_const(a, c: int):
    """a * c mod 2**64 for a constant c."""
    lo, hi = a
    c_lo, c_hi = _u64_split(c)
    p_hi, p_lo = _mulhilo32(c_lo, lo)  # lo * c_lo, full 64 bits
    _, cross1 = _mulhilo32(c_hi, lo)  # (lo * c_hi) mod 2**32
    _, cross2 = _mulhilo32(c_lo, hi)  # (hi * c_lo) mod 2**32
    return p_lo, (p_hi + cross1 + cross2) & MASK32


def _splitmix64_words(a):
    a = _u64_add(a, _u64_split(SPLITMIX_GAMMA))
    a = _u64_mul_const(_u64_xorshift(a, 30), SPLITMIX_MUL1)
    a = _u64_mul_const(_u64_xorshift(a, 27), SPLITMIX_MUL2)
    return _u64_xorshift(a, 31)


def rounding_seed_words(seed: int, t: torch.Tensor, k: int) -> Tuple[torch.Tensor, torch.Tensor]:
    """seed_tk as (lo, hi) uint32 words, for a step ``t`` held in a device int64 tensor.

    The same value as :func:`rounding_seed`, computed where ``t`` lives so that a step whose
    count was decided on the device needs no host synchronisation.
    """
    t = t.to(torch.int64)
    t_words = (t & MASK32, (t >> 32) & MASK32)  # t >= 0: the shift is logical
    z = _u64_add(t_words, _u64_split(seed))
    z = _splitmix64_words(z)
    z = _u64_add(z, _u64_split(k))
    return _splitmix64_words(z)


def _key_words(seed: int, t: Union[int, torch.Tensor], k: int):
    if isinstance(t, torch.Tensor):
        return rounding_seed_words(seed, t, k)
    return _u64_split(rounding_seed(seed, t, k))


def _halves(words: Tuple[Word, Word, Word, Word], w: torch.Tensor, h: torch.Tensor
            ) -> torch.Tensor:
    """(W_w >> (16 h)) & 0xFFFF, elementwise, for word selectors w in 0..3 and halves h."""
    w0, w1, w2, w3 = words
    word = torch.where(w >= 2, torch.where(w == 3, w3, w2), torch.where(w == 1, w1, w0))
    return (word >> (16 * h)) & 0xFFFF


def random_words(seed: int, t: Union[int, torch.Tensor], k: int, index: torch.Tensor,
                 stream: int) -> torch.Tensor:
    """R16(i, stream) for every global element index ``i`` in ``index`` (an int64 tensor).

    ``t`` is the step being applied (the stored count + 1): a Python int or a 0-dim int64
    tensor (on ``index``'s device). Returns an int64 tensor of 16-bit values, shaped as
    ``index``. (One Philox call per element here: a check of the definition; the backends
    and :func:`stream_words` call it once per group of eight.)
    """
    if not isinstance(index, torch.Tensor) or index.dtype != torch.int64:
        raise TypeError("random_words: index must be an int64 tensor of global element indices")
    key = _key_words(seed, t, k)
    j = index >> 3
    words = philox4x32_10(key, j & MASK32, (j >> 32) & MASK32, int(stream), 0)
    words = tuple(wd if isinstance(wd, torch.Tensor) else torch.tensor(wd, dtype=torch.int64)
                  for wd in words)
    out = _halves(words, (index >> 1) & 3, index & 1)
    return out.expand_as(index) if out.shape != index.shape else out


def stream_words(key, first: int, count: int, stream: int, device) -> torch.Tensor:
    """R16(i, stream) for i in [first, first + count): an int64 tensor of ``count`` 16-bit values
    on ``device``, from one Philox call per group of eight indices.

    ``key``: seed_tk as a Python int, or a (lo, hi) pair of uint32 words (0-dim int64 tensors
    computed on the device, as rounding_seed_words gives). ``first`` and ``count`` are host
    integers (a tensor's elem_offset and numel): nothing here waits for the device.
    """
    if count <= 0:
        return torch.zeros(0, dtype=torch.int64, device=device)
    j0, j1 = first >> 3, (first + count - 1) >> 3
    j = torch.arange(j0, j1 + 1, dtype=torch.int64, device=device)
    w0, w1, w2, w3 = (wd if isinstance(wd, torch.Tensor) else torch.tensor(wd, device=device)
                      for wd in philox4x32_10(key, j & MASK32, (j >> 32) & MASK32,
                                              int(stream), 0))
    lo = lambda x: x & 0xFFFF  # noqa: E731
    hi = lambda x: x >> 16  # noqa: E731
    # the eight values of each group, in index order: (w, h) = (0,0) (0,1) (1,0) ... (3,1)
    group = torch.stack([lo(w0), hi(w0), lo(w1), hi(w1), lo(w2), hi(w2), lo(w3), hi(w3)], dim=1)
    start = first & 7
    return group.reshape(-1)[start:start + count]


# --------------------------------------------------------------------------------------------
# rounding to storage dtypes
# --------------------------------------------------------------------------------------------
def round_to_bf16(x: torch.Tensor, words: Optional[torch.Tensor]) -> torch.Tensor:
    """float32 ``x`` to bfloat16.

    With ``words`` (int64 tensor of 16-bit values, shaped as ``x``): finite elements round
    stochastically, ``(bits(x) + R16) >> 16``; non-finite ones round to nearest even.
    Without ``words``: round to nearest even everywhere.
    """
    if x.dtype != torch.float32:
        raise TypeError(f"round_to_bf16 expects float32 input, got {x.dtype}")
    nearest = x.to(torch.bfloat16)
    if words is None:
        return nearest
    bits = x.view(torch.int32).to(torch.int64) & MASK32
    rounded = ((bits + (words & 0xFFFF)) >> 16) & 0xFFFF  # bits < 0xFF800000 when finite
    # Back to a bfloat16 view: the 16-bit pattern as a signed int16.
    as_int16 = torch.where(rounded >= 0x8000, rounded - 0x10000, rounded).to(torch.int16)
    stochastic = as_int16.view(torch.bfloat16)
    return torch.where(torch.isfinite(x), stochastic, nearest)


def round_to_storage(x: torch.Tensor, dtype: torch.dtype,
                     words: Optional[torch.Tensor]) -> torch.Tensor:
    """float32 ``x`` rounded to the storage ``dtype`` (words: stochastic bf16 rounding or None)."""
    if dtype == torch.float32:
        return x
    if dtype == torch.bfloat16:
        return round_to_bf16(x, words)
    return x.to(dtype)  # float16 (and float64, exact): round to nearest even
