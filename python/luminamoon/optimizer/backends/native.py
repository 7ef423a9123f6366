"""optimizer/backends/native.py: the native engine's backends: ``cpu`` (the C++ engine's own passes on CPU threads) and
``aot`` (the Triton kernels compiled ahead of time, launched by the C++ runtime on CUDA).

Both implement :class:`~luminamoon.optimizer.backends.base.Backend` on a
:class:`~luminamoon.optimizer._groups.LaunchGroup`, handing the tensors' addresses
(``data_ptr()``) to ``luminamoon._luminav``. Importing this module imports the compiled module
and nothing else happens: no device probing, no bundle loading (that waits for the first group).
"""
from __future__ import annotations

import operator
import os
from typing import List, Optional, Tuple

import torch

from ...kernels.layout import ALIGN_BYTES, DTYPE_CODES, NONFINITE_CODES
from .._groups import LaunchGroup
from .._validation import check_group_tensors
from ._tables import aligned, build_table, grad_column
from .base import Backend

try:
    from ... import _luminav
except ImportError as exc:  # pragma: no cover - depends on the build
    raise ImportError(
        "the native module luminamoon._luminav is not built: "
        f"{exc}; build it with `pip install .` (or `make dev` and PYTHONPATH=python)") from exc

__all__ = ["CpuBackend", "AotBackend"]

_CPU_CACHE = "cpu"
_AOT_CACHE = "aot"


def _dtype_codes(group: LaunchGroup) -> Tuple[int, int, int]:
    return (DTYPE_CODES[group.param_dtype], DTYPE_CODES[group.grad_dtype],
            DTYPE_CODES[group.state_dtype])


def _group_config(group: LaunchGroup):
    """The group's constants as the native engine takes them: one ``_luminav.GroupConfig`` (lr
    excluded), validated there; built once per native launch group."""
    h = group.hyper
    p, g, s = _dtype_codes(group)
    return _luminav.GroupConfig(
        param_dtype=p, grad_dtype=g, state_dtype=s, beta1=float(h.beta1), beta2=float(h.beta2),
        eps=float(h.eps), weight_decay=float(h.weight_decay), clip=float(h.clip),
        bound_mode=int(h.bound_mode), bound=float(h.bound), maximize=bool(h.maximize),
        nonfinite=NONFINITE_CODES[h.nonfinite], stochastic_rounding=bool(h.stochastic_rounding),
        seed=int(group.seed))


def _rows(group: LaunchGroup) -> List[tuple]:
    """The table rows of docs/internals.md (without BLOCK_START) as ints."""
    rows = []
    bounded = group.hyper.bound_mode != 0
    for j in range(len(group)):
        p = group.params[j]
        rows.append((p.data_ptr(), group.grads[j].data_ptr(), group.exp_avgs[j].data_ptr(),
                     group.exp_avg_sqs[j].data_ptr(),
                     group.p_inits[j].data_ptr() if bounded and group.p_inits is not None else 0,
                     group.steps[j].data_ptr(), p.numel(), int(group.elem_offsets[j]),
                     int(group.param_indices[j]), int(group.global_numels[j])))
    return rows


def _lr_value(lr) -> float:
    if isinstance(lr, torch.Tensor):
        return float(lr.item())  # a CPU tensor: no device synchronisation
    return float(lr)


class CpuBackend(Backend):
    """TDCLM on CPU tensors by the C++ engine: multi-threaded, vectorised, deterministic."""

    name = "cpu"

    def __init__(self, num_threads: int = 0):
        if num_threads < 0:
            raise ValueError(f"num_threads must be >= 0 (0 = one per hardware thread), got {num_threads}")
        self.num_threads = int(num_threads)

    def supports(self, group: LaunchGroup) -> bool:
        return (group.device.type == "cpu" and group.param_dtype in DTYPE_CODES
                and group.grad_dtype in DTYPE_CODES
                and group.state_dtype in (torch.float32, torch.bfloat16))

    def _native(self, group: LaunchGroup):
        """The group's C++ CpuGroup, built once per launch group (params, states and counters
        keep their storage for its life: the optimizer makes a new group when one moves) and
        told new gradient addresses once a step, when they changed."""
        st, grad_ptrs = self._state(group)
        if grad_ptrs is not None:
            st.native.set_grads(list(grad_ptrs))
            st.grad_ptrs = grad_ptrs
        return st.native

    def _state(self, group: LaunchGroup):
        """The group's _CpuState, and the gradient addresses (a tuple) its native group must be
        told before its next pass, None where it has them; the caller records them in the
        state's grad_ptrs once told."""
        new_grads = None
        st = group.cache.get(_CPU_CACHE)
        if st is None or not st.matches(group):
            if not self.supports(group):
                raise ValueError(
                    f"cpu backend: group on {group.device} with param {group.param_dtype}, grad "
                    f"{group.grad_dtype}, state {group.state_dtype} is not supported; it needs "
                    "CPU tensors of float32/bfloat16/float16 and float32/bfloat16 states")
            check_group_tensors(group, "cpu")
            rows = _rows(group)
            st = _CpuState(group, rows, _luminav.CpuGroup(_group_config(group), rows,
                                                          self.num_threads))
            group.cache[_CPU_CACHE] = st
        elif group.grads is not st.seen:
            # the step's first pass: its gradients. (The list is held only until the step's
            # commit, so a later step's list cannot be taken for it, and the gradients are not
            # kept alive between steps: the next zero_grad frees them, not this step.)
            grad_ptrs = group.grad_ptrs
            if grad_ptrs is None or len(grad_ptrs) != len(group.grads):
                grad_ptrs = tuple(map(_DATA_PTR, group.grads))
            if grad_ptrs != st.grad_ptrs:
                # (gradients the optimizer vouched for, group.grad_ptrs, kept the dtype, shape
                # and strides this state was built with: its step plan checked them)
                if grad_ptrs is not group.grad_ptrs and (
                        tuple(map(_NUMEL, group.grads)) != st.numels
                        or set(map(_DTYPE, group.grads)) != {group.grad_dtype}
                        or not all(map(_IS_CONTIGUOUS, group.grads))):
                    check_group_tensors(group, "cpu")  # raises, naming the gradient
                new_grads = grad_ptrs
        st.seen = group.grads
        return st, new_grads

    def pass1(self, group: LaunchGroup, found_inf: torch.Tensor) -> None:
        native = self._native(group)
        _check_flag(found_inf, "cpu")
        stats = group.cache[_CPU_CACHE].stats  # every entry written by the pass
        native.pass1(stats.data_ptr(), found_inf.data_ptr())
        group.stats = stats

    def pass2(self, group: LaunchGroup, found_inf: torch.Tensor) -> None:
        native = self._native(group)
        _check_flag(found_inf, "cpu")
        stats = group.stats
        if group.hyper.clip > 0:
            if stats is None:
                raise RuntimeError("pass2 with clip > 0 needs the statistics of pass1; run pass1 first")
            stats = stats.to(torch.float32).contiguous()
        native.pass2(_lr_value(group.lr), stats.data_ptr() if stats is not None else 0,
                     found_inf.data_ptr())

    def commit(self, group: LaunchGroup, found_inf: torch.Tensor) -> None:
        native = self._native(group)
        _check_flag(found_inf, "cpu")
        native.commit(found_inf.data_ptr())
        group.cache[_CPU_CACHE].seen = None  # the step's gradients are not kept past it

    def step_groups(self, groups, flags, skip_flag, skipped) -> bool:
        """One C++ call for the whole step (``_luminav.cpu_step``): the Python between the
        passes of a small model's step costs as much as the passes themselves."""
        if skipped is not None and (not skipped.is_cpu or skipped.dtype != torch.int64
                                    or skipped.numel() != 1):
            return False
        items, told = [], []
        for group, flag in zip(groups, flags):
            st, grad_ptrs = self._state(group)
            _check_flag(flag, "cpu")
            stats = st.stats
            items.append((st.native, _lr_value(group.lr), stats.data_ptr(), flag.data_ptr(),
                          None if grad_ptrs is None else list(grad_ptrs)))
            told.append((st, grad_ptrs))
            group.stats = stats if group.hyper.needs_pass1 else None
        _luminav.cpu_step(items, skip_flag.data_ptr() if skip_flag is not None else 0,
                          skipped.data_ptr() if skipped is not None else 0)
        for st, grad_ptrs in told:
            if grad_ptrs is not None:
                st.grad_ptrs = grad_ptrs
            st.seen = None  # the step's gradients are not kept past it
        return True


_DATA_PTR = torch.Tensor.data_ptr
_NUMEL = torch.Tensor.numel
_IS_CONTIGUOUS = torch.Tensor.is_contiguous
_DTYPE = operator.attrgetter("dtype")


class _CpuState:
    """What CpuBackend keeps for one LaunchGroup (``group.cache["cpu"]``)."""

    __slots__ = ("lists", "param_ptrs", "grad_ptrs", "numels", "hyper", "seed", "native",
                 "stats", "seen")

    def __init__(self, group: LaunchGroup, rows: List[tuple], native) -> None:
        self.lists = (group.params, group.exp_avgs, group.exp_avg_sqs, group.steps,
                      group.p_inits)
        self.param_ptrs = tuple(r[0] for r in rows)
        self.grad_ptrs = tuple(r[1] for r in rows)
        self.numels = tuple(r[6] for r in rows)
        self.hyper, self.seed = group.hyper, int(group.seed)
        self.native = native
        self.stats = torch.zeros(max(len(rows), 1), dtype=torch.float32)[:len(rows)]
        self.seen = group.grads  # this step's gradients, until its commit

    def matches(self, group: LaunchGroup) -> bool:
        lists = self.lists
        return (group.params is lists[0] and group.exp_avgs is lists[1]
                and group.exp_avg_sqs is lists[2] and group.steps is lists[3]
                and group.p_inits is lists[4] and group.hyper == self.hyper
                and int(group.seed) == self.seed
                and (group.param_ptrs if group.param_ptrs is not None
                     else tuple(map(_DATA_PTR, group.params))) == self.param_ptrs)


def _check_flag(found_inf: torch.Tensor, backend: str) -> None:
    if found_inf.dtype != torch.int32 or found_inf.numel() != 1:
        raise ValueError(f"{backend} backend: found_inf must be a 0-dim int32 tensor, got "
                         f"{found_inf.dtype} of {found_inf.numel()} elements")


class _AotState:
    """Device tables and buffers of one launch group (docs/internals.md), built once per table,
    and its kernels (``_luminav.AotGroup``), bound to them at the first launch: the flag tensor
    is known then. Later launches rebind only the flag and lr addresses, where they moved."""

    def __init__(self, backend: "AotBackend", group: LaunchGroup, rows: List[tuple]):
        device = group.device
        host = build_table(group, _luminav.GPU_BLOCK)
        self.nblocks = host.nblocks
        self.table = host.table.to(device)
        self.static_rows = [r[:1] + r[2:] for r in rows]  # every column but the gradient's
        self.grad_ptrs = tuple(r[1] for r in rows)
        self.grads_checked = True
        self._grad_col_host = None
        self.block_map = host.block_map.to(device)
        n = max(self.nblocks, 1)
        self.partial_sum = torch.zeros(n, dtype=torch.float32, device=device)
        self.partial_bad = torch.zeros(n, dtype=torch.int32, device=device)
        self.stats = torch.zeros(max(len(rows), 1), dtype=torch.float32, device=device)
        self.lr = torch.zeros((), dtype=torch.float32, device=device)
        self.lr_value: Optional[float] = None
        self.ntensors = len(rows)
        self.kernels = _luminav.AotGroup(backend.bundle_dir,
                                         device.index if device.index is not None
                                         else torch.cuda.current_device(),
                                         _group_config(group))
        self.flag_ptr = 0  # the found_inf address the launches are bound to; 0: not bound yet
        self.lr_bound = 0  # the lr address pass 2 is bound to

    def launches(self, found_inf: torch.Tensor):
        """The group's kernels with ``found_inf`` as the flag every launch reads or raises."""
        flag = found_inf.data_ptr()
        if flag != self.flag_ptr:
            if self.flag_ptr == 0:
                self.kernels.bind(self.table.data_ptr(), self.block_map.data_ptr(), self.nblocks,
                                  self.partial_sum.data_ptr(), self.partial_bad.data_ptr(),
                                  self.stats.data_ptr(), self.lr.data_ptr(), self.ntensors,
                                  flag, flag)
                self.lr_bound = self.lr.data_ptr()
            else:
                self.kernels.set_flags(flag, flag)
            self.flag_ptr = flag
        return self.kernels

    def bind_lr(self, lr) -> None:
        """Points pass 2 at the step's lr (lr_ptr), rebinding only when the address moved."""
        ptr = self.lr_ptr(lr)
        if ptr != self.lr_bound:
            self.kernels.set_lr(ptr)
            self.lr_bound = ptr

    def set_grad_ptrs(self, grad_ptrs: tuple) -> None:
        """Rewrites the table's GRAD column (asynchronously, from pinned memory)."""
        col = grad_column(grad_ptrs, pinned=True)
        self._grad_col_host = col  # kept alive until the copy has run
        self.table[:, 1].copy_(col, non_blocking=True)
        self.grad_ptrs = grad_ptrs

    def lr_ptr(self, lr) -> int:
        if isinstance(lr, torch.Tensor):
            if (lr.device != self.lr.device or lr.dtype != torch.float32 or lr.numel() != 1
                    or lr.data_ptr() % ALIGN_BYTES):
                self.lr.copy_(lr.reshape(()).to(torch.float32), non_blocking=True)
                self.lr_value = None
                return self.lr.data_ptr()
            return lr.data_ptr()
        lr = float(lr)
        if lr != self.lr_value:
            self.lr.fill_(lr)  # a device write on the stream, no host synchronisation
            self.lr_value = lr
        return self.lr.data_ptr()


class AotBackend(Backend):
    """The Triton kernels of an AOT bundle (``luminamoon aot build``), launched by the C++
    runtime on the current CUDA stream; bitwise equal to the ``triton`` backend."""

    name = "aot"

    def __init__(self, bundle_dir):
        self.bundle_dir = os.path.abspath(os.fspath(bundle_dir))
        manifest = os.path.join(self.bundle_dir, "manifest.json")
        if not os.path.isfile(manifest):
            raise FileNotFoundError(
                f"aot backend: {manifest} does not exist; build a bundle with "
                "`luminamoon aot build --arch <major><minor> --out DIR` and pass aot_bundle=DIR")

    def supports(self, group: LaunchGroup) -> bool:
        return (group.device.type == "cuda" and group.param_dtype in DTYPE_CODES
                and group.grad_dtype in DTYPE_CODES
                and group.state_dtype in (torch.float32, torch.bfloat16)
                and _luminav.has_cuda_driver())

    def _state(self, group: LaunchGroup, *, fresh_step: bool = False) -> _AotState:
        """The group's device tables, built once per launch group.

        Parameters, states, step counters and p_init keep their storage for the life of a
        launch group (the optimizer makes a new group when any of them moves), so only the
        gradients are looked at per step: once, at the step's first pass (``fresh_step``).
        New gradient addresses rewrite the table's gradient column on the stream, with no
        host synchronisation; anything else rebuilds the state.
        """
        if group.device.type != "cuda":
            raise ValueError(f"aot backend: the group is on {group.device}; it runs CUDA tensors only")
        cached = group.cache.get(_AOT_CACHE)
        if cached is not None and cached[0] == (int(group.seed), group.hyper, len(group)):
            state = cached[1]
            if fresh_step or not state.grads_checked:
                grad_ptrs = group.grad_ptrs
                if grad_ptrs is None or len(grad_ptrs) != len(group.grads):
                    grad_ptrs = tuple(g.data_ptr() for g in group.grads)
                if grad_ptrs != state.grad_ptrs:
                    if grad_ptrs is group.grad_ptrs:
                        # gradients the optimizer vouched for: its step plan checked their
                        # dtype, shape, strides and device, and every parameter's address
                        # (states and step counters move only with a new launch group), so
                        # only the new addresses' alignment is left to look at
                        if not aligned(grad_ptrs):
                            check_group_tensors(group, "aot", ALIGN_BYTES)  # names it
                    else:
                        rows = _rows(group)
                        if state.static_rows != [r[:1] + r[2:] for r in rows]:
                            return self._build(group, rows)
                        check_group_tensors(group, "aot", ALIGN_BYTES)
                    state.set_grad_ptrs(grad_ptrs)
                state.grads_checked = True
            return state
        return self._build(group, _rows(group))

    def _build(self, group: LaunchGroup, rows: List[tuple]) -> _AotState:
        check_group_tensors(group, "aot", ALIGN_BYTES)
        state = _AotState(self, group, rows)
        group.cache[_AOT_CACHE] = ((int(group.seed), group.hyper, len(group)), state)
        return state

    @staticmethod
    def _stream(group: LaunchGroup) -> int:
        return torch.cuda.current_stream(group.device).cuda_stream

    def pass1(self, group: LaunchGroup, found_inf: torch.Tensor) -> None:
        st = self._state(group, fresh_step=True)
        stream = self._stream(group)
        kernels = st.launches(found_inf)
        kernels.pass1(stream)
        kernels.reduce(stream)
        group.stats = st.stats[:len(group)]

    def pass2(self, group: LaunchGroup, found_inf: torch.Tensor) -> None:
        st = self._state(group)
        stats = group.stats if group.hyper.clip > 0 else None
        if group.hyper.clip > 0 and stats is None:
            raise RuntimeError("pass2 with clip > 0 needs the statistics of pass1; run pass1 first")
        if stats is not None and stats.data_ptr() != st.stats.data_ptr():
            st.stats[:len(group)].copy_(stats)  # statistics all-reduced elsewhere (sharding)
        kernels = st.launches(found_inf)
        st.bind_lr(group.lr)
        kernels.update(self._stream(group))

    def commit(self, group: LaunchGroup, found_inf: torch.Tensor) -> None:
        st = self._state(group)
        st.launches(found_inf).commit(self._stream(group))
        st.grads_checked = False  # the next step looks at its gradients again
