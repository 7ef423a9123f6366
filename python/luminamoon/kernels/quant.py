"""kernels/quant.py: q8 moments (docs/tdclm.md, "Quantized moments (q8)"): the codebooks, the
block layout, and quantization and dequantization in plain PyTorch.

The one place the codebooks are written in Python: the reference backend and the kernels take
them from here (the C++ engine writes the same formulas in engine/cpu_quant.cpp, and a contract
test compares the 256 float32 values). Pure torch and the standard library: importing this
module needs neither Triton nor the compiled module, and does nothing.

Codebook values are defined as real numbers; the stored float32 is the float32 nearest to the
real value (computed here in float64 and rounded once: tests/test_q8.py checks that no value
lies within 2**-40 relative of a float32 rounding midpoint, so the double rounding is exact).
"""
from __future__ import annotations

import functools
import math
from typing import Callable, Dict, List, Optional, Tuple

import numpy as np
import torch

__all__ = ["Q8", "BLOCK", "MIN_NUMEL", "CANDIDATES", "CHOSEN", "q8_eligible", "block_rows",
           "scale_shape", "codebook", "zero_code", "block_scales", "expand_scales",
           "block_reciprocals", "FLOAT32_FORMULAS",
           "quantize", "quantize_nearest", "dequantize"]

Q8 = "q8"
# Elements a block: one float32 scale per 256 one-byte codes, 4/256 = 0.016 B a parameter and
# moment (bitsandbytes' and torchao's block size too).
BLOCK = 256
# Parameters of fewer elements (whole tensor) keep float32 moments: their state is small and
# biases and norms are where 8-bit moments hurt most.
MIN_NUMEL = 4096


# --------------------------------------------------------------------------------------------
# the candidate codebooks, as real numbers (Python floats in float64)
# --------------------------------------------------------------------------------------------
def _dynamic_magnitudes(signed: bool) -> List[float]:
    """bitsandbytes' dynamic-exponent magnitudes: for i = 0..6 the midpoints of 2**b equal
    steps of [0.1, 1] scaled by 10**(i-6), b = i (signed) or i + 1 (unsigned):
    10**(i-6) * (0.1 + 0.9 * (j + 1/2) / 2**b), j = 0 .. 2**b - 1."""
    out = []
    for i in range(7):
        n = 2 ** (i if signed else i + 1)
        out += [10.0 ** (i - 6) * (0.1 + 0.9 * (j + 0.5) / n) for j in range(n)]
    return out


def dynamic_signed() -> List[float]:
    """0, the 127 magnitudes with both signs, and +-1; the smallest negative value
    -0.55e-6 gives its place to -1 (256 values, -1 and 1 both codes)."""
    mags = _dynamic_magnitudes(True)
    negative = [-x for x in mags if x != min(mags)] + [-1.0]
    return sorted(negative + [0.0] + mags + [1.0])


def dynamic_unsigned() -> List[float]:
    """0, the 254 magnitudes, 1."""
    return sorted([0.0] + _dynamic_magnitudes(False) + [1.0])


def power_signed(p: int) -> List[float]:
    """code c < 128: -((128 - c) / 128)**p; c = 128: 0; c > 128: ((c - 128) / 127)**p."""
    return ([-((128 - c) / 128) ** p for c in range(128)] + [0.0]
            + [((c - 128) / 127) ** p for c in range(129, 256)])


def power_unsigned(p: int) -> List[float]:
    """code c: (c / 255)**p."""
    return [(c / 255) ** p for c in range(256)]


# name -> (the signed codebook of m, the unsigned codebook of v), as real numbers.
CANDIDATES: Dict[str, Tuple[Callable[[], List[float]], Callable[[], List[float]]]] = {
    "dynamic": (dynamic_signed, dynamic_unsigned),
    "power-3-4": (lambda: power_signed(3), lambda: power_unsigned(4)),
    "power-2-4": (lambda: power_signed(2), lambda: power_unsigned(4)),
}
# The codebooks q8 stores with, chosen by measurement on the demo's model
# (benchmarks/results/2026-12-06-q8-codebooks.md).
CHOSEN = "power-3-4"


def power_3_signed_f32(c: np.ndarray) -> np.ndarray:
    """The chosen C_m in float32 operations (each product rounded to nearest, no fused
    multiply-add), for int codes ``c``: c < 128: t = (128 - c) * 2**-7, -(t * t) * t (exact);
    c = 128: 0; c > 128: t = (c - 128) * fl(1/127), (t * t) * t."""
    f = np.float32
    c = np.asarray(c, dtype=np.int64)
    neg = (f(1) * (128 - c).astype(f)) * f(2.0 ** -7)
    t = (c - 128).astype(f) * (f(1) / f(127))
    t = np.where(c < 128, neg, t).astype(f)
    cube = (t * t).astype(f) * t
    return np.where(c < 128, -cube, np.where(c == 128, f(0), cube)).astype(f)


def power_4_unsigned_f32(c: np.ndarray) -> np.ndarray:
    """The chosen C_v in float32 operations, for int codes ``c``: t = c * fl(1/255),
    s = t * t, s * s."""
    f = np.float32
    t = np.asarray(c, dtype=np.int64).astype(f) * (f(1) / f(255))
    s = (t * t).astype(f)
    return (s * s).astype(f)


# The codebooks defined by float32 operations rather than as the float32 nearest to a real
# number: every backend computes them with a few multiplications instead of a table lookup
# (docs/tdclm.md). Their values are within 6 float32 ulps of the real formulas'.
FLOAT32_FORMULAS: Dict[str, Tuple[Callable[[np.ndarray], np.ndarray],
                                  Callable[[np.ndarray], np.ndarray]]] = {
    "power-3-4": (power_3_signed_f32, power_4_unsigned_f32),
}


@functools.lru_cache(maxsize=None)
def _table(name: str, signed: bool) -> np.ndarray:
    if name not in CANDIDATES:
        raise ValueError(f"unknown q8 codebook {name!r}; the candidates are {sorted(CANDIDATES)}")
    if name in FLOAT32_FORMULAS:
        table = FLOAT32_FORMULAS[name][0 if signed else 1](np.arange(256)).astype(np.float32)
        table.setflags(write=False)
        return table
    values = CANDIDATES[name][0 if signed else 1]()
    table = np.asarray(values, dtype=np.float64).astype(np.float32)  # nearest float32, once
    table.setflags(write=False)
    return table


def real_values(name: str, signed: bool) -> List[float]:
    """The codebook's 256 values as real numbers (float64), before rounding to float32 (the
    codebooks of FLOAT32_FORMULAS are computed in float32 instead, within a few ulps)."""
    return list(CANDIDATES[name][0 if signed else 1]())


def codebook(signed: bool, name: Optional[str] = None, device=None) -> torch.Tensor:
    """The 256 float32 values of the signed (m) or unsigned (v) codebook, sorted ascending."""
    t = torch.from_numpy(_table(name or CHOSEN, signed).copy())
    return t if device is None else t.to(device)


def zero_code(signed: bool, name: Optional[str] = None) -> int:
    """The code whose value is 0 (what a fresh or all-zero block stores)."""
    return int(np.flatnonzero(_table(name or CHOSEN, signed) == 0)[0])


# --------------------------------------------------------------------------------------------
# which tensors, and their blocks
# --------------------------------------------------------------------------------------------
def q8_eligible(global_numel: int) -> bool:
    """Whether a parameter of ``global_numel`` elements (the whole, unsharded tensor) keeps q8
    moments; a smaller one keeps float32 moments."""
    return int(global_numel) >= MIN_NUMEL


def block_rows(shape) -> Tuple[int, int]:
    """(R, K): a parameter of global ``shape`` read as R = d0 rows of K = n / d0 elements
    (a 1-D parameter: one row of n)."""
    shape = tuple(int(d) for d in shape)
    n = math.prod(shape)
    if len(shape) <= 1 or shape[0] == 0:
        return 1, n
    return shape[0], n // shape[0]


def scale_shape(shape) -> Tuple[int, ...]:
    """The shape of a moment's float32 scales: (R, ceil(K/256)), (ceil(n/256),) for 1-D."""
    rows, k = block_rows(shape)
    nb = -(-k // BLOCK)
    return (nb,) if len(tuple(shape)) <= 1 else (rows, nb)


def _blocks(x: torch.Tensor, rows: int, k: int) -> torch.Tensor:
    """Flat ``x`` of rows * k elements as (rows, ceil(k/256), 256), the tail of each row padded
    with zeros."""
    x = x.reshape(rows, k)
    pad = -k % BLOCK
    if pad:
        x = torch.nn.functional.pad(x, (0, pad))
    return x.reshape(rows, -1, BLOCK)


def block_scales(x: torch.Tensor, rows: int, k: int) -> torch.Tensor:
    """Each block's new scale, (rows, ceil(k/256)) float32: the largest |x| of the block, NaN
    where the block holds a non-finite value (only under nonfinite="propagate")."""
    blocks = _blocks(x, rows, k)
    scales = blocks.abs().amax(dim=-1)
    finite = torch.isfinite(blocks).all(dim=-1)
    return torch.where(finite, scales, torch.full_like(scales, math.nan))


def expand_scales(scales: torch.Tensor, rows: int, k: int) -> torch.Tensor:
    """The scale of every element, flat (rows * k), from scales of shape (rows, nb) or (nb,)."""
    scales = scales.reshape(rows, -1)
    return scales.repeat_interleave(BLOCK, dim=1)[:, :k].reshape(-1)


def dequantize(codes: torch.Tensor, scales: torch.Tensor, table: torch.Tensor) -> torch.Tensor:
    """value = scale * codebook[code], float32; ``scales`` one per element (expand_scales)."""
    return scales * table[codes.reshape(-1).to(torch.int64)]


def _brackets(y: torch.Tensor, table: torch.Tensor):
    """(lo, C[lo], C[hi]) for y in [table[0], 1]: lo is the largest code whose value is <= y,
    hi = min(lo + 1, 255)."""
    lo = torch.searchsorted(table, y, right=True) - 1
    lo = lo.clamp(0, table.numel() - 1)
    hi = (lo + 1).clamp(max=table.numel() - 1)
    return lo, table[lo], table[hi]


def block_reciprocals(scales: torch.Tensor) -> torch.Tensor:
    """fl(1 / scale) of each block (float32 division, once a block); 1 where the scale is 0 or
    not finite (those blocks store the zero code)."""
    special = ~(scales > 0) | ~torch.isfinite(scales)
    safe = torch.where(special, torch.ones_like(scales), scales)
    return torch.where(special, torch.ones_like(scales), 1.0 / safe)


def _normalised(x: torch.Tensor, scales: torch.Tensor) -> Tuple[torch.Tensor, torch.Tensor]:
    """(y, whether the element is coded as zero: scale 0, or a NaN scale):
    y = sign(x) where |x| = scale (the block's largest stays exact), else fl(x * fl(1/scale))."""
    special = ~(scales > 0) | ~torch.isfinite(scales)
    y = x * block_reciprocals(scales)
    y = torch.where(x.abs() == scales, torch.sign(x), y)
    return torch.where(special, torch.zeros_like(x), y), special


def quantize(x: torch.Tensor, scales: torch.Tensor, table: torch.Tensor, words: torch.Tensor,
             zero: int) -> torch.Tensor:
    """Flat float32 ``x`` to uint8 codes, stochastically and unbiased (docs/tdclm.md):

        y    = sign(x) if |x| = scale, else fl(x * fl(1 / scale))   (0 where scale is 0 or NaN)
        lo   = the largest code with C[lo] <= y,  hi = min(lo + 1, 255)
        code = hi  iff  fl(T * fl(C[hi] - C[lo])) < fl(y - C[lo]),  T = (R16 + 0.5) * 2**-16

    ``scales``: one per element (expand_scales); ``words``: R16 of each element (int64)."""
    y, special = _normalised(x, scales)
    lo, lo_v, hi_v = _brackets(y, table)
    threshold = (words.to(torch.float32) + 0.5) * (1.0 / 65536.0)  # exact in float32
    code = lo + ((threshold * (hi_v - lo_v)) < (y - lo_v)).to(lo.dtype)
    code = torch.where(special, torch.full_like(code, zero), code)
    return code.to(torch.uint8)


def quantize_nearest(x: torch.Tensor, scales: torch.Tensor, table: torch.Tensor,
                     zero: int) -> torch.Tensor:
    """Flat float32 ``x`` to the nearest code (ties to the lower code): the conversion of a
    state dict of another state_dtype, which has no step to draw random bits for."""
    y, special = _normalised(x, scales)
    lo, lo_v, hi_v = _brackets(y, table)
    code = lo + ((hi_v - y) < (y - lo_v)).to(lo.dtype)
    code = torch.where(special, torch.full_like(code, zero), code)
    return code.to(torch.uint8)
