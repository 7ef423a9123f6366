"""optimizer/optimizer.py: the LuminaMoon class: param groups, state, the cached step plan, hooks.

A step is planned once (grouping, state creation, backend choice) and the plan is reused
until the parameters with gradients, a hyperparameter other than lr, or a parameter's storage
or layout change. The update itself runs through :func:`luminamoon.optimizer._step.run_launch_groups`.
The state dict's checks live in optimizer/_state_dict.py, the plan and its per-step check in
optimizer/_plan.py.
"""
from __future__ import annotations

import dataclasses
import functools
import inspect
import sys
from collections import defaultdict
from typing import Any, Dict, Iterable, Iterator, List, Optional

import torch

from ..kernels.quant import Q8
from . import _q8_state, _state_dict
from ._device import _get_generator
from ._dtensor import is_dtensor, local_tensor, shard_layout
from ._groups import LaunchGroup, TensorRef, group_tensors
from ._plan import _Plan, _plan_key, take_grads
from ._step import run_launch_groups
from ._validation import (
    check_grad,
    check_param,
    check_state_tensor,
    make_hyper,
    torch_flags,
    validate_backend,
    validate_hyperparameters,
    validate_lr,
    validate_seed,
)
from .backends import aot_bundle_dir, select_backend
from .memory_layout import state_like

__all__ = ["LuminaMoon"]

# The rounding stream format this release draws (docs/tdclm.md, "Random streams").
ROUNDING_STREAM = 2


def _draw_seed(device: torch.device) -> int:
    """A 64-bit seed from the default generator of ``device`` (two 32-bit draws)."""
    gen = _get_generator(device)
    words = torch.randint(0, 2**32, (2,), dtype=torch.int64, device=gen.device, generator=gen)
    lo, hi = (int(w) for w in words.tolist())
    return (hi << 32) | lo


def _first_tensor(params: list) -> Optional[torch.Tensor]:
    """The first parameter of a constructor's ``params`` (tensors, (name, tensor) pairs or
    param-group dicts), or None when every group is empty."""
    for item in params:
        group = item.get("params", ()) if isinstance(item, dict) else [item]
        if isinstance(group, torch.Tensor):
            group = [group]
        for p in group:
            p = p[1] if isinstance(p, tuple) and len(p) == 2 else p
            if isinstance(p, torch.Tensor):
                return p
    return None


# torch.optim.Optimizer takes (name, tensor) pairs itself from torch 2.6 on; before, LuminaMoon
# takes them apart (and keeps no names, as those releases' state dicts have none).
_TORCH_TAKES_NAMES = "param_names" in inspect.getsource(torch.optim.Optimizer.add_param_group)

try:  # the registries of torch.optim.Optimizer's global step hooks
    from torch.optim.optimizer import _global_optimizer_post_hooks, _global_optimizer_pre_hooks
except ImportError:  # pragma: no cover - then every step goes through torch's wrapper
    _global_optimizer_pre_hooks = _global_optimizer_post_hooks = None


def _profiler_enabled() -> bool:
    """Whether a torch profiler is recording (then the step opens torch's range)."""
    return _PROFILER_ENABLED is None or bool(_PROFILER_ENABLED())


_UNTRACED: Dict[Any, Any] = {}
_UNTRACED_REASON = ("LuminaMoon.step launches its own fused kernels from a cached plan and runs "
                    "eagerly: compile the model and the loss, and call opt.step() outside a "
                    "fullgraph region")


def _untraced(fn):
    """``fn`` as torch.compile must see it: run eagerly (a graph break; fullgraph=True stops
    with the reason above). Made when an optimizer is built, where torch.optim has imported
    torch._dynamo already: importing luminamoon does not."""
    found = _UNTRACED.get(fn)
    if found is None:
        disable = torch.compiler.disable
        try:
            found = disable(fn, reason=_UNTRACED_REASON)
        except TypeError:  # torch < 2.6: no reason
            found = disable(fn)
        _UNTRACED[fn] = found
    return found


# Whether torch.compile is tracing (a constant True to dynamo), and the eval-frame callback that
# makes it compile the frames it meets (None when no compiled region is running); either may be
# missing from a torch release, and then every step takes torch.compiler.disable's wrapper.
_IS_COMPILING = getattr(getattr(torch, "compiler", None), "is_compiling", None)
_FRAME_CALLBACK = getattr(getattr(getattr(torch._C, "_dynamo", None), "eval_frame", None),
                          "get_eval_frame_callback", None)


def _frame_callback_is_a_new_reference() -> bool:
    """Whether this torch's get_eval_frame_callback hands back a new reference. Releases before
    2.13 return the callback without one: every call then takes a reference from the callback,
    and inside a compiled region (a step called after a graph break) that frees dynamo's
    callback while it runs, a segmentation fault (torch 2.6 and 2.7, seen). Those releases take
    torch.compiler.disable's wrapper on every step, as all did before. Where None is not
    immortal (Python < 3.12) the call is also probed: a reference it took from None shows."""
    if _IS_COMPILING is None or _FRAME_CALLBACK is None:
        return False
    try:
        major, minor = (int(x) for x in torch.__version__.split(".")[:2])
    except ValueError:
        return False
    if (major, minor) < (2, 13):
        return False
    if sys.version_info < (3, 12):
        before = sys.getrefcount(None)
        if _FRAME_CALLBACK() is not None:  # a compiled region is running: no probe now
            return False
        if sys.getrefcount(None) != before:
            return False
    return True


_EAGER_CHECK = _frame_callback_is_a_new_reference()


def _not_traced(fn):
    """The public step: dispatches to ``_untraced(fn)``, made by the constructor, or, in eager
    code with no compiled region around it, to ``fn`` itself (the disabling wrapper would only
    set and restore an eval-frame callback that is not there)."""
    @functools.wraps(fn)
    def step(self, closure=None):
        if _EAGER_CHECK and not _IS_COMPILING() and _FRAME_CALLBACK() is None:
            return fn(self, closure)
        return _UNTRACED[fn](self, closure)

    step.untraced_target = fn
    return step


_GRAD_ENABLED = torch.is_grad_enabled
_SET_GRAD_ENABLED = torch._C._set_grad_enabled
_PROFILER_ENABLED = getattr(getattr(torch._C, "_autograd", None), "_profiler_enabled", None)
class LuminaMoon(torch.optim.Optimizer):
    """TDCLM: two-pass, soft-clipped, decoupled-decay Adam with seeded stochastic rounding.

    Args:
        params: parameters, (name, parameter) pairs, or param-group dicts (each group may
            override any hyperparameter; an empty group is allowed).
        lr: learning rate (a float or a one-element tensor; torch.optim.lr_scheduler works with
            both). A tensor outside host memory is checked on the device: a non-finite or
            negative value skips the step there (nonfinite="skip").
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
        state_dtype: storage of the moments: torch.float32, torch.bfloat16, or "q8" (one byte
            a moment and element plus a float32 scale per block of 256, about 2.03 B a
            parameter for both moments, for tensors of at least 4096 elements; smaller ones
            keep float32 moments; docs/tdclm.md, "Quantized moments (q8)").
        seed: 64-bit base seed of the rounding streams; drawn once from the first parameter's
            device generator when None. Like every other argument it may be given per param
            group; a group without one (or with None) takes the optimizer's. Each group's seed
            is saved in the state dict and restored with it.
        backend: "auto", "reference", "triton", "cpu", "aot" (or a Backend instance).
        aot_bundle: directory of an ahead-of-time bundle, for backend="aot"; None takes the
            default one: ``$LUMINAMOON_AOT_BUNDLE``, else the bundle the wheel ships
            (``luminamoon aot default`` prints its folder).
        foreach, fused, capturable, differentiable: torch.optim's implementation keywords, for
            code that passes them to any optimizer. LuminaMoon's step is one fused multi-tensor
            launch per pass and never synchronises with the host (fused and capturable):
            ``foreach`` of any value, ``fused`` None/True and ``capturable`` of any value are
            accepted; ``fused=False`` and ``differentiable=True`` are refused.

    ``optimizer.skipped_steps`` is a 0-dim int64 tensor on the first parameter's device
    counting the steps skipped for non-finite gradients (read it without a host sync).

    With torch.amp.GradScaler, ``scaler.step(optimizer)`` hands the step its scale and its
    found-inf tensor (``_step_supports_amp_scaling``, as torch's fused AdamW): the gradients
    are unscaled on the device by torch's own multi-tensor unscale, and the scaler's verdict
    joins the skip decision on the device; no host synchronisation. While a scaler drives the
    step, every param group skips a step the scaler found non-finite, whatever its
    ``nonfinite`` (the scaler then lowers its scale: that is its contract).
    """

    _step_supports_amp_scaling = True

    def __init__(self, params, lr=1e-3, betas=(0.9, 0.999), eps=1e-8, weight_decay=0.01,
                 clip=4.0, bound_mode="none", bound=1.0, maximize=False, nonfinite="skip",
                 stochastic_rounding=True, state_dtype=torch.float32, seed=None,
                 backend="auto", aot_bundle=None, *, foreach=None, fused=None, capturable=None,
                 differentiable=None):
        defaults = dict(lr=lr, betas=betas, eps=eps, weight_decay=weight_decay, clip=clip,
                        bound_mode=bound_mode, bound=bound, maximize=maximize,
                        nonfinite=nonfinite, stochastic_rounding=stochastic_rounding,
                        state_dtype=state_dtype)
        validate_hyperparameters(defaults)
        defaults.update(torch_flags(foreach, fused, capturable, differentiable))
        validate_seed(seed)
        validate_backend(backend)
        if backend == "aot":
            aot_bundle_dir(aot_bundle)  # no bundle given and none shipped: say so now
        if not isinstance(params, torch.Tensor):  # (torch's own check names a tensor)
            # (a group's params given as a generator, e.g. module.parameters(), is read once:
            # a list, so that looking for the first tensor below does not consume it)
            params = [dict(item, params=list(item["params"]))
                      if isinstance(item, dict) and isinstance(item.get("params"), Iterator)
                      else item for item in params]
        first = _first_tensor(params) if isinstance(params, list) else None
        home = local_tensor(first).device if first is not None else torch.device("cpu")
        # the default of every group's seed, as torch.optim keeps any default
        defaults["seed"] = _draw_seed(home) if seed is None else int(seed)
        self._backend_choice = backend
        self._aot_bundle = aot_bundle
        self._home = home
        self.skipped_steps = torch.zeros((), dtype=torch.int64, device=home)
        self._reset_caches()
        super().__init__(params, defaults)

    def _reset_caches(self) -> None:
        _untraced(LuminaMoon.step.untraced_target)  # the step torch.compile runs eagerly
        self._plan: Optional[_Plan] = None
        self._flags: Dict[torch.device, torch.Tensor] = {}
        self._scratch: Dict[torch.device, torch.Tensor] = {}
        self._dtensor_census = None

    # ---------------------------------------------------------------------------------
    # param groups
    # ---------------------------------------------------------------------------------
    @property
    def seed(self) -> int:
        """The optimizer's 64-bit base seed of the rounding streams: the seed of every param
        group that gives none (``param_groups[i]["seed"]`` is each group's own)."""
        return self.defaults["seed"]

    @torch._disable_dynamo
    def add_param_group(self, param_group: Dict[str, Any]) -> None:
        """torch.optim's checks and messages first (types, leaves, names, a parameter in two
        groups), then LuminaMoon's (hyperparameters, dtypes, a parameter twice in one group);
        nothing is added when any refuses."""
        if not isinstance(param_group, dict):
            raise TypeError(f"param_group must be a dict, but got {type(param_group)}")
        group = dict(param_group)
        params = group.get("params", [])
        if isinstance(params, torch.Tensor):
            params = [params]
        elif not isinstance(params, set):  # (a set: torch's own message below)
            params = list(params)
            if not _TORCH_TAKES_NAMES:
                params = [p[1] if isinstance(p, tuple) and len(p) == 2 else p for p in params]
        group["params"] = params
        index = len(self.param_groups)
        where = f" (param group {index})"
        if group.get("seed") is None:
            group["seed"] = self.defaults["seed"]
        validate_seed(group["seed"], where)
        group["seed"] = int(group["seed"])
        tensors = [p[1] if isinstance(p, tuple) and len(p) == 2 else p
                   for p in (params if not isinstance(params, set) else ())]
        if len({id(p) for p in tensors}) != len(tensors):
            raise ValueError(f"param group {index} holds the same tensor more than once; "
                             f"LuminaMoon would step it twice: list each parameter once")
        check = {k: group.get(k, v) for k, v in self.defaults.items()}
        validate_hyperparameters(check, where=where)
        offset = sum(len(g["params"]) for g in self.param_groups)
        for j, p in enumerate(tensors):
            if isinstance(p, torch.Tensor):  # (anything else: torch's TypeError below)
                name = f"parameter {offset + j} (param group {index}, index {j})"
                check_param(p, name)
                if is_dtensor(p):
                    shard_layout(p, name)  # a placement it cannot step: refused now
        super().add_param_group(group)
        added = self.param_groups[-1]
        added.update(skipped_steps=self.skipped_steps, rounding_stream=ROUNDING_STREAM)
        self._plan = None

    # ---------------------------------------------------------------------------------
    # copies: deepcopy, pickle, torch.save(optimizer)
    # ---------------------------------------------------------------------------------
    def __getstate__(self) -> Dict[str, Any]:
        state = super().__getstate__()
        state.update(_backend_choice=self._backend_choice,
                     _aot_bundle=self._aot_bundle, _home=self._home,
                     skipped_steps=self.skipped_steps)
        return state

    def __setstate__(self, state: Dict[str, Any]) -> None:
        seed = state.pop("_seed", None)  # where copies of earlier releases kept the seed
        super().__setstate__(state)
        if seed is not None:
            self.defaults.setdefault("seed", seed)
            for group in self.param_groups:
                group.setdefault("seed", seed)
        self._reset_caches()  # plans, flags: rebuilt on the copy's first step

    # ---------------------------------------------------------------------------------
    # state
    # ---------------------------------------------------------------------------------
    def _flat_index(self, gi: int, j: int) -> int:
        return sum(len(g["params"]) for g in self.param_groups[:gi]) + j

    def _sr(self, p: torch.Tensor, group: Dict[str, Any]) -> bool:
        """Whether p's stores round stochastically (decides its state tensors' layout)."""
        return bool(group["stochastic_rounding"]) and torch.bfloat16 in (
            p.dtype, group["state_dtype"])

    @torch.no_grad()
    def reset_p_init(self, params: Optional[Iterable[torch.Tensor]] = None) -> None:
        """Take the current values of ``params`` (default: all parameters of bounded groups)
        as their initial values p_init, the centre of the "abs"/"rel" bounds."""
        wanted = None if params is None else {id(p) for p in params}
        for group in self.param_groups:
            if group["bound_mode"] == "none":
                continue
            for p in group["params"]:
                if wanted is None or id(p) in wanted:
                    self.state[p]["p_init"] = state_like(p, p.dtype, self._sr(p, group)).copy_(p)
        self._plan = None

    def _init_state(self, p: torch.Tensor, group: Dict[str, Any]) -> None:
        state = self.state[p]
        sr = self._sr(p, group)
        state["step"] = torch.zeros((), dtype=torch.int64, device=local_tensor(p).device)
        if _q8_state.is_q8(p, group["state_dtype"]):
            state.update(_q8_state.new_state(p))
        else:  # (under q8, a tensor below the size rule keeps float32 moments)
            dtype = torch.float32 if group["state_dtype"] == Q8 else group["state_dtype"]
            state["exp_avg"] = state_like(p, dtype, sr)
            state["exp_avg_sq"] = state_like(p, dtype, sr)
        if group["bound_mode"] != "none":
            state["p_init"] = state_like(p, p.dtype, sr).copy_(p.detach())

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
        if _q8_state.is_q8(p, group["state_dtype"]):
            _q8_state.check_state(p, state, name)
        else:
            dtype = torch.float32 if group["state_dtype"] == Q8 else group["state_dtype"]
            for key in ("exp_avg", "exp_avg_sq"):
                check_state_tensor(p, state[key], key, dtype, name)
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
        """Whether ``plan`` still describes the parameters (optimizer/_plan.py, take_grads);
        hands its launch groups this step's gradients when it does."""
        return take_grads(plan, self.param_groups)

    def _has_dtensor(self) -> bool:
        count = sum(len(g["params"]) for g in self.param_groups)
        cached = self._dtensor_census
        if cached is None or cached[0] != count:
            cached = (count, any(is_dtensor(p) for g in self.param_groups for p in g["params"]))
            self._dtensor_census = cached
        return cached[1]

    def _build_plan(self, amp: bool = False) -> _Plan:
        # 1. Validate everything before touching any state.
        for gi, group in enumerate(self.param_groups):
            validate_hyperparameters(group, where=f" (param group {gi})")
            validate_seed(group.get("seed"), f" (param group {gi})", allow_none=False)
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
                    refs.append(self._tensor_ref(p, gi, j, index))
                hyper = make_hyper(group)
                if amp:  # a GradScaler decides non-finite steps: skip them on the device
                    hyper = dataclasses.replace(hyper, nonfinite="skip")
                for launch, owners in group_tensors(refs, hyper=hyper,
                                                    state_dtype=group["state_dtype"],
                                                    lr=group["lr"], seed=group["seed"]):
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
        plan = _Plan(groups, backends, lr_sources, sources, param_lists, keys, without_grad,
                     self._has_dtensor())
        plan.amp = amp
        return plan

    def _tensor_ref(self, p: torch.Tensor, gi: int, j: int, index: int) -> TensorRef:
        """What group_tensors takes of parameter ``p`` (its state created), the one place a
        step, here or inside backward (optimizer/in_backward.py), reads a parameter's state."""
        state = self.state[p]
        return TensorRef(p, p.grad, state["exp_avg"], state["exp_avg_sq"], state.get("p_init"),
                         state["step"], index, f"parameter {index} (param group {gi}, index {j})",
                         state.get("exp_avg_scale"), state.get("exp_avg_sq_scale"))

    def _current_plan(self, amp: bool = False) -> _Plan:
        plan = self._plan
        if plan is None or plan.amp != amp or not self._take_grads(plan):
            self._plan = None
            plan = self._build_plan(amp)
            if not self._take_grads(plan):
                raise RuntimeError("the step's plan does not describe the parameters it was "
                                   "built from")
            self._plan = plan
        # Every lr is checked before anything is launched: a float or a host tensor here (the
        # value the kernels will use, as float32); a tensor in device memory on the device,
        # by the step, unless its group raises on bad values (then read here).
        for launch, gi in zip(plan.groups, plan.lr_sources):
            lr = self.param_groups[gi]["lr"]
            try:
                if (isinstance(lr, torch.Tensor) and lr.device.type != "cpu"
                        and launch.hyper.nonfinite == "raise" and lr.numel() == 1):
                    validate_lr(float(lr), f" (param group {gi})")
                validate_lr(lr, f" (param group {gi})")
            except BaseException:
                plan.release_grads()
                raise
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
        Under torch.compile the step runs eagerly (a graph break).
        """
        if type(self).step is not LuminaMoon.step:
            # a subclass's own step, which torch wraps itself (hooks, range): just the step
            return self._step(closure)
        if (_global_optimizer_pre_hooks is None or _global_optimizer_pre_hooks
                or _global_optimizer_post_hooks or self._optimizer_step_pre_hooks
                or self._optimizer_step_post_hooks or _profiler_enabled()):
            return _hooked_step(self, closure)
        return self._step(closure)

    step = _not_traced(step)
    # torch.optim.Optimizer wraps a step not marked so; this class runs the wrapper itself
    step.hooked = True

    def _step(self, closure=None):
        # torch.no_grad() as two grad-mode calls: its decorator makes and enters a context object
        # every call (1.4 us against 0.03 for a bare call, warm, on a 2-core Xeon)
        enabled = _GRAD_ENABLED()
        if enabled:
            _SET_GRAD_ENABLED(False)
        try:
            return self._step_without_grad(closure)
        finally:
            if enabled:
                _SET_GRAD_ENABLED(True)

    def _step_without_grad(self, closure):
        loss = None
        if closure is not None:
            with torch.enable_grad():
                loss = closure()
        # torch.amp.GradScaler (through _step_supports_amp_scaling) sets these two for the step
        grad_scale = self.__dict__.get("grad_scale")
        found_inf = self.__dict__.get("found_inf")
        amp = grad_scale is not None or found_inf is not None
        plan = self._current_plan(amp)
        if not plan.groups:
            return loss
        try:
            run_launch_groups(plan.groups, plan.backends, flags=self._flags,
                              scratch=self._scratch, skipped=self.skipped_steps,
                              describe=self._describe_flat,
                              amp=(grad_scale, found_inf) if amp else None)
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
    @torch._disable_dynamo
    def load_state_dict(self, state_dict: Dict[str, Any]) -> None:
        """Load a state dict, checking all of it first: nothing changes when it is refused.

        Load-state-dict pre-hooks run first (their changes count), post-hooks see the loaded
        state. Moments keep their group's state dtype and p_init its parameter's dtype; every
        state tensor takes its parameter's device and layout (torch's default would cast
        floating state to the parameter dtype).
        """
        state_dict = dict(state_dict)  # shallow, as torch
        for pre_hook in self._optimizer_load_state_dict_pre_hooks.values():
            result = pre_hook(self, state_dict)
            if result is not None:
                state_dict = result
        loaded = _state_dict.load(self, state_dict)
        self.state = defaultdict(dict, loaded.state)  # as torch.optim keeps it
        self.param_groups = loaded.param_groups
        self.defaults["seed"] = loaded.seed
        for group in self.param_groups:
            group.update(skipped_steps=self.skipped_steps, rounding_stream=ROUNDING_STREAM)
        self.skipped_steps.copy_(loaded.skipped)
        self._reset_caches()
        for post_hook in self._optimizer_load_state_dict_post_hooks.values():
            post_hook(self)


# torch's step wrapper (step hooks, profiler range) around the bare step: LuminaMoon.step calls
# it when a hook is registered or a profiler runs.
_hooked_step = torch.optim.Optimizer.profile_hook_step(LuminaMoon._step)
