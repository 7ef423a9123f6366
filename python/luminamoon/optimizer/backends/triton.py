"""optimizer/backends/triton.py: the ``triton`` backend, the TDCLM step through the Triton
kernels of luminamoon.kernels, compiled just in time, on CUDA (and XPU where Triton has a
backend); on CPU tensors only under TRITON_INTERPRET=1 (tests).

The kernels, their arguments and the device tables they read are specified in
docs/internals.md; the update rule in docs/tdclm.md. Importing this module imports Triton.
"""
import operator
import struct
from typing import Optional, Tuple

import torch
import triton

from ...kernels.catalog import COMMIT_LAST_VARIANT, ELEMENTWISE_BLOCK, variants_for
from ...kernels.launch import launcher
from ...kernels.layout import ALIGN_BYTES, COL_GRAD, DTYPE_CODES
from ...kernels.rounding import INTERPRET as _INTERPRET
from .._groups import LaunchGroup
from .._validation import _same_device, check_element_tensor, check_group_tensors
from ._tables import aligned, build_table, grad_column, signed64
from .base import Backend

__all__ = ["TritonBackend"]

_DATA_PTR = torch.Tensor.data_ptr
_NUMEL = torch.Tensor.numel
_IS_CONTIGUOUS = torch.Tensor.is_contiguous
_DEVICE = operator.attrgetter("device")
_DTYPE = operator.attrgetter("dtype")


def _bind(*args) -> Tuple[tuple, tuple]:
    """A launch's arguments for a _Launcher: as given (the JIT's first launch compiles from
    them) and with every tensor replaced by its address (what the direct path hands over)."""
    return args, tuple(_DATA_PTR(a) if isinstance(a, torch.Tensor) else a for a in args)



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
        st.grads_seen = None

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
        st.grads_seen = None

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
            if grad_ptrs is not st.grad_ptrs and grad_ptrs != st.grad_ptrs:
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


def _grads_fit(st: _GroupState, group: LaunchGroup, grad_ptrs: tuple) -> bool:
    """What _check_tensor asks of every gradient, for all of them at once (C-level maps: new
    gradient tensors every step, as zero_grad's default gives, keep the step cheap)."""
    grads = group.grads
    try:
        return (tuple(map(_NUMEL, grads)) == st.numels
                and set(map(_DTYPE, grads)) <= {group.grad_dtype}
                and all(map(_IS_CONTIGUOUS, grads))
                and aligned(grad_ptrs)
                and all(_same_device(d, group.device) for d in set(map(_DEVICE, grads))))
    except (TypeError, AttributeError):  # not a tensor: the checks below name it
        return False


def _check_grads_by_name(group: LaunchGroup) -> None:
    """Raises for the first gradient the kernels cannot read, naming it and the fix."""
    for j, g in enumerate(group.grads):
        check_element_tensor(f"grad of tensor {j} (param index {group.param_indices[j]})", g,
                             group.device, group.grad_dtype, group.params[j].numel(), "triton",
                             ALIGN_BYTES)


def _refresh_grads(st: _GroupState, group: LaunchGroup, grad_ptrs: tuple) -> None:
    """New gradient tensors: check them, then rewrite the GRAD column in stream order.

    Where the optimizer vouched for them (``group.grad_ptrs``: its step plan checked every
    gradient's dtype, shape, strides and device against the ones this state was built with)
    only their addresses' alignment is new to look at."""
    if grad_ptrs is group.grad_ptrs:
        fits = aligned(grad_ptrs)
    else:
        fits = _grads_fit(st, group, grad_ptrs)
    if not fits:
        _check_grads_by_name(group)
    # pinned host memory, then an asynchronous copy into the column
    col = grad_column(grad_ptrs, pinned=group.device.type == "cuda")
    st.table[:, COL_GRAD].copy_(col, non_blocking=True)
    st.grad_ptrs = grad_ptrs


def _build_state(group: LaunchGroup) -> _GroupState:
    check_group_tensors(group, "triton", ALIGN_BYTES)
    hyper = group.hyper
    dev = group.device
    n = len(group.params)
    host = build_table(group, ELEMENTWISE_BLOCK)
    st = _GroupState()
    st.lists = (group.params, group.exp_avgs, group.exp_avg_sqs, group.steps, group.p_inits)
    st.param_ptrs = tuple(map(_DATA_PTR, group.params))
    st.numels = tuple(map(_NUMEL, group.params))
    st.grad_ptrs = tuple(map(_DATA_PTR, group.grads))
    st.ntensors = n
    st.nblocks = host.nblocks
    st.table = _to_device(host.table, dev)
    st.block_map = _to_device(host.block_map, dev)
    st.partial_sum = torch.zeros(max(st.nblocks, 1), dtype=torch.float32, device=dev)
    st.partial_bad = torch.zeros(max(st.nblocks, 1), dtype=torch.int32, device=dev)
    st.stats = torch.zeros(max(n, 1), dtype=torch.float32, device=dev)
    st.stats_view = st.stats[:n]
    st.lr_buf = torch.zeros((), dtype=torch.float32, device=dev)
    st.lr_value = None
    st.found_inf = None
    st.lr_arg = None
    st.grads_seen = None
    st.reduce_args = st.commit_args = st.pass2_args = st.commit_last_args = None
    st.variants = variants_for(group.param_dtype, group.grad_dtype, group.state_dtype,
                               group.flags)
    st.launchers = {name: launcher(v, dev) for name, v in st.variants.items()}
    st.commit_last_launcher = (launcher(COMMIT_LAST_VARIANT, dev)
                               if hyper.nonfinite == "skip" else None)
    seed = signed64(group.seed)  # the kernels take the uint64 seed as i64
    sign = -1.0 if hyper.maximize else 1.0
    b1, b2, eps = _f32(hyper.beta1), _f32(hyper.beta2), _f32(hyper.eps)
    st.pass1_args = _bind(st.table, st.block_map, st.partial_sum, st.partial_bad, seed, sign, b1,
                          b2, eps)
    st.reduce_head = (st.table, st.partial_sum, st.partial_bad, st.stats)
    st.pass2_head = (st.table, st.block_map, st.stats)
    st.pass2_tail = (seed, sign, b1, b2, eps, _f32(hyper.weight_decay), _f32(hyper.clip),
                     _f32(hyper.bound))
    return st
