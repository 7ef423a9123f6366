"""optimizer/memory_layout.py: how a tensor of any memory layout enters the kernels, which read flat
contiguous runs of memory.

- ``direct``: every tensor of the parameter (param, grad, moments, p_init) is contiguous.
- ``flat``: all of them are dense (no gaps, no overlap: e.g. channels_last) with the same
  strides, so the same memory position holds the same logical element in each; the kernels
  then run over their memory as one flat run. The update is elementwise, so only two things
  see the order: the per-tensor sum S (summed in memory order: a float32 rounding difference)
  and the rounding streams, keyed on an element's logical flat index (docs/tdclm.md): so this
  mode is used only where nothing is rounded stochastically.
- ``staged``: anything else (layouts that differ, a strided view, or stochastic rounding of a
  non-contiguous tensor): the step copies the tensor into a contiguous buffer before its
  launches and the results back after them.
"""
from __future__ import annotations

from typing import Sequence

import torch

__all__ = ["DIRECT", "FLAT", "STAGED", "is_dense", "layout_mode", "flat_view", "state_like"]

DIRECT, FLAT, STAGED = "direct", "flat", "staged"


def is_dense(t: torch.Tensor) -> bool:
    """No gaps and no overlap: the elements fill numel() consecutive memory slots in some
    order of the dimensions (contiguous, channels_last, a permutation of either)."""
    if t.is_contiguous():
        return True
    dims = sorted((s, n) for s, n in zip(t.stride(), t.shape) if n != 1)
    expected = 1
    for stride, size in dims:
        if stride != expected:
            return False
        expected *= size
    return True


def layout_mode(tensors: Sequence[torch.Tensor], sr: bool) -> str:
    """The mode of one parameter's tensors (param first), given whether the group rounds
    stochastically."""
    if all(t.is_contiguous() for t in tensors):
        return DIRECT
    first = tensors[0]
    if (not sr and all(is_dense(t) for t in tensors)
            and all(t.stride() == first.stride() for t in tensors)):
        return FLAT
    return STAGED


def flat_view(t: torch.Tensor) -> torch.Tensor:
    """A contiguous 1-D view of a dense tensor's memory (its elements in memory order)."""
    if t.is_contiguous():
        return t.view(-1) if t.dim() != 1 else t
    return t.as_strided((t.numel(),), (1,), t.storage_offset())


def state_like(p: torch.Tensor, dtype: torch.dtype, sr: bool) -> torch.Tensor:
    """A zero state tensor for ``p``: in ``p``'s layout where the flat mode can use it (p dense,
    no stochastic rounding), else contiguous."""
    keep = not sr and is_dense(p) and not p.is_contiguous()
    fmt = torch.preserve_format if keep else torch.contiguous_format
    return torch.zeros_like(p, dtype=dtype, memory_format=fmt)
