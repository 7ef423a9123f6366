"""kernels/blocks.py: where a kernel program's elements are, and how it reads and reduces them:
the element pointers and widening loads, a block's offsets (flat or in rows of eight), the
sub-tiles of a masked block, and the block reductions (@triton.jit helpers of kernels/tdclm.py).
"""
import triton
import triton.language as tl


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
    """Load elements of dtype code DTYPE (where ``mask``; every one when it is None) and widen
    them to float32 (exactly)."""
    if mask is None:
        x = tl.load(ptr + offs)
    else:
        x = tl.load(ptr + offs, mask=mask, other=0.0)
    if DTYPE == 1:
        # bf16 -> fp32 is a 16-bit shift of the bits; done on integers so that the interpreter
        # and the compiled kernel agree bit for bit.
        return (x.to(tl.uint16, bitcast=True).to(tl.uint32) << 16).to(tl.float32, bitcast=True)
    else:
        return x.to(tl.float32)


@triton.jit
def _is_finite(x):
    """Elementwise: x (float32) is neither inf nor NaN."""
    return (x.to(tl.uint32, bitcast=True) & 0x7F800000) != 0x7F800000


@triton.jit
def _block_offsets(pid, block_start, BLOCK: tl.constexpr, VEC: tl.constexpr,
                   TILE: tl.constexpr):
    """int64 element offsets of this program's block inside its tensor (tensors > 2**31 elems).

    TILE (kernels that round stochastically): a [BLOCK/8, 8] tile whose row r holds elements
    8r .. 8r + 7 of the block, for an unsharded tensor a group of eight of the rounding
    streams, so one Philox call serves a row (docs/tdclm.md "Random streams"). Else a flat
    [BLOCK] run (measured faster where nothing draws random words: 1766.6 vs 1842.8 us for a
    256M fp32 step, H200, benchmarks/results/2026-12-01-h200-compare.txt).

    VEC: the contiguous run each thread owns. BLOCK (flat) or 8 (tile) lets every tensor take
    its widest access (16 bytes); 4 keeps 32-bit and 16-bit tensors of one kernel in one
    register layout (16-byte accesses for 32-bit data, 8-byte for 16-bit data) so that no layout
    conversion through shared memory sits between the loads and the arithmetic.
    """
    local_block = pid - block_start
    start = local_block.to(tl.int64) * BLOCK
    if TILE:
        offs = start + (tl.arange(0, BLOCK // 8)[:, None] * 8 + tl.arange(0, 8)[None, :])
        offs = tl.max_contiguous(tl.multiple_of(offs, [8, 8]), [1, VEC])
    else:
        offs = start + tl.arange(0, BLOCK)
        offs = tl.max_contiguous(tl.multiple_of(offs, BLOCK), VEC)
    return start, offs


@triton.jit
def _block_layout(pid, block_start, BLOCK: tl.constexpr, MIXED: tl.constexpr,
                  TILE: tl.constexpr):
    """_block_offsets at the access width a kernel's tensors take: runs of 4 elements where
    32-bit and 16-bit tensors meet (MIXED), rows of 8 (TILE), else the whole block."""
    if MIXED:
        return _block_offsets(pid, block_start, BLOCK, 4, TILE)
    elif TILE:
        return _block_offsets(pid, block_start, BLOCK, 8, TILE)
    else:
        return _block_offsets(pid, block_start, BLOCK, BLOCK, TILE)


# The masked blocks of the kernels that draw rounding words (a tensor's last block, and every
# block of a shard that starts inside a group of eight) run as a loop over sub-tiles of this
# many elements: the registers a kernel gets are those of its heaviest branch, and these two,
# done in one [BLOCK/8, 8] tile, took about twice the full block's (120 against 56 a thread
# for bf16 params and moments: half the programs an SM holds). Elementwise, the same bits.
SUB_BLOCK: tl.constexpr = tl.constexpr(128)


@triton.jit
def _sub_offsets(start, sub, SUB: tl.constexpr):
    """int64 offsets of sub-tile ``sub`` of a block from ``start``: [SUB/8, 8], rows of eight."""
    first = start + sub * SUB
    return first, first + (tl.arange(0, SUB // 8)[:, None] * 8 + tl.arange(0, 8)[None, :])


@triton.jit
def _sum_and_max(s1, a1, s2, a2):
    """(s1 + s2, max(a1, a2)), a NaN in either a winning the max."""
    return s1 + s2, tl.maximum(a1, a2, propagate_nan=tl.PropagateNan.ALL)


@triton.jit
def _reduce_sum_and_max(s, a):
    """(sum of s, max of a) over a flat run or a tile, in a fixed order: one reduction of the
    pair, so a program reaches shared memory and its barriers once for both."""
    if len(s.shape) == 2:
        s, a = tl.reduce((s, a), 1, _sum_and_max)
    return tl.reduce((s, a), 0, _sum_and_max)
