"""optimizer/_plan.py: the cached step plan: what it was built from, and the check every step
makes that it still describes the parameters (take_grads).

A plan stays valid while every param group holds the same parameter objects and
hyperparameters (lr aside), the same parameters have gradients, and every parameter keeps its
address, dtype, shape and strides; each step hands its launch groups the step's gradients.
"""
from __future__ import annotations

import operator
from typing import Any, Dict, List, Optional, Tuple

import torch

from ._dtensor import local_tensor
from ._groups import LaunchGroup, launch_grads
from ._validation import HYPER_KEYS
from .backends.base import Backend

# What decides the launch groups: the hyperparameters and the group's seed (lr is set on each
# step instead).
_PLAN_KEYS = tuple(k for k in HYPER_KEYS if k != "lr") + ("seed",)
_DATA_PTR = torch.Tensor.data_ptr
_STRIDE = torch.Tensor.stride
_DTYPE = operator.attrgetter("dtype")
_SHAPE = operator.attrgetter("shape")
_GRAD = operator.attrgetter("grad")

try:  # torch's own C++ check of tensors' dtype, device, sizes and strides (torch.compile's)
    from torch._C._dynamo.guards import TensorGuards as _TensorGuards
except ImportError:  # pragma: no cover - depends on the torch build
    _TensorGuards = None
_GUARDS_WORK: Optional[bool] = None  # whether _TensorGuards passed _guards_work's probe

# torch's C++ comparison of tensors' data pointers with recorded ones, in one call (CUDA graph
# trees' check of their static inputs; CUDA builds of torch have it): a pointer read in C++
# instead of one Python call per tensor. None where this torch lacks it.
_PTRS_EQUAL = getattr(torch._C, "_tensors_data_ptrs_at_indices_equal", None)


class _Pointers:
    """The data pointers a step expects of a list of tensors, as the tuple the backends take
    and as what ``_PTRS_EQUAL`` compares against (a list, with the list of indices)."""

    __slots__ = ("ptrs", "as_list", "indices")

    def __init__(self, ptrs: tuple, indices: Optional[list] = None):
        self.ptrs = ptrs
        self.as_list = list(ptrs)
        self.indices = indices if indices is not None else list(range(len(ptrs)))

    def equal(self, tensors: List[torch.Tensor]) -> bool:
        """Whether every tensor of ``tensors`` (a list as long as ``ptrs``) starts at its
        recorded address; raises what a non-tensor raises (None has no data pointer)."""
        if _PTRS_EQUAL is not None:
            return _PTRS_EQUAL(tensors, self.as_list, self.indices)
        return tuple(map(_DATA_PTR, tensors)) == self.ptrs


def _new_guards(tensors: List[torch.Tensor]):
    """torch's TensorGuards over ``tensors`` as they are now (every size and stride static)."""
    return _TensorGuards(*tensors, dynamic_dims_sizes=[list(t.shape) for t in tensors],
                         dynamic_dims_strides=[list(t.stride()) for t in tensors])


def _guards_work() -> bool:
    """Whether this torch's TensorGuards tells apart every change _LayoutGuard must see (its
    constructor and its checks are torch internals): probed once, on tensors made for it."""
    global _GUARDS_WORK
    if _GUARDS_WORK is None:
        try:
            base = torch.zeros(4, 6, dtype=torch.bfloat16)
            guards = _new_guards([base])
            _GUARDS_WORK = bool(guards.check(base)) and not any(
                guards.check(t) for t in (base.view(6, 4), base[:2], base.t(),
                                          base.view(torch.float16), base.float()))
        except Exception:  # noqa: BLE001 - no TensorGuards, or one with another signature
            _GUARDS_WORK = False
    return _GUARDS_WORK


class _LayoutGuard:
    """What a step checks of a launch group's parameters besides their addresses (a p.data
    swapped for another view of the same storage, or another tensor at the same address):
    every parameter's dtype, shape and strides. One C++ call a step where torch's TensorGuards
    works (it also sees requires_grad and the dispatch keys: a change there rebuilds the plan
    too), else the three tuples compared in Python."""

    __slots__ = ("guards", "key")

    def __init__(self, tensors: List[torch.Tensor]):
        self.guards = None
        self.key = None
        if tensors and _TensorGuards is not None and _guards_work():
            try:
                guards = _new_guards(tensors)
                if guards.check(*tensors):
                    self.guards = guards
            except Exception:  # noqa: BLE001 - a tensor it cannot guard: the tuples then
                pass
        if self.guards is None:
            self.key = _layout_key(tensors)

    def holds(self, tensors: List[torch.Tensor]) -> bool:
        """Whether every tensor has the dtype, shape and strides it had at construction."""
        if self.guards is not None:
            return self.guards.check(*tensors)
        return _layout_key(tensors) == self.key


def _layout_key(tensors: List[torch.Tensor]) -> tuple:
    return (tuple(map(_DTYPE, tensors)), tuple(map(_SHAPE, tensors)),
            tuple(map(_STRIDE, tensors)))


class _Plan:
    """Launch groups of one step layout, their backends, and what they were built from.

    The plan stays valid while every param group holds the same parameter objects and
    hyperparameters (lr aside), the same parameters have gradients, and every parameter keeps
    its address, dtype, shape and strides, and its gradient the plan's dtype and a layout the
    plan can read.
    """

    def __init__(self, groups: List[LaunchGroup], backends: List[Backend],
                 lr_sources: List[int], grad_sources: List[List[torch.Tensor]],
                 param_lists: List[Tuple[list, tuple]], keys: List[tuple],
                 without_grad: List[torch.Tensor], sharded: bool):
        self.groups = groups
        self.backends = backends
        self.lr_sources = lr_sources  # param-group index of each launch group
        self.grad_sources = grad_sources  # parameters of each launch group, in order
        self.param_lists = param_lists  # per param group: (its params list, its items then)
        self.keys = keys  # per param group: _plan_key
        self.without_grad = without_grad  # parameters that had no gradient
        self.sharded = sharded  # any DTensor parameter: grads are read through their local shard
        self.owner_ptrs, self.owner_layouts, self.grad_layouts = [], [], []
        # per launch group: the gradients' addresses the last step took (None: none yet), the
        # tensors the backends read (flat views and staging buffers where the group has them),
        # so that a step whose gradients did not move compares them in one call instead of
        # reading each
        self.last_grad_ptrs: List[Optional[_Pointers]] = [None] * len(groups)
        for g, owners in zip(groups, grad_sources):
            # the addresses the backends read (param_ptrs: flat views or staging buffers where
            # a layout needs them), and the owners' own, checked every step
            g.param_ptrs = tuple(map(_DATA_PTR, g.params))
            local = [local_tensor(p) for p in owners] if sharded else owners
            self.owner_ptrs.append(_Pointers(tuple(map(_DATA_PTR, local))))
            self.owner_layouts.append(_LayoutGuard(local))
            # the gradients' dtype and layout the launch modes were chosen for: a step whose
            # gradient has another (a transposed copy, another dtype) rebuilds the plan, which
            # stages that gradient, instead of reaching a backend's refusal
            grads = [p.grad for p in owners]
            self.grad_layouts.append(
                _LayoutGuard([local_tensor(x) for x in grads] if sharded else grads))

    def release_grads(self) -> None:
        """Drops this step's gradients (and their addresses): none is kept alive between steps."""
        for g in self.groups:
            g.grads, g.grad_ptrs = [], None



def _grad_pointers(plan: _Plan, i: int, grads: List[torch.Tensor]) -> tuple:
    """The addresses of launch group ``i``'s gradients (of the same dtype and layout as the
    plan's: checked before): the last step's tuple where they did not move (one C++ call),
    else read one by one (and remembered where that call exists)."""
    if _PTRS_EQUAL is None:
        return tuple(map(_DATA_PTR, grads))
    last = plan.last_grad_ptrs[i]
    if last is not None and last.equal(grads):
        return last.ptrs
    ptrs = tuple(map(_DATA_PTR, grads))
    plan.last_grad_ptrs[i] = _Pointers(ptrs, last.indices if last is not None else None)
    return ptrs


def _plan_key(group: Dict[str, Any]) -> Optional[tuple]:
    """The hyperparameters a plan was built for; None where one is missing or malformed (the
    plan is then rebuilt, and the rebuild's validation names the value and the fix)."""
    try:
        return tuple(tuple(group[k]) if k == "betas" else group[k] for k in _PLAN_KEYS)
    except Exception:  # noqa: BLE001 - a deleted key, betas=0.9, ...
        return None


def take_grads(plan: _Plan, groups: List[Dict[str, Any]]) -> bool:
    """Checks that ``plan`` still describes the parameters, on every step: keep it cheap.

    When it does, hands each launch group this step's gradients with their addresses (its
    ``param_ptrs``, set with the plan, are then checked: backends need not look again) and
    returns True; else returns False and changes nothing. (A gradient lives on its
    parameter's device: autograd enforces it.)
    """
    if len(groups) != len(plan.keys):
        return False
    for group, (params, items), key in zip(groups, plan.param_lists, plan.keys):
        now = group["params"]
        if (now is not params or len(now) != len(items)
                or not all(map(operator.is_, now, items)) or _plan_key(group) != key):
            return False
    for p in plan.without_grad:
        if p.grad is not None:
            return False
    taken = []
    for i, (launch, owners) in enumerate(zip(plan.groups, plan.grad_sources)):
        grads = list(map(_GRAD, owners))
        try:
            # None (a gradient gone) has no data pointer, nor has a sparse gradient; the
            # gradients' dtype and layout are the guard's
            local = [local_tensor(p) for p in owners] if plan.sharded else owners
            if plan.sharded:
                grads = [local_tensor(g) for g in grads]
            if (not plan.owner_ptrs[i].equal(local)
                    or not plan.owner_layouts[i].holds(local)
                    or not plan.grad_layouts[i].holds(grads)):
                return False
            if launch.modes is not None:
                grads = launch_grads(launch, grads, owners)
                if grads is None:
                    return False
            grad_ptrs = _grad_pointers(plan, i, grads)
        except (AttributeError, RuntimeError, TypeError, ValueError):
            return False
        taken.append((grads, grad_ptrs))
    for launch, (grads, grad_ptrs) in zip(plan.groups, taken):
        launch.grads, launch.grad_ptrs = grads, grad_ptrs
    return True
