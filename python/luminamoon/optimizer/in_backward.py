"""optimizer/in_backward.py: the step inside backward (gradient release).

``step_in_backward(model_or_params, **optimizer_kwargs)`` registers a post-accumulate-grad hook
on every parameter: once a parameter's gradient is final in a backward pass, the parameter joins
the current bucket; a bucket of ``bucket_bytes`` gradient bytes is stepped at once (one launch
group per param group and tensor kind, the same ``_groups.group_tensors`` and
``_step.run_launch_groups`` as ``LuminaMoon.step``) and its gradients freed, so no full set of
gradients ever exists. The last partial bucket is stepped at the end of backward (an autograd
engine callback). Semantics (docs/tdclm.md, "The step inside backward"): each tensor clips by its
own statistics as in the normal step; a tensor whose gradient is not finite (nonfinite="skip")
is not updated and is counted in ``skipped_steps``, the others of its bucket are.

:class:`_GradHooks` (the hooks, buckets, accumulation and the end-of-backward callback) is shared
with optimizer/offload.py, which hands each bucket to the CPU engine instead.
"""
from __future__ import annotations

import atexit
import collections
import contextlib
import operator
import weakref
from typing import Any, Callable, Dict, Iterable, List, Optional, Sequence, Tuple

import torch

from ._dtensor import local_tensor, shard_layout
from ._groups import LaunchGroup, TensorRef, group_tensors, launch_grads
from ._plan import _plan_key
from ._step import run_launch_groups
from ._validation import check_grad, check_param, make_hyper, validate_hyperparameters, validate_lr
from .backends import select_backend
from .optimizer import LuminaMoon

__all__ = ["InBackward", "step_in_backward"]

# 25 MiB of gradients a bucket: torch DDP's default bucket size, a few launches per backward
# of a GPT-2-sized model, and little gradient memory held at once.
DEFAULT_BUCKET_BYTES = 25 * 2**20
_CACHE_LIMIT = 4096  # bucket layouts kept (a model's backward repeats a handful)

# The hooks keep their stepper alive from the parameters (a reference cycle that the interpreter
# may not collect before the native module's objects are checked at exit): the caches of the
# live steppers (native groups among them) are dropped at exit.
# (registered with atexit by the first stepper, not at import)
_LIVE: "weakref.WeakSet[BucketStepper]" = weakref.WeakSet()


def _drop_caches() -> None:
    for stepper in list(_LIVE):
        stepper.invalidate()
        stepper.opt._plan = None  # (offload's host optimizer steps through its own plan too)


_LIVE_REGISTERED = False


def _register_drop() -> None:
    global _LIVE_REGISTERED
    atexit.register(_drop_caches)
    _LIVE_REGISTERED = True


def _params_of(model_or_params) -> Any:
    """What LuminaMoon's constructor takes, from a module (its trainable parameters) or params."""
    if isinstance(model_or_params, torch.nn.Module):
        return [p for p in model_or_params.parameters() if p.requires_grad]
    return model_or_params


class _Bucket:
    """The cached launch groups of one set of parameters (a bucket seen before)."""

    __slots__ = ("launches", "check", "keys")

    def __init__(self, launches, check, keys):
        self.launches = launches  # [(LaunchGroup, owners, backend, param-group index)]
        self.check = check  # [(param, data_ptr, dtype, shape, stride, its state's values)]
        self.keys = keys  # {param-group index: _plan_key}


class BucketStepper:
    """Steps a chosen subset of a LuminaMoon's parameters (those of one bucket) with their
    current gradients, through ``group_tensors`` and ``run_launch_groups``; caches the launch
    groups of each bucket. Per-tensor non-finite policy: see the module docstring."""

    def __init__(self, optimizer: LuminaMoon):
        self.opt = optimizer
        self._cache: Dict[Tuple[int, ...], _Bucket] = {}
        self._index: Dict[int, Tuple[int, int, int]] = {}
        self._index_of: Optional[Tuple[int, ...]] = None
        # buckets whose finite flags are not read yet: (params, grads, flags, event)
        self.pending: collections.deque = collections.deque()
        if not _LIVE_REGISTERED:
            _register_drop()
        _LIVE.add(self)

    def invalidate(self) -> None:
        self._cache.clear()
        self._index_of = None
        self.pending.clear()

    def _where(self, p: torch.Tensor) -> Tuple[int, int, int]:
        """(param group, index in it, k) of ``p``; the index is rebuilt when groups change."""
        shape = tuple(len(g["params"]) for g in self.opt.param_groups)
        if shape != self._index_of:
            self._index = {}
            k = 0
            for gi, g in enumerate(self.opt.param_groups):
                for j, q in enumerate(g["params"]):
                    self._index[id(q)] = (gi, j, k)
                    k += 1
            self._index_of = shape
            self._cache.clear()
        found = self._index.get(id(p))
        if found is None:
            raise ValueError("a parameter whose gradient arrived is not in the optimizer's param "
                             "groups (added to the model after step_in_backward?); call "
                             "remove() and step_in_backward again with the new parameters")
        return found

    def _name(self, gi: int, j: int, k: int) -> str:
        return f"parameter {k} (param group {gi}, index {j})"

    def _build(self, params: Sequence[torch.Tensor], where) -> _Bucket:
        opt = self.opt
        for p, (gi, j, k) in zip(params, where):
            group = opt.param_groups[gi]
            validate_hyperparameters(group, where=f" (param group {gi})")
            name = self._name(gi, j, k)
            check_param(p, name)
            check_grad(p, p.grad, name)
            shard_layout(p, name)
            if p in opt.state and len(opt.state[p]) > 0:
                opt._check_state(p, group, name)
        created = []
        try:
            by_group: Dict[int, List[TensorRef]] = {}
            for p, (gi, j, k) in zip(params, where):
                group = opt.param_groups[gi]
                if p not in opt.state or len(opt.state[p]) == 0:
                    opt._init_state(p, group)
                    created.append(p)
                by_group.setdefault(gi, []).append(opt._tensor_ref(p, gi, j, k))
            launches = []
            for gi in sorted(by_group):
                group = opt.param_groups[gi]
                for launch, owners in group_tensors(by_group[gi], hyper=make_hyper(group),
                                                    state_dtype=group["state_dtype"],
                                                    lr=group["lr"], seed=opt.seed):
                    backend = select_backend(opt._backend_choice, launch,
                                             aot_bundle=opt._aot_bundle)
                    launches.append((launch, owners, backend, gi))
        except BaseException:
            for p in created:
                opt.state.pop(p, None)
            raise
        check = [(p, local_tensor(p).data_ptr(), p.dtype, p.shape, local_tensor(p).stride(),
                  tuple(opt.state[p].values())) for p in params]
        keys = {gi: _plan_key(opt.param_groups[gi]) for _, _, _, gi in launches}
        return _Bucket(launches, check, keys)

    def _holds(self, bucket: _Bucket) -> bool:
        opt = self.opt
        for p, ptr, dtype, shape, stride, values in bucket.check:
            local = local_tensor(p)
            state = opt.state.get(p)
            if (local.data_ptr() != ptr or p.dtype != dtype or p.shape != shape
                    or local.stride() != stride or not state or len(state) != len(values)
                    or not all(map(operator.is_, state.values(), values))):
                return False
        return all(_plan_key(opt.param_groups[gi]) == key for gi, key in bucket.keys.items())

    @staticmethod
    def _take_grads(launch: LaunchGroup, owners: List[torch.Tensor]) -> bool:
        grads = [local_tensor(p.grad) for p in owners]
        if any(g.dtype != launch.grad_dtype for g in grads):
            return False
        if launch.modes is not None:
            grads = launch_grads(launch, grads, owners)
            if grads is None:
                return False
        elif not all(g.is_contiguous() for g in grads):
            return False
        launch.grads, launch.grad_ptrs = grads, None
        return True

    @torch.no_grad()
    def step(self, params: Sequence[torch.Tensor], *, verified: bool = False) -> None:
        """One TDCLM step of ``params`` (each with a gradient). Under nonfinite="skip" a bucket
        with a non-finite gradient is skipped whole on the device (the normal step's flag), and
        its per-tensor finite flags are queued (``pending``): :meth:`settle` reads them and
        steps the finite tensors of such a bucket from the gradients kept until then, counting
        each skipped tensor in ``skipped_steps``. ``verified``: the gradients are known finite
        (a settle's own step)."""
        if not params:
            return
        opt = self.opt
        where = [self._where(p) for p in params]
        order = sorted(range(len(params)), key=lambda i: where[i][2])
        params = [params[i] for i in order]
        where = [where[i] for i in order]
        key = tuple(id(p) for p in params)
        bucket = self._cache.get(key)
        if bucket is None or not self._holds(bucket):
            bucket = None
        if bucket is not None:
            for launch, owners, _, _ in bucket.launches:
                if not self._take_grads(launch, owners):
                    bucket = None
                    break
        if bucket is None:
            bucket = self._build(params, where)
            for launch, owners, _, _ in bucket.launches:
                if not self._take_grads(launch, owners):
                    raise RuntimeError("a bucket's launch group does not take the gradients it "
                                       "was built from")
            if len(self._cache) >= _CACHE_LIMIT:
                self._cache.clear()
            self._cache[key] = bucket
        launches = bucket.launches
        try:
            for launch, _, _, gi in launches:
                lr = opt.param_groups[gi]["lr"]
                if (isinstance(lr, torch.Tensor) and lr.device.type != "cpu"
                        and launch.hyper.nonfinite != "propagate" and lr.numel() == 1):
                    # read on the host: a bad lr must not skip the bucket on the device, where
                    # it would pass for a non-finite gradient
                    validate_lr(float(lr), f" (param group {gi})")
                validate_lr(lr, f" (param group {gi})")
                launch.lr = lr
            checked = [] if verified else [x for x in launches if x[0].hyper.nonfinite == "skip"]
            if checked:
                self._queue_flags(checked)
            run_launch_groups([x[0] for x in launches], [x[2] for x in launches],
                              flags=opt._flags, scratch=opt._scratch, skipped=None,
                              describe=opt._describe_flat)
        except BaseException:
            self.pending.clear()
            raise
        finally:
            for launch, _, _, _ in launches:
                launch.grads, launch.grad_ptrs = [], None

    def _queue_flags(self, checked) -> None:
        """Per-tensor "not finite" flags of the checked launches (combined over the ranks of a
        sharded tensor's mesh), copied to the host without waiting, with the gradients."""
        owners = [p for _, o, _, _ in checked for p in o]
        grads = [g for launch, _, _, _ in checked for g in launch.grads]
        bad = torch.logical_not(torch.stack([torch.isfinite(g).all() for g in grads])).to(
            torch.int32)
        dims = sorted({d for launch, _, _, _ in checked for d in launch.mesh_dims})
        if dims:
            import torch.distributed as dist

            for mesh_dim in dims:
                dist.all_reduce(bad, op=dist.ReduceOp.MAX, group=mesh_dim.group)
        event = None
        if bad.device.type == "cuda":
            host = torch.empty(bad.shape, dtype=bad.dtype, pin_memory=True)
            host.copy_(bad, non_blocking=True)
            event = torch.cuda.Event()
            event.record()
            bad = host
        elif bad.device.type != "cpu":
            bad = bad.cpu()
        self.pending.append((owners, [p.grad for p in owners], bad, event))

    @torch.no_grad()
    def settle(self, keep: int = 0) -> None:
        """Reads the queued flags of all but the last ``keep`` buckets (waiting for them where
        they are not on the host yet) and steps the finite tensors of every bucket that a
        non-finite gradient skipped."""
        while len(self.pending) > keep:
            owners, grads, bad, event = self.pending.popleft()
            if event is not None:
                event.synchronize()
            flags = bad.tolist()
            if not any(flags):
                continue
            self.opt.skipped_steps.add_(sum(flags))
            keep_params = [(p, g) for p, g, b in zip(owners, grads, flags) if not b]
            if not keep_params:
                continue
            held = [p.grad for p, _ in keep_params]
            try:
                for p, g in keep_params:
                    p.grad = g
                self.step([p for p, _ in keep_params], verified=True)
            finally:
                for (p, _), h in zip(keep_params, held):
                    p.grad = h


def tell_scheduler(opt: torch.optim.Optimizer) -> None:
    """A torch LRScheduler warns when its optimizer's step did not run before its own: after a
    backward that stepped, mark the step as run, as its wrapper of ``step`` does."""
    if hasattr(opt.step, "_wrapped_by_lr_sched"):
        opt._opt_called = True


# The running backward's id (torch >= 2.1), to tell one backward from the next.
_GRAPH_TASK_ID = getattr(torch._C, "_current_graph_task_id", None)


class _GradHooks:
    """Post-accumulate-grad hooks on ``params`` that gather parameters whose gradients are
    final into buckets of ``bucket_bytes`` (in backward order) and hand each bucket to
    ``on_bucket``; the last partial bucket, and parameters holding a gradient that this backward
    did not reach (accumulated earlier), go at the end of backward. Backward passes that only
    accumulate (inside ``accumulate()``, or all but every ``accumulate_steps``-th) hand nothing.
    """

    def __init__(self, params: Iterable[torch.Tensor], bucket_bytes: int, accumulate_steps: int,
                 on_bucket: Callable[[List[torch.Tensor]], None],
                 on_end: Optional[Callable[[], None]] = None,
                 on_reset: Optional[Callable[[], None]] = None):
        if isinstance(bucket_bytes, bool) or not isinstance(bucket_bytes, int) or bucket_bytes < 0:
            raise ValueError(f"bucket_bytes must be an int >= 0 (0: one bucket per gradient), got "
                             f"{bucket_bytes!r}")
        if (isinstance(accumulate_steps, bool) or not isinstance(accumulate_steps, int)
                or accumulate_steps < 1):
            raise ValueError(f"accumulate_steps must be an int >= 1 (1: step on every "
                             f"backward), got {accumulate_steps!r}")
        self.params = [p for p in params if p.requires_grad]
        if not self.params:
            raise ValueError("no parameter requires a gradient: nothing to step in backward")
        self.bucket_bytes = bucket_bytes
        self.accumulate_steps = accumulate_steps
        self._on_bucket, self._on_end, self._on_reset = on_bucket, on_end, on_reset
        self._pending: List[torch.Tensor] = []
        self._pending_bytes = 0
        self._queued = False  # the end-of-backward callback of the running backward is queued
        self._task = None  # the graph task (backward) it was queued in
        self._stepping = False
        self._done: set = set()
        self._hold = 0
        self.micro_step = 0  # backward passes since the last step
        self._handles = [p.register_post_accumulate_grad_hook(self._hook) for p in self.params]

    def remove(self) -> None:
        for h in self._handles:
            h.remove()
        self._handles = []

    @contextlib.contextmanager
    def accumulate(self):
        """Backward passes inside only accumulate gradients; the first one outside steps."""
        self._hold += 1
        try:
            yield
        finally:
            self._hold -= 1

    def _hook(self, p: torch.Tensor) -> None:
        task = _GRAPH_TASK_ID() if _GRAPH_TASK_ID is not None else None
        if self._queued and task is not None and task != self._task:
            # a backward that failed after this one's first hook never ran its end: start over
            self._reset()
        if not self._queued:
            torch.autograd.Variable._execution_engine.queue_callback(self._end)
            self._queued = True
            self._task = task
            self._stepping = (self._hold == 0
                              and (self.micro_step + 1) % self.accumulate_steps == 0)
        if not self._stepping or p.grad is None:
            return
        self._pending.append(p)
        self._pending_bytes += p.grad.numel() * p.grad.element_size()
        if self._pending_bytes >= self.bucket_bytes:
            self._flush()

    def _flush(self) -> None:
        bucket, self._pending, self._pending_bytes = self._pending, [], 0
        if not bucket:
            return
        self._done.update(map(id, bucket))
        try:
            self._on_bucket(bucket)
        except BaseException:
            self._reset()
            raise

    def _reset(self) -> None:
        self._pending, self._pending_bytes = [], 0
        self._queued = self._stepping = False
        self._done = set()
        if self._on_reset is not None:
            self._on_reset()

    def _end(self) -> None:
        try:
            if self._stepping:
                self._flush()
                left = [p for p in self.params if p.grad is not None and id(p) not in self._done]
                if left:
                    self._on_bucket(left)
                self.micro_step = 0
            else:
                self.micro_step += 1
            if self._on_end is not None:
                self._on_end()
        finally:
            self._reset()


class _OptimizerFace:
    """What the step inside backward and the offload show of their LuminaMoon (``optimizer``):
    its param groups, state and skipped-step counter, as a torch optimizer would."""

    optimizer: LuminaMoon

    @property
    def param_groups(self):
        return self.optimizer.param_groups

    @property
    def state(self):
        return self.optimizer.state

    @property
    def skipped_steps(self) -> torch.Tensor:
        return self.optimizer.skipped_steps


class InBackward(_OptimizerFace):
    """A LuminaMoon stepped inside backward (see :func:`step_in_backward`).

    ``optimizer`` is the LuminaMoon it drives (its param groups, state and lr are the ones the
    buckets use: an lr scheduler takes it), ``param_groups``/``state``/``state_dict``/
    ``load_state_dict`` are the optimizer's, ``skipped_steps`` counts the tensors whose update a
    non-finite gradient skipped. ``step()`` and ``zero_grad()`` do nothing (the steps happen in
    backward; gradients are freed there), so a training loop written for an optimizer runs
    unchanged. ``remove()`` takes the hooks off.
    """

    def __init__(self, optimizer: LuminaMoon, params: Sequence[torch.Tensor], *,
                 bucket_bytes: int = DEFAULT_BUCKET_BYTES, accumulate_steps: int = 1):
        self.optimizer = optimizer
        self._stepper = BucketStepper(optimizer)
        self._lag: Optional[int] = None  # buckets whose flags wait (None: 1 on a GPU, else 0)
        self._hooks = _GradHooks(params, bucket_bytes, accumulate_steps, self._step_bucket,
                                 self._after_backward, self._stepper.pending.clear)

    def _step_bucket(self, params: List[torch.Tensor]) -> None:
        stepper = self._stepper
        try:
            stepper.step(params)
        finally:
            for p in params:
                p.grad = None
        # the flags of a bucket on a GPU are read one bucket later, when its copy has most
        # likely landed: backward does not wait for the GPU at every bucket
        lag = self._lag
        if lag is None:
            lag = 1 if stepper.pending and stepper.pending[-1][3] is not None else 0
        try:
            stepper.settle(lag)
        except BaseException:
            stepper.pending.clear()
            raise

    def _after_backward(self) -> None:
        try:
            self._stepper.settle(0)
        except BaseException:
            self._stepper.pending.clear()
            raise
        tell_scheduler(self.optimizer)

    # the optimizer's face (param_groups, state, skipped_steps: _OptimizerFace)
    @property
    def accumulate_steps(self) -> int:
        return self._hooks.accumulate_steps

    def accumulate(self):
        """Context: backward passes inside only accumulate; the first outside steps."""
        return self._hooks.accumulate()

    def state_dict(self) -> Dict[str, Any]:
        return self.optimizer.state_dict()

    def load_state_dict(self, state_dict: Dict[str, Any]) -> None:
        self.optimizer.load_state_dict(state_dict)
        self._stepper.invalidate()

    def step(self, closure=None):
        """Nothing to do (the parameters were stepped in backward); runs the closure if given."""
        if closure is not None:
            with torch.enable_grad():
                return closure()
        return None

    def zero_grad(self, set_to_none: bool = True) -> None:
        """Nothing to do after a stepping backward (its gradients were freed); between
        accumulating passes it clears the accumulated gradients, as Optimizer.zero_grad."""
        self.optimizer.zero_grad(set_to_none)

    def remove(self) -> None:
        self._hooks.remove()


def step_in_backward(model_or_params, *, bucket_bytes: int = DEFAULT_BUCKET_BYTES,
                     accumulate_steps: int = 1, **optimizer_kwargs) -> InBackward:
    """Step LuminaMoon inside backward: each parameter is stepped once its gradient is final,
    in buckets of ``bucket_bytes`` gradient bytes, and its gradient freed.

    ``model_or_params``: an ``nn.Module`` (its parameters that require grad), what LuminaMoon
    takes (params or param-group dicts), or a LuminaMoon itself (then no keyword arguments).
    ``accumulate_steps``: K; backward passes accumulate and every K-th steps (also
    ``with ib.accumulate():``). The other keyword arguments are LuminaMoon's. See
    docs/memory.md (when to use it) and docs/tdclm.md (its semantics).
    """
    if isinstance(model_or_params, LuminaMoon):
        if optimizer_kwargs:
            raise ValueError(f"step_in_backward got a LuminaMoon and optimizer keywords "
                             f"{sorted(optimizer_kwargs)}; set them on the optimizer instead")
        opt = model_or_params
    else:
        opt = LuminaMoon(_params_of(model_or_params), **optimizer_kwargs)
    params = [p for g in opt.param_groups for p in g["params"]]
    return InBackward(opt, params, bucket_bytes=bucket_bytes, accumulate_steps=accumulate_steps)
