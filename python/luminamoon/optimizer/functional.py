"""The functional form of TDCLM, and the step flow shared with the optimizer class.

``tdclm(...)`` steps lists of tensors with one set of hyperparameters. ``run_launch_groups``
is the flow of docs/internals.md ("One step") over launch groups; the ``LuminaMoon`` class
calls it with its cached groups.
"""
from __future__ import annotations

from typing import Callable, Dict, List, Optional, Sequence, Tuple, Union

import torch

from ._backend import Backend
from ._device import _get_device_context
from ._dtensor import local_tensor, shard_layout
from ._plan import LaunchGroup
from ._validation import (
    check_grad,
    check_param,
    check_state_tensor,
    make_hyper,
    validate_backend,
    validate_hyperparameters,
    validate_seed,
)
from .backends import select_backend

__all__ = ["tdclm"]

# --------------------------------------------------------------------------------------------
# the step flow
# --------------------------------------------------------------------------------------------
def _raise_on_nonfinite(groups: Sequence[LaunchGroup], describe: Callable[[int], str]) -> None:
    """nonfinite="raise": one host check per device, before anything changes. With DTensor
    parameters every rank raises for the same parameter (the first offending one over all
    ranks): a rank that raised alone would leave the others waiting in the step's collectives."""
    by_device: Dict[torch.device, List[Tuple[int, torch.Tensor]]] = {}
    for group in groups:
        if group.hyper.nonfinite != "raise":
            continue
        for k, grad in zip(group.param_indices, group.grads):
            by_device.setdefault(group.device, []).append((k, grad))
    if not by_device:
        return
    bad: List[int] = []
    for items in by_device.values():
        finite = torch.stack([torch.isfinite(grad).all() for _, grad in items]).tolist()
        bad.extend(k for (k, _), ok in zip(items, finite) if not ok)
    dims = _step_mesh_dims(groups)
    if dims:
        import torch.distributed as dist

        none = 2**62
        first = torch.tensor([min(bad, default=none)], dtype=torch.int64, device=dims[0][1])
        for mesh_dim, _ in dims:
            dist.all_reduce(first, op=dist.ReduceOp.MIN, group=mesh_dim.group)
        bad = [int(first.item())] if int(first.item()) != none else []
    if bad:
        k = min(bad)
        raise FloatingPointError(
            f"{describe(k)} has a non-finite gradient (nan or inf) and nonfinite='raise'; "
            f"nothing was changed. Fix: find where the gradient overflows (lower the lr, scale "
            f"the loss), or pass nonfinite='skip' to skip such steps on the device")


def _step_mesh_dims(groups: Sequence[LaunchGroup]) -> List[Tuple[object, torch.device]]:
    """Every mesh dimension of the step's sharded groups with the device its buffers live on,
    in the canonical order (MeshDim's key: the same on every rank)."""
    seen: Dict[object, torch.device] = {}
    for group in groups:
        for d in group.mesh_dims:
            seen.setdefault(d, group.device)
    return sorted(seen.items(), key=lambda item: item[0])


def _all_reduce_shards(groups: Sequence[LaunchGroup], flags: Dict[torch.device, torch.Tensor]):
    """The step's collectives, issued in one order on every rank: for each mesh dimension of the
    step's DTensor parameters, in MeshDim order, one SUM all-reduce of one float32 buffer that
    holds the S of every group sharded along that dimension (in group order, which is parameter
    order) and, when some group skips, the skip flag as a count of ranks that saw a non-finite
    gradient. After the last dimension every rank holds the same count, so every rank skips
    the same steps; S is summed over exactly the dimensions that shard its tensor."""
    import torch.distributed as dist

    skipping = any(g.hyper.nonfinite == "skip" for g in groups)
    for mesh_dim, device in _step_mesh_dims(groups):
        owners = [g for g in groups if mesh_dim in g.reduce_dims and g.hyper.clip > 0
                  and g.stats is not None]
        flag = flags.get(device) if skipping else None
        parts = [g.stats.to(torch.float32) for g in owners]
        if flag is not None:
            parts.append(flag.to(torch.float32).reshape(1))
        if not parts:
            continue
        buf = torch.cat(parts)
        dist.all_reduce(buf, op=dist.ReduceOp.SUM, group=mesh_dim.group)
        at = 0
        for g in owners:
            n = g.stats.numel()
            g.stats.copy_(buf[at:at + n])
            at += n
        if flag is not None:
            flag.copy_((buf[at] > 0).to(flag.dtype))


def run_launch_groups(groups: Sequence[LaunchGroup], backends: Sequence[Backend], *,
                      flags: Optional[Dict[torch.device, torch.Tensor]] = None,
                      scratch: Optional[Dict[torch.device, torch.Tensor]] = None,
                      skipped: Optional[torch.Tensor] = None,
                      describe: Callable[[int], str] = lambda k: f"parameter {k}",
                      flags_clear: bool = False,
                      ) -> Optional[torch.Tensor]:
    """One step over ``groups``: raise check, pass 1, reduce, pass 2, commit.

    ``flags``: per device, the int32 0-dim ``found_inf`` of the groups with nonfinite="skip"
    (created when missing; zeroed here). ``scratch``: per device, the flag given to pass 1 of
    the other groups, whose non-finite gradients must not skip anyone else's step.
    ``skipped``: an int64 0-dim counter, += the step's skip decision.
    ``flags_clear``: the caller keeps ``flags`` clear between steps (the optimizer does), and
    the step leaves them clear, also when it fails part-way, and returns None. Where the
    skipping groups share one device, their flag is then not zeroed first: the step adds it to
    ``skipped`` and clears it at its end, in the last commit's launch where that backend can.
    Returns the skip decision (an int32 0-dim device tensor), or None when no group skips.
    """
    flags = {} if flags is None else flags
    scratch = {} if scratch is None else scratch
    _raise_on_nonfinite(groups, describe)

    def flag_for(group: LaunchGroup) -> torch.Tensor:
        table = flags if group.hyper.nonfinite == "skip" else scratch
        flag = table.get(group.device)
        if flag is None:
            flag = torch.zeros((), dtype=torch.int32, device=group.device)
            table[group.device] = flag
        return flag

    skip_devices = []
    last_skipping = -1  # the last group that reads the skip flag: it commits last
    for i, group in enumerate(groups):
        flag_for(group)
        if group.hyper.nonfinite == "skip":
            last_skipping = i
            if group.device not in skip_devices:
                skip_devices.append(group.device)
    clear_after = flags_clear and len(skip_devices) == 1
    if not clear_after:
        for device in skip_devices:
            flags[device].zero_()
    # The scratch flag is written only by pass 1 of groups that do not skip; a step without
    # such a group (e.g. the single-pass AdamW mode) leaves it alone: one launch less.
    if any(g.hyper.needs_pass1 and g.hyper.nonfinite != "skip" for g in groups):
        for flag in scratch.values():
            flag.zero_()
    try:
        _launch_step(groups, backends, flags, skip_devices, flag_for,
                     skipped if clear_after else None, last_skipping if clear_after else -1)
    except BaseException:
        if flags_clear:  # what the failed step raised must not skip the next one
            for device in skip_devices:
                flags[device].zero_()
        raise
    if not skip_devices or clear_after:
        return None
    if skipped is not None:
        decision = flags.get(skipped.device)
        if decision is None:
            decision = flags[skip_devices[0]].to(skipped.device, non_blocking=True)
        skipped.add_(decision)  # int64 += int32 in place: no conversion launch
    if flags_clear:
        for device in skip_devices:
            flags[device].zero_()
        return None
    return flags[skip_devices[0]]


def _launch_step(groups: Sequence[LaunchGroup], backends: Sequence[Backend],
                 flags: Dict[torch.device, torch.Tensor], skip_devices: List[torch.device],
                 flag_for: Callable[[LaunchGroup], torch.Tensor],
                 clear_into: Optional[torch.Tensor], last: int) -> None:
    """Pass 1, the shard all-reduce, the cross-device skip decision, pass 2, commit. With
    ``last`` >= 0 (one skip device, its flag to be cleared): group ``last`` commits through
    ``commit_last`` (adding the flag to ``clear_into`` when given), else the flag is added and
    cleared here after every commit."""
    # Pass 1 (statistics, non-finite flag).
    for group, backend in zip(groups, backends):
        group.stats = None
        if group.hyper.needs_pass1:
            with _get_device_context(group.device):
                backend.pass1(group, flag_for(group))
    if any(group.mesh_dims for group in groups):
        _all_reduce_shards(groups, flags)
    # One skip decision for the whole step: the flags of every device combined (max) before
    # any pass 2 runs; cross-device copies, no host synchronisation.
    if len(skip_devices) > 1:
        home = skip_devices[0]
        combined = torch.stack([flags[d].to(home, non_blocking=True) for d in skip_devices]).amax()
        for device in skip_devices:
            flags[device].copy_(combined, non_blocking=True)
    # Pass 2 (the update), then commit (step counters).
    for group, backend in zip(groups, backends):
        with _get_device_context(group.device):
            backend.pass2(group, flag_for(group))
    cleared = last < 0
    for i, (group, backend) in enumerate(zip(groups, backends)):
        with _get_device_context(group.device):
            if i == last and clear_into is not None:
                cleared = backend.commit_last(group, flag_for(group), clear_into)
                if cleared:
                    continue
            backend.commit(group, flag_for(group))
    if not cleared:
        flag = flags[skip_devices[0]]
        if clear_into is not None:
            clear_into.add_(flag.to(clear_into.device, non_blocking=True))
        flag.zero_()


# --------------------------------------------------------------------------------------------
# the public functional
# --------------------------------------------------------------------------------------------
def tdclm(params: List[torch.Tensor], grads: List[torch.Tensor], exp_avgs: List[torch.Tensor],
          exp_avg_sqs: List[torch.Tensor], p_inits: Optional[List[torch.Tensor]],
          steps: List[torch.Tensor], *, param_indices: Optional[List[int]] = None,
          lr: Union[float, torch.Tensor], betas: Tuple[float, float], eps: float,
          weight_decay: float, clip: float, bound_mode: str, bound: float, maximize: bool,
          nonfinite: str, stochastic_rounding: bool, seed: int,
          found_inf: Optional[torch.Tensor] = None, skipped: Optional[torch.Tensor] = None,
          backend: Union[str, Backend] = "reference", aot_bundle=None) -> None:
    """One TDCLM step (docs/tdclm.md) of ``params`` in place, with one set of hyperparameters.

    ``exp_avgs``/``exp_avg_sqs`` are the moments (float32 or bfloat16, shaped as their
    parameter), ``p_inits`` the initial values (required when ``bound_mode`` is not "none",
    else None), ``steps`` 0-dim int64 tensors on each parameter's device holding the applied
    step counts (updated in place). ``param_indices`` gives each tensor's index k in the
    rounding streams (default 0, 1, ...). ``found_inf``: an int32 0-dim tensor that receives
    the step's skip decision (zeroed first); ``skipped``: an int64 0-dim counter increased by it.
    """
    n = len(params)
    lists = {"grads": grads, "exp_avgs": exp_avgs, "exp_avg_sqs": exp_avg_sqs, "steps": steps}
    if bound_mode != "none" and p_inits is not None:
        lists["p_inits"] = p_inits
    for key, values in lists.items():
        if len(values) != n:
            raise ValueError(f"{key} has {len(values)} entries but params has {n}; give one per "
                             f"parameter")
    if not exp_avgs:
        state_dtype = torch.float32
    else:
        state_dtype = exp_avgs[0].dtype
    hyper_dict = dict(lr=lr, betas=betas, eps=eps, weight_decay=weight_decay, clip=clip,
                      bound_mode=bound_mode, bound=bound, maximize=maximize, nonfinite=nonfinite,
                      stochastic_rounding=stochastic_rounding, state_dtype=state_dtype)
    validate_hyperparameters(hyper_dict)
    if seed is None:
        raise ValueError("seed must be an integer in [0, 2**64) for tdclm (the optimizer draws "
                         "one for you; the functional form needs it given)")
    validate_seed(seed)
    validate_backend(backend)
    if bound_mode != "none" and p_inits is None:
        raise ValueError(f"p_inits must be given when bound_mode={bound_mode!r}: a copy of each "
                         f"parameter taken before its first update")
    if param_indices is None:
        param_indices = list(range(n))
    elif len(param_indices) != n or len(set(param_indices)) != n:
        raise ValueError(f"param_indices must hold {n} distinct indices, got {param_indices!r}")
    if found_inf is not None and (found_inf.dim() != 0 or found_inf.dtype != torch.int32):
        raise ValueError(f"found_inf must be a 0-dim int32 tensor, got shape "
                         f"{tuple(found_inf.shape)} dtype {found_inf.dtype}")
    if skipped is not None and (skipped.dim() != 0 or skipped.dtype != torch.int64):
        raise ValueError(f"skipped must be a 0-dim int64 tensor, got shape "
                         f"{tuple(skipped.shape)} dtype {skipped.dtype}")

    hyper = make_hyper(hyper_dict)
    buckets: Dict[tuple, LaunchGroup] = {}
    for i in range(n):
        name = f"params[{i}]"
        p, g = params[i], grads[i]
        check_param(p, name)
        check_grad(p, g, name)
        _check_state(p, exp_avgs[i], "exp_avg", state_dtype, name)
        _check_state(p, exp_avg_sqs[i], "exp_avg_sq", state_dtype, name)
        if hyper.bound_mode:
            _check_state(p, p_inits[i], "p_init", p.dtype, name)
        step = steps[i]
        if not isinstance(step, torch.Tensor) or step.dim() != 0 or step.dtype != torch.int64:
            raise ValueError(f"steps[{i}] must be a 0-dim int64 tensor, got {step!r}")
        layout = shard_layout(p, name)
        local = local_tensor(p)
        if step.device != local.device:
            raise ValueError(f"steps[{i}] lives on {step.device} but {name} on {local.device}; "
                             f"keep each step counter on its parameter's device")
        key = (local.device, p.dtype, g.dtype, layout.reduce_dims, layout.mesh_dims)
        group = buckets.get(key)
        if group is None:
            group = LaunchGroup(
                device=local.device, param_dtype=p.dtype, grad_dtype=g.dtype,
                state_dtype=state_dtype, hyper=hyper, lr=lr, seed=int(seed), params=[],
                grads=[], exp_avgs=[], exp_avg_sqs=[],
                p_inits=[] if hyper.bound_mode else None, steps=[], param_indices=[],
                elem_offsets=[], global_numels=[], reduce_dims=layout.reduce_dims,
                mesh_dims=layout.mesh_dims)
            buckets[key] = group
        group.params.append(local)
        group.grads.append(local_tensor(g))
        group.exp_avgs.append(local_tensor(exp_avgs[i]))
        group.exp_avg_sqs.append(local_tensor(exp_avg_sqs[i]))
        if hyper.bound_mode:
            group.p_inits.append(local_tensor(p_inits[i]))
        group.steps.append(step)
        group.param_indices.append(int(param_indices[i]))
        group.elem_offsets.append(layout.elem_offset)
        group.global_numels.append(layout.global_numel)
    groups = list(buckets.values())
    chosen = [select_backend(backend, group, aot_bundle=aot_bundle) for group in groups]
    flags = {}
    if found_inf is not None:
        flags[found_inf.device] = found_inf
    position = {int(k): i for i, k in enumerate(param_indices)}
    decision = run_launch_groups(groups, chosen, flags=flags, skipped=skipped,
                                 describe=lambda k: f"params[{position[k]}] (param_indices {k})")
    if found_inf is not None:
        if decision is None:
            found_inf.zero_()
        elif decision is not found_inf:
            found_inf.copy_(decision)


def _check_state(p, t, key, dtype, name):
    check_state_tensor(p, t, key, dtype, name)
