"""optimizer/backends/cpu.py: the ``cpu`` backend, the C++ engine's own passes on CPU threads
(multi-threaded, vectorised, deterministic), driven through luminamoon._luminav.

Per LaunchGroup it keeps the table state of backends/_tables.py (host stats, the invalidation
key, the gradient addresses) and the engine's ``CpuGroup``, built from the group's rows; new
gradient addresses are handed to the engine once a step, where they moved.
"""
from __future__ import annotations

import torch

from ...kernels.layout import DTYPE_CODES
from ...kernels.quant import Q8
from .._groups import LaunchGroup
from ._native import _luminav, group_config, lr_value
from ._tables import TableState, host_rows, step_state
from .base import Backend

__all__ = ["CpuBackend"]

# q8: one-byte codes with float32 block scales (docs/tdclm.md "Quantized moments (q8)")
_STATES = (torch.float32, torch.bfloat16, Q8)


class _CpuState(TableState):
    """What CpuBackend keeps for one LaunchGroup (``group.cache["cpu"]``)."""

    __slots__ = ("native",)

    def __init__(self, group: LaunchGroup, num_threads: int) -> None:
        super().__init__(group, "cpu")
        self.native = _luminav.CpuGroup(group_config(group), host_rows(group), num_threads)


class CpuBackend(Backend):
    """TDCLM on CPU tensors by the C++ engine: multi-threaded, vectorised, deterministic."""

    name = "cpu"

    def __init__(self, num_threads: int = 0):
        if num_threads < 0:
            raise ValueError(f"num_threads must be >= 0 (0 = one per hardware thread), got {num_threads}")
        self.num_threads = int(num_threads)

    def supports(self, group: LaunchGroup) -> bool:
        return (group.device.type == "cpu" and group.param_dtype in DTYPE_CODES
                and group.grad_dtype in DTYPE_CODES and group.state_dtype in _STATES)

    def _build(self, group: LaunchGroup) -> _CpuState:
        if not self.supports(group):
            raise ValueError(
                f"cpu backend: group on {group.device} with param {group.param_dtype}, grad "
                f"{group.grad_dtype}, state {group.state_dtype} is not supported; it needs "
                "CPU tensors of float32/bfloat16/float16 and float32/bfloat16/q8 states")
        return _CpuState(group, self.num_threads)

    def _state(self, group: LaunchGroup, found_inf: torch.Tensor) -> _CpuState:
        """The group's state, its engine group told this step's gradient addresses where they
        moved, ``found_inf`` checked where it is new."""
        st, grad_ptrs = step_state(group, "cpu", self._build)
        if grad_ptrs is not None:
            st.native.set_grads(list(grad_ptrs))
            st.grad_ptrs = grad_ptrs
        st.take_flag(found_inf, group.device)
        return st

    def pass1(self, group: LaunchGroup, found_inf: torch.Tensor) -> None:
        st = self._state(group, found_inf)
        stats = st.stats_view  # every entry written by the pass
        st.native.pass1(stats.data_ptr(), found_inf.data_ptr())
        group.stats = stats

    def pass2(self, group: LaunchGroup, found_inf: torch.Tensor) -> None:
        st = self._state(group, found_inf)
        stats = group.stats
        if group.hyper.clip > 0:
            if stats is None:
                raise RuntimeError("pass2 with clip > 0 needs the statistics of pass1; run pass1 first")
            stats = stats.to(torch.float32).contiguous()
        st.native.pass2(lr_value(group.lr), stats.data_ptr() if stats is not None else 0,
                        found_inf.data_ptr())

    def commit(self, group: LaunchGroup, found_inf: torch.Tensor) -> None:
        st = self._state(group, found_inf)
        st.native.commit(found_inf.data_ptr())
        st.end_step()  # the step's gradients are not kept past it

    def step_groups(self, groups, flags, skip_flag, skipped) -> bool:
        """One C++ call for the whole step (``_luminav.cpu_step``): the Python between the
        passes of a small model's step costs as much as the passes themselves."""
        if skipped is not None and (not skipped.is_cpu or skipped.dtype != torch.int64
                                    or skipped.numel() != 1):
            return False
        items, told = [], []
        for group, flag in zip(groups, flags):
            st, grad_ptrs = step_state(group, "cpu", self._build)
            st.take_flag(flag, group.device)
            stats = st.stats_view
            items.append((st.native, lr_value(group.lr), stats.data_ptr(), flag.data_ptr(),
                          None if grad_ptrs is None else list(grad_ptrs)))
            told.append((st, grad_ptrs))
            group.stats = stats if group.hyper.needs_pass1 else None
        _luminav.cpu_step(items, skip_flag.data_ptr() if skip_flag is not None else 0,
                          skipped.data_ptr() if skipped is not None else 0)
        for st, grad_ptrs in told:
            if grad_ptrs is not None:
                st.grad_ptrs = grad_ptrs
            st.end_step()  # the step's gradients are not kept past it
        return True
