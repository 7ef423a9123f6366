"""optimizer/_step.py: the flow of one step over launch groups (docs/internals.md, "One step").

The optimizer and the functional ``tdclm`` both run a step through :func:`run_launch_groups`:
the host check of nonfinite="raise", pass 1, the collectives of sharded groups, the skip
decision across devices, pass 2, and the commits. Every backend call runs here, under its
group's device context (backends do not enter it again). The skip flags are clear (zero) when
a step starts and when it ends, also when it fails part-way; a skipped step is counted in one
place, the last commit that reads each flag (``Backend.commit_last``).

A tensor's update and its step counter are issued together: each group's pass 2 is followed
by its commit, and a KeyboardInterrupt that arrives from the first pass 2 on is held until
the last commit has been issued, so an interrupted step is either not begun or whole (pass 1
changes nothing a retry would see twice).
"""
from __future__ import annotations

import _signal  # signal's C functions: the step sets and restores a handler every time
import signal
import threading
from typing import Callable, Dict, List, Optional, Sequence, Tuple

import torch

from ._device import _get_device_context
from ._groups import LaunchGroup
from .backends.base import Backend

__all__ = ["run_launch_groups"]


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
            first = _reduced(first, mesh_dim, dist.ReduceOp.MIN)
        bad = [int(first.item())] if int(first.item()) != none else []
    if bad:
        k = min(bad)
        raise FloatingPointError(
            f"{describe(k)} has a non-finite gradient (nan or inf) and nonfinite='raise'; "
            f"nothing was changed. Fix: find where the gradient overflows (lower the lr, scale "
            f"the loss), or pass nonfinite='skip' to skip such steps on the device")


def _reduced(buf: torch.Tensor, mesh_dim, op) -> torch.Tensor:
    """``buf`` all-reduced along ``mesh_dim``, on the mesh's device type: the host step of
    offloaded shards (optimizer/offload.py: local tensors on the CPU, the mesh on CUDA) reduces
    its few statistics where the mesh's backend takes them, and gets them back."""
    import torch.distributed as dist

    kind = mesh_dim.key[0]
    if kind in (buf.device.type, "cpu"):
        dist.all_reduce(buf, op=op, group=mesh_dim.group)
        return buf
    there = buf.to(torch.device(kind, getattr(torch, kind).current_device()))
    dist.all_reduce(there, op=op, group=mesh_dim.group)
    return there.to(buf.device)


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
    the same steps; S is summed over exactly the dimensions that shard its tensor. Then, where
    q8 blocks are cut by shard boundaries, for each such mesh dimension in the same order one
    MAX all-reduce of one float32 buffer of every such group's partial block maxima of m' and
    v' (``LaunchGroup.q8_partials``): after it every rank holds each whole block's scale."""
    import torch.distributed as dist

    skipping = any(g.hyper.nonfinite == "skip" for g in groups)
    dims = _step_mesh_dims(groups)
    for mesh_dim, device in dims:
        owners = [g for g in groups if mesh_dim in g.reduce_dims and g.hyper.clip > 0
                  and g.stats is not None]
        flag = flags.get(device) if skipping else None
        parts = [g.stats.to(torch.float32) for g in owners]
        if flag is not None:
            parts.append(flag.to(torch.float32).reshape(1))
        if not parts:
            continue
        buf = _reduced(torch.cat(parts), mesh_dim, dist.ReduceOp.SUM)
        at = 0
        for g in owners:
            n = g.stats.numel()
            g.stats.copy_(buf[at:at + n])
            at += n
        if flag is not None:
            flag.copy_((buf[at] > 0).to(flag.dtype))
    for mesh_dim, _ in dims:
        parts = [t for g in groups if mesh_dim in g.q8_max_dims and g.q8_partials is not None
                 for t in g.q8_partials]
        if not parts:
            continue
        buf = _reduced(torch.cat(parts), mesh_dim, dist.ReduceOp.MAX)
        at = 0
        for t in parts:
            t.copy_(buf[at:at + t.numel()])
            at += t.numel()


def run_launch_groups(groups: Sequence[LaunchGroup], backends: Sequence[Backend], *,
                      flags: Dict[torch.device, torch.Tensor],
                      scratch: Dict[torch.device, torch.Tensor],
                      skipped: Optional[torch.Tensor] = None,
                      describe: Callable[[int], str] = lambda k: f"parameter {k}",
                      decision: Optional[torch.Tensor] = None,
                      amp: Optional[Tuple[Optional[torch.Tensor], Optional[torch.Tensor]]] = None
                      ) -> None:
    """One step over ``groups``: raise check, pass 1, reduce, pass 2, commit.

    ``flags``: per device, the int32 0-dim ``found_inf`` of the groups with nonfinite="skip",
    zero on entry (created here when missing) and zero again on return. ``scratch``: per
    device, the flag given to pass 1 of the other groups, whose non-finite gradients must not
    skip anyone else's step. ``skipped``: an int64 0-dim counter, += the step's skip decision.
    ``decision``: an int32 0-dim tensor that receives the skip decision (the functional form's
    ``found_inf``); left alone when no group skips. ``amp``: a GradScaler's (grad_scale,
    found_inf) for this step: the gradients are unscaled first (torch's own unscale, one
    multi-tensor launch per device) and the scaler's found_inf raises the skip flags.
    """
    _raise_on_nonfinite(groups, describe)

    def flag_for(group: LaunchGroup) -> torch.Tensor:
        table = flags if group.hyper.nonfinite == "skip" else scratch
        flag = table.get(group.device)
        if flag is None:
            flag = torch.zeros((), dtype=torch.int32, device=group.device)
            table[group.device] = flag
        return flag

    skip_devices: List[torch.device] = []
    for group in groups:
        flag_for(group)
        if group.hyper.nonfinite == "skip" and group.device not in skip_devices:
            skip_devices.append(group.device)
    # The scratch flag is written only by pass 1 of groups that do not skip; a step without
    # such a group (e.g. the single-pass AdamW mode) leaves it alone: one launch less.
    if any(g.needs_pass1 and g.hyper.nonfinite != "skip" for g in groups):
        for flag in scratch.values():
            flag.zero_()
    try:
        if amp is not None:
            _apply_grad_scaler(groups, amp, flag_for)
        elif decision is None and _step_in_one_call(groups, backends, flags, flag_for, skipped):
            return
        _launch_step(groups, backends, flags, skip_devices, flag_for, skipped, decision)
    except BaseException:
        for device in skip_devices:  # what the failed step raised must not skip the next one
            flags[device].zero_()
        raise


def _step_in_one_call(groups: Sequence[LaunchGroup], backends: Sequence[Backend],
                      flags: Dict[torch.device, torch.Tensor],
                      flag_for: Callable[[LaunchGroup], torch.Tensor],
                      skipped: Optional[torch.Tensor]) -> bool:
    """The step as one backend call (``Backend.step_groups``), where one kind of backend runs
    every group, all on one device, none staged or sharded and no lr in device memory: the same
    passes and commits in the same order as :func:`_launch_step`, without the Python between
    them. Returns whether it ran."""
    backend = backends[0]
    kind = type(backend)
    if kind.step_groups is Backend.step_groups:
        return False
    device = groups[0].device
    for group, other in zip(groups, backends):
        lr = group.lr
        if (type(other) is not kind or group.device != device or group.stage_in
                or group.stage_out or group.mesh_dims
                or (isinstance(lr, torch.Tensor) and lr.device.type != "cpu")):
            return False
    skip_flag = flags.get(device) if any(g.hyper.nonfinite == "skip" for g in groups) else None
    return backend.step_groups(groups, [flag_for(g) for g in groups], skip_flag, skipped)


def _apply_grad_scaler(groups: Sequence[LaunchGroup], amp, flag_for) -> None:
    """A GradScaler's step: unscale every group's gradients by 1 / grad_scale (where the scaler
    has not unscaled them already) and raise the skip flags where it found infs; on the
    device, in stream order (the same arithmetic as the scaler's own unscale_)."""
    grad_scale, found_inf = amp
    by_device: Dict[torch.device, List[torch.Tensor]] = {}
    for group in groups:
        by_device.setdefault(group.device, []).extend(group.grads)
    for device, grads in by_device.items():
        with _get_device_context(device):
            if grad_scale is not None:
                inv = grad_scale.double().reciprocal().float().to(device)
                seen = torch.zeros(1, dtype=torch.float32, device=device)
                torch._amp_foreach_non_finite_check_and_unscale_(grads, seen, inv)
            if found_inf is not None:
                raised = (found_inf.to(device) > 0).reshape(())
                for group in groups:
                    if group.device == device:
                        flag = flag_for(group)
                        flag.copy_(torch.maximum(flag, raised.to(flag.dtype)))
                        break


def _launch_step(groups: Sequence[LaunchGroup], backends: Sequence[Backend],
                 flags: Dict[torch.device, torch.Tensor], skip_devices: List[torch.device],
                 flag_for: Callable[[LaunchGroup], torch.Tensor],
                 skipped: Optional[torch.Tensor], decision: Optional[torch.Tensor]) -> None:
    """Pass 1, the shard all-reduce, the cross-device skip decision, pass 2, then the commits:
    on each skip device the last group that reads its flag commits through ``commit_last``,
    which clears the flag and, on the counter's device, counts the decision into ``skipped``."""
    # Staged tensors into their contiguous buffers, then pass 1 (statistics, non-finite flag).
    for group in groups:
        if group.stage_in:
            with _get_device_context(group.device):
                for src, dst in group.stage_in:
                    dst.copy_(src)
    for group, backend in zip(groups, backends):
        group.stats = None
        group.q8_partials = None
        if group.needs_pass1:
            with _get_device_context(group.device):
                backend.pass1(group, flag_for(group))
    # A learning rate in device memory that is not finite and >= 0 skips the step (groups with
    # nonfinite="skip"; an lr on the host was checked before the step began).
    for group in groups:
        lr = group.lr
        if (group.hyper.nonfinite == "skip" and isinstance(lr, torch.Tensor)
                and lr.device.type != "cpu"):
            with _get_device_context(group.device):
                flag = flag_for(group)
                bad = ~(torch.isfinite(lr) & (lr >= 0)).reshape(())
                flag.copy_(torch.maximum(flag, bad.to(device=flag.device, dtype=flag.dtype)))
    if any(group.mesh_dims for group in groups):
        _all_reduce_shards(groups, flags)
    # One skip decision for the whole step: the flags of every device combined (max) before
    # any pass 2 runs; cross-device copies, no host synchronisation.
    home = None
    if skip_devices:
        home = (skipped.device if skipped is not None and skipped.device in skip_devices
                else skip_devices[0])
    if len(skip_devices) > 1:
        combined = torch.stack([flags[d].to(home, non_blocking=True) for d in skip_devices]).amax()
        for device in skip_devices:
            flags[device].copy_(combined, non_blocking=True)
    if decision is not None and home is not None:
        decision.copy_(flags[home], non_blocking=True)
    # Pass 2 (the update) and commit (step counters), group by group; then the staged
    # tensors' results back where their owners hold them.
    last = {g.device: i for i, g in enumerate(groups) if g.hyper.nonfinite == "skip"}
    held = _hold_interrupts()
    try:
        for i, (group, backend) in enumerate(zip(groups, backends)):
            with _get_device_context(group.device):
                backend.pass2(group, flag_for(group))
                if last.get(group.device) == i:
                    backend.commit_last(group, flag_for(group),
                                        skipped if group.device == home else None)
                else:
                    backend.commit(group, flag_for(group))
                for src, dst in group.stage_out:
                    dst.copy_(src)
    finally:
        _release_interrupts(held)


_SIGINT = int(signal.SIGINT)


def _hold_interrupts():
    """Holds SIGINT (KeyboardInterrupt) until _release_interrupts, which then delivers it; in
    the main thread only (where Python delivers signals), and where the handler can be set.
    Returns what the release needs (None where nothing is held)."""
    if threading.current_thread() is not threading.main_thread():
        return None
    received: list = []
    try:
        previous = _signal.signal(_SIGINT, lambda signum, frame: received.append(frame))
    except (ValueError, OSError):  # not settable here (an embedded interpreter)
        return None
    return previous, received


def _release_interrupts(held) -> None:
    if held is None:
        return
    previous, received = held
    _signal.signal(_SIGINT, previous)
    if received:
        if callable(previous):
            previous(_SIGINT, received[0])
        elif previous != signal.SIG_IGN:
            raise KeyboardInterrupt
