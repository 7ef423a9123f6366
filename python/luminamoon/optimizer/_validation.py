"""Checks of hyperparameters and tensors; each failure names the value and the fix."""
from __future__ import annotations

import math
import numbers
from typing import Any, Mapping, Optional

import numpy as np
import torch

from ._plan import BOUND_MODES, NONFINITE_POLICIES, Hyper

STATE_DTYPES = (torch.float32, torch.bfloat16)
BACKEND_NAMES = ("auto", "reference", "triton", "cpu", "aot")
HYPER_KEYS = ("lr", "betas", "eps", "weight_decay", "clip", "bound_mode", "bound", "maximize",
              "nonfinite", "stochastic_rounding", "state_dtype")


def f32(x: float) -> float:
    """``x`` rounded once to float32, as a Python float."""
    return float(np.float32(x))


def _is_real(x: Any) -> bool:
    return isinstance(x, numbers.Real) and not isinstance(x, bool)


def _real(name: str, value: Any, where: str) -> float:
    if isinstance(value, torch.Tensor) and value.dim() == 0 and value.is_floating_point():
        value = value.item()
    if not _is_real(value):
        raise ValueError(f"{name}{where} must be a real number, got {value!r}")
    value = float(value)
    if not math.isfinite(value):
        raise ValueError(f"{name}{where} must be finite, got {value!r}")
    return value


def _flag(name: str, value: Any, where: str) -> None:
    if not isinstance(value, (bool, np.bool_)):
        raise ValueError(f"{name}{where} must be True or False, got {value!r}")


def validate_lr(lr: Any, where: str = "") -> None:
    if isinstance(lr, torch.Tensor):
        if lr.dim() != 0 or not lr.is_floating_point():
            raise ValueError(
                f"lr{where} as a tensor must be a 0-dim floating-point tensor, got shape "
                f"{tuple(lr.shape)} and dtype {lr.dtype}; use e.g. torch.tensor(1e-3)")
        if lr.device.type == "meta":
            return
    value = _real("lr", lr, where)
    if value < 0:
        raise ValueError(f"lr{where} must be >= 0, got {value!r}")


def validate_hyperparameters(group: Mapping[str, Any], where: str = "") -> None:
    """Raise ValueError naming the first invalid hyperparameter of ``group``."""
    validate_lr(group["lr"], where)
    betas = group["betas"]
    if not isinstance(betas, (tuple, list)) or len(betas) != 2:
        raise ValueError(f"betas{where} must be a pair (beta1, beta2), got {betas!r}")
    for i, beta in enumerate(betas):
        value = _real(f"betas[{i}]", beta, where)
        if not 0.0 <= value < 1.0:
            raise ValueError(f"betas[{i}]{where} must be in [0, 1), got {value!r}")
        if f32(value) >= 1.0:
            raise ValueError(
                f"betas[{i}]{where} rounds to 1.0 in float32 (got {value!r}); use a value "
                f"<= {float(np.nextafter(np.float32(1), np.float32(0)))!r}")
    eps = _real("eps", group["eps"], where)
    if eps <= 0:
        raise ValueError(f"eps{where} must be > 0, got {eps!r}")
    if f32(eps) <= 0:
        raise ValueError(f"eps{where} rounds to 0 in float32 (got {eps!r}); use eps >= 1e-38")
    wd = _real("weight_decay", group["weight_decay"], where)
    if wd < 0:
        raise ValueError(f"weight_decay{where} must be >= 0, got {wd!r}")
    clip = _real("clip", group["clip"], where)
    if clip < 0:
        raise ValueError(f"clip{where} must be >= 0 (0 turns soft clipping off), got {clip!r}")
    mode = group["bound_mode"]
    if mode not in BOUND_MODES or not isinstance(mode, str):
        raise ValueError(
            f"bound_mode{where} must be one of {tuple(BOUND_MODES)}, got {mode!r}")
    bound = _real("bound", group["bound"], where)
    if mode != "none" and bound <= 0:
        raise ValueError(f"bound{where} must be > 0 when bound_mode={mode!r}, got {bound!r}")
    _flag("maximize", group["maximize"], where)
    policy = group["nonfinite"]
    if policy not in NONFINITE_POLICIES or not isinstance(policy, str):
        raise ValueError(f"nonfinite{where} must be one of {NONFINITE_POLICIES}, got {policy!r}")
    _flag("stochastic_rounding", group["stochastic_rounding"], where)
    state_dtype = group["state_dtype"]
    if state_dtype not in STATE_DTYPES:
        raise ValueError(
            f"state_dtype{where} must be torch.float32 or torch.bfloat16, got {state_dtype!r}")


def validate_seed(seed: Any) -> None:
    if seed is None:
        return
    if not isinstance(seed, numbers.Integral) or isinstance(seed, bool) or not 0 <= seed < 2**64:
        raise ValueError(f"seed must be None or an integer in [0, 2**64), got {seed!r}")


def validate_backend(backend: Any) -> None:
    from ._backend import Backend

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
        raise ValueError(
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
