"""The LuminaMoon optimizer: validation, param groups, state, and launch-group planning.

A step is planned once (grouping, state creation, backend choice) and the plan is reused
until the parameters with gradients, a hyperparameter other than lr, or a parameter's storage
change. The update itself runs through :func:`luminamoon.optimizer.functional.run_launch_groups`.
"""
from __future__ import annotations

import math
import operator
from typing import Any, Dict, Iterable, List, Optional, Tuple

import torch

from ._device import _get_generator
from ._groups import LaunchGroup, TensorRef, group_tensors
from ._validation import (
    HYPER_KEYS,
    check_grad,
    check_param,
    check_state_tensor,
    make_hyper,
    validate_backend,
    validate_hyperparameters,
    validate_lr,
    validate_seed,
)
from ._dtensor import is_dtensor, local_tensor, shard_layout
from ._step import run_launch_groups
from .backends import select_backend
from .backends.base import Backend

__all__ = ["LuminaMoon"]

# Hyperparameters that decide the launch groups (lr is set on each step instead).
_PLAN_KEYS = tuple(k for k in HYPER_KEYS if k != "lr")


def _draw_seed(device: torch.device) -> int:
    """A 64-bit seed from the default generator of ``device`` (two 32-bit draws)."""
    gen = _get_generator(device)
    words = torch.randint(0, 2**32, (2,), dtype=torch.int64, device=gen.device, generator=gen)
    lo, hi = (int(w) for w in words.tolist())
    return (hi << 32) | lo


def _plan_key(group: Dict[str, Any]) -> tuple:
    return tuple(tuple(group[k]) if k == "betas" else group[k] for k in _PLAN_KEYS)


_DATA_PTR = torch.Tensor.data_ptr
_DTYPE = operator.attrgetter("dtype")

try:  # the registries of torch.optim.Optimizer's global step hooks
    from torch.optim.optimizer import _global_optimizer_post_hooks, _global_optimizer_pre_hooks
except ImportError:  # pragma: no cover - then every step goes through torch's wrapper
    _global_optimizer_pre_hooks = _global_optimizer_post_hooks = None


def _profiler_enabled() -> bool:
    """Whether a torch profiler is recording (then the step opens torch's range)."""
    return _PROFILER_ENABLED is None or bool(_PROFILER_ENABLED())


_PROFILER_ENABLED = getattr(getattr(torch._C, "_autograd", None), "_profiler_enabled", None)
_GRAD = operator.attrgetter("grad")


class _Plan:
    """Launch groups of one step layout, their backends, and what they were built from.

    The plan stays valid while every param group holds the same parameter objects and
    hyperparameters (lr aside), the same parameters have gradients, every parameter keeps its
    storage address, and every gradient keeps its plan's dtype and a dense layout.
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
        for g in groups:  # the storage addresses of its (local) parameters, checked every step
            g.param_ptrs = tuple(map(_DATA_PTR, g.params))

    def release_grads(self) -> None:
        """Drops this step's gradients (and their addresses): none is kept alive between steps."""
        for g in self.groups:
            g.grads, g.grad_ptrs = [], None


class LuminaMoon(torch.optim.Optimizer):
    """TDCLM: two-pass, soft-clipped, decoupled-decay Adam with seeded stochastic rounding.

    Args:
        params: parameters or param-group dicts (each group may override any hyperparameter).
        lr: learning rate (float or 0-dim tensor; torch.optim.lr_scheduler works with both).
        betas: moment decay rates, each in [0, 1).
        eps: denominator guard, > 0.
        weight_decay: decoupled weight decay, >= 0.
        clip: soft-clip threshold in units of each tensor's update RMS; 0 turns it off.
        bound_mode: "none", "abs" or "rel": limit each parameter's distance from its initial
            value to ``bound`` ("abs") or ``bound * sqrt(p0**2 + 1e-4)`` ("rel").
        bound: the bound's size, > 0 (used when bound_mode is not "none").
        maximize: ascend instead of descend.
        nonfinite: "skip" (skip the whole step on the device), "raise" (FloatingPointError
            before any change) or "propagate" (as torch.optim.AdamW).
        stochastic_rounding: round bf16 stores stochastically with the seeded streams.
        state_dtype: dtype of the moments, torch.float32 or torch.bfloat16.
        seed: 64-bit base seed of the rounding streams; drawn once from the first parameter's
            device generator when None. Saved in the state dict.
        backend: "auto", "reference", "triton", "cpu", "aot" (or a Backend instance).
        aot_bundle: directory of an ahead-of-time bundle, for backend="aot".

    ``optimizer.skipped_steps`` is a 0-dim int64 tensor on the first parameter's device
    counting the steps skipped for non-finite gradients (read it without a host sync).
    """

    def __init__(self, params, lr=1e-3, betas=(0.9, 0.999), eps=1e-8, weight_decay=0.01,
                 clip=4.0, bound_mode="none", bound=1.0, maximize=False, nonfinite="skip",
                 stochastic_rounding=True, state_dtype=torch.float32, seed=None,
                 backend="auto", aot_bundle=None):
        defaults = dict(lr=lr, betas=betas, eps=eps, weight_decay=weight_decay, clip=clip,
                        bound_mode=bound_mode, bound=bound, maximize=maximize,
                        nonfinite=nonfinite, stochastic_rounding=stochastic_rounding,
                        state_dtype=state_dtype)
        validate_hyperparameters(defaults)
        validate_seed(seed)
        validate_backend(backend)
        if backend == "aot" and aot_bundle is None:
            raise ValueError("backend='aot' needs aot_bundle=<bundle directory> (written by "
                             "'luminamoon aot build')")
        if isinstance(params, torch.Tensor):
            raise TypeError("params must be an iterable of tensors or dicts, got a tensor; "
                            "pass [tensor] or model.parameters()")
        params = list(params)
        self._seed: Optional[int] = None if seed is None else int(seed)
        self._backend_choice = backend
        self._aot_bundle = aot_bundle
        self._plan: Optional[_Plan] = None
        self._flags: Dict[torch.device, torch.Tensor] = {}
        self._scratch: Dict[torch.device, torch.Tensor] = {}
        super().__init__(params, defaults)
        first = local_tensor(self.param_groups[0]["params"][0])
        self._home = first.device
        if self._seed is None:
            self._seed = _draw_seed(first.device)
        for group in self.param_groups:
            group["seed"] = self._seed
        self.skipped_steps = torch.zeros((), dtype=torch.int64, device=first.device)

    # ---------------------------------------------------------------------------------
    # param groups
    # ---------------------------------------------------------------------------------
    @property
    def seed(self) -> int:
        """The 64-bit base seed of the rounding streams."""
        return self._seed

    def add_param_group(self, param_group: Dict[str, Any]) -> None:
        if not isinstance(param_group, dict):
            raise TypeError(f"param_group must be a dict, got {type(param_group).__name__}")
        group = dict(param_group)
        params = group.get("params")
        if isinstance(params, torch.Tensor):
            params = [params]
        elif isinstance(params, set):
            raise TypeError("param group 'params' must be an ordered collection (list or "
                            "tuple), not a set: the order decides the rounding streams")
        else:
            params = list(params) if params is not None else []
        group["params"] = params
        for key, value in self.defaults.items():
            group.setdefault(key, value)
        index = len(self.param_groups)
        validate_hyperparameters(group, where=f" (param group {index})")
        own_seed = getattr(self, "_seed", None)
        if "seed" in group and own_seed is not None and group["seed"] != own_seed:
            raise ValueError(
                f"seed (param group {index}) is {group['seed']!r} but the optimizer's seed is "
                f"{own_seed}; the seed is optimizer-wide, drop 'seed' from the group")
        offset = sum(len(g["params"]) for g in self.param_groups)
        for j, p in enumerate(params):
            check_param(p, f"parameter {offset + j} (param group {index}, index {j})")
        if own_seed is not None:
            group["seed"] = own_seed
        super().add_param_group(group)
        self._plan = None

    # ---------------------------------------------------------------------------------
    # state
    # ---------------------------------------------------------------------------------
    def _flat_index(self, gi: int, j: int) -> int:
        return sum(len(g["params"]) for g in self.param_groups[:gi]) + j

    def reset_p_init(self, params: Optional[Iterable[torch.Tensor]] = None) -> None:
        """Take the current values of ``params`` (default: all parameters of bounded groups)
        as their initial values p_init, the centre of the "abs"/"rel" bounds."""
        wanted = None if params is None else {id(p) for p in params}
        with torch.no_grad():
            for group in self.param_groups:
                if group["bound_mode"] == "none":
                    continue
                for p in group["params"]:
                    if wanted is None or id(p) in wanted:
                        self.state[p]["p_init"] = p.detach().clone(
                            memory_format=torch.contiguous_format)
        self._plan = None

    def _init_state(self, p: torch.Tensor, group: Dict[str, Any]) -> None:
        state = self.state[p]
        local = local_tensor(p)
        state["step"] = torch.zeros((), dtype=torch.int64, device=local.device)
        zeros = dict(dtype=group["state_dtype"], memory_format=torch.contiguous_format)
        state["exp_avg"] = torch.zeros_like(p, **zeros)
        state["exp_avg_sq"] = torch.zeros_like(p, **zeros)
        if group["bound_mode"] != "none":
            state["p_init"] = p.detach().clone(memory_format=torch.contiguous_format)

    def _check_state(self, p: torch.Tensor, group: Dict[str, Any], name: str) -> None:
        state = self.state[p]
        for key in ("step", "exp_avg", "exp_avg_sq"):
            if key not in state:
                raise ValueError(f"{name}: its state lacks {key!r} (a state dict from another "
                                 f"optimizer?); load a LuminaMoon state dict")
        step = state["step"]
        local = local_tensor(p)
        if (not isinstance(step, torch.Tensor) or step.dim() != 0 or step.dtype != torch.int64
                or step.device != local.device):
            raise ValueError(f"{name}: state 'step' must be a 0-dim int64 tensor on "
                             f"{local.device}, got {step!r}")
        for key in ("exp_avg", "exp_avg_sq"):
            check_state_tensor(p, state[key], key, group["state_dtype"], name)
        if group["bound_mode"] != "none":
            if "p_init" not in state:
                raise ValueError(
                    f"{name} has no 'p_init' in its state but bound_mode="
                    f"{group['bound_mode']!r} needs its initial value (was the state saved "
                    f"with bound_mode='none'?); call optimizer.reset_p_init() to take the "
                    f"current values as initial values")
            check_state_tensor(p, state["p_init"], "p_init", p.dtype, name)

    # ---------------------------------------------------------------------------------
    # planning
    # ---------------------------------------------------------------------------------
    def _take_grads(self, plan: _Plan) -> bool:
        """Checks that ``plan`` still describes the parameters, on every step: keep it cheap.

        When it does, hands each launch group this step's gradients with their addresses (its
        ``param_ptrs``, set with the plan, are then checked: backends need not look again) and
        returns True; else returns False and changes nothing. (A gradient lives on its
        parameter's device: autograd enforces it.)
        """
        groups = self.param_groups
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
        for launch, owners in zip(plan.groups, plan.grad_sources):
            grads = list(map(_GRAD, owners))
            try:
                # None (a gradient gone) has no dtype; a sparse gradient has no data pointer
                if set(map(_DTYPE, grads)) != {launch.grad_dtype}:
                    return False
                if plan.sharded:
                    grads = [local_tensor(g) for g in grads]
                    now_ptrs = tuple(_DATA_PTR(local_tensor(p)) for p in owners)
                else:
                    now_ptrs = tuple(map(_DATA_PTR, owners))
                grad_ptrs = tuple(map(_DATA_PTR, grads))
            except (AttributeError, RuntimeError):
                return False
            if now_ptrs != launch.param_ptrs:
                return False
            taken.append((grads, grad_ptrs))
        for launch, (grads, grad_ptrs) in zip(plan.groups, taken):
            launch.grads, launch.grad_ptrs = grads, grad_ptrs
        return True

    def _has_dtensor(self) -> bool:
        count = sum(len(g["params"]) for g in self.param_groups)
        cached = getattr(self, "_dtensor_census", None)
        if cached is None or cached[0] != count:
            cached = (count, any(is_dtensor(p) for g in self.param_groups for p in g["params"]))
            self._dtensor_census = cached
        return cached[1]

    def _build_plan(self) -> _Plan:
        # 1. Validate everything before touching any state.
        for gi, group in enumerate(self.param_groups):
            validate_hyperparameters(group, where=f" (param group {gi})")
            for j, p in enumerate(group["params"]):
                if p.grad is None:
                    continue
                name = f"parameter {self._flat_index(gi, j)} (param group {gi}, index {j})"
                check_param(p, name)
                check_grad(p, p.grad, name)
                shard_layout(p, name)
                if p in self.state and len(self.state[p]) > 0:
                    self._check_state(p, group, name)
        # 2. Create missing state, build the launch groups, choose their backends; undo the
        #    new state if a backend refuses.
        created = []
        try:
            groups: List[LaunchGroup] = []
            lr_sources: List[int] = []
            sources: List[List[torch.Tensor]] = []
            k = 0
            for gi, group in enumerate(self.param_groups):
                refs = []
                for j, p in enumerate(group["params"]):
                    index = k
                    k += 1
                    if p.grad is None:
                        continue
                    if p not in self.state or len(self.state[p]) == 0:
                        self._init_state(p, group)
                        created.append(p)
                    state = self.state[p]
                    refs.append(TensorRef(p, p.grad, state["exp_avg"], state["exp_avg_sq"],
                                          state.get("p_init"), state["step"], index,
                                          f"parameter {index} (param group {gi}, index {j})"))
                for launch, owners in group_tensors(refs, hyper=make_hyper(group),
                                                    state_dtype=group["state_dtype"],
                                                    lr=group["lr"], seed=self._seed):
                    groups.append(launch)
                    lr_sources.append(gi)
                    sources.append(owners)
            # (a backend may look at the group's grads to decide support)
            backends = [select_backend(self._backend_choice, launch, aot_bundle=self._aot_bundle)
                        for launch in groups]
        except BaseException:
            for p in created:
                self.state.pop(p, None)
            raise
        param_lists = [(g["params"], tuple(g["params"])) for g in self.param_groups]
        keys = [_plan_key(g) for g in self.param_groups]
        without_grad = [p for g in self.param_groups for p in g["params"] if p.grad is None]
        return _Plan(groups, backends, lr_sources, sources, param_lists, keys, without_grad,
                     self._has_dtensor())

    def _current_plan(self) -> _Plan:
        plan = self._plan
        if plan is None or not self._take_grads(plan):
            self._plan = None
            plan = self._build_plan()
            if not self._take_grads(plan):
                raise RuntimeError("the step's plan does not describe the parameters it was "
                                   "built from")
            self._plan = plan
        for launch, gi in zip(plan.groups, plan.lr_sources):
            lr = self.param_groups[gi]["lr"]
            if isinstance(lr, torch.Tensor):
                if lr.dim() != 0 or not lr.is_floating_point():
                    plan.release_grads()
                    validate_lr(lr, f" (param group {gi})")  # raises, naming the fix
            elif not (math.isfinite(lr) and lr >= 0):
                plan.release_grads()
                raise ValueError(f"lr (param group {gi}) must be >= 0, got {lr!r}")
            launch.lr = lr
        return plan

    # ---------------------------------------------------------------------------------
    # the step
    # ---------------------------------------------------------------------------------
    def step(self, closure=None):
        """One TDCLM step for every parameter with a gradient. Returns the closure's loss.

        Step hooks (``register_step_pre_hook``/``post_hook``, global or per optimizer) and the
        profiler's "Optimizer.step#LuminaMoon.step" range work as for any torch optimizer: with
        a hook registered or a profiler running, the step goes through torch's own wrapper;
        otherwise it skips that wrapper, whose range alone costs a few microseconds a step.
        """
        if type(self).step is not LuminaMoon.step:
            # a subclass's own step, which torch wraps itself (hooks, range): just the step
            return self._step(closure)
        if (_global_optimizer_pre_hooks is None or _global_optimizer_pre_hooks
                or _global_optimizer_post_hooks or self._optimizer_step_pre_hooks
                or self._optimizer_step_post_hooks or _profiler_enabled()):
            return _hooked_step(self, closure)
        return self._step(closure)

    # torch.optim.Optimizer wraps a step not marked so; this class runs the wrapper itself
    step.hooked = True

    @torch.no_grad()
    def _step(self, closure=None):
        loss = None
        if closure is not None:
            with torch.enable_grad():
                loss = closure()
        plan = self._current_plan()
        if not plan.groups:
            return loss
        try:
            run_launch_groups(plan.groups, plan.backends, flags=self._flags,
                              scratch=self._scratch, skipped=self.skipped_steps,
                              describe=self._describe_flat)
        finally:
            plan.release_grads()
        return loss

    def _describe_flat(self, k: int) -> str:
        for gi, group in enumerate(self.param_groups):
            if k < len(group["params"]):
                return f"parameter {self._flat_index(gi, k)} (param group {gi}, index {k})"
            k -= len(group["params"])
        return f"parameter {k}"

    # ---------------------------------------------------------------------------------
    # state dict
    # ---------------------------------------------------------------------------------
    def state_dict(self) -> Dict[str, Any]:
        state_dict = super().state_dict()
        state_dict["skipped_steps"] = self.skipped_steps.detach().clone()
        return state_dict

    def load_state_dict(self, state_dict: Dict[str, Any]) -> None:
        """Load a state dict; moments keep their state dtype and p_init its parameter dtype
        (torch's default would cast floating state to the parameter dtype)."""
        state_dict = dict(state_dict)
        skipped = state_dict.pop("skipped_steps", None)
        saved_groups = state_dict.get("param_groups", [])
        seeds = {g["seed"] for g in saved_groups if "seed" in g}
        if len(seeds) > 1:
            raise ValueError(f"the state dict's param groups carry different seeds {seeds}; "
                             f"a LuminaMoon state dict has one seed")
        for seed in seeds:
            validate_seed(seed)
        saved_state = state_dict.get("state", {})
        owners: Dict[Any, torch.Tensor] = {}
        for gi, (saved_group, group) in enumerate(zip(saved_groups, self.param_groups)):
            for j, (saved_id, p) in enumerate(zip(saved_group.get("params", []), group["params"])):
                owners[saved_id] = p
                for key in ("exp_avg", "exp_avg_sq", "p_init"):
                    value = saved_state.get(saved_id, {}).get(key)
                    if isinstance(value, torch.Tensor) and value.shape != p.shape:
                        raise ValueError(
                            f"the state dict's {key!r} for parameter {self._flat_index(gi, j)} "
                            f"(param group {gi}, index {j}) has shape {tuple(value.shape)} but "
                            f"the parameter has shape {tuple(p.shape)}: the state dict belongs "
                            f"to another model or another parameter order")
        super().load_state_dict(state_dict)
        for gi, group in enumerate(self.param_groups):
            validate_hyperparameters(group, where=f" (param group {gi}, loaded)")
        seed = seeds.pop() if seeds else self._seed
        self._seed = int(seed)
        for group in self.param_groups:
            group["seed"] = self._seed
        groups_of = {id(p): g for g in self.param_groups for p in g["params"]}
        for saved_id, p in owners.items():
            if saved_id not in saved_state:
                continue
            group = groups_of[id(p)]
            state = self.state[p]
            local = local_tensor(p)
            for key, value in saved_state[saved_id].items():
                if not isinstance(value, torch.Tensor):
                    continue
                if key == "step":
                    state[key] = local_tensor(value).detach().to(
                        device=local.device, dtype=torch.int64, copy=True).reshape(())
                    continue
                if key in ("exp_avg", "exp_avg_sq"):
                    dtype = group["state_dtype"]
                elif key == "p_init":
                    dtype = p.dtype
                else:
                    continue
                if is_dtensor(value):
                    state[key] = value.detach().to(dtype=dtype, copy=True)
                else:
                    state[key] = value.detach().to(device=local.device, dtype=dtype, copy=True)
        if skipped is not None:
            self.skipped_steps.copy_(torch.as_tensor(skipped).to(self.skipped_steps.device))
        self._plan = None


# torch's step wrapper (step hooks, profiler range) around the bare step: LuminaMoon.step calls
# it when a hook is registered or a profiler runs.
_hooked_step = torch.optim.Optimizer.profile_hook_step(LuminaMoon._step)
