"""optimizer/_q8_state.py: the optimizer state of q8 moments (state_dtype "q8", docs/tdclm.md,
"Quantized moments (q8)"): creating it, checking it, and converting moments between q8 and the
float state dtypes when a state dict of the other kind is loaded.

A q8 parameter's state holds, beside ``step`` (and ``p_init``): ``exp_avg`` and ``exp_avg_sq``,
uint8 codes of the parameter's shape, and ``exp_avg_scale`` and ``exp_avg_sq_scale``, float32
scales of shape (R, ceil(K/256)) ((ceil(n/256),) for a 1-D parameter). All plain tensors.
"""
from __future__ import annotations

from typing import Any, Dict, Optional, Tuple

import torch

from ..kernels import quant
from ..kernels.quant import Q8
from ._dtensor import is_dtensor, local_tensor
from .memory_layout import state_like

__all__ = ["SCALE_KEYS", "is_q8", "new_state", "check_state", "load_moments"]

# moment key -> its scales' key
SCALE_KEYS = {"exp_avg": "exp_avg_scale", "exp_avg_sq": "exp_avg_sq_scale"}
_SIGNED = {"exp_avg": True, "exp_avg_sq": False}


def is_q8(p: torch.Tensor, state_dtype: Any) -> bool:
    """Whether ``p`` keeps q8 moments under ``state_dtype`` (the rule reads the whole tensor's
    element count: a DTensor's numel() is global)."""
    return isinstance(state_dtype, str) and state_dtype == Q8 and quant.q8_eligible(p.numel())


def new_state(p: torch.Tensor) -> Dict[str, torch.Tensor]:
    """Zero q8 moments for ``p``: every scale 0, every code the codebook's zero."""
    device = local_tensor(p).device
    out = {}
    for key, signed in _SIGNED.items():
        out[key] = torch.full(tuple(p.shape), quant.zero_code(signed), dtype=torch.uint8,
                              device=device)
        out[SCALE_KEYS[key]] = torch.zeros(quant.scale_shape(p.shape), dtype=torch.float32,
                                           device=device)
    return out


def check_state(p: torch.Tensor, state: Dict[str, Any], name: str) -> None:
    """The q8 state of ``p`` is one the step can read; ValueError naming what is wrong."""
    device = local_tensor(p).device
    for key, scale_key in SCALE_KEYS.items():
        for what, shape, dtype in ((key, tuple(p.shape), torch.uint8),
                                   (scale_key, quant.scale_shape(p.shape), torch.float32)):
            t = state.get(what)
            if not isinstance(t, torch.Tensor):
                raise ValueError(f"{name}: state_dtype='q8' needs a tensor in state {what!r}, "
                                 f"got {type(t).__name__}; load a state dict saved with q8 "
                                 f"moments, or start from fresh state")
            if tuple(t.shape) != shape or t.dtype != dtype or t.device != device:
                raise ValueError(
                    f"{name}: state {what!r} must be {dtype} of shape {shape} on {device} "
                    f"(state_dtype='q8'), got {t.dtype} of shape {tuple(t.shape)} on {t.device}")
            if not t.is_contiguous():
                raise ValueError(f"{name}: state {what!r} must be contiguous (q8 blocks are "
                                 f"runs of the flat index); use .contiguous()")


def _dequantized(p: torch.Tensor, key: str, codes: torch.Tensor, scales: torch.Tensor
                 ) -> torch.Tensor:
    rows, k = quant.block_rows(p.shape)
    table = quant.codebook(_SIGNED[key], device=codes.device)
    x = quant.dequantize(codes, quant.expand_scales(scales.to(torch.float32), rows, k), table)
    return x.reshape(p.shape)


def _quantized(p: torch.Tensor, key: str, x: torch.Tensor) -> Tuple[torch.Tensor, torch.Tensor]:
    rows, k = quant.block_rows(p.shape)
    signed = _SIGNED[key]
    flat = x.reshape(-1).to(torch.float32)
    scales = quant.block_scales(flat, rows, k)
    codes = quant.quantize_nearest(flat, quant.expand_scales(scales, rows, k),
                                   quant.codebook(signed, device=flat.device),
                                   quant.zero_code(signed))
    return codes.reshape(p.shape), scales.reshape(quant.scale_shape(p.shape))


def load_moments(p: torch.Tensor, values: Dict[str, Any], state_dtype: Any, sr: bool,
                 name: str) -> Tuple[Dict[str, torch.Tensor], Optional[Tuple[str, str]]]:
    """The moments of ``p`` from a saved state ``values`` in the storage ``state_dtype`` gives
    ``p``, converting between q8 codes and float moments where the saved kind differs.
    Returns (the moment entries of the new state, (from, to) when converted, else None)."""
    target_q8 = is_q8(p, state_dtype)
    saved_q8 = isinstance(values.get("exp_avg"), torch.Tensor) and \
        values["exp_avg"].dtype == torch.uint8
    if (target_q8 or saved_q8) and (is_dtensor(p) or any(
            is_dtensor(values.get(k)) for k in ("exp_avg", "exp_avg_sq"))):
        raise ValueError(f"{name}: q8 moments of DTensor parameters are not supported yet; "
                         f"load with state_dtype=torch.float32 or torch.bfloat16")
    device = local_tensor(p).device
    out: Dict[str, torch.Tensor] = {}
    if saved_q8:
        saved = {k: values.get(k) for k in (*SCALE_KEYS, *SCALE_KEYS.values())}
        check_state(p, {k: (v.to(device) if isinstance(v, torch.Tensor) else v)
                        for k, v in saved.items()}, f"the state dict's state of {name}")
        if target_q8:
            return {k: v.detach().to(device, copy=True).contiguous()
                    for k, v in saved.items()}, None
        dtype = torch.float32 if state_dtype == Q8 else state_dtype
        for key in SCALE_KEYS:
            x = _dequantized(p, key, saved[key].to(device), saved[SCALE_KEYS[key]].to(device))
            out[key] = state_like(p, dtype, sr).copy_(x)
        return out, ("q8", str(dtype).replace("torch.", ""))
    if not target_q8:
        return {}, None  # float moments into float moments: the caller's path
    for key in SCALE_KEYS:
        value = values[key]
        if not isinstance(value, torch.Tensor) or not value.is_floating_point() \
                or tuple(value.shape) != tuple(p.shape):
            raise ValueError(
                f"the state dict's {key!r} for {name} must be a floating point tensor of shape "
                f"{tuple(p.shape)} (converted to q8), got "
                f"{value.dtype if isinstance(value, torch.Tensor) else type(value).__name__} "
                f"{tuple(getattr(value, 'shape', ()))}")
        codes, scales = _quantized(p, key, value.detach().to(device))
        out[key], out[SCALE_KEYS[key]] = codes.contiguous(), scales.contiguous()
    return out, (str(values["exp_avg"].dtype).replace("torch.", ""), "q8")
