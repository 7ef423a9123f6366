"""kernels/tdclm.py: the TDCLM step's kernels (docs/internals.md, "Kernels"); the element
arithmetic they share is in kernels/arith.py, a program's block layout, loads and reductions in
kernels/blocks.py, the random words and storage roundings in kernels/rounding.py, the table
reads in kernels/step_constants.py, and the programs of q8 moments (S_DTYPE 3) in
kernels/tdclm_q8.py.

The same functions are compiled just in time (the ``triton`` backend) and ahead of time
(``luminamoon.aot``); every choice that shapes the generated code and is made at import is made
once (kernels/arith.py), so both builds agree.

Specialisation (what keeps JIT and AOT builds identical):
- Triton's JIT specialises integer arguments (a value of 1 becomes a constant, a multiple of 16
  gets a divisibility hint) and derives an integer argument's type from its value. The AOT
  builder compiles every integer scalar with no hint and a fixed type, so every integer scalar
  of every kernel here (``seed``, ``ntensors``) is listed in ``do_not_specialize`` and carries a
  type annotation (``tl.int64`` / ``tl.int32``).
- Pointer arguments get a 16-byte alignment hint from the JIT when their address allows it; the
  AOT builder marks every pointer argument divisible by 16. The backends therefore only ever
  pass 16-byte aligned pointers (their own buffers, and ``found_inf``/``lr`` after a check).
- Element addresses loaded from the table are declared 16-byte aligned (``tl.multiple_of``) so
  loads and stores move 16-byte vectors; the backends refuse any tensor whose data_ptr is not a
  multiple of 16 when they build a table.

Importing this module defines kernels and nothing else; Triton is required.
"""
import triton
import triton.language as tl

from .blocks import (SUB_BLOCK, _block_layout, _elem_ptr, _is_finite, _load_f32,
                     _reduce_sum_and_max, _sub_offsets)
from .rounding import (_seed_bits, _seed_tk, _storage_to_f32,  # noqa: F401  (used by kernels)
                       _to_storage)
from .arith import (TANH_IMPL, _adam_scalars, _clip_decay_bound,  # noqa: F401
                    _direction, _moment_update, _step_applies, _triton_tanh_fast)
from .quant_tl import _q8_programs
from .tdclm_q8 import _C_ROW_LEN, _q8_pass1_block, _q8_update_block
from .step_constants import (_C_BLOCK_START, _C_NUMEL, _C_STEP, _TC,  # noqa: F401
                             _bias_corrections, _bias_reciprocals, _cache_next_step_constants,
                             _load_row, _load_step_cache, _step_constants)



@triton.jit
def _pass1_loads(g_ptr, m_ptr, v_ptr, offs, mask, G_DTYPE: tl.constexpr, S_DTYPE: tl.constexpr,
                 NEED_SUM: tl.constexpr):
    """The elements pass 1 reads, as float32 (m and v only when it sums)."""
    g_raw = _load_f32(g_ptr, offs, mask, G_DTYPE)
    if NEED_SUM:
        m = _load_f32(m_ptr, offs, mask, S_DTYPE)
        v = _load_f32(v_ptr, offs, mask, S_DTYPE)
    else:
        m = g_raw
        v = g_raw
    return g_raw, m, v


@triton.jit
def _pass1_sums(g_raw, m, v, mask, g0, rbc1, rbc2, key, sign, beta1, beta2, eps,
                S_DTYPE: tl.constexpr, SR: tl.constexpr, NEED_SUM: tl.constexpr,
                WIDE: tl.constexpr, ALIGNED: tl.constexpr, FAST_U: tl.constexpr):
    """(sum of u*u, any non-finite grad) over one block of loaded elements.

    The finite check is one max of |g| a element (a NaN wins it), tested once a block."""
    g_abs = tl.where(mask, tl.abs(g_raw), 0.0)
    if NEED_SUM:
        _m_st, _v_st, u = _moment_update(g_raw, m, v, sign, beta1, beta2, eps, rbc1, rbc2, key,
                                         g0, S_DTYPE, SR, g_raw.numel, ALIGNED, WIDE, FAST_U)
        uu = tl.where(mask, u * u, 0.0)
    else:
        uu = g_abs * 0.0
    s, g_max = _reduce_sum_and_max(uu, g_abs)
    return s, (_is_finite(g_max) == 0).to(tl.int32)


@triton.jit
def _pass1_constants(table, row, t, seed, param_index, beta1, beta2,
                     SR: tl.constexpr, NEED_SUM: tl.constexpr):
    """(rbc1, rbc2, seed_tk) where pass 1 sums, else placeholders it does not read."""
    if NEED_SUM:
        tag, packed, cached_key = _load_step_cache(table, row, t)
        return _step_constants(tag, packed, cached_key, t, seed, param_index, beta1, beta2, SR)
    else:
        return beta1, beta2, _seed_bits(seed)


@triton.jit
def _pass1_sub_tiles(g_ptr, m_ptr, v_ptr, start, numel, elem_offset, rbc1, rbc2, key, sign,
                     beta1, beta2, eps,
                     G_DTYPE: tl.constexpr, S_DTYPE: tl.constexpr, SR: tl.constexpr,
                     NEED_SUM: tl.constexpr, WIDE: tl.constexpr, BLOCK: tl.constexpr,
                     ALIGNED: tl.constexpr, FAST_U: tl.constexpr):
    """Pass 1 over a masked block of a kernel that draws rounding words, SUB_BLOCK elements at a
    time; the sub-tiles' sums added in order."""
    nsub = tl.minimum((numel - start + SUB_BLOCK - 1) // SUB_BLOCK, BLOCK // SUB_BLOCK)
    s = nsub.to(tl.float32) * 0.0
    bad = (nsub * 0).to(tl.int32)
    sub = nsub * 0
    while sub < nsub:  # (a while loop: the interpreter takes no tensor range() bound)
        first, so = _sub_offsets(start, sub, SUB_BLOCK)
        mask = so < numel
        g_raw, m, v = _pass1_loads(g_ptr, m_ptr, v_ptr, so, mask, G_DTYPE, S_DTYPE, NEED_SUM)
        s_sub, bad_sub = _pass1_sums(g_raw, m, v, mask, elem_offset + first, rbc1, rbc2, key,
                                     sign, beta1, beta2, eps, S_DTYPE, SR, NEED_SUM, WIDE,
                                     ALIGNED, FAST_U)
        s += s_sub
        bad = tl.maximum(bad, bad_sub)
        sub += 1
    return s, bad


@triton.jit
def _pass2_loads(p_ptr, g_ptr, m_ptr, v_ptr, p0_ptr, offs, mask, P_DTYPE: tl.constexpr,
                 G_DTYPE: tl.constexpr, S_DTYPE: tl.constexpr, BOUND_MODE: tl.constexpr):
    """The elements pass 2 reads, as float32 (p0 only in the bounded modes)."""
    g_raw = _load_f32(g_ptr, offs, mask, G_DTYPE)
    m = _load_f32(m_ptr, offs, mask, S_DTYPE)
    v = _load_f32(v_ptr, offs, mask, S_DTYPE)
    p = _load_f32(p_ptr, offs, mask, P_DTYPE)
    if BOUND_MODE != 0:
        p0 = _load_f32(p0_ptr, offs, mask, P_DTYPE)
    else:
        p0 = p
    return g_raw, m, v, p, p0


@triton.jit
def _pass2_update(g_raw, m, v, p, p0, p_ptr, m_ptr, v_ptr, offs, mask, g0, key, lr, sign, beta1,
                  beta2, eps, rbc1, rbc2, decay, tau, bound,
                  P_DTYPE: tl.constexpr, S_DTYPE: tl.constexpr, SR: tl.constexpr,
                  BOUND_MODE: tl.constexpr, USE_CLIP: tl.constexpr, WIDE: tl.constexpr,
                  ALIGNED: tl.constexpr, FAST_U: tl.constexpr):
    """Steps 1-8 of docs/internals.md over one block of loaded elements, stored where ``mask``
    (ALIGNED: the block's first global index is a multiple of 8)."""
    m_st, v_st, u = _moment_update(g_raw, m, v, sign, beta1, beta2, eps, rbc1, rbc2, key, g0,
                                   S_DTYPE, SR, offs.numel, ALIGNED, WIDE, FAST_U)
    # 5-7. soft clip, decoupled decay and step, bound
    q = _clip_decay_bound(u, p, p0, lr, decay, tau, bound, BOUND_MODE, USE_CLIP)
    # 8. store p (stream 0), m, v, each rounded to its storage dtype
    p_st = _to_storage(q, P_DTYPE, SR, key, g0, 0, offs.numel, ALIGNED, WIDE)
    tl.store(p_ptr + offs, p_st, mask=mask)
    tl.store(m_ptr + offs, m_st, mask=mask)
    tl.store(v_ptr + offs, v_st, mask=mask)


@triton.jit
def _pass2_sub_tiles(p_ptr, g_ptr, m_ptr, v_ptr, p0_ptr, start, numel, elem_offset, found_inf,
                     key, lr, sign, beta1, beta2, eps, rbc1, rbc2, decay, tau, bound,
                     P_DTYPE: tl.constexpr, G_DTYPE: tl.constexpr, S_DTYPE: tl.constexpr,
                     SR: tl.constexpr, BOUND_MODE: tl.constexpr, USE_CLIP: tl.constexpr,
                     CHECK_FLAG: tl.constexpr, WIDE: tl.constexpr, BLOCK: tl.constexpr,
                     ALIGNED: tl.constexpr, FAST_U: tl.constexpr):
    """Pass 2 over a masked block of a kernel that draws rounding words, SUB_BLOCK elements at
    a time (the sub-tiles the block has elements in); stored where the step applies."""
    nsub = tl.minimum((numel - start + SUB_BLOCK - 1) // SUB_BLOCK, BLOCK // SUB_BLOCK)
    sub = nsub * 0
    while sub < nsub:  # (a while loop: the interpreter takes no tensor range() bound)
        first, so = _sub_offsets(start, sub, SUB_BLOCK)
        inside = so < numel
        g_raw, m, v, p, p0 = _pass2_loads(p_ptr, g_ptr, m_ptr, v_ptr, p0_ptr, so, inside,
                                          P_DTYPE, G_DTYPE, S_DTYPE, BOUND_MODE)
        if CHECK_FLAG:
            store = inside & _step_applies(found_inf, so)
        else:
            store = inside
        _pass2_update(g_raw, m, v, p, p0, p_ptr, m_ptr, v_ptr, so, store,
                      elem_offset + first, key, lr, sign, beta1, beta2, eps, rbc1, rbc2, decay,
                      tau, bound, P_DTYPE, S_DTYPE, SR, BOUND_MODE, USE_CLIP, WIDE, ALIGNED,
                      FAST_U)
        sub += 1


@triton.jit
def _tdclm_update_block(table, block_map, stats, found_inf, lr_ptr, seed, sign, beta1, beta2, eps,
                        weight_decay, clip, bound,
                        P_DTYPE: tl.constexpr, G_DTYPE: tl.constexpr, S_DTYPE: tl.constexpr,
                        SR: tl.constexpr, BOUND_MODE: tl.constexpr, USE_CLIP: tl.constexpr,
                        CHECK_FLAG: tl.constexpr, BLOCK: tl.constexpr):
    """Pass 2 for the block of program_id(0): the body of both update kernels.

    The scalars a program reads (lr, S, the skip flag, the step counter) are loaded together
    right after its table row; the skip flag masks only the stores, so no element load waits
    on it."""
    sign, beta1, beta2, eps = _adam_scalars(sign, beta1, beta2, eps)
    weight_decay = tl.cast(weight_decay, tl.float32)
    clip = tl.cast(clip, tl.float32)
    bound = tl.cast(bound, tl.float32)
    pid = tl.program_id(0)
    row = tl.load(block_map + pid)
    (p_addr, g_addr, m_addr, v_addr, p0_addr, step_addr, numel, block_start, elem_offset,
     param_index, global_numel) = _load_row(table, row)
    # 32-bit and 16-bit element tensors together: one layout of 4 elements per access
    MIXED: tl.constexpr = ((P_DTYPE == 0) != (S_DTYPE == 0)) or ((G_DTYPE == 0) != (S_DTYPE == 0))
    # the wide Philox multiply where every tensor is 16-bit (rounding._stream_words16)
    WIDE: tl.constexpr = ((P_DTYPE != 0) and (G_DTYPE != 0)) and (S_DTYPE != 0)
    # step 4 with the approximate root and division (_direction): as pass 1 decides it
    FAST_U: tl.constexpr = (G_DTYPE != 0) and (S_DTYPE != 0)
    start, offs = _block_layout(pid, block_start, BLOCK, MIXED, SR)
    p_ptr = _elem_ptr(p_addr, P_DTYPE)
    g_ptr = _elem_ptr(g_addr, G_DTYPE)
    m_ptr = _elem_ptr(m_addr, S_DTYPE)
    v_ptr = _elem_ptr(v_addr, S_DTYPE)
    p0_ptr = _elem_ptr(p0_addr, P_DTYPE)
    lr = tl.load(lr_ptr)
    if USE_CLIP:
        s_sum = tl.load(stats + row)
    # every element's store mask also carries the step's skip decision (one int1 for the
    # program; an int1 tensor, not a Python bool, so that every Triton's interpreter takes it
    # as a mask)
    if CHECK_FLAG:
        ok = _step_applies(found_inf, offs)
    else:
        ok = tl.full(offs.shape, 1, tl.int1)
    t = tl.load(step_addr.to(tl.pointer_type(tl.int64))) + 1
    tag, packed, cached_key = _load_step_cache(table, row, t)
    rbc1, rbc2, key = _step_constants(tag, packed, cached_key, t, seed, param_index, beta1, beta2,
                                      SR)
    # the first program of each tensor prepares the next step's constants
    if pid == block_start:
        _cache_next_step_constants(table, row, t, seed, param_index, beta1, beta2)
    decay = 1.0 - lr * weight_decay
    if USE_CLIP:
        tau = clip * tl.sqrt_rn(tl.div_rn(s_sum, global_numel.to(tl.float32)))
    else:
        tau = clip * 0.0
    g0 = elem_offset + start  # the global flat index of the block's first element
    # a shard that starts inside a group of eight matters only to rounding words (the offset
    # is looked at only then; a constexpr-and-tensor test is refused by Triton 3.0/3.1)
    misaligned = 0
    if SR:
        misaligned = elem_offset & 7
    if misaligned != 0:
        # a shard that starts inside a group of eight: two Philox calls a row, masked accesses,
        # in sub-tiles (SUB_BLOCK)
        _pass2_sub_tiles(p_ptr, g_ptr, m_ptr, v_ptr, p0_ptr, start, numel, elem_offset, found_inf,
                         key, lr, sign, beta1, beta2, eps, rbc1, rbc2, decay, tau, bound, P_DTYPE,
                         G_DTYPE, S_DTYPE, SR, BOUND_MODE, USE_CLIP, CHECK_FLAG, WIDE, BLOCK, 0,
                         FAST_U)
    elif start + BLOCK <= numel:
        # a full block: unmasked loads, so accesses stay 16-byte vectors
        g_raw, m, v, p, p0 = _pass2_loads(p_ptr, g_ptr, m_ptr, v_ptr, p0_ptr, offs, None,
                                          P_DTYPE, G_DTYPE, S_DTYPE, BOUND_MODE)
        _pass2_update(g_raw, m, v, p, p0, p_ptr, m_ptr, v_ptr, offs, ok, g0, key, lr, sign,
                      beta1, beta2, eps, rbc1, rbc2, decay, tau, bound, P_DTYPE, S_DTYPE, SR,
                      BOUND_MODE, USE_CLIP, WIDE, 1, FAST_U)
    elif SR:
        # the tensor's last block, in sub-tiles (SUB_BLOCK)
        _pass2_sub_tiles(p_ptr, g_ptr, m_ptr, v_ptr, p0_ptr, start, numel, elem_offset, found_inf,
                         key, lr, sign, beta1, beta2, eps, rbc1, rbc2, decay, tau, bound, P_DTYPE,
                         G_DTYPE, S_DTYPE, SR, BOUND_MODE, USE_CLIP, CHECK_FLAG, WIDE, BLOCK, 1,
                         FAST_U)
    else:
        inside = offs < numel
        g_raw, m, v, p, p0 = _pass2_loads(p_ptr, g_ptr, m_ptr, v_ptr, p0_ptr, offs, inside,
                                          P_DTYPE, G_DTYPE, S_DTYPE, BOUND_MODE)
        _pass2_update(g_raw, m, v, p, p0, p_ptr, m_ptr, v_ptr, offs, inside & ok, g0, key, lr,
                      sign, beta1, beta2, eps, rbc1, rbc2, decay, tau, bound, P_DTYPE, S_DTYPE,
                      SR, BOUND_MODE, USE_CLIP, WIDE, 1, FAST_U)


# ----------------------------------------------------------------------------------------------
# Kernels (names and argument lists: docs/internals.md, "Kernels")
# ----------------------------------------------------------------------------------------------


@triton.jit
def _tdclm_pass1_block(table, block_map, partial_sum, partial_bad, seed, sign, beta1, beta2, eps,
                       G_DTYPE: tl.constexpr, S_DTYPE: tl.constexpr, SR: tl.constexpr,
                       NEED_SUM: tl.constexpr, BLOCK: tl.constexpr):
    """Pass 1 of the program_id(0) (float moments).

    The step counter is loaded with the row; where pass 1 reads 32-bit moments a full block's
    elements are loaded before the constants' cache slot is read (it needs the counter), where
    it draws rounding words (bf16 moments) after; the two results are reduced together at the
    end."""
    sign, beta1, beta2, eps = _adam_scalars(sign, beta1, beta2, eps)
    pid = tl.program_id(0)
    row = tl.load(block_map + pid)
    (_p_addr, g_addr, m_addr, v_addr, _p0_addr, step_addr, numel, block_start, elem_offset,
     param_index, _global_numel) = _load_row(table, row)
    # 32-bit and 16-bit element tensors together: one layout of 4 elements per access
    MIXED: tl.constexpr = NEED_SUM and ((G_DTYPE == 0) != (S_DTYPE == 0))
    # the moments' rounding words matter only with bf16 moments and a sum to take
    TILE: tl.constexpr = (SR and NEED_SUM) and (S_DTYPE == 1)
    WIDE: tl.constexpr = (G_DTYPE != 0) and (S_DTYPE != 0)
    # step 4 with the approximate root and division (_direction): as pass 2 decides it
    FAST_U: tl.constexpr = (G_DTYPE != 0) and (S_DTYPE != 0)
    start, offs = _block_layout(pid, block_start, BLOCK, MIXED, TILE)
    g_ptr = _elem_ptr(g_addr, G_DTYPE)
    m_ptr = _elem_ptr(m_addr, S_DTYPE)
    v_ptr = _elem_ptr(v_addr, S_DTYPE)
    if NEED_SUM:
        t = tl.load(step_addr.to(tl.pointer_type(tl.int64))) + 1
    else:
        t = pid.to(tl.int64)  # (unused: nothing to sum)
    g0 = elem_offset + start  # the global flat index of the block's first element
    full = start + BLOCK <= numel  # (as in pass 2: the offset matters only to rounding words)
    if TILE:
        full = full & ((elem_offset & 7) == 0)
        # the step constants before the elements where pass 1 draws rounding words (its work is
        # bound by instructions there: 905 -> 828 us a 256M bf16 pass 1 on an H100); after the
        # full block's loads elsewhere (bound by memory, whose loads it then issues earlier)
        rbc1, rbc2, key = _pass1_constants(table, row, t, seed, param_index, beta1, beta2, SR,
                                           NEED_SUM)
    if full:
        g_raw, m, v = _pass1_loads(g_ptr, m_ptr, v_ptr, offs, None, G_DTYPE, S_DTYPE, NEED_SUM)
        if not TILE:
            rbc1, rbc2, key = _pass1_constants(table, row, t, seed, param_index, beta1,
                                               beta2, SR, NEED_SUM)
        s, bad = _pass1_sums(g_raw, m, v, tl.full(offs.shape, 1, tl.int1), g0, rbc1, rbc2, key,
                             sign, beta1, beta2, eps, S_DTYPE, SR, NEED_SUM, WIDE, 1,
                             FAST_U)
    else:
        if TILE:
            # in sub-tiles, as pass 2 (SUB_BLOCK)
            if (elem_offset & 7) != 0:
                s, bad = _pass1_sub_tiles(g_ptr, m_ptr, v_ptr, start, numel, elem_offset, rbc1,
                                          rbc2, key, sign, beta1, beta2, eps, G_DTYPE, S_DTYPE,
                                          SR, NEED_SUM, WIDE, BLOCK, 0, FAST_U)
            else:
                s, bad = _pass1_sub_tiles(g_ptr, m_ptr, v_ptr, start, numel, elem_offset, rbc1,
                                          rbc2, key, sign, beta1, beta2, eps, G_DTYPE, S_DTYPE,
                                          SR, NEED_SUM, WIDE, BLOCK, 1, FAST_U)
        else:
            rbc1, rbc2, key = _pass1_constants(table, row, t, seed, param_index, beta1,
                                               beta2, SR, NEED_SUM)
            inside = offs < numel
            g_raw, m, v = _pass1_loads(g_ptr, m_ptr, v_ptr, offs, inside, G_DTYPE, S_DTYPE,
                                       NEED_SUM)
            s, bad = _pass1_sums(g_raw, m, v, inside, g0, rbc1, rbc2, key, sign, beta1, beta2,
                                 eps, S_DTYPE, SR, NEED_SUM, WIDE, 1, FAST_U)
    tl.store(partial_sum + pid, s)
    tl.store(partial_bad + pid, bad)


@triton.jit(do_not_specialize=["seed"])
def _lumina_tdclm_pass1_kernel(table, block_map, partial_sum, partial_bad, seed: tl.int64,
                               sign: tl.float32, beta1: tl.float32, beta2: tl.float32,
                               eps: tl.float32,
                               G_DTYPE: tl.constexpr, S_DTYPE: tl.constexpr, SR: tl.constexpr,
                               NEED_SUM: tl.constexpr, BLOCK: tl.constexpr):
    """Per block: partial_sum = sum of u*u (NEED_SUM) and partial_bad = any non-finite grad."""
    if S_DTYPE == 3:  # q8 moments (layout.S_DTYPE_Q8)
        _q8_pass1_block(table, block_map, partial_sum, partial_bad, seed, sign, beta1, beta2, eps,
                        G_DTYPE, NEED_SUM, BLOCK)
    else:
        _tdclm_pass1_block(table, block_map, partial_sum, partial_bad, seed, sign, beta1, beta2,
                           eps, G_DTYPE, S_DTYPE, SR, NEED_SUM, BLOCK)


@triton.jit(do_not_specialize=["ntensors"])
def _lumina_tdclm_reduce_kernel(table, partial_sum, partial_bad, stats, found_inf,
                                ntensors: tl.int32,
                                BLOCK: tl.constexpr, RBLOCK: tl.constexpr):
    """stats[j] = S_j from tensor j's partials in a fixed order; raises found_inf (int atomic)."""
    j = tl.program_id(0)
    base = table + j.to(tl.int64) * _TC
    numel = tl.load(base + _C_NUMEL)
    block_start = tl.load(base + _C_BLOCK_START)
    nblk = _q8_programs(numel, tl.load(base + _C_ROW_LEN), BLOCK)  # (float moments: ROW_LEN 0)
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
    if S_DTYPE == 3:  # q8 moments
        _q8_update_block(table, block_map, stats, found_inf, lr, seed, sign, beta1, beta2, eps,
                         weight_decay, clip, bound, P_DTYPE, G_DTYPE, SR, BOUND_MODE, USE_CLIP,
                         CHECK_FLAG, BLOCK)
    else:
        _tdclm_update_block(table, block_map, stats, found_inf, lr, seed, sign, beta1, beta2,
                            eps, weight_decay, clip, bound, P_DTYPE, G_DTYPE, S_DTYPE, SR,
                            BOUND_MODE, USE_CLIP, CHECK_FLAG, BLOCK)


@triton.jit(do_not_specialize=["seed"])
def _lumina_adamw_single_pass_kernel(table, block_map, stats, found_inf, lr, seed: tl.int64,
                                     sign: tl.float32, beta1: tl.float32, beta2: tl.float32,
                                     eps: tl.float32, weight_decay: tl.float32,
                                     clip: tl.float32, bound: tl.float32,
                                     P_DTYPE: tl.constexpr, G_DTYPE: tl.constexpr,
                                     S_DTYPE: tl.constexpr, SR: tl.constexpr,
                                     BOUND_MODE: tl.constexpr, BLOCK: tl.constexpr):
    """Pass 2 with USE_CLIP = 0 and CHECK_FLAG = 0: one read and one write of p, m, v."""
    if S_DTYPE == 3:  # q8 moments
        _q8_update_block(table, block_map, stats, found_inf, lr, seed, sign, beta1, beta2, eps,
                         weight_decay, clip, bound, P_DTYPE, G_DTYPE, SR, BOUND_MODE, 0, 0, BLOCK)
    else:
        _tdclm_update_block(table, block_map, stats, found_inf, lr, seed, sign, beta1, beta2,
                            eps, weight_decay, clip, bound, P_DTYPE, G_DTYPE, S_DTYPE, SR,
                            BOUND_MODE, 0, 0, BLOCK)


@triton.jit
def _add_to_step_counters(table, inc, ntensors, TBLOCK: tl.constexpr):
    """The step counter of every table row += inc (int64)."""
    # a while loop: the interpreter cannot take a kernel argument as a range() bound
    c = tl.program_id(0) * 0
    while c < ntensors:
        j = c + tl.arange(0, TBLOCK)
        msk = j < ntensors
        addr = tl.load(table + j.to(tl.int64) * _TC + _C_STEP, mask=msk, other=0)
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


