"""optimizer/backends/_native.py: what the cpu and aot backends share of the compiled module
luminamoon._luminav: the module itself (with the fix when it is missing), a launch group's
constants as the engine takes them, and a step's lr as the cpu engine takes it.

Importing this module imports the compiled module and nothing else happens: no device probing,
no bundle loading (that waits for a group's first step).
"""
from __future__ import annotations

import torch

from ...kernels.layout import DTYPE_CODES, S_DTYPE_Q8
from ...kernels.quant import Q8
from .._groups import LaunchGroup

try:
    from ... import _luminav
except ImportError as exc:  # pragma: no cover - depends on the build
    raise ImportError(
        "the native module luminamoon._luminav is not built: "
        f"{exc}; build it with `pip install .` (or `make dev` and PYTHONPATH=python)") from exc

__all__ = ["_luminav", "group_config", "lr_value"]


def group_config(group: LaunchGroup):
    """The group's constants as the engine takes them (lr excluded): one
    ``_luminav.GroupConfig`` of the dtype codes (q8 moments: S_DTYPE_Q8), the hyperparameter record (optimizer/_groups.
    Hyper, read field by field in C++ as engine/engine.h's Hyper) and the seed; validated there,
    built once per launch group."""
    state = S_DTYPE_Q8 if group.state_dtype == Q8 else DTYPE_CODES[group.state_dtype]
    return _luminav.GroupConfig(
        (DTYPE_CODES[group.param_dtype], DTYPE_CODES[group.grad_dtype], state), group.hyper,
        int(group.seed))


def lr_value(lr) -> float:
    """A step's lr as the cpu engine takes it: a float (a CPU tensor read without a device
    synchronisation)."""
    if isinstance(lr, torch.Tensor):
        if lr.numel() != 1:
            raise ValueError(f"Tensor lr must be 1-element; got a tensor of shape "
                             f"{tuple(lr.shape)}. Fix: pass a float or a one-element tensor")
        return float(lr.item())
    return float(lr)
