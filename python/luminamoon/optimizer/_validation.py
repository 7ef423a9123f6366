"""optimizer/_validation.py: checks of hyperparameters and tensors; each failure names the
value and the fix."""
from __future__ import annotations

import math
import numbers
from typing import Any, Mapping, Optional

import numpy as np
import torch

from ..kernels.quant import Q8
from ._groups import BOUND_MODES, NONFINITE_POLICIES, Hyper
from .backends.base import BACKEND_NAMES, Backend

STATE_DTYPES = (torch.float32, torch.bfloat16, Q8)
HYPER_KEYS = ("lr", "betas", "eps", "weight_decay", "clip", "bound_mode", "bound", "maximize",
              "nonfinite", "stochastic_rounding", "state_dtype")


def f32(x: float) -> float:
    """``x`` rounded once to float32, as a Python float (inf where float32 overflows)."""
    with np.errstate(over="ignore"):
        return float(np.float32(x))


def _is_real(x: Any) -> bool:
    return isinstance(x, numbers.Real) and not isinstance(x, bool)


class TorchRuntimeError(ValueError, RuntimeError):
    """A bad input for which torch.optim raises RuntimeError: LuminaMoon's ValueError that an
    ``except RuntimeError`` written for torch.optim catches as well."""


# torch.optim's own refusals of a value (torch/optim/adam.py, which AdamW shares): its wording
# and the test it fails. Where a value fails it, LuminaMoon's message starts with torch's
# wording, then names the value and the fix.
_TORCH_RANGES = {
    "lr": ("Invalid learning rate: {}", lambda v: 0.0 <= v),
    "eps": ("Invalid epsilon value: {}", lambda v: 0.0 <= v),
    "betas[0]": ("Invalid beta parameter at index 0: {}", lambda v: 0.0 <= v < 1.0),
    "betas[1]": ("Invalid beta parameter at index 1: {}", lambda v: 0.0 <= v < 1.0),
    "weight_decay": ("Invalid weight_decay value: {}", lambda v: 0.0 <= v),
}


def torch_wording(name: str, given: Any) -> str:
    """torch.optim's message for the value ``given`` of ``name`` followed by "; ", or "" where
    torch.optim takes the value (or refuses it only through Python's own TypeError)."""
    rule = _TORCH_RANGES.get(name)
    if rule is None:
        return ""
    try:
        if bool(rule[1](given)):
            return ""
    except Exception:  # noqa: BLE001 - a string, a tensor of several elements: not torch's wording
        return ""
    return rule[0].format(given) + "; "


def _real(name: str, value: Any, where: str) -> float:
    """A real hyperparameter as a float, finite both as given and as the float32 the kernels use
    (1e39 is a finite double but inf in float32)."""
    torch_says = torch_wording(name, value)
    if isinstance(value, torch.Tensor) and value.numel() == 1 and value.is_floating_point():
        value = value.item()
    if not _is_real(value):
        raise ValueError(f"{name}{where} must be a real number, got {value!r}")
    value = float(value)
    if not math.isfinite(value):
        raise ValueError(f"{torch_says}{name}{where} must be finite, got {value!r}")
    if not math.isfinite(f32(value)):
        raise ValueError(f"{name}{where} must be finite in float32 (|x| < 3.4e38), got {value!r}")
    return value


def _flag(name: str, value: Any, where: str) -> None:
    if not isinstance(value, (bool, np.bool_)):
        raise ValueError(f"{name}{where} must be True or False, got {value!r}")


# The smallest magnitude that rounds to inf in float32: 2**128 - 2**103.
_F32_OVERFLOW = 3.4028235677973366e38


def validate_lr(lr: Any, where: str = "") -> None:
    """lr: a real >= 0, or a one-element floating-point tensor (as torch.optim takes). A tensor
    outside host memory is not read here (no synchronisation): its value is checked on the
    device by the step (optimizer/_step.py)."""
    if type(lr) is float and 0.0 <= lr < _F32_OVERFLOW:  # the common case, checked every step
        return
    if isinstance(lr, torch.Tensor):
        if lr.numel() != 1 or not lr.is_floating_point():
            raise ValueError(
                f"{'Tensor lr must be 1-element; ' if lr.numel() != 1 else ''}lr{where} as a "
                f"tensor must have one floating-point element, got shape {tuple(lr.shape)} and "
                f"dtype {lr.dtype}; use e.g. torch.tensor(1e-3)")
        if lr.device.type != "cpu":
            return
    value = _real("lr", lr, where)
    if value < 0:
        raise ValueError(f"{torch_wording('lr', lr)}lr{where} must be >= 0, got {value!r}")


def validate_hyperparameters(group: Mapping[str, Any], where: str = "") -> None:
    """Raise ValueError naming the first missing or invalid hyperparameter of ``group``."""
    for key in HYPER_KEYS:
        if key not in group:
            raise ValueError(f"param group{where} has no {key!r}; every LuminaMoon param group "
                             f"holds {', '.join(HYPER_KEYS)} (the constructor's defaults fill in "
                             f"what a group does not give)")
    validate_lr(group["lr"], where)
    betas = group["betas"]
    if not isinstance(betas, (tuple, list)) or len(betas) != 2:
        raise ValueError(f"betas{where} must be a pair (beta1, beta2), got {betas!r}")
    for i, beta in enumerate(betas):
        value = _real(f"betas[{i}]", beta, where)
        if not 0.0 <= value < 1.0:
            raise ValueError(f"{torch_wording(f'betas[{i}]', beta)}betas[{i}]{where} must be in "
                             f"[0, 1), got {value!r}")
        if f32(value) >= 1.0:
            raise ValueError(
                f"betas[{i}]{where} rounds to 1.0 in float32 (got {value!r}); use a value "
                f"<= {float(np.nextafter(np.float32(1), np.float32(0)))!r}")
    eps = _real("eps", group["eps"], where)
    if eps <= 0:
        raise ValueError(f"{torch_wording('eps', group['eps'])}eps{where} must be > 0, got {eps!r}")
    if f32(eps) <= 0:
        raise ValueError(f"eps{where} rounds to 0 in float32 (got {eps!r}); use eps >= 1e-38")
    wd = _real("weight_decay", group["weight_decay"], where)
    if wd < 0:
        raise ValueError(f"{torch_wording('weight_decay', group['weight_decay'])}weight_decay"
                         f"{where} must be >= 0, got {wd!r}")
    clip = _real("clip", group["clip"], where)
    if clip < 0:
        raise ValueError(f"clip{where} must be >= 0 (0 turns soft clipping off), got {clip!r}")
    mode = group["bound_mode"]
    if not isinstance(mode, str) or mode not in BOUND_MODES:
        raise ValueError(
            f"bound_mode{where} must be one of {tuple(BOUND_MODES)}, got {mode!r}")
    bound = _real("bound", group["bound"], where)
    if mode != "none" and bound <= 0:
        raise ValueError(f"bound{where} must be > 0 when bound_mode={mode!r}, got {bound!r}")
    _flag("maximize", group["maximize"], where)
    policy = group["nonfinite"]
    if not isinstance(policy, str) or policy not in NONFINITE_POLICIES:
        raise ValueError(f"nonfinite{where} must be one of {NONFINITE_POLICIES}, got {policy!r}")
    _flag("stochastic_rounding", group["stochastic_rounding"], where)
    state_dtype = group["state_dtype"]
    if not any(state_dtype is d or (type(state_dtype) is type(d) and state_dtype == d)
               for d in STATE_DTYPES):
        raise ValueError(
            f"state_dtype{where} must be torch.float32, torch.bfloat16 or 'q8' (8-bit moments, "
            f"docs/tdclm.md), got {state_dtype!r}")


def torch_flags(foreach: Any, fused: Any, capturable: Any, differentiable: Any) -> dict:
    """The torch.optim implementation keywords, as the values that describe LuminaMoon: one
    fused multi-tensor step (so ``foreach`` of any value is met), capturable (no host
    synchronisation), not differentiable. Refuses what it cannot be, by name."""
    for name, value in (("foreach", foreach), ("fused", fused), ("capturable", capturable),
                        ("differentiable", differentiable)):
        if value is not None and not isinstance(value, (bool, np.bool_)):
            raise ValueError(f"{name} must be None, True or False, got {value!r}")
    if differentiable:
        message = ("differentiable=True is not supported: LuminaMoon's step runs in fused "
                   "kernels outside autograd; use torch.optim.AdamW(differentiable=True) to "
                   "differentiate through an optimizer step")
        if fused:  # torch.optim refuses the pair too
            raise TorchRuntimeError(f"`fused` does not support `differentiable`; {message}")
        raise ValueError(message)
    if fused is False:
        raise ValueError("fused=False is not supported: LuminaMoon's step is always fused (one "
                         "launch per pass for a whole param group); pass fused=None or True")
    return dict(foreach=foreach, fused=True, capturable=True, differentiable=False)


def validate_seed(seed: Any, where: str = "", allow_none: bool = True) -> None:
    """A seed as given (None: drawn, or the optimizer's where a param group gives it) or as a
    param group holds it when a step is planned (``allow_none=False``)."""
    if seed is None and allow_none:
        return
    if not isinstance(seed, numbers.Integral) or isinstance(seed, bool) or not 0 <= seed < 2**64:
        wanted = "None or an integer" if allow_none else "an integer"
        raise ValueError(f"seed{where} must be {wanted} in [0, 2**64), got {seed!r}")


def validate_backend(backend: Any) -> None:
    if isinstance(backend, Backend):
        return
    if backend not in BACKEND_NAMES:
        raise ValueError(
            f"backend must be one of {BACKEND_NAMES} (or a Backend instance), got {backend!r}")


def make_hyper(group: Mapping[str, Any]) -> Hyper:
    """The launch-group key of a (validated) param group: floats rounded to float32."""
    beta1, beta2 = group["betas"]
    return Hyper(
        beta1=f32(float(beta1)),
        beta2=f32(float(beta2)),
        eps=f32(float(group["eps"])),
        weight_decay=f32(float(group["weight_decay"])),
        clip=f32(float(group["clip"])),
        bound_mode=BOUND_MODES[group["bound_mode"]],
        bound=f32(float(group["bound"])),
        maximize=bool(group["maximize"]),
        nonfinite=str(group["nonfinite"]),
        stochastic_rounding=bool(group["stochastic_rounding"]),
    )


def check_param(p: torch.Tensor, name: str) -> None:
    """A tensor the optimizer may own."""
    if not isinstance(p, torch.Tensor):
        raise TypeError(f"{name} must be a torch.Tensor, got {type(p).__name__}")
    if not p.is_floating_point():
        raise ValueError(
            f"{name} has dtype {p.dtype}; LuminaMoon steps floating-point parameters only "
            f"(float32, bfloat16, float16; float64 on the reference backend)")
    if p.is_sparse:
        raise ValueError(f"{name} is a sparse tensor; LuminaMoon steps dense parameters only")


def check_grad(p: torch.Tensor, grad: torch.Tensor, name: str) -> None:
    """The gradient of ``p`` is one LuminaMoon can use."""
    if grad.is_sparse or getattr(grad, "layout", torch.strided) != torch.strided:
        raise TorchRuntimeError(
            f"Adam does not support sparse gradients, please consider SparseAdam instead; "
            f"{name} has a sparse gradient ({grad.layout}); LuminaMoon needs dense gradients "
            f"(use sparse=False in nn.Embedding, or torch.optim.SparseAdam)")
    if not grad.is_floating_point():
        raise ValueError(f"{name} has a gradient of dtype {grad.dtype}; it must be floating point")
    if grad.shape != p.shape:
        raise ValueError(
            f"{name} has shape {tuple(p.shape)} but its gradient has shape {tuple(grad.shape)}; "
            f"they must match")
    if grad.device != p.device:
        raise ValueError(
            f"{name} lives on {p.device} but its gradient on {grad.device}; move them together")


def check_state_tensor(p: torch.Tensor, t: Optional[torch.Tensor], key: str, dtype: torch.dtype,
                       name: str) -> None:
    if not isinstance(t, torch.Tensor):
        raise ValueError(f"{name}: state {key!r} must be a tensor, got {type(t).__name__}")
    if t.shape != p.shape:
        raise ValueError(
            f"{name}: state {key!r} has shape {tuple(t.shape)} but the parameter has shape "
            f"{tuple(p.shape)}; the state belongs to another parameter (check the param order "
            f"of the loaded state dict)")
    if t.dtype != dtype:
        raise ValueError(f"{name}: state {key!r} has dtype {t.dtype}, expected {dtype}")
    if t.device != p.device:
        raise ValueError(
            f"{name}: state {key!r} lives on {t.device} but the parameter on {p.device}")


def _same_device(a: torch.device, b: torch.device) -> bool:
    """Device equality where an index-less accelerator device means its current index."""
    if a.type != b.type:
        return False
    if a.index is None or b.index is None:
        if a.type == "cpu":
            return True
        mod = getattr(torch, a.type, None)
        current = mod.current_device() if mod is not None and hasattr(mod, "current_device") else 0
        return (a.index if a.index is not None else current) == (
            b.index if b.index is not None else current)
    return a.index == b.index


def check_element_tensor(label: str, t: Any, device: torch.device, dtype: torch.dtype,
                         numel: int, backend: str, align: Optional[int]) -> None:
    """What a table-driven backend needs of one element tensor; the message names the fix."""
    if not isinstance(t, torch.Tensor):
        raise ValueError(f"{backend} backend: {label} must be a tensor, got {type(t).__name__}")
    if not _same_device(t.device, device):
        raise ValueError(f"{backend} backend: {label} is on {t.device}, the group on {device}; "
                         f"move it to {device}")
    if t.dtype != dtype:
        raise ValueError(f"{backend} backend: {label} has dtype {t.dtype}, the group expects "
                         f"{dtype}")
    if t.numel() != numel:
        raise ValueError(f"{backend} backend: {label} has {t.numel()} elements, its param {numel}")
    if not t.is_contiguous():
        raise ValueError(f"{backend} backend: {label} is not contiguous; the kernels read flat "
                         "storage")
    if align and numel and t.data_ptr() % align:
        raise ValueError(
            f"{backend} backend: {label} starts at address {t.data_ptr():#x}, not a multiple of "
            f"{align} bytes; the kernels read {align}-byte vectors (a view into another "
            "tensor's storage can start anywhere). Use a tensor that owns its storage (e.g. "
            ".clone()) or another backend")


def check_group_tensors(group, backend: str, align: Optional[int] = None) -> None:
    """Refuses, before anything is launched, what a table-driven backend (triton, aot, cpu)
    cannot read correctly: list lengths, every element tensor (device, dtype, size, layout,
    ``align``-byte alignment when given), the step counters, offsets and the seed."""
    n = len(group.params)
    for what, lst in (("grads", group.grads), ("exp_avgs", group.exp_avgs),
                      ("exp_avg_sqs", group.exp_avg_sqs), ("steps", group.steps),
                      ("param_indices", group.param_indices),
                      ("elem_offsets", group.elem_offsets),
                      ("global_numels", group.global_numels)):
        if len(lst) != n:
            raise ValueError(f"{backend} backend: the group has {n} params but {len(lst)} {what}")
    bounded = group.hyper.bound_mode != 0
    if bounded and (group.p_inits is None or len(group.p_inits) != n):
        raise ValueError(f"{backend} backend: bound_mode {group.hyper.bound_mode} needs one "
                         f"p_init per param; got "
                         f"{None if group.p_inits is None else len(group.p_inits)}")
    if not 0 <= int(group.seed) < 2 ** 64:
        raise ValueError(f"seed must be in [0, 2**64), got {group.seed}")
    q8 = group.state_dtype == Q8
    moment_dtype = torch.uint8 if q8 else group.state_dtype  # q8: one-byte codes
    expect = [("param", group.params, group.param_dtype),
              ("grad", group.grads, group.grad_dtype),
              ("exp_avg", group.exp_avgs, moment_dtype),
              ("exp_avg_sq", group.exp_avg_sqs, moment_dtype)]
    if bounded:
        expect.append(("p_init", group.p_inits, group.param_dtype))
    dev = group.device
    for j in range(n):
        numel = group.params[j].numel()
        label = f"tensor {j} (param index {group.param_indices[j]})"
        for what, lst, dtype in expect:
            check_element_tensor(f"{what} of {label}", lst[j], dev, dtype, numel, backend, align)
        if q8:
            _check_q8_scales(group, j, label, dev, backend, align)
        s = group.steps[j]
        if (not isinstance(s, torch.Tensor) or not _same_device(s.device, dev)
                or s.dtype != torch.int64 or s.numel() != 1):
            raise ValueError(f"{backend} backend: the step counter of {label} must be a "
                             f"one-element int64 tensor on {dev}, got {s!r}")
        if s.data_ptr() % 8:
            raise ValueError(f"{backend} backend: the step counter of {label} is not 8-byte "
                             f"aligned ({s.data_ptr():#x}); use a tensor that owns its storage")
        off, gnumel = int(group.elem_offsets[j]), int(group.global_numels[j])
        if off < 0 or gnumel < off + numel:
            raise ValueError(f"{backend} backend: {label}: elem_offset {off} + numel {numel} "
                             f"exceeds global_numel {gnumel}")


def _check_q8_scales(group, j: int, label: str, dev, backend: str, align: Optional[int]) -> None:
    """Tensor j's q8 scales: float32, one per block of its (R, K) rows (kernels/quant.py),
    contiguous, on the group's device."""
    from ..kernels.quant import BLOCK

    if group.exp_avg_scales is None or group.exp_avg_sq_scales is None or group.q8_rows is None:
        raise ValueError(f"{backend} backend: a q8 group needs exp_avg_scales, exp_avg_sq_scales "
                         "and q8_rows (optimizer/_groups.py group_tensors fills them)")
    rows, k = group.q8_rows[j]
    nblocks = rows * -(-k // BLOCK)
    for what, lst in (("exp_avg_scale", group.exp_avg_scales),
                      ("exp_avg_sq_scale", group.exp_avg_sq_scales)):
        check_element_tensor(f"{what} of {label}", lst[j], dev, torch.float32, nblocks, backend,
                             align)
