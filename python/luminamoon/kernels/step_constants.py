"""kernels/step_constants.py: the @triton.jit helpers that read a launch's device table: a row's
columns, and the step constants (the bias corrections' reciprocals, the rounding streams' key)
with the cache the table holds for them (docs/internals.md, "Device tables").

The TDCLM kernels (kernels/tdclm.py) call these; the same functions are compiled just in time
and ahead of time.
"""
import triton
import triton.language as tl

from . import layout
from .rounding import _seed_tk

# Table layout (kernels/layout.py) as constexprs the kernels index with: the row width and
# every column by its name.
_TC: tl.constexpr = tl.constexpr(layout.TABLE_COLS)
_CC: tl.constexpr = tl.constexpr(layout.COL_CACHE)
_C_PARAM: tl.constexpr = tl.constexpr(layout.COL_PARAM)
_C_GRAD: tl.constexpr = tl.constexpr(layout.COL_GRAD)
_C_EXP_AVG: tl.constexpr = tl.constexpr(layout.COL_EXP_AVG)
_C_EXP_AVG_SQ: tl.constexpr = tl.constexpr(layout.COL_EXP_AVG_SQ)
_C_P_INIT: tl.constexpr = tl.constexpr(layout.COL_P_INIT)
_C_STEP: tl.constexpr = tl.constexpr(layout.COL_STEP)
_C_NUMEL: tl.constexpr = tl.constexpr(layout.COL_NUMEL)
_C_BLOCK_START: tl.constexpr = tl.constexpr(layout.COL_BLOCK_START)
_C_ELEM_OFFSET: tl.constexpr = tl.constexpr(layout.COL_ELEM_OFFSET)
_C_PARAM_INDEX: tl.constexpr = tl.constexpr(layout.COL_PARAM_INDEX)
_C_GLOBAL_NUMEL: tl.constexpr = tl.constexpr(layout.COL_GLOBAL_NUMEL)


@triton.jit
def _load_row(table, row):
    """The 11 host-written columns of table row ``row`` (int64 values)."""
    base = table + row.to(tl.int64) * _TC
    param = tl.load(base + _C_PARAM)
    grad = tl.load(base + _C_GRAD)
    exp_avg = tl.load(base + _C_EXP_AVG)
    exp_avg_sq = tl.load(base + _C_EXP_AVG_SQ)
    p_init = tl.load(base + _C_P_INIT)
    step = tl.load(base + _C_STEP)
    numel = tl.load(base + _C_NUMEL)
    block_start = tl.load(base + _C_BLOCK_START)
    elem_offset = tl.load(base + _C_ELEM_OFFSET)
    param_index = tl.load(base + _C_PARAM_INDEX)
    global_numel = tl.load(base + _C_GLOBAL_NUMEL)
    return (param, grad, exp_avg, exp_avg_sq, p_init, step, numel, block_start, elem_offset,
            param_index, global_numel)


@triton.jit
def _bias_corrections(beta1, beta2, t):
    """bc1 = float32(1 - beta1**t), bc2 likewise; the power in float64 by binary exponentiation.

    r = 1; b = beta; e = t; while e > 0: (if e & 1: r *= b); b *= b; e >>= 1   (C++ engine: same)
    """
    b1 = tl.cast(beta1, tl.float64)
    b2 = tl.cast(beta2, tl.float64)
    r1 = b1 * 0.0 + 1.0
    r2 = b2 * 0.0 + 1.0
    e = t.to(tl.int64)
    while e > 0:
        odd = (e & 1) == 1
        r1 = tl.where(odd, r1 * b1, r1)
        r2 = tl.where(odd, r2 * b2, r2)
        b1 = b1 * b1
        b2 = b2 * b2
        e = e >> 1
    bc1 = (1.0 - r1).to(tl.float32)
    bc2 = (1.0 - r2).to(tl.float32)
    return bc1, bc2


@triton.jit
def _bias_reciprocals(beta1, beta2, t):
    """(float32(1 / bc1), float32(1 / bc2)): once per program, so that each element multiplies."""
    bc1, bc2 = _bias_corrections(beta1, beta2, t)
    return tl.div_rn(1.0 + bc1 * 0.0, bc1), tl.div_rn(1.0 + bc2 * 0.0, bc2)


@triton.jit
def _load_step_cache(table, row, t):
    """The cache slot t & 1 of table row ``row``: (the step it holds, the bits of rbc1 | the bits
    of rbc2 << 32, seed_tk). Pass 1 issues these loads after a full block's element loads (the
    step counter they wait on came with its row), so the slot arrives while they are in flight."""
    slot = table + row.to(tl.int64) * _TC + _CC + (t & 1) * 3
    return tl.load(slot), tl.load(slot + 1), tl.load(slot + 2)


@triton.jit
def _step_constants(tag, packed, cached_key, t, seed, param_index, beta1, beta2,
                    NEED_KEY: tl.constexpr):
    """(rbc1, rbc2, seed_tk) of step t, from the cache slot _load_step_cache read.

    From the slot when it holds step t (written by the previous step's update kernel), else
    computed here: the float64 power costs a loop of log2(t) iterations in every thread of
    every program, which the cache saves. Either way the same bits.
    """
    if tag == t:
        rbc1 = (packed & 0xFFFFFFFF).to(tl.uint32).to(tl.float32, bitcast=True)
        rbc2 = ((packed >> 32) & 0xFFFFFFFF).to(tl.uint32).to(tl.float32, bitcast=True)
        key = cached_key.to(tl.uint64, bitcast=True)
    else:
        rbc1, rbc2 = _bias_reciprocals(beta1, beta2, t)
        if NEED_KEY:
            key = _seed_tk(seed, t, param_index)
        else:
            key = tag.to(tl.uint64, bitcast=True)
    return rbc1, rbc2, key


@triton.jit
def _cache_next_step_constants(table, row, t, seed, param_index, beta1, beta2):
    """Writes step t + 1's constants into slot (t + 1) & 1 of the row: a slot no program of
    step t reads, so the writes race with nothing (a skipped step leaves slot t & 1 valid)."""
    tn = t + 1
    slot = table + row.to(tl.int64) * _TC + _CC + (tn & 1) * 3
    rbc1, rbc2 = _bias_reciprocals(beta1, beta2, tn)
    packed = (rbc1.to(tl.uint32, bitcast=True).to(tl.int64)
              | (rbc2.to(tl.uint32, bitcast=True).to(tl.int64) << 32))
    tl.store(slot + 1, packed)
    tl.store(slot + 2, _seed_tk(seed, tn, param_index).to(tl.int64, bitcast=True))
    tl.store(slot, tn)
