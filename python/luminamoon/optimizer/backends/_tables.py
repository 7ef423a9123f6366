"""optimizer/backends/_tables.py: the device table of a launch group, written once in Python.

The one Python writer of the layout of docs/internals.md ("Device tables", kernels/layout.py),
used by the triton and the aot backends; tests/test_contract.py compares its bytes with the C++
engine's build_tables.
"""
from __future__ import annotations

import functools
import operator
from typing import NamedTuple, Sequence

import torch

from ...kernels.layout import (ALIGN_BYTES, COL_BLOCK_START, COL_ELEM_OFFSET, COL_EXP_AVG, COL_EXP_AVG_SQ,
                               COL_GLOBAL_NUMEL, COL_GRAD, COL_NUMEL, COL_P_INIT, COL_PARAM,
                               COL_PARAM_INDEX, COL_STEP, HOST_COLS, TABLE_COLS)
from .._groups import LaunchGroup

__all__ = ["HostTables", "aligned", "build_table", "grad_column", "signed64"]

# build_table writes the host columns in this order, one list per row.
if (COL_PARAM, COL_GRAD, COL_EXP_AVG, COL_EXP_AVG_SQ, COL_P_INIT, COL_STEP, COL_NUMEL,
        COL_BLOCK_START, COL_ELEM_OFFSET, COL_PARAM_INDEX, COL_GLOBAL_NUMEL) != tuple(
            range(HOST_COLS)):  # pragma: no cover - a layout change must update build_table
    raise ImportError("kernels/layout.py's host columns are not in build_table's order")

# The kernels take the grid as an int32: a group may own at most this many programs.
MAX_BLOCKS = 2**31 - 1


class HostTables(NamedTuple):
    table: torch.Tensor  # int64 [n, TABLE_COLS] on the CPU; the cache columns zero
    block_map: torch.Tensor  # int32 [max(nblocks, 1)]: the row of every program
    nblocks: int  # programs of pass 1 and pass 2


def signed64(x: int) -> int:
    """An address (uint64) as the int64 with the same bits, as the table stores it."""
    x = int(x) & 0xFFFFFFFFFFFFFFFF
    return x - (1 << 64) if x >= (1 << 63) else x


def aligned(ptrs: Sequence[int]) -> bool:
    """Whether every address is a multiple of ALIGN_BYTES, as the kernels declare them."""
    return not functools.reduce(operator.or_, ptrs, 0) % ALIGN_BYTES


def build_table(group: LaunchGroup, block: int) -> HostTables:
    """The host images of ``group``'s table and block map for programs of ``block`` elements
    (a tensor with no element owns no program). Addresses are read from the tensors here."""
    n = len(group.params)
    bounded = group.hyper.bound_mode != 0
    numels = [p.numel() for p in group.params]
    per = [-(-numel // block) for numel in numels]
    starts, acc = [], 0
    for nb in per:
        starts.append(acc)
        acc += nb
    if acc > MAX_BLOCKS:
        raise ValueError(f"a group of {acc} blocks exceeds the grid limit 2**31 - 1; split the "
                         "parameters into several param groups")
    host = torch.zeros((n, TABLE_COLS), dtype=torch.int64)
    if n:
        cols = torch.tensor(
            [[signed64(group.params[j].data_ptr()), signed64(group.grads[j].data_ptr()),
              signed64(group.exp_avgs[j].data_ptr()), signed64(group.exp_avg_sqs[j].data_ptr()),
              signed64(group.p_inits[j].data_ptr()) if bounded else 0,
              signed64(group.steps[j].data_ptr()), numels[j], starts[j],
              int(group.elem_offsets[j]), int(group.param_indices[j]),
              int(group.global_numels[j])] for j in range(n)], dtype=torch.int64)
        host[:, :HOST_COLS] = cols
    if acc:
        block_map = torch.repeat_interleave(torch.arange(n, dtype=torch.int32),
                                            torch.tensor(per, dtype=torch.int64))
    else:  # never an empty buffer: every pointer argument must be a real, aligned address
        block_map = torch.zeros(1, dtype=torch.int32)
    return HostTables(host, block_map, acc)


def grad_column(grad_ptrs: Sequence[int], pinned: bool) -> torch.Tensor:
    """The GRAD column for new gradient addresses, as a host tensor to copy into the table's
    column asynchronously (pinned when the table lives on a CUDA device)."""
    col = torch.tensor([signed64(x) for x in grad_ptrs], dtype=torch.int64)
    return col.pin_memory() if pinned else col
