"""optimizer/offload.py: optimizer state in host memory, stepped by the CPU engine.

``offload(model_or_params, **optimizer_kwargs)`` keeps, for every parameter on the GPU, a host
copy (pinned; float32 when ``master_weights`` is asked for a bf16/fp16 parameter) and a pinned
host gradient buffer; the moments live in host memory, created by a LuminaMoon over the host
copies (backend "cpu": the C++ engine, its own threads). Post-accumulate-grad hooks (the same
buckets as optimizer/in_backward.py) copy each bucket's gradients to the host on a side stream
as backward produces them and free them on the GPU. Then:

- ``in_backward=False`` (the default): ``step()`` waits for the copies and runs the host
  LuminaMoon's normal step (the same skip-the-whole-step and per-tensor clip semantics);
- ``in_backward=True``: a worker thread steps each bucket as soon as its copy is done, while
  backward continues (the step-in-backward semantics: per-tensor skip, docs/tdclm.md).

The updated parameters go back to the GPU on a second side stream; a forward pre-hook on each
module makes the compute stream wait for its own parameters' copies, so the copies overlap the
forward of the modules before. Where the "device" is the CPU (tests), the same code runs with
plain copies and no streams.

Bounded resources: pinned host memory = the parameters' bytes (host copies, or their float32
masters) + as much again for the host gradient buffers, allocated once in chunks of up to 4 GiB
(each tensor rounded up to 64 bytes, the last chunk partly used); moments and p_init in
pageable host memory; on the GPU at most ``inflight_buckets`` buckets of gradients waiting for
their copy; one Python worker thread (in_backward=True) plus the engine's pool of
``num_threads`` (0: one per hardware thread).
"""
from __future__ import annotations

import collections
import concurrent.futures
import math
from typing import Any, Dict, List

import torch

from ._dtensor import is_dtensor, local_tensor
from .backends import get_backend
from .in_backward import (DEFAULT_BUCKET_BYTES, BucketStepper, _GradHooks, _OptimizerFace,
                          _params_of, tell_scheduler)
from .optimizer import LuminaMoon

__all__ = ["CpuOffload", "offload"]

_MASTER = "master_param"  # where a state dict keeps the float32 master copy of a parameter


def _as_groups(params) -> List[Dict[str, Any]]:
    if isinstance(params, torch.Tensor):
        params = [params]
    params = list(params)
    if params and isinstance(params[0], dict):
        return [dict(g, params=list(g["params"]) if not isinstance(g["params"], torch.Tensor)
                     else [g["params"]]) for g in params]
    return [{"params": params}]


def _like(p: torch.Tensor, local: torch.Tensor) -> torch.Tensor:
    """``local`` (a host tensor of p's local shape) as what stands for ``p`` on the host: itself
    for a plain parameter; for a DTensor, a DTensor over it with p's mesh, placements and global
    shape (its local tensor on the host: only the step's statistics cross the mesh)."""
    if not is_dtensor(p):
        return local
    return type(p).from_local(local, p.device_mesh, p.placements, run_check=False,
                              shape=p.shape, stride=p.stride())


_ALIGN = 64  # bytes: each host tensor starts on a cache line
_CHUNK = 4 * 2**30  # bytes of one pinned allocation (a power of two: nothing rounded away)


def host_buffers(specs, pin: bool) -> List[torch.Tensor]:
    """Host tensors of the given (shape, dtype), packed in order into few allocations of up to
    ``_CHUNK`` bytes (a tensor larger than that gets its own): torch's pinned-memory allocator
    rounds each allocation up to a power of two, which would waste up to half of a
    tensor-by-tensor allocation."""
    nbytes = [math.prod(shape) * dtype.itemsize for shape, dtype in specs]
    sizes = [-(-n // _ALIGN) * _ALIGN for n in nbytes]
    total = max(sum(sizes), 1)
    chunk = min(_CHUNK, 1 << (total - 1).bit_length())
    out: List[torch.Tensor] = []
    buf, used = None, 0
    for (shape, dtype), n, size in zip(specs, nbytes, sizes):
        if size > chunk:
            own = torch.empty(size, dtype=torch.uint8, pin_memory=pin)
            out.append(own[:n].view(dtype).view(shape))
            continue
        if buf is None or used + size > chunk:
            buf, used = torch.empty(chunk, dtype=torch.uint8, pin_memory=pin), 0
        out.append(buf[used:used + n].view(dtype).view(shape))
        used += size
    return out


class CpuOffload(_OptimizerFace):
    """LuminaMoon with its state in host memory (see :func:`offload`).

    ``optimizer`` is the host LuminaMoon (lr schedulers drive it; its state dict is the
    offloaded state), ``step()`` finishes a step (in_backward=False: runs it), ``wait()`` makes
    the compute stream wait for every parameter copy still in flight, ``remove()`` takes the
    hooks off.
    """

    def __init__(self, model_or_params, *, in_backward: bool = False,
                 bucket_bytes: int = DEFAULT_BUCKET_BYTES, accumulate_steps: int = 1,
                 master_weights: bool = False, num_threads: int = 0, overlap: bool = True,
                 inflight_buckets: int = 4, **optimizer_kwargs):
        if isinstance(inflight_buckets, bool) or not isinstance(inflight_buckets, int) \
                or inflight_buckets < 1:
            raise ValueError(f"inflight_buckets must be an int >= 1, got {inflight_buckets!r}")
        module = model_or_params if isinstance(model_or_params, torch.nn.Module) else None
        groups = _as_groups(_params_of(model_or_params))
        self.params: List[torch.Tensor] = [p for g in groups for p in g["params"]]
        if not self.params:
            raise ValueError("offload got no parameters")
        self._sharded = any(is_dtensor(p) for p in self.params)
        if self._sharded and in_backward:
            raise ValueError(
                "offload(in_backward=True) steps on a worker thread, whose collectives (the "
                "statistics of sharded tensors) would interleave with FSDP2's own in backward; "
                "for DTensor (FSDP2) parameters use offload(in_backward=False), which steps "
                "them in step(), or step_in_backward")
        devices = {p.device for p in self.params}
        if len(devices) != 1:
            raise ValueError(f"offload's parameters live on {sorted(map(str, devices))}; they "
                             f"must share one device")
        self.device = devices.pop()
        self._cuda = self.device.type == "cuda"
        pin = self._cuda
        self.master_weights = bool(master_weights)
        self.in_backward = bool(in_backward)
        # the host gradient takes the host copy's dtype (torch keeps a tensor's .grad in its
        # dtype); a bf16 gradient is widened on the device before its copy
        # (a DTensor parameter: its local shard, and host DTensors over the host shards with
        # the parameter's mesh and placements, so the host step reduces what it must over it)
        specs = [(local_tensor(p).shape, torch.float32 if self.master_weights
                  and p.dtype in (torch.bfloat16, torch.float16) else p.dtype)
                 for p in self.params]
        self._host: List[torch.Tensor] = host_buffers(specs, pin)
        self._grads: List[torch.Tensor] = host_buffers(specs, pin)
        with torch.no_grad():
            for p, h in zip(self.params, self._host):
                h.copy_(local_tensor(p.detach()))
        self._host_params = [_like(p, h) for p, h in zip(self.params, self._host)]
        self._host_grads = [_like(p, g) for p, g in zip(self.params, self._grads)]
        self._slot = {id(p): i for i, p in enumerate(self.params)}
        at = 0
        host_groups = []
        for g in groups:
            n = len(g["params"])
            host_groups.append(dict(g, params=self._host_params[at:at + n]))
            at += n
        backend = optimizer_kwargs.pop("backend", None)
        if backend is None or backend == "cpu":
            backend = get_backend("cpu", "cpu")
            if num_threads:
                from .backends.cpu import CpuBackend

                backend = CpuBackend(num_threads)
        self.optimizer = LuminaMoon(host_groups, backend=backend, **optimizer_kwargs)
        self._stepper = BucketStepper(self.optimizer)
        self._d2h = torch.cuda.Stream(self.device) if self._cuda else None
        self._h2d = torch.cuda.Stream(self.device) if self._cuda else None
        self._ready: List[int] = []  # slots whose host gradient holds this step's gradient
        self._d2h_events: List[Any] = []
        # gradient copies not known to be done: (event, bytes); backward waits for the oldest
        # when more than inflight_buckets * bucket_bytes are in flight, so the GPU never holds
        # more gradients than that while PCIe is slower than backward. (The default, 4 buckets
        # of 25 MiB, queues about 4 ms of copies at 25 GB/s: enough to keep the link busy while
        # the next bucket is produced; a reasoned choice, not yet a measured one.)
        self._inflight: collections.deque = collections.deque()
        self._inflight_bytes = 0
        self._inflight_limit = inflight_buckets * max(bucket_bytes, 1)
        self._param_event: Dict[int, Any] = {}  # slot -> event after its copy back
        self._future_of: Dict[int, concurrent.futures.Future] = {}
        self._pool = (concurrent.futures.ThreadPoolExecutor(
            max_workers=1, thread_name_prefix="luminamoon-offload") if self.in_backward else None)
        self._hooks = _GradHooks(self.params, bucket_bytes, accumulate_steps, self._on_bucket,
                                 lambda: tell_scheduler(self.optimizer))
        self._pre_hooks = []
        if module is not None and overlap:
            for m in module.modules():
                own = [self._slot[id(p)] for p in m.parameters(recurse=False)
                       if id(p) in self._slot]
                if own:
                    self._pre_hooks.append(m.register_forward_pre_hook(
                        lambda mod, args, own=own: self._wait_for(own)))
        self._overlap = bool(self._pre_hooks)

    # ---------------------------------------------------------------------------------
    # backward: gradients down, (in_backward) buckets stepped by the worker
    # ---------------------------------------------------------------------------------
    def _on_bucket(self, params: List[torch.Tensor]) -> None:
        slots = [self._slot[id(p)] for p in params]
        event = None
        with torch.no_grad():
            if self._cuda:
                self._d2h.wait_stream(torch.cuda.current_stream(self.device))
                with torch.cuda.stream(self._d2h):
                    for p, i in zip(params, slots):
                        grad = local_tensor(p.grad)
                        grad.record_stream(self._d2h)
                        if grad.dtype != self._grads[i].dtype:
                            grad = grad.to(self._grads[i].dtype)  # on the side stream
                        self._grads[i].copy_(grad, non_blocking=True)
                event = torch.cuda.Event()
                event.record(self._d2h)
                self._throttle(event, sum(p.grad.numel() * p.grad.element_size()
                                          for p in params))
            else:
                for p, i in zip(params, slots):
                    self._grads[i].copy_(local_tensor(p.grad))
        for p in params:
            p.grad = None
        if self.in_backward:
            future = self._pool.submit(self._step_bucket, slots, event)
            for i in slots:
                self._future_of[i] = future
        else:
            self._ready.extend(slots)
            if event is not None:
                self._d2h_events.append(event)

    def _throttle(self, event, nbytes: int) -> None:
        self._inflight.append((event, nbytes))
        self._inflight_bytes += nbytes
        while self._inflight_bytes > self._inflight_limit and len(self._inflight) > 1:
            oldest, n = self._inflight.popleft()
            oldest.synchronize()
            self._inflight_bytes -= n
        while self._inflight and self._inflight[0][0].query():
            self._inflight_bytes -= self._inflight.popleft()[1]

    def _step_bucket(self, slots: List[int], event) -> None:
        """The worker: wait for the bucket's gradients, step it on the CPU, copy it back."""
        if event is not None:
            event.synchronize()
        hosts = [self._host_params[i] for i in slots]
        for h, i in zip(hosts, slots):
            h.grad = self._host_grads[i]
        try:
            self._stepper.step(hosts)
            self._stepper.settle(0)  # host flags: read now, before the copy back
        finally:
            self._stepper.pending.clear()
            for h in hosts:
                h.grad = None
        self._copy_back(slots, event)

    def _copy_back(self, slots: List[int], after=None) -> None:
        with torch.no_grad():
            if self._cuda:
                # the parameters' last readers (backward's kernels) run first: the gradient
                # copy's event, which followed them, or the compute stream now
                if after is not None:
                    self._h2d.wait_event(after)
                else:
                    self._h2d.wait_stream(torch.cuda.current_stream(self.device))
                with torch.cuda.stream(self._h2d):
                    for i in slots:
                        p, h = local_tensor(self.params[i].detach()), self._host[i]
                        if h.dtype == p.dtype:
                            p.copy_(h, non_blocking=True)
                        else:  # a float32 master: over as float32, rounded on the device
                            p.copy_(h.to(p.device, non_blocking=True))
                event = torch.cuda.Event()
                event.record(self._h2d)
                for i in slots:
                    self._param_event[i] = event
            else:
                for i in slots:
                    local_tensor(self.params[i].detach()).copy_(self._host[i])

    # ---------------------------------------------------------------------------------
    # the step, and waiting for the parameters
    # ---------------------------------------------------------------------------------
    def step(self, closure=None):
        """in_backward=False: wait for the gradients' copies and step on the CPU (the normal
        step's semantics), then start copying the parameters back. in_backward=True: nothing to
        step. Without forward pre-hooks (params given, or overlap=False) the compute stream
        then waits for every copy."""
        loss = None
        if closure is not None:
            with torch.enable_grad():
                loss = closure()
        if not self.in_backward and self._ready:
            for event in self._d2h_events:
                event.synchronize()
            self._d2h_events = []
            slots, self._ready = sorted(set(self._ready)), []
            for i in slots:
                self._host_params[i].grad = self._host_grads[i]
            try:
                self.optimizer.step()
            finally:
                for i in slots:
                    self._host_params[i].grad = None
            self._copy_back(slots, None)
        if not self._overlap:
            self.wait()
        return loss

    def _wait_for(self, slots: List[int]) -> None:
        for i in slots:
            future = self._future_of.pop(i, None)
            if future is not None and future.exception() is not None:
                # the worker's error surfaces here, once: its bucket's other slots let go of it
                for j in [j for j, f in self._future_of.items() if f is future]:
                    del self._future_of[j]
                future.result()
            event = self._param_event.pop(i, None)
            if event is not None:
                torch.cuda.current_stream(self.device).wait_event(event)

    def wait(self) -> None:
        """Every pending bucket step done and the compute stream waiting for every copy."""
        self._wait_for(range(len(self.params)))

    def zero_grad(self, set_to_none: bool = True) -> None:
        """Clears accumulated device gradients (after a stepping backward there are none)."""
        for p in self.params:
            p.grad = None

    def remove(self) -> None:
        self.wait()
        self._hooks.remove()
        for h in self._pre_hooks:
            h.remove()
        self._pre_hooks, self._overlap = [], False
        if self._pool is not None:
            self._pool.shutdown()

    # ---------------------------------------------------------------------------------
    # the optimizer's face (param_groups, state, skipped_steps: _OptimizerFace), state dict
    # ---------------------------------------------------------------------------------
    def accumulate(self):
        """Context: backward passes inside only accumulate (on the device); the first outside
        steps."""
        return self._hooks.accumulate()

    def state_dict(self) -> Dict[str, Any]:
        """The host LuminaMoon's state dict (loadable by a LuminaMoon over the device
        parameters too); with master_weights, each stepped parameter's float32 master copy
        beside its moments (key "master_param")."""
        self.wait()
        sd = self.optimizer.state_dict()
        if self.master_weights:
            for k, h in enumerate(self._host):
                entry = sd["state"].get(k)
                if entry and h.dtype != self.params[k].dtype:
                    entry[_MASTER] = _like(self.params[k], h.detach().clone())
        return sd

    def load_state_dict(self, state_dict: Dict[str, Any]) -> None:
        """Loads the state (a LuminaMoon state dict from any device); the host copies are then
        taken from the parameters (load the model's state dict first), or from the saved
        float32 masters, which the parameters are then rounded from."""
        self.wait()
        sd = dict(state_dict)
        sd["state"] = {k: dict(v) if isinstance(v, dict) else v
                       for k, v in state_dict["state"].items()}
        masters = {k: v.pop(_MASTER) for k, v in sd["state"].items()
                   if isinstance(v, dict) and _MASTER in v}
        if masters and not self.master_weights:
            raise ValueError("the state dict holds float32 master copies (master_weights=True) "
                             "but this offload keeps none; build it with master_weights=True")
        self.optimizer.load_state_dict(sd)
        self._stepper.invalidate()
        with torch.no_grad():
            for k, (p, h) in enumerate(zip(self.params, self._host)):
                if k in masters:
                    h.copy_(local_tensor(masters[k]))
                    local_tensor(p.detach()).copy_(h)
                else:
                    h.copy_(local_tensor(p.detach()))


def offload(model_or_params, *, in_backward: bool = False,
            bucket_bytes: int = DEFAULT_BUCKET_BYTES, accumulate_steps: int = 1,
            master_weights: bool = False, num_threads: int = 0, overlap: bool = True,
            inflight_buckets: int = 4, **optimizer_kwargs) -> CpuOffload:
    """LuminaMoon with its moments (and, with ``master_weights``, float32 master copies of
    bf16/fp16 parameters) in host memory, stepped by the C++ CPU engine; gradients go to the
    host as backward produces them (buckets of ``bucket_bytes``), parameters come back before
    the forward of the module that holds them. ``in_backward=True`` also steps each bucket while
    backward continues. At most ``inflight_buckets`` buckets of gradients wait on the GPU for
    their copy (backward waits for the oldest beyond). ``num_threads``: the CPU engine's threads
    (0: one per hardware thread). ``overlap``: with a module, each submodule's forward waits
    only for its own parameters (else ``step()`` waits for all). The other keyword arguments
    are LuminaMoon's. See docs/memory.md."""
    return CpuOffload(model_or_params, in_backward=in_backward, bucket_bytes=bucket_bytes,
                      accumulate_steps=accumulate_steps, master_weights=master_weights,
                      num_threads=num_threads, overlap=overlap,
                      inflight_buckets=inflight_buckets, **optimizer_kwargs)
