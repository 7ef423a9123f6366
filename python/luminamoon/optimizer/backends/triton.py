"""optimizer/backends/triton.py: the ``triton`` backend, the TDCLM step through the Triton
kernels of luminamoon.kernels, compiled just in time, on CUDA (and XPU where Triton has a
backend); on CPU tensors only under TRITON_INTERPRET=1 (tests).

The kernels, their arguments and the device tables they read are specified in
docs/internals.md; the update rule in docs/tdclm.md. Importing this module imports Triton.
"""
import struct
from typing import Optional, Tuple

import torch
import triton

from ...kernels.catalog import COMMIT_LAST_VARIANT, ELEMENTWISE_BLOCK, variants_for
from ...kernels.launch import launcher
from ...kernels.layout import ALIGN_BYTES, DTYPE_CODES
from ...kernels.quant import Q8
from ...kernels.rounding import INTERPRET as _INTERPRET
from .._groups import LaunchGroup
from .._validation import _same_device
from ._tables import TableState, signed64, step_state
from .base import Backend

__all__ = ["TritonBackend"]

_DATA_PTR = torch.Tensor.data_ptr


def _bind(*args) -> Tuple[tuple, tuple]:
    """A launch's arguments for a _Launcher: as given (the JIT's first launch compiles from
    them) and with every tensor replaced by its address (what the direct path hands over)."""
    return args, tuple(_DATA_PTR(a) if isinstance(a, torch.Tensor) else a for a in args)



def _f32(x: float) -> float:
    """A float rounded to float32 (hyperparameters are rounded once, docs/internals.md)."""
    return struct.unpack("f", struct.pack("f", float(x)))[0]


class _GroupState(TableState):
    """What TritonBackend keeps for one LaunchGroup (``group.cache["triton"]``): the table state
    (backends/_tables.py) and the launchers and argument tuples built from it."""

    __slots__ = ("variants", "launchers", "commit_last_launcher", "reduce_head", "pass2_head",
                 "pass2_tail", "lr_arg",
                 # launch arguments, each as _bind gives them
                 "pass1_args", "reduce_args", "pass2_args", "commit_args", "commit_last_args")

    def __init__(self, group: LaunchGroup) -> None:
        super().__init__(group, "triton", align=ALIGN_BYTES, block=ELEMENTWISE_BLOCK)
        hyper = group.hyper
        dev = group.device
        self.lr_arg = None
        self.reduce_args = self.commit_args = self.pass2_args = self.commit_last_args = None
        self.variants = variants_for(group.param_dtype, group.grad_dtype, group.state_dtype,
                                     group.flags)
        self.launchers = {name: launcher(v, dev) for name, v in self.variants.items()}
        self.commit_last_launcher = (launcher(COMMIT_LAST_VARIANT, dev)
                                     if hyper.nonfinite == "skip" else None)
        seed = signed64(group.seed)  # the kernels take the uint64 seed as i64
        sign = -1.0 if hyper.maximize else 1.0
        b1, b2, eps = _f32(hyper.beta1), _f32(hyper.beta2), _f32(hyper.eps)
        self.pass1_args = _bind(self.table, self.block_map, self.partial_sum, self.partial_bad,
                                seed, sign, b1, b2, eps)
        self.reduce_head = (self.table, self.partial_sum, self.partial_bad, self.stats)
        self.pass2_head = (self.table, self.block_map, self.stats)
        self.pass2_tail = (seed, sign, b1, b2, eps, _f32(hyper.weight_decay), _f32(hyper.clip),
                           _f32(hyper.bound))


class TritonBackend(Backend):
    """The TDCLM step on CUDA (and XPU where Triton has a backend) through the Triton kernels
    above; on CPU tensors only under TRITON_INTERPRET=1 (tests).

    Per LaunchGroup it keeps, in ``group.cache["triton"]``, the table state of
    backends/_tables.py (device table and block_map, partial-sum and stats buffers, the lr slot;
    rebuilt when the group's key changes, the GRAD column rewritten when the gradients moved),
    the precomputed argument tuples and one launcher per kernel variant. Nothing in a step waits
    for the device (host-built tables go up through pinned memory, asynchronously).
    """

    name = "triton"

    # -- Backend protocol -----------------------------------------------------------------
    def supports(self, group: LaunchGroup) -> bool:
        if group.param_dtype not in DTYPE_CODES or group.grad_dtype not in DTYPE_CODES:
            return False
        if group.state_dtype not in (torch.float32, torch.bfloat16, Q8):
            return False
        return _device_supported(group.device)

    def pass1(self, group: LaunchGroup, found_inf: torch.Tensor) -> None:
        if not group.hyper.needs_pass1:
            return
        st = self._state(group, found_inf)
        st.launchers["pass1"](st.nblocks, st.pass1_args)
        st.launchers["reduce"](st.ntensors, st.reduce_args)
        group.stats = st.stats_view

    def pass2(self, group: LaunchGroup, found_inf: torch.Tensor) -> None:
        st = self._state(group, found_inf)
        self._set_lr(st, group)
        kernel = "pass2" if group.hyper.needs_pass1 else "single_pass"
        st.launchers[kernel](st.nblocks, st.pass2_args)

    def commit(self, group: LaunchGroup, found_inf: torch.Tensor) -> None:
        st = self._state(group, found_inf)
        st.launchers["commit"](1, st.commit_args)
        st.end_step()

    def commit_last(self, group: LaunchGroup, found_inf: torch.Tensor,
                    skipped: Optional[torch.Tensor]) -> None:
        """The commit, ``skipped += found_inf`` and ``found_inf = 0`` in one kernel
        (``_lumina_tdclm_commit_last_kernel``) where ``skipped`` is an aligned int64 counter on
        the group's device; else the commit and two torch ops (Backend.commit_last)."""
        st = self._state(group, found_inf)
        bound = st.commit_last_args  # None after a new flag (_state)
        if skipped is None or group.hyper.nonfinite != "skip":
            return super().commit_last(group, found_inf, skipped)
        if bound is None or bound[0][2] is not skipped or bound[1][2] != _DATA_PTR(skipped):
            if not (isinstance(skipped, torch.Tensor) and skipped.dtype == torch.int64
                    and skipped.numel() == 1 and _same_device(skipped.device, group.device)
                    and skipped.data_ptr() % ALIGN_BYTES == 0):
                return super().commit_last(group, found_inf, skipped)
            bound = st.commit_last_args = _bind(st.table, found_inf, skipped, st.ntensors)
        st.commit_last_launcher(1, bound)
        st.end_step()

    # -- cache ----------------------------------------------------------------------------
    def _state(self, group: LaunchGroup, found_inf: torch.Tensor) -> _GroupState:
        st, grad_ptrs = step_state(group, "triton", _GroupState)
        if grad_ptrs is not None:
            st.write_grad_column(grad_ptrs)
        if st.take_flag(found_inf, group.device):  # the launches' arguments with the new flag
            st.reduce_args = _bind(*st.reduce_head, found_inf, st.ntensors)
            st.commit_args = _bind(st.table, found_inf, st.ntensors)
            st.commit_last_args = None
            st.lr_arg = None  # pass-2 arguments are rebuilt with the new flag
        return st

    @staticmethod
    def _set_lr(st: _GroupState, group: LaunchGroup) -> None:
        arg = st.lr_tensor(group.lr, group.device)
        if arg is not st.lr_arg or _DATA_PTR(arg) != st.pass2_args[1][4]:
            st.lr_arg = arg
            st.pass2_args = _bind(*st.pass2_head, st.flag, arg, *st.pass2_tail)


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
