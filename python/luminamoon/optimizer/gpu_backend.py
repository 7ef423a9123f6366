"""Triton kernels of the TDCLM step and the backend that launches them.

The kernels, their arguments and the device tables they read are specified in
docs/internals.md; the update rule in docs/tdclm.md. The same @triton.jit functions are
compiled just in time here (``TritonBackend``) and ahead of time by ``luminamoon.aot`` (through
``KERNEL_SPECS`` and ``all_variants``); both must produce the same bits, so every choice that
shapes the generated code (constexprs, num_warps, num_stages, specialisation, tanh) is made in
one place below.

Specialisation (what keeps JIT and AOT builds identical):
- Triton's JIT specialises integer arguments (a value of 1 becomes a constant, a multiple of 16
  gets a divisibility hint) and derives an integer argument's type from its value. The AOT
  builder compiles every integer scalar with no hint and a fixed type, so every integer scalar
  of every kernel here (``seed``, ``ntensors``) is listed in ``do_not_specialize`` and carries a
  type annotation (``tl.int64`` / ``tl.int32``).
- Pointer arguments get a 16-byte alignment hint from the JIT when their address allows it; the
  AOT builder marks every pointer argument divisible by 16. ``TritonBackend`` therefore only
  ever passes 16-byte aligned pointers (its own buffers, and ``found_inf``/``lr`` after a check).
- Element addresses loaded from the table are declared 16-byte aligned (``tl.multiple_of``) so
  loads and stores move 16-byte vectors; ``TritonBackend`` refuses any tensor whose data_ptr is
  not a multiple of 16 when it builds a table.

Importing this module defines kernels and tables and nothing else; Triton is required.
"""
import functools
import inspect
import operator
import os
import struct
from dataclasses import dataclass
from typing import Dict, List, Optional, Tuple

import torch
import triton
import triton.language as tl

from ._backend import Backend
from ._device import _get_device_context, _get_generator  # noqa: F401  (re-exported)
from ._plan import BOUND_MODES, DTYPE_CODES, Hyper, LaunchGroup

__all__ = [
    "KernelSpec",
    "KERNEL_SPECS",
    "Variant",
    "variants_for",
    "all_variants",
    "DEFAULT_DTYPE_COMBOS",
    "TritonBackend",
    "TANH_IMPL",
    "COMPILE_OPTIONS",
]

# ----------------------------------------------------------------------------------------------
# tanh: chosen once, here, at import; the AOT builder compiles these same functions, so JIT and
# AOT builds agree. The interpreter (TRITON_INTERPRET=1) runs no libdevice call, so it gets a
# formula through tl.exp.
# ----------------------------------------------------------------------------------------------
_INTERPRET = os.environ.get("TRITON_INTERPRET", "0") not in ("", "0")


def _find_libdevice_tanh():
    """libdevice's tanh: triton.language.extra.libdevice (3.2+) or extra.cuda.libdevice (3.0, 3.1)."""
    for modname in ("triton.language.extra.libdevice", "triton.language.extra.cuda.libdevice"):
        try:
            mod = __import__(modname, fromlist=["tanh"])
        except ImportError:
            continue
        fn = getattr(mod, "tanh", None)
        if fn is not None:
            return fn
    return None


if _INTERPRET:
    TANH_IMPL = "exp-formula"
    _tanh_builtin = None
elif hasattr(tl.math, "tanh"):
    TANH_IMPL = "tl.math.tanh"
    _tanh_builtin = tl.math.tanh
else:
    _tanh_builtin = _find_libdevice_tanh()
    TANH_IMPL = "libdevice.tanh" if _tanh_builtin is not None else "exp-formula"

if _tanh_builtin is None:

    @triton.jit
    def _triton_tanh_fast(x):
        # sign(x) * (1 - e) / (1 + e) with e = exp(-2|x|) <= 1: no overflow for any x,
        # +-1 at +-inf, NaN stays NaN; absolute error <= 2**-23.
        # below 1e-4, tanh(x) = x to within x**2 / 3 < 2**-24 relative (and keeps the sign)
        e = tl.exp(-2.0 * tl.abs(x))
        t = tl.div_rn(1.0 - e, 1.0 + e)
        t = tl.where(x < 0, -t, t)
        return tl.where(tl.abs(x) < 1e-4, x, t)

else:

    @triton.jit
    def _triton_tanh_fast(x):
        return _tanh_builtin(x)


# The skip decision as an element mask. Compiled, one scalar load of found_inf that broadcasts;
# the interpreter of newer Triton releases refuses a scalar int1 broadcast into a load mask, so
# there every lane loads the flag's one address (the same value).
if _INTERPRET:

    @triton.jit
    def _step_applies(found_inf, offs):
        return tl.load(found_inf + offs * 0) == 0

else:

    @triton.jit
    def _step_applies(found_inf, offs):
        return tl.load(found_inf) == 0


# ----------------------------------------------------------------------------------------------
# Table layout (docs/internals.md, "Device tables")
# ----------------------------------------------------------------------------------------------
TABLE_COLS = 18
COL_PARAM, COL_GRAD, COL_EXP_AVG, COL_EXP_AVG_SQ, COL_P_INIT, COL_STEP = 0, 1, 2, 3, 4, 5
COL_NUMEL, COL_BLOCK_START, COL_ELEM_OFFSET, COL_PARAM_INDEX, COL_GLOBAL_NUMEL = 6, 7, 8, 9, 10
# Columns 12-17: the step-constant cache, two slots of (t, bits of rbc1 | bits of rbc2 << 32,
# seed_tk) for the steps t with t & 1 == slot; written by the update kernels, zero on the host.
COL_CACHE = 12
_TC: tl.constexpr = tl.constexpr(TABLE_COLS)
_CC: tl.constexpr = tl.constexpr(COL_CACHE)

# Every element address must be a multiple of this (bytes): the kernels declare it to the
# compiler so that loads and stores become 16-byte vector accesses.
ALIGN_BYTES = 16

# ----------------------------------------------------------------------------------------------
# Shared @triton.jit helpers
# ----------------------------------------------------------------------------------------------


@triton.jit
def _load_row(table, row):
    """The 11 host-written columns of table row ``row`` (int64 values)."""
    base = table + row.to(tl.int64) * _TC
    param = tl.load(base + 0)
    grad = tl.load(base + 1)
    exp_avg = tl.load(base + 2)
    exp_avg_sq = tl.load(base + 3)
    p_init = tl.load(base + 4)
    step = tl.load(base + 5)
    numel = tl.load(base + 6)
    block_start = tl.load(base + 7)
    elem_offset = tl.load(base + 8)
    param_index = tl.load(base + 9)
    global_numel = tl.load(base + 10)
    return (param, grad, exp_avg, exp_avg_sq, p_init, step, numel, block_start, elem_offset,
            param_index, global_numel)


@triton.jit
def _elem_ptr(addr, DTYPE: tl.constexpr):
    """An element pointer of dtype code DTYPE (0 fp32, 1 bf16, 2 fp16) from an int64 address.

    The address is declared 16-byte aligned (the backend checks it) so that accesses vectorise.
    """
    if DTYPE == 0:
        ptr = addr.to(tl.pointer_type(tl.float32))
    elif DTYPE == 1:
        ptr = addr.to(tl.pointer_type(tl.bfloat16))
    else:
        ptr = addr.to(tl.pointer_type(tl.float16))
    return tl.multiple_of(ptr, 16)


@triton.jit
def _load_f32(ptr, offs, mask, DTYPE: tl.constexpr):
    """Load elements of dtype code DTYPE and widen them to float32 (exactly)."""
    x = tl.load(ptr + offs, mask=mask, other=0.0)
    if DTYPE == 1:
        # bf16 -> fp32 is a 16-bit shift of the bits; done on integers so that the interpreter
        # and the compiled kernel agree bit for bit.
        return (x.to(tl.uint16, bitcast=True).to(tl.uint32) << 16).to(tl.float32, bitcast=True)
    else:
        return x.to(tl.float32)


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


if _INTERPRET:

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
def _step_constants(table, row, t, seed, param_index, beta1, beta2, NEED_KEY: tl.constexpr,
                    BOTH_SLOTS: tl.constexpr):
    """(rbc1, rbc2, seed_tk) of step t for table row ``row``.

    From the row's cache slot t & 1 when it holds step t (written by the previous step's update
    kernel), else computed here: the float64 power costs a loop of log2(t) iterations in every
    thread of every program, which the cache saves. Either way the same bits.
    """
    cache = table + row.to(tl.int64) * _TC + _CC
    if BOTH_SLOTS:
        # both slots loaded (their addresses do not wait for t), then the one of t's parity
        # taken: pass 1, whose element loads are issued first, then overlaps all of them
        odd = (t & 1) == 1
        tag = tl.where(odd, tl.load(cache + 3), tl.load(cache))
        packed = tl.where(odd, tl.load(cache + 4), tl.load(cache + 1))
        cached_key = tl.where(odd, tl.load(cache + 5), tl.load(cache + 2))
    else:
        slot = cache + (t & 1) * 3
        tag = tl.load(slot)
        packed = tl.load(slot + 1)
        cached_key = tl.load(slot + 2)
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


@triton.jit
def _moment_update(g_raw, m, v, sign, beta1, beta2, eps, rbc1, rbc2, key, idx,
                   S_DTYPE: tl.constexpr, SR: tl.constexpr):
    """Steps 1-4 of docs/internals.md; pass 1 and pass 2 both call this, so their u agree.

    Returns (m', v') rounded to the state dtype (in that dtype) and u (float32).
    """
    # 1. gradient, sign applied: folded into the scalar (1 - beta1) * sign, the same bits as
    # (1 - beta1) * (g * sign) since a sign flip is exact; (g * sign)**2 is g * g
    g = g_raw
    # 2. moments
    m_new = beta1 * m + ((1.0 - beta1) * sign) * g
    v_new = beta2 * v + (1.0 - beta2) * (g * g)
    # 3. round moments to their storage dtype (streams 1 and 2)
    m_st = _to_storage(m_new, S_DTYPE, SR, key, idx, 1)
    v_st = _to_storage(v_new, S_DTYPE, SR, key, idx, 2)
    m_r = _storage_to_f32(m_st, S_DTYPE)
    v_r = _storage_to_f32(v_st, S_DTYPE)
    # 4. Adam direction
    u = tl.div_rn(m_r * rbc1, tl.sqrt_rn(v_r * rbc2) + eps)
    return m_st, v_st, u


@triton.jit
def _is_finite(x):
    """Elementwise: x (float32) is neither inf nor NaN."""
    return (x.to(tl.uint32, bitcast=True) & 0x7F800000) != 0x7F800000


@triton.jit
def _block_offsets(pid, block_start, BLOCK: tl.constexpr, VEC: tl.constexpr):
    """int64 element offsets of this program's block inside its tensor (tensors > 2**31 elems).

    VEC: the contiguous run each thread owns. BLOCK lets every tensor take its widest access
    (16 bytes); 4 keeps 32-bit and 16-bit tensors of one kernel in one register layout
    (16-byte accesses for 32-bit data, 8-byte for 16-bit data) so that no layout conversion
    through shared memory sits between the loads and the arithmetic.
    """
    local_block = pid - block_start
    start = local_block.to(tl.int64) * BLOCK
    offs = start + tl.arange(0, BLOCK)
    offs = tl.max_contiguous(tl.multiple_of(offs, BLOCK), VEC)
    return start, offs


@triton.jit
def _program_constants(table, row, step_addr, seed, param_index, beta1, beta2, NEED_KEY: tl.constexpr):
    """(t, rbc1, rbc2, seed_tk) of the step being applied to table row ``row``.

    Called after a program has issued its element loads: the step counter and cache loads it
    waits on then overlap with them."""
    t = tl.load(step_addr.to(tl.pointer_type(tl.int64))) + 1
    rbc1, rbc2, key = _step_constants(table, row, t, seed, param_index, beta1, beta2, NEED_KEY,
                                      True)
    return t, rbc1, rbc2, key


@triton.jit
def _pass1_elements(g_ptr, m_ptr, v_ptr, offs, mask, idx, table, row, step_addr, seed,
                    param_index, sign, beta1, beta2, eps,
                    G_DTYPE: tl.constexpr, S_DTYPE: tl.constexpr, SR: tl.constexpr,
                    NEED_SUM: tl.constexpr):
    """(sum of u*u, any non-finite grad) over one block of elements."""
    g_raw = _load_f32(g_ptr, offs, mask, G_DTYPE)
    if NEED_SUM:
        m = _load_f32(m_ptr, offs, mask, S_DTYPE)
        v = _load_f32(v_ptr, offs, mask, S_DTYPE)
    bad = tl.max((mask & (_is_finite(g_raw) == 0)).to(tl.int32), axis=0)
    if NEED_SUM:
        _t, rbc1, rbc2, key = _program_constants(table, row, step_addr, seed, param_index, beta1,
                                                 beta2, SR)
        _m_st, _v_st, u = _moment_update(g_raw, m, v, sign, beta1, beta2, eps, rbc1, rbc2, key,
                                         idx, S_DTYPE, SR)
        s = tl.sum(tl.where(mask, u * u, 0.0), axis=0)
    else:
        s = bad.to(tl.float32) * 0.0
    return s, bad


@triton.jit
def _pass2_elements(p_ptr, g_ptr, m_ptr, v_ptr, p0_ptr, offs, mask, idx, key, lr, sign, beta1,
                    beta2, eps, rbc1, rbc2, decay, tau, bound,
                    P_DTYPE: tl.constexpr, G_DTYPE: tl.constexpr, S_DTYPE: tl.constexpr,
                    SR: tl.constexpr, BOUND_MODE: tl.constexpr, USE_CLIP: tl.constexpr):
    """Steps 1-8 of docs/internals.md over one block of elements."""
    g_raw = _load_f32(g_ptr, offs, mask, G_DTYPE)
    m = _load_f32(m_ptr, offs, mask, S_DTYPE)
    v = _load_f32(v_ptr, offs, mask, S_DTYPE)
    p = _load_f32(p_ptr, offs, mask, P_DTYPE)
    m_st, v_st, u = _moment_update(g_raw, m, v, sign, beta1, beta2, eps, rbc1, rbc2, key, idx,
                                   S_DTYPE, SR)
    # 5. soft clip (pass 2 only)
    if USE_CLIP:
        # tau == 0 (every u zero) gives 0; a NaN tau (non-finite grads, nonfinite="propagate")
        # gives NaN, as the unclipped update would
        tau_zero = tau == 0.0
        tau_safe = tl.where(tau_zero, 1.0, tau)
        rtau = tl.div_rn(1.0 + tau_safe * 0.0, tau_safe)
        u = tl.where(tau_zero, 0.0, tau_safe * _triton_tanh_fast(u * rtau))
    # 6. decoupled decay and step
    q = p * decay - lr * u
    # 7. bound (modes 1, 2)
    if BOUND_MODE != 0:
        p0 = _load_f32(p0_ptr, offs, mask, P_DTYPE)
        if BOUND_MODE == 1:
            r = bound + p0 * 0.0
        else:
            r = bound * tl.sqrt_rn(p0 * p0 + 1e-4)
        q = tl.minimum(tl.maximum(q, p0 - r, propagate_nan=tl.PropagateNan.ALL), p0 + r,
                       propagate_nan=tl.PropagateNan.ALL)
    # 8. store p (stream 0), m, v, each rounded to its storage dtype
    tl.store(p_ptr + offs, _to_storage(q, P_DTYPE, SR, key, idx, 0), mask=mask)
    tl.store(m_ptr + offs, m_st, mask=mask)
    tl.store(v_ptr + offs, v_st, mask=mask)


@triton.jit
def _tdclm_update_block(table, block_map, stats, found_inf, lr_ptr, seed, sign, beta1, beta2, eps,
                        weight_decay, clip, bound,
                        P_DTYPE: tl.constexpr, G_DTYPE: tl.constexpr, S_DTYPE: tl.constexpr,
                        SR: tl.constexpr, BOUND_MODE: tl.constexpr, USE_CLIP: tl.constexpr,
                        CHECK_FLAG: tl.constexpr, BLOCK: tl.constexpr):
    """Pass 2 for the block of program_id(0): the body of both update kernels."""
    # float32 scalars (the interpreter hands Python floats over; compiled, these are no-ops)
    sign = tl.cast(sign, tl.float32)
    beta1 = tl.cast(beta1, tl.float32)
    beta2 = tl.cast(beta2, tl.float32)
    eps = tl.cast(eps, tl.float32)
    weight_decay = tl.cast(weight_decay, tl.float32)
    clip = tl.cast(clip, tl.float32)
    bound = tl.cast(bound, tl.float32)
    pid = tl.program_id(0)
    row = tl.load(block_map + pid)
    (p_addr, g_addr, m_addr, v_addr, p0_addr, step_addr, numel, block_start, elem_offset,
     param_index, global_numel) = _load_row(table, row)
    # 32-bit and 16-bit element tensors together: one layout of 4 elements per access
    MIXED: tl.constexpr = ((P_DTYPE == 0) != (S_DTYPE == 0)) or ((G_DTYPE == 0) != (S_DTYPE == 0))
    if MIXED:
        start, offs = _block_offsets(pid, block_start, BLOCK, 4)
    else:
        start, offs = _block_offsets(pid, block_start, BLOCK, BLOCK)
    p_ptr = _elem_ptr(p_addr, P_DTYPE)
    g_ptr = _elem_ptr(g_addr, G_DTYPE)
    m_ptr = _elem_ptr(m_addr, S_DTYPE)
    v_ptr = _elem_ptr(v_addr, S_DTYPE)
    p0_ptr = _elem_ptr(p0_addr, P_DTYPE)
    t = tl.load(step_addr.to(tl.pointer_type(tl.int64))) + 1
    rbc1, rbc2, key = _step_constants(table, row, t, seed, param_index, beta1, beta2, SR,
                                      False)
    # the first program of each tensor prepares the next step's constants
    if pid == block_start:
        _cache_next_step_constants(table, row, t, seed, param_index, beta1, beta2)
    lr = tl.load(lr_ptr)
    decay = 1.0 - lr * weight_decay
    if USE_CLIP:
        s_sum = tl.load(stats + row)
        tau = clip * tl.sqrt_rn(tl.div_rn(s_sum, global_numel.to(tl.float32)))
    else:
        tau = clip * 0.0
    idx = elem_offset + offs
    # every element's mask also carries the step's skip decision (one int1 for the program;
    # an int1 tensor, not a Python bool, so that every Triton's interpreter takes it as a mask)
    if CHECK_FLAG:
        ok = _step_applies(found_inf, offs)
    else:
        ok = tl.full([BLOCK], 1, tl.int1)
    if start + BLOCK <= numel:
        # a full block: the mask is uniform, so accesses stay 16-byte vectors
        mask = (tl.full([BLOCK], 1, tl.int1)) & ok
        _pass2_elements(p_ptr, g_ptr, m_ptr, v_ptr, p0_ptr, offs, mask, idx, key, lr, sign, beta1,
                        beta2, eps, rbc1, rbc2, decay, tau, bound, P_DTYPE, G_DTYPE, S_DTYPE, SR,
                        BOUND_MODE, USE_CLIP)
    else:
        mask = (offs < numel) & ok
        _pass2_elements(p_ptr, g_ptr, m_ptr, v_ptr, p0_ptr, offs, mask, idx, key, lr, sign, beta1,
                        beta2, eps, rbc1, rbc2, decay, tau, bound, P_DTYPE, G_DTYPE, S_DTYPE, SR,
                        BOUND_MODE, USE_CLIP)


# ----------------------------------------------------------------------------------------------
# Kernels (names and argument lists: docs/internals.md, "Kernels")
# ----------------------------------------------------------------------------------------------


@triton.jit(do_not_specialize=["seed"])
def _lumina_tdclm_pass1_kernel(table, block_map, partial_sum, partial_bad, seed: tl.int64,
                               sign: tl.float32, beta1: tl.float32, beta2: tl.float32,
                               eps: tl.float32,
                               G_DTYPE: tl.constexpr, S_DTYPE: tl.constexpr, SR: tl.constexpr,
                               NEED_SUM: tl.constexpr, BLOCK: tl.constexpr):
    """Per block: partial_sum = sum of u*u (NEED_SUM) and partial_bad = any non-finite grad."""
    # float32 scalars (the interpreter hands Python floats over; compiled, these are no-ops)
    sign = tl.cast(sign, tl.float32)
    beta1 = tl.cast(beta1, tl.float32)
    beta2 = tl.cast(beta2, tl.float32)
    eps = tl.cast(eps, tl.float32)
    pid = tl.program_id(0)
    row = tl.load(block_map + pid)
    (_p_addr, g_addr, m_addr, v_addr, _p0_addr, step_addr, numel, block_start, elem_offset,
     param_index, _global_numel) = _load_row(table, row)
    # 32-bit and 16-bit element tensors together: one layout of 4 elements per access
    MIXED: tl.constexpr = NEED_SUM and ((G_DTYPE == 0) != (S_DTYPE == 0))
    if MIXED:
        start, offs = _block_offsets(pid, block_start, BLOCK, 4)
    else:
        start, offs = _block_offsets(pid, block_start, BLOCK, BLOCK)
    g_ptr = _elem_ptr(g_addr, G_DTYPE)
    m_ptr = _elem_ptr(m_addr, S_DTYPE)
    v_ptr = _elem_ptr(v_addr, S_DTYPE)
    idx = elem_offset + offs
    if start + BLOCK <= numel:
        mask = tl.full([BLOCK], 1, tl.int1)
        s, bad = _pass1_elements(g_ptr, m_ptr, v_ptr, offs, mask, idx, table, row, step_addr,
                                 seed, param_index, sign, beta1, beta2, eps, G_DTYPE, S_DTYPE, SR,
                                 NEED_SUM)
    else:
        mask = offs < numel
        s, bad = _pass1_elements(g_ptr, m_ptr, v_ptr, offs, mask, idx, table, row, step_addr,
                                 seed, param_index, sign, beta1, beta2, eps, G_DTYPE, S_DTYPE, SR,
                                 NEED_SUM)
    tl.store(partial_sum + pid, s)
    tl.store(partial_bad + pid, bad)


@triton.jit(do_not_specialize=["ntensors"])
def _lumina_tdclm_reduce_kernel(table, partial_sum, partial_bad, stats, found_inf,
                                ntensors: tl.int32,
                                BLOCK: tl.constexpr, RBLOCK: tl.constexpr):
    """stats[j] = S_j from tensor j's partials in a fixed order; raises found_inf (int atomic)."""
    j = tl.program_id(0)
    base = table + j.to(tl.int64) * _TC
    numel = tl.load(base + 6)
    block_start = tl.load(base + 7)
    nblk = (numel + BLOCK - 1) // BLOCK
    acc = tl.zeros([RBLOCK], dtype=tl.float32)
    bad = tl.zeros([RBLOCK], dtype=tl.int32)
    # chunks of RBLOCK in order (a while loop: the interpreter takes no tensor range() bound)
    c = nblk * 0
    while c < nblk:
        ids = c + tl.arange(0, RBLOCK)
        msk = ids < nblk
        acc += tl.load(partial_sum + block_start + ids, mask=msk, other=0.0)
        bad = tl.maximum(bad, tl.load(partial_bad + block_start + ids, mask=msk, other=0))
        c += RBLOCK
    tl.store(stats + j, tl.sum(acc, axis=0))
    any_bad = tl.max(bad, axis=0)
    # An integer max: the result does not depend on the order of the programs.
    tl.atomic_max(found_inf, any_bad, mask=any_bad > 0)


@triton.jit(do_not_specialize=["seed"])
def _lumina_tdclm_pass2_kernel(table, block_map, stats, found_inf, lr, seed: tl.int64,
                               sign: tl.float32, beta1: tl.float32, beta2: tl.float32,
                               eps: tl.float32, weight_decay: tl.float32, clip: tl.float32,
                               bound: tl.float32,
                               P_DTYPE: tl.constexpr, G_DTYPE: tl.constexpr,
                               S_DTYPE: tl.constexpr, SR: tl.constexpr,
                               BOUND_MODE: tl.constexpr, USE_CLIP: tl.constexpr,
                               CHECK_FLAG: tl.constexpr, BLOCK: tl.constexpr):
    """The update: soft clip (USE_CLIP), decay, bound, rounding; all masked off when CHECK_FLAG
    and found_inf is set."""
    _tdclm_update_block(table, block_map, stats, found_inf, lr, seed, sign, beta1, beta2, eps,
                        weight_decay, clip, bound, P_DTYPE, G_DTYPE, S_DTYPE, SR, BOUND_MODE,
                        USE_CLIP, CHECK_FLAG, BLOCK)


@triton.jit(do_not_specialize=["seed"])
def _lumina_adamw_single_pass_kernel(table, block_map, stats, found_inf, lr, seed: tl.int64,
                                     sign: tl.float32, beta1: tl.float32, beta2: tl.float32,
                                     eps: tl.float32, weight_decay: tl.float32,
                                     clip: tl.float32, bound: tl.float32,
                                     P_DTYPE: tl.constexpr, G_DTYPE: tl.constexpr,
                                     S_DTYPE: tl.constexpr, SR: tl.constexpr,
                                     BOUND_MODE: tl.constexpr, BLOCK: tl.constexpr):
    """Pass 2 with USE_CLIP = 0 and CHECK_FLAG = 0: one read and one write of p, m, v."""
    _tdclm_update_block(table, block_map, stats, found_inf, lr, seed, sign, beta1, beta2, eps,
                        weight_decay, clip, bound, P_DTYPE, G_DTYPE, S_DTYPE, SR, BOUND_MODE,
                        0, 0, BLOCK)


@triton.jit
def _add_to_step_counters(table, inc, ntensors, TBLOCK: tl.constexpr):
    """The step counter of every table row += inc (int64)."""
    # a while loop: the interpreter cannot take a kernel argument as a range() bound
    c = tl.program_id(0) * 0
    while c < ntensors:
        j = c + tl.arange(0, TBLOCK)
        msk = j < ntensors
        addr = tl.load(table + j.to(tl.int64) * _TC + 5, mask=msk, other=0)
        ptr = addr.to(tl.pointer_type(tl.int64))
        cur = tl.load(ptr, mask=msk, other=0)
        tl.store(ptr, cur + inc, mask=msk)
        c += TBLOCK


@triton.jit(do_not_specialize=["ntensors"])
def _lumina_tdclm_commit_kernel(table, found_inf, ntensors: tl.int32,
                                CHECK_FLAG: tl.constexpr, TBLOCK: tl.constexpr):
    """Every step counter of the group += 1 - found_inf (CHECK_FLAG) or += 1."""
    if CHECK_FLAG:
        inc = 1 - tl.load(found_inf).to(tl.int64)
    else:
        inc = tl.full([], 1, tl.int64)
    _add_to_step_counters(table, inc, ntensors, TBLOCK)


@triton.jit(do_not_specialize=["ntensors"])
def _lumina_tdclm_commit_last_kernel(table, found_inf, skipped, ntensors: tl.int32,
                                     TBLOCK: tl.constexpr):
    """The commit (CHECK_FLAG = 1) of the step's last launch that reads found_inf, then
    skipped += found_inf and found_inf = 0: the flag is clear again for the next step.

    The triton backend's own kernel (no AOT bundle holds it): the optimizer's step ends with
    this one launch where it would otherwise take two more (an add and a fill)."""
    flag = tl.load(found_inf)
    _add_to_step_counters(table, 1 - flag.to(tl.int64), ntensors, TBLOCK)
    tl.store(skipped, tl.load(skipped) + flag.to(tl.int64))
    tl.store(found_inf, flag * 0)


# ----------------------------------------------------------------------------------------------
# Kernel specs and variants: the interface of the AOT builder and the C++ engine
# ----------------------------------------------------------------------------------------------


# Compiler options every variant is built with, by the JIT launcher and the AOT builder alike.
# No floating-point contraction: with division and square root already IEEE-rounded (div_rn,
# sqrt_rn), each element's arithmetic is then the same sequence of correctly rounded float32
# operations as the C++ CPU engine (built with -ffp-contract=off) and the reference, so the
# backends agree to the bit except where tanh's implementations differ. An FMA would change
# m' = beta1*m + (1-beta1)*g by up to an ulp of its operands, which under cancellation is many
# ulps of the result and moves bf16 moments by several storage ulps. The kernels are bound by
# memory, so the separate multiply and add cost no time.
COMPILE_OPTIONS = {"enable_fp_fusion": False}


@dataclass(frozen=True)
class KernelSpec:
    name: str  # "pass1" | "reduce" | "pass2" | "single_pass" | "commit"
    fn: object  # the @triton.jit function
    args: tuple  # ((arg_name, triton_type_word), ...): runtime arguments in order
    constexprs: tuple  # constexpr parameter names in declaration order
    # compiler options beyond num_warps/num_stages, as ((name, value), ...): COMPILE_OPTIONS
    compile_options: tuple = tuple(sorted(COMPILE_OPTIONS.items()))


_PASS2_ARGS = (
    ("table", "*i64"), ("block_map", "*i32"), ("stats", "*fp32"), ("found_inf", "*i32"),
    ("lr", "*fp32"), ("seed", "i64"), ("sign", "fp32"), ("beta1", "fp32"), ("beta2", "fp32"),
    ("eps", "fp32"), ("weight_decay", "fp32"), ("clip", "fp32"), ("bound", "fp32"),
)

KERNEL_SPECS: Dict[str, KernelSpec] = {
    "pass1": KernelSpec(
        "pass1", _lumina_tdclm_pass1_kernel,
        (("table", "*i64"), ("block_map", "*i32"), ("partial_sum", "*fp32"),
         ("partial_bad", "*i32"), ("seed", "i64"), ("sign", "fp32"), ("beta1", "fp32"),
         ("beta2", "fp32"), ("eps", "fp32")),
        ("G_DTYPE", "S_DTYPE", "SR", "NEED_SUM", "BLOCK")),
    "reduce": KernelSpec(
        "reduce", _lumina_tdclm_reduce_kernel,
        (("table", "*i64"), ("partial_sum", "*fp32"), ("partial_bad", "*i32"),
         ("stats", "*fp32"), ("found_inf", "*i32"), ("ntensors", "i32")),
        ("BLOCK", "RBLOCK")),
    "pass2": KernelSpec(
        "pass2", _lumina_tdclm_pass2_kernel, _PASS2_ARGS,
        ("P_DTYPE", "G_DTYPE", "S_DTYPE", "SR", "BOUND_MODE", "USE_CLIP", "CHECK_FLAG", "BLOCK")),
    "single_pass": KernelSpec(
        "single_pass", _lumina_adamw_single_pass_kernel, _PASS2_ARGS,
        ("P_DTYPE", "G_DTYPE", "S_DTYPE", "SR", "BOUND_MODE", "BLOCK")),
    "commit": KernelSpec(
        "commit", _lumina_tdclm_commit_kernel,
        (("table", "*i64"), ("found_inf", "*i32"), ("ntensors", "i32")),
        ("CHECK_FLAG", "TBLOCK")),
}

# Kernels only the triton backend launches (just in time; never in an AOT bundle).
JIT_ONLY_KERNEL_SPECS: Dict[str, KernelSpec] = {
    "commit_last": KernelSpec(
        "commit_last", _lumina_tdclm_commit_last_kernel,
        (("table", "*i64"), ("found_inf", "*i32"), ("skipped", "*i64"), ("ntensors", "i32")),
        ("TBLOCK",)),
}

# Launch shapes, measured on an H200 (torch 2.11, Triton 3.6; benchmarks/tune_launch.py, one
# 256M-element tensor, benchmarks/results/2026-11-29-h200-tune.csv). Pass 1 and pass 2: BLOCK
# 1024 with 4 warps (8 elements a thread) beat 2048/8, 2048/4, 4096/8 and 1024/8 in every mix:
# fp32 AdamW mode 4.10 TB/s (2048/8: 3.96), bf16 params with fp32 moments 2.96 TB/s (2048/8:
# 2.49; that mix is bound by the Philox rounding words, not by memory). Pass 1 and pass 2 of a
# group must share BLOCK (one block_map), and reduce must know it.
ELEMENTWISE_BLOCK = 1024
ELEMENTWISE_WARPS = 4
# Reduce: one program per tensor sums cdiv(numel, BLOCK) partials in chunks of RBLOCK. The one
# program that owns the 262144 partials of a 256M tensor waits on its chunk loads one after the
# other: 8192 with 8 warps took 2-4 % off the clipped step against 1024/4, and 16384 with 16
# warps 4-6 % more (fp32 2671 vs 2838 us, bf16 5420 vs 5529 us; 32768/32: 2848, 5457;
# benchmarks/results/2026-11-29-h200-tune-2.csv).
REDUCE_RBLOCK = 16384
REDUCE_WARPS = 16
# Register cap of the single-pass kernel when every element tensor is 16-bit and nothing is
# rounded stochastically (bf16 params, grads and moments, round to nearest): uncapped it takes
# 68 registers a thread, which leaves room for 7 programs of 4 warps on an SM; at 64 (a few
# bytes of spill, outside the element loop) 8 fit, and the step ran 1053.7 instead of 1090.7 us
# on one 256M tensor (H200, torch 2.11, Triton 3.6; 56: 1087.8, 48: 1244.8). Every other mix
# measured slower under a cap (fp32: 1810.7 vs 1808.7 us at 64; bf16 params with fp32 moments
# and SR: 1869.6 vs 1748.8), so they keep the compiler's choice. A cap changes no arithmetic.
SINGLE_PASS_16BIT_MAXNREG = 64
# Commit: one program; 1024 counters per chunk covers the 1000-tiny-tensor case in one pass.
COMMIT_TBLOCK = 1024
COMMIT_WARPS = 4
# No kernel here has a loop over global memory that software pipelining would help; 1 stage
# keeps the shared-memory use at 0 (and the same value in the AOT build).
NUM_STAGES = 1


_KEY_LETTERS = {
    "SR": "sr", "BOUND_MODE": "b", "USE_CLIP": "c", "CHECK_FLAG": "f", "NEED_SUM": "n",
    "BLOCK": "B", "RBLOCK": "R", "TBLOCK": "T",
}
_DTYPE_LETTERS = (("P_DTYPE", "p"), ("G_DTYPE", "g"), ("S_DTYPE", "s"))


def _spec_of(kernel: str) -> KernelSpec:
    spec = KERNEL_SPECS.get(kernel)
    return spec if spec is not None else JIT_ONLY_KERNEL_SPECS[kernel]


@dataclass(frozen=True)
class Variant:
    kernel: str  # key into KERNEL_SPECS
    constexprs: tuple  # ((name, int_value), ...) in KernelSpec.constexprs order
    num_warps: int
    num_stages: int
    # registers a thread may use (Triton's ``maxnreg``), or None for the compiler's choice; a
    # launch-shape choice like num_warps that changes no result, so it is not part of the key
    maxnreg: Optional[int] = None

    def key(self) -> str:
        """e.g. "pass2.p1g1s0.sr1.b2.c1.f1.B1024.w4" (docs/internals.md, "Variant keys").

        Order: kernel, the dtype codes present (p, g, s) joined, then sr, b, c, f, n, B, R, T in
        that order for the constexprs the kernel takes, then w (num_warps).
        """
        cx = dict(self.constexprs)
        parts = [self.kernel]
        dtypes = "".join(f"{letter}{cx[name]}" for name, letter in _DTYPE_LETTERS if name in cx)
        if dtypes:
            parts.append(dtypes)
        for name in ("SR", "BOUND_MODE", "USE_CLIP", "CHECK_FLAG", "NEED_SUM", "BLOCK", "RBLOCK",
                     "TBLOCK"):
            if name in cx:
                parts.append(f"{_KEY_LETTERS[name]}{cx[name]}")
        parts.append(f"w{self.num_warps}")
        return ".".join(parts)

    @property
    def spec(self) -> KernelSpec:
        return _spec_of(self.kernel)

    def constexpr_dict(self) -> Dict[str, int]:
        return dict(self.constexprs)


def _make_variant(kernel: str, values: Dict[str, int], num_warps: int,
                  maxnreg: Optional[int] = None) -> Variant:
    spec = _spec_of(kernel)
    missing = [n for n in spec.constexprs if n not in values]
    if missing:
        raise ValueError(f"variant of {kernel!r} lacks constexprs {missing}")
    return Variant(kernel, tuple((n, int(values[n])) for n in spec.constexprs), num_warps,
                   NUM_STAGES, maxnreg)


def _dtype_code(dtype: torch.dtype, what: str) -> int:
    try:
        return DTYPE_CODES[dtype]
    except KeyError:
        raise ValueError(
            f"{what} dtype {dtype} is not supported by the triton backend; use one of "
            f"float32, bfloat16, float16") from None


def variants_for(param_dtype, grad_dtype, state_dtype, hyper: Hyper) -> Dict[str, Variant]:
    """The variants one launch group runs: {"pass1", "reduce", "pass2"} + "commit" when pass 1 is
    needed, else {"single_pass", "commit"}.

    Normalisation (the C++ engine builds the same keys): SR = 1 only when stochastic rounding is
    on and the params or the states are bf16; CHECK_FLAG = (nonfinite == "skip");
    USE_CLIP = NEED_SUM = (clip > 0).
    """
    p = _dtype_code(param_dtype, "param")
    g = _dtype_code(grad_dtype, "grad")
    s = _dtype_code(state_dtype, "state")
    if s == 2:
        raise ValueError("state_dtype float16 is not supported; use float32 or bfloat16")
    sr = int(bool(hyper.stochastic_rounding) and (p == 1 or s == 1))
    bound_mode = int(hyper.bound_mode)
    if bound_mode not in BOUND_MODES.values():
        raise ValueError(f"bound_mode code must be one of {sorted(BOUND_MODES.values())}, "
                         f"got {bound_mode}")
    use_clip = int(hyper.clip > 0)
    check = int(hyper.nonfinite == "skip")
    out: Dict[str, Variant] = {}
    if hyper.needs_pass1:
        out["pass1"] = _make_variant(
            "pass1", dict(G_DTYPE=g, S_DTYPE=s, SR=sr, NEED_SUM=use_clip, BLOCK=ELEMENTWISE_BLOCK),
            ELEMENTWISE_WARPS)
        out["reduce"] = _make_variant(
            "reduce", dict(BLOCK=ELEMENTWISE_BLOCK, RBLOCK=REDUCE_RBLOCK), REDUCE_WARPS)
        out["pass2"] = _make_variant(
            "pass2", dict(P_DTYPE=p, G_DTYPE=g, S_DTYPE=s, SR=sr, BOUND_MODE=bound_mode,
                          USE_CLIP=use_clip, CHECK_FLAG=check, BLOCK=ELEMENTWISE_BLOCK),
            ELEMENTWISE_WARPS)
    else:
        all_16bit = p != 0 and g != 0 and s != 0
        out["single_pass"] = _make_variant(
            "single_pass", dict(P_DTYPE=p, G_DTYPE=g, S_DTYPE=s, SR=sr, BOUND_MODE=bound_mode,
                                BLOCK=ELEMENTWISE_BLOCK),
            ELEMENTWISE_WARPS, SINGLE_PASS_16BIT_MAXNREG if all_16bit and not sr else None)
    out["commit"] = _make_variant("commit", dict(CHECK_FLAG=check, TBLOCK=COMMIT_TBLOCK),
                                  COMMIT_WARPS)
    return out


# The commit that also counts a skipped step and clears the flag (TritonBackend.commit_last).
_COMMIT_LAST = _make_variant("commit_last", dict(TBLOCK=COMMIT_TBLOCK), COMMIT_WARPS)


DEFAULT_DTYPE_COMBOS: List[Tuple[torch.dtype, torch.dtype, torch.dtype]] = [
    (torch.float32, torch.float32, torch.float32),
    (torch.float32, torch.float32, torch.bfloat16),  # fp32 weights, half-size moments
    (torch.bfloat16, torch.bfloat16, torch.float32),
    (torch.bfloat16, torch.bfloat16, torch.bfloat16),
    (torch.float16, torch.float16, torch.float32),
    (torch.bfloat16, torch.float32, torch.float32),
]


def all_variants(dtype_combos=DEFAULT_DTYPE_COMBOS) -> List[Variant]:
    """Every variant the given (param, grad, state) dtype combos may launch, deduplicated, in
    key order: all bound modes, clip on/off, every nonfinite policy, SR on/off (normalised)."""
    seen: Dict[str, Variant] = {}
    for param_dtype, grad_dtype, state_dtype in dtype_combos:
        for bound_mode in sorted(BOUND_MODES.values()):
            for clip in (0.0, 1.0):
                for nonfinite in ("skip", "raise", "propagate"):
                    for sr in (False, True):
                        hyper = Hyper(beta1=0.9, beta2=0.999, eps=1e-8, weight_decay=0.0,
                                      clip=clip, bound_mode=bound_mode, bound=1.0,
                                      maximize=False, nonfinite=nonfinite,
                                      stochastic_rounding=sr)
                        for v in variants_for(param_dtype, grad_dtype, state_dtype,
                                              hyper).values():
                            seen.setdefault(v.key(), v)
    return [seen[k] for k in sorted(seen)]


# ----------------------------------------------------------------------------------------------
# Launchers: one per (kernel variant, device); every launch goes through one.
# ----------------------------------------------------------------------------------------------


def _direct_launch_supported() -> bool:
    """Whether this Triton's JIT hands every bound argument (constexprs included) to the
    compiled kernel's launcher (``kernel.run(..., *bound_args.values())``, Triton 3.3+), so a
    launcher may call ``CompiledKernel.run`` the same way. Decided from Triton's own source,
    not from a version table; any doubt means no."""
    try:
        from triton.runtime.jit import JITFunction
        src = inspect.getsource(JITFunction.run)
    except Exception:  # noqa: BLE001 - any failure here only disables the fast path
        return False
    return ("kernel.run(grid_0, grid_1, grid_2, stream, kernel.function, kernel.packed_metadata"
            in src and "*bound_args.values())" in src)


def _hook_active(hook) -> bool:
    """None and an empty hook chain (Triton 3.6+: ``knobs.HookChain``) call nothing."""
    if hook is None:
        return False
    calls = getattr(hook, "calls", None)
    return calls is None or len(calls) > 0


_HOOK_HOLDER = None  # where this Triton keeps its launch hooks: knobs.runtime or CompiledKernel


def _hook_holder():
    global _HOOK_HOLDER
    if _HOOK_HOLDER is None:
        knobs = getattr(triton, "knobs", None)
        runtime = getattr(knobs, "runtime", None) if knobs is not None else None
        if runtime is None:
            try:
                from triton.compiler import CompiledKernel as runtime
            except ImportError:
                return None
        _HOOK_HOLDER = runtime
    return _HOOK_HOLDER


def _launch_hooks_set() -> bool:
    """A launch hook (profilers) needs the JIT's own path, which builds its metadata."""
    holder = _hook_holder()
    if holder is None:
        return True
    return (_hook_active(getattr(holder, "launch_enter_hook", None))
            or _hook_active(getattr(holder, "launch_exit_hook", None)))


_DIRECT_LAUNCH: Optional[bool] = None


def _direct_launch_enabled() -> bool:
    global _DIRECT_LAUNCH
    if _DIRECT_LAUNCH is None:
        env = os.environ.get("LUMINAMOON_TRITON_DIRECT_LAUNCH", "1")
        _DIRECT_LAUNCH = (not _INTERPRET) and env not in ("0", "") and _direct_launch_supported()
    return _DIRECT_LAUNCH


class _Launcher:
    """Launches one kernel variant on one device with exactly the variant's constexprs,
    num_warps, num_stages and register cap (what the AOT build compiles), so the two are bitwise
    equal.

    The first launch goes through ``kernel[grid](...)`` (compiles, caches, returns the compiled
    kernel). Later launches call the compiled kernel's launcher directly where Triton's calling
    convention is known (see ``_direct_launch_supported``), skipping the JIT's per-call argument
    binding and cache lookup; otherwise, or with a launch hook installed, they keep the JIT path.
    The direct path is safe because every argument keeps its type and its alignment class from
    launch to launch (the backend passes only its own buffers and checked tensors). It hands
    over the arguments with tensors replaced by their addresses (``_bind``): Triton's launcher
    then neither calls each tensor's data_ptr() nor asks the driver about each pointer, a
    driver call per pointer argument per launch. The backend re-reads the
    address of every tensor it did not allocate (lr, the flag, the skip counter) every step.
    """

    __slots__ = ("variant", "fn", "cx_kwargs", "cx_values", "options", "compiled_kernel",
                 "direct", "device_index", "_get_stream", "_get_device")

    def __init__(self, variant: Variant, device: torch.device):
        self.variant = variant
        self.fn = variant.spec.fn
        self.cx_kwargs = variant.constexpr_dict()
        self.cx_values = tuple(v for _, v in variant.constexprs)
        self.options = dict(COMPILE_OPTIONS, num_warps=variant.num_warps,
                            num_stages=variant.num_stages)
        if variant.maxnreg is not None:
            self.options["maxnreg"] = variant.maxnreg
        self.compiled_kernel = None  # what the JIT compiled for this variant (None: interpreter)
        self.direct = False
        # None: the device's current index (the launch runs under its device context)
        self.device_index = device.index
        self._get_stream = None
        self._get_device = None

    def __call__(self, grid: int, bound: Tuple[tuple, tuple]) -> None:
        """``bound``: the arguments and the same with every tensor an address (``_bind``)."""
        if grid <= 0:
            return
        args, addresses = bound
        if self.direct and not _launch_hooks_set():
            ck = self.compiled_kernel
            index = self.device_index if self.device_index is not None else self._get_device()
            ck.run(grid, 1, 1, self._get_stream(index), ck.function,
                   ck.packed_metadata, None, None, None, *addresses, *self.cx_values)
            return
        ret = self.fn[(grid,)](*args, **self.cx_kwargs, **self.options)
        if self.compiled_kernel is None and ret is not None and hasattr(ret, "asm"):
            self.compiled_kernel = ret
            if (_direct_launch_enabled() and getattr(ret, "function", None) is not None
                    and hasattr(ret, "packed_metadata") and hasattr(ret, "run")):
                from triton.runtime.driver import driver
                self._get_stream = driver.active.get_current_stream
                self._get_device = driver.active.get_current_device
                self.direct = True


# One launcher per (variant, device) for the process: groups rebuilt (new params, or the
# functional form's fresh groups) keep the compiled kernels and the direct launch path.
_LAUNCHERS: Dict[Tuple[Variant, str, int], _Launcher] = {}


def _launcher(variant: Variant, device: torch.device) -> _Launcher:
    key = (variant, device.type, device.index if device.index is not None else -1)
    launcher = _LAUNCHERS.get(key)
    if launcher is None:
        launcher = _LAUNCHERS[key] = _Launcher(variant, device)
    return launcher


# ----------------------------------------------------------------------------------------------
# The backend
# ----------------------------------------------------------------------------------------------

_DATA_PTR = torch.Tensor.data_ptr
_NUMEL = torch.Tensor.numel
_IS_CONTIGUOUS = torch.Tensor.is_contiguous
_DEVICE = operator.attrgetter("device")
_DTYPE = operator.attrgetter("dtype")


def _bind(*args) -> Tuple[tuple, tuple]:
    """A launch's arguments for a _Launcher: as given (the JIT's first launch compiles from
    them) and with every tensor replaced by its address (what the direct path hands over)."""
    return args, tuple(_DATA_PTR(a) if isinstance(a, torch.Tensor) else a for a in args)


def _i64(x: int) -> int:
    """A uint64 as the int64 with the same bits (the kernels take the seed as i64)."""
    x = int(x) & 0xFFFFFFFFFFFFFFFF
    return x - (1 << 64) if x >= (1 << 63) else x


def _f32(x: float) -> float:
    """A float rounded to float32 (hyperparameters are rounded once, docs/internals.md)."""
    return struct.unpack("f", struct.pack("f", float(x)))[0]


def _to_device(cpu: torch.Tensor, device: torch.device) -> torch.Tensor:
    """A host-built tensor onto ``device`` without waiting for the device: pinned + async."""
    if device.type == "cpu":
        return cpu
    if device.type == "cuda":
        return cpu.pin_memory().to(device, non_blocking=True)
    return cpu.to(device, non_blocking=True)


class _GroupState:
    """Everything TritonBackend keeps for one LaunchGroup (``group.cache["triton"]``)."""

    __slots__ = ("lists", "param_ptrs", "grad_ptrs", "numels", "table", "block_map", "nblocks",
                 "ntensors", "partial_sum", "partial_bad", "stats", "stats_view", "lr_buf",
                 "lr_value", "variants", "launchers", "commit_last_launcher", "reduce_head",
                 "pass2_head", "pass2_tail", "found_inf", "lr_arg", "grads_seen",
                 # launch arguments, each as _bind gives them
                 "pass1_args", "reduce_args", "pass2_args", "commit_args", "commit_last_args")

    def matches(self, group: LaunchGroup) -> bool:
        """Built from this group's params and state lists (grads are checked apart)."""
        lists = self.lists
        return (group.params is lists[0] and group.exp_avgs is lists[1]
                and group.exp_avg_sqs is lists[2] and group.steps is lists[3]
                and group.p_inits is lists[4] and len(group.params) == self.ntensors
                and (group.param_ptrs if group.param_ptrs is not None
                     else tuple(map(_DATA_PTR, group.params))) == self.param_ptrs)


class TritonBackend(Backend):
    """The TDCLM step on CUDA (and XPU where Triton has a backend) through the Triton kernels
    above; on CPU tensors only under TRITON_INTERPRET=1 (tests).

    Per LaunchGroup it keeps, in ``group.cache["triton"]``: the device table and block_map, the
    partial-sum buffers, the stats buffer (also ``group.stats``), a float32 device scalar for a
    float lr, the precomputed argument tuples and one launcher per kernel variant. They are built
    on the group's first step and rebuilt when a param's data_ptr changes or a state list is
    replaced by another list object; the grads' data_ptrs are compared every step and, when they
    moved, only the GRAD column of the table is rewritten. Nothing in a step waits for the
    device (host-built tables go up through pinned memory, asynchronously).
    """

    name = "triton"

    # -- Backend protocol -----------------------------------------------------------------
    def supports(self, group: LaunchGroup) -> bool:
        if group.param_dtype not in DTYPE_CODES or group.grad_dtype not in DTYPE_CODES:
            return False
        if group.state_dtype not in (torch.float32, torch.bfloat16):
            return False
        return _device_supported(group.device)

    def pass1(self, group: LaunchGroup, found_inf: torch.Tensor) -> None:
        if not group.hyper.needs_pass1:
            return
        st = self._state(group, found_inf)
        with _get_device_context(group.device):
            st.launchers["pass1"](st.nblocks, st.pass1_args)
            st.launchers["reduce"](st.ntensors, st.reduce_args)
        group.stats = st.stats_view

    def pass2(self, group: LaunchGroup, found_inf: torch.Tensor) -> None:
        st = self._state(group, found_inf)
        self._set_lr(st, group)
        kernel = "pass2" if group.hyper.needs_pass1 else "single_pass"
        with _get_device_context(group.device):
            st.launchers[kernel](st.nblocks, st.pass2_args)

    def commit(self, group: LaunchGroup, found_inf: torch.Tensor) -> None:
        st = self._state(group, found_inf)
        with _get_device_context(group.device):
            st.launchers["commit"](1, st.commit_args)
        st.grads_seen = None

    def commit_last(self, group: LaunchGroup, found_inf: torch.Tensor,
                    skipped: torch.Tensor) -> bool:
        if group.hyper.nonfinite != "skip":
            return False
        st = self._state(group, found_inf)
        bound = st.commit_last_args  # None after a new flag (_state)
        if bound is None or bound[0][2] is not skipped or bound[1][2] != _DATA_PTR(skipped):
            if not (isinstance(skipped, torch.Tensor) and skipped.dtype == torch.int64
                    and skipped.numel() == 1 and _same_device(skipped.device, group.device)
                    and skipped.data_ptr() % ALIGN_BYTES == 0):
                return False
            bound = st.commit_last_args = _bind(st.table, found_inf, skipped, st.ntensors)
        with _get_device_context(group.device):
            st.commit_last_launcher(1, bound)
        st.grads_seen = None
        return True

    # -- cache ----------------------------------------------------------------------------
    def _state(self, group: LaunchGroup, found_inf: torch.Tensor) -> _GroupState:
        st = group.cache.get("triton")
        # The pointer checks run once per step: on the first pass that sees this step's grads
        # list. (The list is held only until commit, so its identity cannot be mistaken for a
        # later step's list, and grads are not kept alive between steps.)
        first = st is None or group.grads is not st.grads_seen
        if first:
            if st is None or not st.matches(group):
                st = _build_state(group)
                group.cache["triton"] = st
            if len(group.grads) != st.ntensors:
                raise ValueError(f"LaunchGroup has {st.ntensors} params but "
                                 f"{len(group.grads)} grads")
            grad_ptrs = group.grad_ptrs
            if grad_ptrs is None or len(grad_ptrs) != st.ntensors:
                try:
                    grad_ptrs = tuple(map(_DATA_PTR, group.grads))
                except (TypeError, AttributeError):
                    _check_grads_by_name(group)  # raises, naming the one that is no tensor
                    raise
            if grad_ptrs != st.grad_ptrs:
                _refresh_grads(st, group, grad_ptrs)
            st.grads_seen = group.grads
        # a new flag, or (once a step) the same flag moved to other storage
        if found_inf is not st.found_inf or (
                first and _DATA_PTR(found_inf) != st.commit_args[1][1]):
            _check_found_inf(found_inf, group.device)
            st.found_inf = found_inf
            st.reduce_args = _bind(*st.reduce_head, found_inf, st.ntensors)
            st.commit_args = _bind(st.table, found_inf, st.ntensors)
            st.commit_last_args = None
            st.lr_arg = None  # pass-2 arguments are rebuilt with the new flag
        return st

    @staticmethod
    def _set_lr(st: _GroupState, group: LaunchGroup) -> None:
        lr = group.lr
        if isinstance(lr, torch.Tensor):
            if lr.numel() != 1:
                raise ValueError(f"lr must be a float or a one-element tensor, got a tensor of "
                                 f"shape {tuple(lr.shape)}")
            if (lr.dtype == torch.float32 and _same_device(lr.device, group.device)
                    and lr.data_ptr() % ALIGN_BYTES == 0):
                arg = lr
            else:
                # cast (and move) in stream order: no host sync for a device tensor
                st.lr_buf.copy_(lr.detach().reshape(()), non_blocking=True)
                st.lr_value = None
                arg = st.lr_buf
        else:
            lr = float(lr)
            if lr != st.lr_value:
                st.lr_buf.fill_(lr)
                st.lr_value = lr
            arg = st.lr_buf
        if arg is not st.lr_arg or _DATA_PTR(arg) != st.pass2_args[1][4]:
            st.lr_arg = arg
            st.pass2_args = _bind(*st.pass2_head, st.found_inf, arg, *st.pass2_tail)


def _device_supported(device: torch.device) -> bool:
    if device.type == "cuda":
        return torch.cuda.is_available()
    if device.type == "cpu":
        return _INTERPRET
    if device.type == "xpu":
        backends = getattr(getattr(triton, "backends", None), "backends", {}) or {}
        xpu = getattr(torch, "xpu", None)
        return "intel" in backends and xpu is not None and xpu.is_available()
    return False


def _same_device(a: torch.device, b: torch.device) -> bool:
    """Device equality where an index-less accelerator device means its current index."""
    if a.type != b.type:
        return False
    if a.index is None or b.index is None:
        if a.type == "cpu":
            return True
        mod = getattr(torch, a.type, None)
        current = mod.current_device() if mod is not None and hasattr(mod, "current_device") else 0
        return (a.index if a.index is not None else current) == (
            b.index if b.index is not None else current)
    return a.index == b.index


def _check_found_inf(found_inf: torch.Tensor, device: torch.device) -> None:
    if not isinstance(found_inf, torch.Tensor) or found_inf.dtype != torch.int32 \
            or found_inf.numel() != 1:
        raise ValueError("found_inf must be a one-element int32 tensor on the group's device, "
                         f"got {found_inf!r}")
    if not _same_device(found_inf.device, device):
        raise ValueError(f"found_inf is on {found_inf.device}, the group on {device}; create it "
                         "on the group's device")
    if found_inf.data_ptr() % ALIGN_BYTES:
        raise ValueError(f"found_inf must be {ALIGN_BYTES}-byte aligned (got address "
                         f"{found_inf.data_ptr():#x}); allocate it as its own tensor, not a view")


def _check_tensor(label: str, t: torch.Tensor, device: torch.device, dtype: torch.dtype,
                  numel: int) -> None:
    """What the kernels need of every element tensor; the message names the fix."""
    if not isinstance(t, torch.Tensor):
        raise ValueError(f"{label} must be a tensor, got {type(t).__name__}")
    if not _same_device(t.device, device):
        raise ValueError(f"{label} is on {t.device}, the group on {device}; move it to {device}")
    if t.dtype != dtype:
        raise ValueError(f"{label} has dtype {t.dtype}, the group expects {dtype}")
    if t.numel() != numel:
        raise ValueError(f"{label} has {t.numel()} elements, its param {numel}")
    if not t.is_contiguous():
        raise ValueError(f"{label} is not contiguous; the triton backend needs contiguous "
                         "tensors (call .contiguous() on it)")
    if numel and t.data_ptr() % ALIGN_BYTES:
        raise ValueError(
            f"{label} starts at address {t.data_ptr():#x}, not a multiple of {ALIGN_BYTES} "
            "bytes; the triton kernels read 16-byte vectors. Use a tensor that owns its storage "
            "(e.g. .clone()) or another backend")


def _label(group: LaunchGroup, what: str, j: int) -> str:
    return f"{what} of tensor {j} (param index {group.param_indices[j]})"


def _check_group(group: LaunchGroup) -> None:
    """Refuses, before anything is launched, what the kernels cannot read correctly."""
    n = len(group.params)
    hyper = group.hyper
    for what, lst in (("grads", group.grads), ("exp_avgs", group.exp_avgs),
                      ("exp_avg_sqs", group.exp_avg_sqs), ("steps", group.steps),
                      ("param_indices", group.param_indices),
                      ("elem_offsets", group.elem_offsets),
                      ("global_numels", group.global_numels)):
        if len(lst) != n:
            raise ValueError(f"LaunchGroup has {n} params but {len(lst)} {what}")
    if hyper.bound_mode != 0 and (group.p_inits is None or len(group.p_inits) != n):
        raise ValueError(f"bound_mode {hyper.bound_mode} needs one p_init per param; got "
                         f"{None if group.p_inits is None else len(group.p_inits)}")
    if not 0 <= int(group.seed) < 2 ** 64:
        raise ValueError(f"seed must be in [0, 2**64), got {group.seed}")
    dev = group.device
    expect = [("param", group.params, group.param_dtype),
              ("grad", group.grads, group.grad_dtype),
              ("exp_avg", group.exp_avgs, group.state_dtype),
              ("exp_avg_sq", group.exp_avg_sqs, group.state_dtype)]
    if hyper.bound_mode != 0:
        expect.append(("p_init", group.p_inits, group.param_dtype))
    for j in range(n):
        numel = group.params[j].numel()
        for what, lst, dtype in expect:
            _check_tensor(_label(group, what, j), lst[j], dev, dtype, numel)
        s = group.steps[j]
        if not _same_device(s.device, dev) or s.dtype != torch.int64 or s.numel() != 1:
            raise ValueError(f"{_label(group, 'step', j)} must be a one-element int64 tensor on "
                             f"{dev}, got dtype {s.dtype} on {s.device} with {s.numel()} elements")
        if s.data_ptr() % 8:
            raise ValueError(f"{_label(group, 'step', j)} is not 8-byte aligned "
                             f"({s.data_ptr():#x}); use a tensor that owns its storage")
        off, gnumel = int(group.elem_offsets[j]), int(group.global_numels[j])
        if off < 0 or gnumel < off + numel:
            raise ValueError(f"tensor {j}: elem_offset {off} + numel {numel} exceeds "
                             f"global_numel {gnumel}")


def _grads_fit(st: _GroupState, group: LaunchGroup, grad_ptrs: tuple) -> bool:
    """What _check_tensor asks of every gradient, for all of them at once (C-level maps: new
    gradient tensors every step, as zero_grad's default gives, keep the step cheap)."""
    grads = group.grads
    try:
        return (tuple(map(_NUMEL, grads)) == st.numels
                and set(map(_DTYPE, grads)) <= {group.grad_dtype}
                and all(map(_IS_CONTIGUOUS, grads))
                and not functools.reduce(operator.or_, grad_ptrs, 0) % ALIGN_BYTES
                and all(_same_device(d, group.device) for d in set(map(_DEVICE, grads))))
    except (TypeError, AttributeError):  # not a tensor: the checks below name it
        return False


def _check_grads_by_name(group: LaunchGroup) -> None:
    """Raises for the first gradient the kernels cannot read, naming it and the fix."""
    for j, g in enumerate(group.grads):
        _check_tensor(_label(group, "grad", j), g, group.device, group.grad_dtype,
                      group.params[j].numel())


def _refresh_grads(st: _GroupState, group: LaunchGroup, grad_ptrs: tuple) -> None:
    """New gradient tensors: check them, then rewrite the GRAD column in stream order."""
    if not _grads_fit(st, group, grad_ptrs):
        _check_grads_by_name(group)
    if group.device.type == "cuda":
        # one call: pinned host memory, then an asynchronous copy into the column
        col = torch.tensor(grad_ptrs, dtype=torch.int64, pin_memory=True)
    else:
        col = _to_device(torch.tensor(grad_ptrs, dtype=torch.int64), group.device)
    st.table[:, COL_GRAD].copy_(col, non_blocking=True)
    st.grad_ptrs = grad_ptrs


def _build_state(group: LaunchGroup) -> _GroupState:
    _check_group(group)
    hyper = group.hyper
    dev = group.device
    n = len(group.params)
    rows = []
    nblocks_per = []
    block_start = 0
    for j in range(n):
        numel = group.params[j].numel()
        nb = -(-numel // ELEMENTWISE_BLOCK)  # a tensor with no element owns no program
        p0 = group.p_inits[j].data_ptr() if hyper.bound_mode != 0 else 0
        rows.append([group.params[j].data_ptr(), group.grads[j].data_ptr(),
                     group.exp_avgs[j].data_ptr(), group.exp_avg_sqs[j].data_ptr(), p0,
                     group.steps[j].data_ptr(), numel, block_start, int(group.elem_offsets[j]),
                     int(group.param_indices[j]), int(group.global_numels[j])]
                    + [0] * (TABLE_COLS - COL_GLOBAL_NUMEL - 1))
        nblocks_per.append(nb)
        block_start += nb
    nblocks = block_start
    if nblocks >= 2 ** 31:
        raise ValueError(f"a group of {nblocks} blocks exceeds the grid limit 2**31 - 1; "
                         "split the parameters into several param groups")
    st = _GroupState()
    st.lists = (group.params, group.exp_avgs, group.exp_avg_sqs, group.steps, group.p_inits)
    st.param_ptrs = tuple(map(_DATA_PTR, group.params))
    st.numels = tuple(map(_NUMEL, group.params))
    st.grad_ptrs = tuple(map(_DATA_PTR, group.grads))
    st.ntensors = n
    st.nblocks = nblocks
    st.table = _to_device(torch.tensor(rows, dtype=torch.int64).reshape(n, TABLE_COLS), dev)
    bm = torch.repeat_interleave(torch.arange(n, dtype=torch.int32),
                                 torch.tensor(nblocks_per, dtype=torch.int64))
    # Never an empty buffer: every pointer argument must be a real, 16-byte aligned address.
    st.block_map = _to_device(bm if nblocks else torch.zeros(1, dtype=torch.int32), dev)
    st.partial_sum = torch.zeros(max(nblocks, 1), dtype=torch.float32, device=dev)
    st.partial_bad = torch.zeros(max(nblocks, 1), dtype=torch.int32, device=dev)
    st.stats = torch.zeros(max(n, 1), dtype=torch.float32, device=dev)
    st.stats_view = st.stats[:n]
    st.lr_buf = torch.zeros((), dtype=torch.float32, device=dev)
    st.lr_value = None
    st.found_inf = None
    st.lr_arg = None
    st.grads_seen = None
    st.reduce_args = st.commit_args = st.pass2_args = st.commit_last_args = None
    st.variants = variants_for(group.param_dtype, group.grad_dtype, group.state_dtype, hyper)
    st.launchers = {name: _launcher(v, dev) for name, v in st.variants.items()}
    st.commit_last_launcher = _launcher(_COMMIT_LAST, dev) if hyper.nonfinite == "skip" else None
    seed = _i64(group.seed)
    sign = -1.0 if hyper.maximize else 1.0
    b1, b2, eps = _f32(hyper.beta1), _f32(hyper.beta2), _f32(hyper.eps)
    st.pass1_args = _bind(st.table, st.block_map, st.partial_sum, st.partial_bad, seed, sign, b1,
                          b2, eps)
    st.reduce_head = (st.table, st.partial_sum, st.partial_bad, st.stats)
    st.pass2_head = (st.table, st.block_map, st.stats)
    st.pass2_tail = (seed, sign, b1, b2, eps, _f32(hyper.weight_decay), _f32(hyper.clip),
                     _f32(hyper.bound))
    return st
