"""kernels/tdclm_q8.py: the programs of the TDCLM kernels for q8 moments (S_DTYPE 3,
docs/tdclm.md "Quantized moments (q8)"): pass 1 and the update (pass 2 and the single pass),
which kernels/tdclm.py's kernels run under S_DTYPE == 3.

A program owns BLOCK / 256 whole q8 blocks, q8 block index qb = r * nb + b in (row, block)
order, as a [BLOCK / 256, 32, 8] tile (kernels/quant_tl.py); a tensor owns
ceil(rows * nb / (BLOCK / 256)) programs (the table's BLOCK_START counts them so). Where 256
divides the row length K and the program's blocks all exist, its elements are one run of BLOCK
and the loads are unmasked vectors; else each block starts at r * K + 256 b and is masked to
its length. m, v, m', v' and u are float32 as for float32 moments (IEEE square root and
division); pass 2 computes each block's scale and reciprocal once, and each code with the
rounding words of streams 3 (m) and 4 (v).
"""
import triton
import triton.language as tl

from . import layout
from .arith import _adam_scalars, _clip_decay_bound, _moment_update, _step_applies
from .blocks import _elem_ptr, _is_finite, _load_f32
from .quant_tl import (_block_scale, _code_m, _code_v, _cm, _cv, _normalise, _q8_words)
from .rounding import _to_bf16, _to_storage
from .step_constants import (_TC, _cache_next_step_constants, _load_row, _load_step_cache,
                             _step_constants)

_C_SCALE_M: tl.constexpr = tl.constexpr(layout.COL_EXP_AVG_SCALE)
_C_SCALE_V: tl.constexpr = tl.constexpr(layout.COL_EXP_AVG_SQ_SCALE)
_C_ROW_LEN: tl.constexpr = tl.constexpr(layout.COL_ROW_LEN)
_STREAM_P: tl.constexpr = tl.constexpr(0)
_STREAM_M: tl.constexpr = tl.constexpr(3)  # rng.STREAM_Q8_EXP_AVG
_STREAM_V: tl.constexpr = tl.constexpr(4)  # rng.STREAM_Q8_EXP_AVG_SQ


@triton.jit
def _q8_row(table, row):
    """The q8 columns of a table row: the scales' float32 pointers (m, v) and the row length."""
    base = table + row.to(tl.int64) * _TC
    sm = tl.load(base + _C_SCALE_M).to(tl.pointer_type(tl.float32))
    sv = tl.load(base + _C_SCALE_V).to(tl.pointer_type(tl.float32))
    return sm, sv, tl.load(base + _C_ROW_LEN)


@triton.jit
def _codes_ptr(addr):
    return tl.multiple_of(addr.to(tl.pointer_type(tl.uint8)), 16)


@triton.jit
def _q8_tile(local, numel, row_len, NQB: tl.constexpr):
    """(qb [NQB], first element of each block [1, NQB, 1], offsets [32, NQB, 8], the
    elements' mask, the blocks' mask) of program ``local`` of its tensor (masked form)."""
    nb = (row_len + 255) // 256
    qb = local.to(tl.int64) * NQB + tl.arange(0, NQB)
    qmask = qb < (numel // row_len) * nb
    r = qb // nb
    b = qb - r * nb
    first = (r * row_len + b * 256)[None, :, None]
    blen = tl.minimum(row_len - b * 256, 256)[None, :, None]
    pos = tl.arange(0, 32)[:, None, None] * 8 + tl.arange(0, 8)[None, None, :]
    mask = (pos < blen) & qmask[None, :, None]
    return qb, first, first + pos, mask, qmask


@triton.jit
def _q8_full_tile(local, NQB: tl.constexpr):
    """(qb, first, offsets) of a program whose NQB blocks are one run of NQB * 256 elements."""
    qb = local.to(tl.int64) * NQB + tl.arange(0, NQB)
    first = (qb * 256)[None, :, None]
    offs = first + (tl.arange(0, 32)[:, None, None] * 8 + tl.arange(0, 8)[None, None, :])
    offs = tl.max_contiguous(tl.multiple_of(offs, [8, 8, 8]), [1, 1, 8])
    return qb, first, offs


@triton.jit
def _load_codes(ptr, offs, mask):
    if mask is None:
        return tl.load(ptr + offs).to(tl.int32)
    else:
        return tl.load(ptr + offs, mask=mask, other=0).to(tl.int32)


@triton.jit
def _decode(mc_ptr, vc_ptr, sm_ptr, sv_ptr, offs, mask, qb, qmask):
    """m and v of a tile, float32: scale * C[code]."""
    if qmask is None:
        sm = tl.load(sm_ptr + qb)
        sv = tl.load(sv_ptr + qb)
    else:
        sm = tl.load(sm_ptr + qb, mask=qmask, other=0.0)
        sv = tl.load(sv_ptr + qb, mask=qmask, other=0.0)
    m = sm[None, :, None] * _cm(_load_codes(mc_ptr, offs, mask))
    v = sv[None, :, None] * _cv(_load_codes(vc_ptr, offs, mask))
    return m, v


@triton.jit
def _q8_pass1_tile(g_ptr, mc_ptr, vc_ptr, sm_ptr, sv_ptr, offs, mask, qb, qmask, sign, beta1,
                   beta2, eps, rbc1, rbc2, G_DTYPE: tl.constexpr, NEED_SUM: tl.constexpr):
    """(sum of u*u, any non-finite grad) over a tile."""
    g = _load_f32(g_ptr, offs, mask, G_DTYPE)
    bad = (_is_finite(g) == 0).to(tl.int32)
    if mask is not None:
        bad = tl.where(mask, bad, 0)
    if NEED_SUM:
        m, v = _decode(mc_ptr, vc_ptr, sm_ptr, sv_ptr, offs, mask, qb, qmask)
        _m, _v, u = _moment_update(g, m, v, sign, beta1, beta2, eps, rbc1, rbc2, 0, 0, 0, 0,
                                   8, 1, 0, 0)
        uu = u * u
        if mask is not None:
            uu = tl.where(mask, uu, 0.0)
        s = tl.sum(tl.sum(tl.sum(uu, axis=2), axis=1), axis=0)
    else:
        s = rbc1 * 0.0
    return s, tl.max(tl.max(tl.max(bad, axis=2), axis=1), axis=0)


@triton.jit
def _q8_pass1_block(table, block_map, partial_sum, partial_bad, seed, sign, beta1, beta2, eps,
                    G_DTYPE: tl.constexpr, NEED_SUM: tl.constexpr, BLOCK: tl.constexpr):
    """Pass 1 of the program_id(0): partial_sum = sum of u*u (NEED_SUM), partial_bad = any
    non-finite grad, over its q8 blocks."""
    NQB: tl.constexpr = BLOCK // 256
    sign, beta1, beta2, eps = _adam_scalars(sign, beta1, beta2, eps)
    pid = tl.program_id(0)
    row = tl.load(block_map + pid)
    (_p, g_addr, m_addr, v_addr, _p0, step_addr, numel, block_start, _off, param_index,
     _gn) = _load_row(table, row)
    sm_ptr, sv_ptr, row_len = _q8_row(table, row)
    g_ptr = _elem_ptr(g_addr, G_DTYPE)
    mc_ptr = _codes_ptr(m_addr)
    vc_ptr = _codes_ptr(v_addr)
    if NEED_SUM:
        t = tl.load(step_addr.to(tl.pointer_type(tl.int64))) + 1
        tag, packed, cached_key = _load_step_cache(table, row, t)
        rbc1, rbc2, _key = _step_constants(tag, packed, cached_key, t, seed, param_index, beta1,
                                           beta2, 0)
    else:
        rbc1 = beta1
        rbc2 = beta2
    local = pid - block_start
    nqb = (numel // row_len) * ((row_len + 255) // 256)
    if ((row_len & 255) == 0) & ((local + 1) * NQB <= nqb):
        qb, _first, offs = _q8_full_tile(local, NQB)
        s, bad = _q8_pass1_tile(g_ptr, mc_ptr, vc_ptr, sm_ptr, sv_ptr, offs, None, qb, None,
                                sign, beta1, beta2, eps, rbc1, rbc2, G_DTYPE, NEED_SUM)
    else:
        qb, _first, offs, mask, qmask = _q8_tile(local, numel, row_len, NQB)
        s, bad = _q8_pass1_tile(g_ptr, mc_ptr, vc_ptr, sm_ptr, sv_ptr, offs, mask, qb, qmask,
                                sign, beta1, beta2, eps, rbc1, rbc2, G_DTYPE, NEED_SUM)
    tl.store(partial_sum + pid, s)
    tl.store(partial_bad + pid, bad)


@triton.jit
def _requantize(x, mask, words_key, first, STREAM: tl.constexpr, SIGNED: tl.constexpr,
                ALIGNED: tl.constexpr, WIDE: tl.constexpr):
    """(codes as uint8, the blocks' scales [NQB]) of the float32 tile x (m' or v')."""
    scale = _block_scale(x, mask)
    y = _normalise(x, scale[None, :, None], SIGNED)
    words = _q8_words(words_key, first, STREAM, ALIGNED, WIDE)
    if SIGNED:
        code = _code_m(y, words)
    else:
        code = _code_v(y, words)
    return code.to(tl.uint8), scale


@triton.jit
def _q8_update_tile(p_ptr, g_ptr, mc_ptr, vc_ptr, p0_ptr, sm_ptr, sv_ptr, offs, mask, qb,
                    qmask, first, ok, ok_b, key, lr, sign, beta1, beta2, eps, rbc1, rbc2, decay,
                    tau, bound, P_DTYPE: tl.constexpr, G_DTYPE: tl.constexpr, SR: tl.constexpr,
                    BOUND_MODE: tl.constexpr, USE_CLIP: tl.constexpr, ALIGNED: tl.constexpr,
                    WIDE: tl.constexpr):
    """Steps 1-8 over a tile; stores where ``ok`` (and ``mask``), each block's scales where
    ``ok_b`` (and ``qmask``): the step's skip decision as a mask of the elements and of the
    blocks."""
    g = _load_f32(g_ptr, offs, mask, G_DTYPE)
    p = _load_f32(p_ptr, offs, mask, P_DTYPE)
    if BOUND_MODE != 0:
        p0 = _load_f32(p0_ptr, offs, mask, P_DTYPE)
    else:
        p0 = p
    m, v = _decode(mc_ptr, vc_ptr, sm_ptr, sv_ptr, offs, mask, qb, qmask)
    m_new, v_new, u = _moment_update(g, m, v, sign, beta1, beta2, eps, rbc1, rbc2, 0, 0, 0, 0,
                                     8, 1, 0, 0)
    q = _clip_decay_bound(u, p, p0, lr, decay, tau, bound, BOUND_MODE, USE_CLIP)
    if SR and (P_DTYPE == 1):
        p_st = _to_bf16(q, _q8_words(key, first, _STREAM_P, ALIGNED, WIDE), 1)
    else:
        p_st = _to_storage(q, P_DTYPE, 0, key, 0, 0, 8, 1)
    m_codes, m_scale = _requantize(m_new, mask, key, first, _STREAM_M, 1, ALIGNED, WIDE)
    v_codes, v_scale = _requantize(v_new, mask, key, first, _STREAM_V, 0, ALIGNED, WIDE)
    store = ok
    if mask is not None:
        store = store & mask
        ok_b = ok_b & qmask
    tl.store(p_ptr + offs, p_st, mask=store)
    tl.store(mc_ptr + offs, m_codes, mask=store)
    tl.store(vc_ptr + offs, v_codes, mask=store)
    tl.store(sm_ptr + qb, m_scale, mask=ok_b)
    tl.store(sv_ptr + qb, v_scale, mask=ok_b)


@triton.jit
def _skip_masks(found_inf, offs, qb, CHECK_FLAG: tl.constexpr):
    """The step's skip decision as masks of a tile's elements and of its blocks."""
    if CHECK_FLAG:
        return _step_applies(found_inf, offs), _step_applies(found_inf, qb)
    else:
        return tl.full(offs.shape, 1, tl.int1), tl.full(qb.shape, 1, tl.int1)


@triton.jit
def _q8_update_block(table, block_map, stats, found_inf, lr_ptr, seed, sign, beta1, beta2, eps,
                     weight_decay, clip, bound,
                     P_DTYPE: tl.constexpr, G_DTYPE: tl.constexpr, SR: tl.constexpr,
                     BOUND_MODE: tl.constexpr, USE_CLIP: tl.constexpr,
                     CHECK_FLAG: tl.constexpr, BLOCK: tl.constexpr):
    """Pass 2 (and the single pass) of the program_id(0) over its q8 blocks."""
    NQB: tl.constexpr = BLOCK // 256
    sign, beta1, beta2, eps = _adam_scalars(sign, beta1, beta2, eps)
    weight_decay = tl.cast(weight_decay, tl.float32)
    clip = tl.cast(clip, tl.float32)
    bound = tl.cast(bound, tl.float32)
    pid = tl.program_id(0)
    row = tl.load(block_map + pid)
    (p_addr, g_addr, m_addr, v_addr, p0_addr, step_addr, numel, block_start, elem_offset,
     param_index, global_numel) = _load_row(table, row)
    sm_ptr, sv_ptr, row_len = _q8_row(table, row)
    # the wide Philox multiply where the element tensors are 16-bit (rounding._philox)
    WIDE: tl.constexpr = (P_DTYPE != 0) and (G_DTYPE != 0)
    p_ptr = _elem_ptr(p_addr, P_DTYPE)
    g_ptr = _elem_ptr(g_addr, G_DTYPE)
    p0_ptr = _elem_ptr(p0_addr, P_DTYPE)
    mc_ptr = _codes_ptr(m_addr)
    vc_ptr = _codes_ptr(v_addr)
    lr = tl.load(lr_ptr)
    if USE_CLIP:
        s_sum = tl.load(stats + row)
    t = tl.load(step_addr.to(tl.pointer_type(tl.int64))) + 1
    tag, packed, cached_key = _load_step_cache(table, row, t)
    rbc1, rbc2, key = _step_constants(tag, packed, cached_key, t, seed, param_index, beta1, beta2,
                                      1)
    if pid == block_start:
        _cache_next_step_constants(table, row, t, seed, param_index, beta1, beta2)
    decay = 1.0 - lr * weight_decay
    if USE_CLIP:
        tau = clip * tl.sqrt_rn(tl.div_rn(s_sum, global_numel.to(tl.float32)))
    else:
        tau = clip * 0.0
    local = pid - block_start
    nqb = (numel // row_len) * ((row_len + 255) // 256)
    if ((row_len & 255) == 0) & ((local + 1) * NQB <= nqb) & ((elem_offset & 7) == 0):
        qb, first, offs = _q8_full_tile(local, NQB)
        ok, ok_b = _skip_masks(found_inf, offs, qb, CHECK_FLAG)
        _q8_update_tile(p_ptr, g_ptr, mc_ptr, vc_ptr, p0_ptr, sm_ptr, sv_ptr, offs, None, qb,
                        None, elem_offset + first, ok, ok_b, key, lr, sign, beta1, beta2, eps,
                        rbc1, rbc2, decay, tau, bound, P_DTYPE, G_DTYPE, SR, BOUND_MODE, USE_CLIP,
                        1, WIDE)
    else:
        qb, first, offs, mask, qmask = _q8_tile(local, numel, row_len, NQB)
        ok, ok_b = _skip_masks(found_inf, offs, qb, CHECK_FLAG)
        if ((row_len & 7) == 0) & ((elem_offset & 7) == 0):  # rows of eight: one word call
            _q8_update_tile(p_ptr, g_ptr, mc_ptr, vc_ptr, p0_ptr, sm_ptr, sv_ptr, offs, mask, qb,
                            qmask, elem_offset + first, ok, ok_b, key, lr, sign, beta1, beta2,
                            eps, rbc1, rbc2, decay, tau, bound, P_DTYPE, G_DTYPE, SR, BOUND_MODE,
                            USE_CLIP, 1, WIDE)
        else:
            _q8_update_tile(p_ptr, g_ptr, mc_ptr, vc_ptr, p0_ptr, sm_ptr, sv_ptr, offs, mask, qb,
                            qmask, elem_offset + first, ok, ok_b, key, lr, sign, beta1, beta2,
                            eps, rbc1, rbc2, decay, tau, bound, P_DTYPE, G_DTYPE, SR, BOUND_MODE,
                            USE_CLIP, 0, WIDE)
