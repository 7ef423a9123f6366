"""kernels/layout.py: the device tables' layout and the codes the kernels read (no Triton).

The Python owner of every constant the kernels, the Python backends and the C++ engine share
(docs/internals.md, "Device tables"); tests/test_contract.py compares each with the C++ one.
"""
from dataclasses import dataclass

import torch

# One row per tensor of a launch group, int64 columns.
TABLE_COLS = 21
COL_PARAM, COL_GRAD, COL_EXP_AVG, COL_EXP_AVG_SQ, COL_P_INIT, COL_STEP = 0, 1, 2, 3, 4, 5
COL_NUMEL, COL_BLOCK_START, COL_ELEM_OFFSET, COL_PARAM_INDEX, COL_GLOBAL_NUMEL = 6, 7, 8, 9, 10
# Column 11 is unused (zero). Columns 12-17: the step-constant cache, two slots of (t, bits of
# rbc1 | bits of rbc2 << 32, seed_tk) for the steps t with t & 1 == slot; written by the update
# kernels, zero on the host.
COL_CACHE = 12
# The columns the host writes first (0 .. COL_GLOBAL_NUMEL).
HOST_COLS = COL_GLOBAL_NUMEL + 1
# q8 moments (state_dtype "q8", docs/tdclm.md "Quantized moments"), written by the host, zero
# for other state dtypes: the addresses of the float32 block scales of m and of v (row-major
# [numel / ROW_LEN, ceil(ROW_LEN / 256)]) and ROW_LEN, the elements of a block row (K).
COL_EXP_AVG_SCALE, COL_EXP_AVG_SQ_SCALE, COL_ROW_LEN = 18, 19, 20
Q8_HOST_COLS = (COL_EXP_AVG_SCALE, COL_EXP_AVG_SQ_SCALE, COL_ROW_LEN)
# Elements of a q8 block (kernels/quant.py BLOCK).
Q8_BLOCK = 256

# Every element address must be a multiple of this (bytes): the kernels declare it to the
# compiler so that loads and stores become 16-byte vector accesses.
ALIGN_BYTES = 16

# Storage dtype codes (the kernels' P_DTYPE, G_DTYPE, S_DTYPE constexprs).
DTYPE_CODES = {torch.float32: 0, torch.bfloat16: 1, torch.float16: 2}
# S_DTYPE of q8 moments (uint8 codes with float32 block scales).
S_DTYPE_Q8 = 3
# bound_mode codes (BOUND_MODE constexpr).
BOUND_MODES = {"none": 0, "abs": 1, "rel": 2}
# nonfinite policies, in the order of their codes (skip 0, raise 1, propagate 2).
NONFINITE_POLICIES = ("skip", "raise", "propagate")
NONFINITE_CODES = {name: i for i, name in enumerate(NONFINITE_POLICIES)}


@dataclass(frozen=True)
class LaunchFlags:
    """The normalised flags that pick a group's variants (C++ variant_keys(cfg) computes the
    same): SR only when stochastic rounding is on and the params or the states are bf16;
    ``check`` = nonfinite == "skip"; ``use_clip`` = clip > 0 (pass 1 then also sums, NEED_SUM)."""

    sr: bool
    bound_mode: int
    use_clip: bool
    check: bool

    @property
    def need_sum(self) -> bool:
        return self.use_clip

    @property
    def needs_pass1(self) -> bool:
        return self.use_clip or self.check

    @staticmethod
    def normalised(param_dtype: torch.dtype, state_dtype: torch.dtype, *,
                   stochastic_rounding: bool, bound_mode: int, clip: float,
                   nonfinite: str) -> "LaunchFlags":
        if bound_mode not in BOUND_MODES.values():
            raise ValueError(f"bound_mode code must be one of {sorted(BOUND_MODES.values())}, "
                             f"got {bound_mode}")
        if nonfinite not in NONFINITE_POLICIES:
            raise ValueError(f"nonfinite must be one of {NONFINITE_POLICIES}, got {nonfinite!r}")
        bf16 = torch.bfloat16
        return LaunchFlags(sr=bool(stochastic_rounding) and bf16 in (param_dtype, state_dtype),
                           bound_mode=int(bound_mode), use_clip=clip > 0,
                           check=nonfinite == "skip")
