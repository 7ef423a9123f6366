"""optimizer/backends/_tables.py: the per-step state of the table-driven backends (triton, aot,
cpu), written once in Python.

- :func:`host_rows` and :func:`build_table`: the one Python writer of a launch group's rows and
  device table (docs/internals.md, "Device tables", kernels/layout.py); tests/test_contract.py
  compares its bytes with the C++ engine's build_tables.
- :class:`TableState` and :func:`step_state`: what a backend keeps for one LaunchGroup between
  steps (``group.cache[backend]``): the table and its buffers, the invalidation key, the
  gradient addresses and their refresh, the lr slot, and the flag that tells a step's first
  pass from the later ones. The backends differ only in what they launch with it.
"""
from __future__ import annotations

import functools
import operator
from typing import Callable, List, NamedTuple, Optional, Sequence, Tuple, TypeVar

import torch

from ...kernels.layout import (ALIGN_BYTES, COL_BLOCK_START, COL_ELEM_OFFSET, COL_EXP_AVG, COL_EXP_AVG_SQ,
                               COL_GLOBAL_NUMEL, COL_GRAD, COL_NUMEL, COL_P_INIT, COL_PARAM,
                               COL_PARAM_INDEX, COL_STEP, HOST_COLS, Q8_BLOCK, Q8_HOST_COLS,
                               TABLE_COLS)
from ...kernels.quant import Q8
from .._groups import LaunchGroup
from .._validation import _same_device, check_group_tensors

__all__ = ["HostTables", "TableState", "aligned", "build_table", "grad_column", "host_rows",
           "signed64", "step_state"]

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


def _q8_fields(group: LaunchGroup, j: int) -> tuple:
    """(scale_m address, scale_v address, row_len) of tensor j; (0, 0, 0) unless q8."""
    if group.state_dtype != Q8:
        return (0, 0, 0)
    return (group.exp_avg_scales[j].data_ptr(), group.exp_avg_sq_scales[j].data_ptr(),
            int(group.q8_rows[j][1]))


def host_rows(group: LaunchGroup) -> List[tuple]:
    """Every tensor's row as ints, in the C++ engine's RowTuple order (engine/group.h): param,
    grad, exp_avg, exp_avg_sq, p_init (0 unbounded), step, numel, elem_offset, param_index,
    global_numel, then q8's scale_m, scale_v and row_len (0, 0, 0 for other state dtypes).
    Addresses are read from the tensors here."""
    bounded = group.hyper.bound_mode != 0
    return [(p.data_ptr(), group.grads[j].data_ptr(), group.exp_avgs[j].data_ptr(),
             group.exp_avg_sqs[j].data_ptr(), group.p_inits[j].data_ptr() if bounded else 0,
             group.steps[j].data_ptr(), p.numel(), int(group.elem_offsets[j]),
             int(group.param_indices[j]), int(group.global_numels[j])) + _q8_fields(group, j)
            for j, p in enumerate(group.params)]


def _programs(numel: int, row_len: int, block: int) -> int:
    """Programs of ``block`` elements one tensor owns: ceil(numel / block); a q8 tensor's
    (row_len > 0) each own block / 256 whole q8 blocks in (row, block) order."""
    if row_len > 0:
        per = block // Q8_BLOCK
        nq = numel // row_len * -(-row_len // Q8_BLOCK)
        return -(-nq // per)
    return -(-numel // block)


def build_table(group: LaunchGroup, block: int) -> HostTables:
    """The host images of ``group``'s table and block map for programs of ``block`` elements
    (a tensor with no element owns no program), from :func:`host_rows`."""
    n = len(group.params)
    rows = host_rows(group)
    per = [_programs(r[6], r[12], block) for r in rows]
    starts, acc = [], 0
    for nb in per:
        starts.append(acc)
        acc += nb
    if acc > MAX_BLOCKS:
        raise ValueError(f"a group of {acc} blocks exceeds the grid limit 2**31 - 1; split the "
                         "parameters into several param groups")
    host = torch.zeros((n, TABLE_COLS), dtype=torch.int64)
    if n:
        # RowTuple order with BLOCK_START inserted: the table's host columns (checked above)
        cols = torch.tensor([[signed64(a) for a in r[:6]] + [r[6], start] + list(r[7:10])
                             for r, start in zip(rows, starts)], dtype=torch.int64)
        host[:, :HOST_COLS] = cols
        host[:, list(Q8_HOST_COLS)] = torch.tensor(
            [[signed64(r[10]), signed64(r[11]), r[12]] for r in rows], dtype=torch.int64)
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


_DATA_PTR = torch.Tensor.data_ptr
_NUMEL = torch.Tensor.numel
_IS_CONTIGUOUS = torch.Tensor.is_contiguous
_DEVICE = operator.attrgetter("device")
_DTYPE = operator.attrgetter("dtype")


def _to_device(cpu: torch.Tensor, device: torch.device) -> torch.Tensor:
    """A host-built tensor onto ``device`` without waiting for the device: pinned + async."""
    if device.type == "cpu":
        return cpu
    if device.type == "cuda":
        return cpu.pin_memory().to(device, non_blocking=True)
    return cpu.to(device, non_blocking=True)


class TableState:
    """What a table-driven backend keeps for one LaunchGroup between steps.

    Built on the group's first step from its tensors (checked first), and built anew when the
    group's key changes: another list object for params or a state, another param address,
    count, hyperparameter or seed. Parameters, states and step counters keep their storage for
    the life of a launch group (the optimizer makes a new group when one moves), so per step
    only the gradients are looked at, once, on the step's first pass (:func:`step_state`).

    With ``block`` (the GPU backends) it holds the device table and block map for programs of
    ``block`` elements, the partial-sum buffers, the stats buffer and a float32 lr slot on the
    group's device; without (the cpu backend, whose engine keeps its own rows), host stats.
    Backends subclass it for what they launch with.
    """

    __slots__ = ("backend", "align", "lists", "key", "param_ptrs", "grad_ptrs", "numels",
                 "ntensors", "grads_seen", "table", "block_map", "nblocks", "partial_sum",
                 "partial_bad", "stats", "stats_view", "lr_buf", "lr_value", "_grad_col", "flag",
                 "flag_ptr")

    def __init__(self, group: LaunchGroup, backend: str, *, align: Optional[int] = None,
                 block: Optional[int] = None) -> None:
        check_group_tensors(group, backend, align)
        self.backend, self.align = backend, align
        self.lists = (group.params, group.exp_avgs, group.exp_avg_sqs, group.steps,
                      group.p_inits, group.exp_avg_scales, group.exp_avg_sq_scales)
        self.key = (group.hyper, int(group.seed))
        self.param_ptrs = tuple(map(_DATA_PTR, group.params))
        self.grad_ptrs = tuple(map(_DATA_PTR, group.grads))
        self.numels = tuple(map(_NUMEL, group.params))
        n = self.ntensors = len(group.params)
        self.grads_seen = None
        self._grad_col = None
        self.flag, self.flag_ptr = None, 0
        dev = group.device
        if block is None:
            self.table = self.block_map = self.partial_sum = self.partial_bad = None
            self.lr_buf = None
            self.nblocks = 0
            self.stats = torch.zeros(max(n, 1), dtype=torch.float32)
        else:
            host = build_table(group, block)
            self.nblocks = host.nblocks
            self.table = _to_device(host.table, dev)
            self.block_map = _to_device(host.block_map, dev)
            self.partial_sum = torch.zeros(max(self.nblocks, 1), dtype=torch.float32, device=dev)
            self.partial_bad = torch.zeros(max(self.nblocks, 1), dtype=torch.int32, device=dev)
            self.stats = torch.zeros(max(n, 1), dtype=torch.float32, device=dev)
            self.lr_buf = torch.zeros((), dtype=torch.float32, device=dev)
        self.stats_view = self.stats[:n]
        self.lr_value = None

    def matches(self, group: LaunchGroup) -> bool:
        """Built from this group's lists, params, hyperparameters and seed (grads apart)."""
        lists = self.lists
        return (group.params is lists[0] and group.exp_avgs is lists[1]
                and group.exp_avg_sqs is lists[2] and group.steps is lists[3]
                and group.p_inits is lists[4] and group.exp_avg_scales is lists[5]
                and group.exp_avg_sq_scales is lists[6] and len(group.params) == self.ntensors
                and (group.hyper is self.key[0] or group.hyper == self.key[0])
                and int(group.seed) == self.key[1]
                and (group.param_ptrs if group.param_ptrs is not None
                     else tuple(map(_DATA_PTR, group.params))) == self.param_ptrs)

    def grads_fit(self, group: LaunchGroup, grad_ptrs: tuple) -> bool:
        """What check_group_tensors asks of every gradient, for all of them at once (C-level
        maps: new gradient tensors every step, as zero_grad's default gives, keep it cheap)."""
        grads = group.grads
        try:
            return (tuple(map(_NUMEL, grads)) == self.numels
                    and set(map(_DTYPE, grads)) <= {group.grad_dtype}
                    and all(map(_IS_CONTIGUOUS, grads))
                    and (not self.align or aligned(grad_ptrs))
                    and all(_same_device(d, group.device) for d in set(map(_DEVICE, grads))))
        except (TypeError, AttributeError):  # not a tensor: check_group_tensors names it
            return False

    def write_grad_column(self, grad_ptrs: tuple) -> None:
        """Rewrites the device table's GRAD column in stream order (pinned host memory, an
        asynchronous copy; no host synchronisation) and records the addresses."""
        col = grad_column(grad_ptrs, pinned=self.table.device.type == "cuda")
        self._grad_col = col  # the copy's source, kept until the next one
        self.table[:, COL_GRAD].copy_(col, non_blocking=True)
        self.grad_ptrs = grad_ptrs

    def lr_tensor(self, lr, device: torch.device) -> torch.Tensor:
        """The float32 device scalar pass 2 reads this step's lr from: ``lr`` itself where it
        is one (aligned, on the group's device), else the lr slot, written in stream order
        (a float only when it changed; a tensor cast and moved with no host sync)."""
        if isinstance(lr, torch.Tensor):
            if lr.numel() != 1:
                raise ValueError(f"Tensor lr must be 1-element; got a tensor of shape "
                                 f"{tuple(lr.shape)}. Fix: pass a float or a one-element tensor")
            if (lr.dtype == torch.float32 and _same_device(lr.device, device)
                    and lr.data_ptr() % ALIGN_BYTES == 0):
                return lr
            self.lr_buf.copy_(lr.detach().reshape(()), non_blocking=True)
            self.lr_value = None
            return self.lr_buf
        lr = float(lr)
        if lr != self.lr_value:
            self.lr_buf.fill_(lr)  # a device write on the stream, no host synchronisation
            self.lr_value = lr
        return self.lr_buf

    def take_flag(self, found_inf: torch.Tensor, device: torch.device) -> bool:
        """Whether ``found_inf`` is another flag than the one the launches were last given
        (another tensor, or the same one moved to other storage): then it is checked (an int32
        one-element tensor on the group's device, aligned for the GPU kernels) and recorded."""
        if found_inf is self.flag and _DATA_PTR(found_inf) == self.flag_ptr:
            return False
        if not isinstance(found_inf, torch.Tensor) or found_inf.dtype != torch.int32 \
                or found_inf.numel() != 1:
            raise ValueError(f"{self.backend} backend: found_inf must be a 0-dim int32 tensor, "
                             f"got {found_inf!r}")
        if not _same_device(found_inf.device, device):
            raise ValueError(f"{self.backend} backend: found_inf is on {found_inf.device}, the "
                             f"group on {device}; create it on the group's device")
        if self.align and found_inf.data_ptr() % self.align:
            raise ValueError(f"{self.backend} backend: found_inf must be {self.align}-byte "
                             f"aligned (got address {found_inf.data_ptr():#x}); allocate it as "
                             "its own tensor, not a view")
        self.flag, self.flag_ptr = found_inf, _DATA_PTR(found_inf)
        return True

    def end_step(self) -> None:
        """At the step's commit: the next pass is the next step's first, and this step's
        gradient list is not kept alive past it."""
        self.grads_seen = None


S = TypeVar("S", bound=TableState)


def step_state(group: LaunchGroup, name: str, build: Callable[[LaunchGroup], S]
               ) -> Tuple[S, Optional[tuple]]:
    """Backend ``name``'s state of ``group`` (``group.cache[name]``), built by ``build`` where
    there is none or it no longer matches, and the gradient addresses it must be given before
    its next launch (None when it has them). Only a step's first pass looks at the group: the
    later ones find its gradient list already seen.

    New gradients are checked before they are handed back: where the optimizer vouched for
    them (``group.grad_ptrs``: its step plan checked every gradient's dtype, shape, strides and
    device against the ones this state was built with) only their alignment is new to look at;
    else all of them at once, and on a misfit check_group_tensors raises, naming the gradient
    and the fix. The caller records the addresses (``grad_ptrs``) once it has handed them on."""
    st = group.cache.get(name)
    if st is not None and group.grads is st.grads_seen:
        return st, None
    if st is None or not st.matches(group):
        st = build(group)
        group.cache[name] = st
    if len(group.grads) != st.ntensors:
        raise ValueError(f"{st.backend} backend: the group has {st.ntensors} params but "
                         f"{len(group.grads)} grads")
    grad_ptrs = group.grad_ptrs
    if grad_ptrs is None or len(grad_ptrs) != st.ntensors:
        try:
            grad_ptrs = tuple(map(_DATA_PTR, group.grads))
        except (TypeError, AttributeError):
            check_group_tensors(group, st.backend, st.align)  # raises, naming the one
            raise
    new = None
    if grad_ptrs is not st.grad_ptrs and grad_ptrs != st.grad_ptrs:
        if grad_ptrs is group.grad_ptrs:
            fits = not st.align or aligned(grad_ptrs)
        else:
            fits = st.grads_fit(group, grad_ptrs)
        if not fits:
            check_group_tensors(group, st.backend, st.align)  # raises, naming the gradient
        new = grad_ptrs
    st.grads_seen = group.grads
    return st, new
