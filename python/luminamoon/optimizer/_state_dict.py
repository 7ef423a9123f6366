"""optimizer/_state_dict.py: a LuminaMoon state dict checked whole before anything is loaded.

``load`` builds the new state and param groups aside and raises ValueError, naming what is
wrong and the fix, for anything the optimizer could not step from: another optimizer's state
dict, group counts or sizes, hyperparameters, seeds, the rounding stream format, step counts,
state shapes. The optimizer then swaps them in (LuminaMoon.load_state_dict).

Where the state dict carries what (every key a param group holds travels through
torch.distributed.checkpoint; top-level keys other than ``state`` and ``param_groups`` do not):
each param group holds its own ``seed``, ``rounding_stream`` and ``skipped_steps`` beside its
hyperparameters; each parameter's state holds ``step`` (int64), ``exp_avg``, ``exp_avg_sq`` and,
for bounded groups, ``p_init``.
"""
from __future__ import annotations

import copy
import math
import numbers
import warnings
from typing import Any, Dict, List, NamedTuple

import torch

from ..kernels.quant import Q8
from . import _q8_state
from ._dtensor import is_dtensor, local_tensor
from ._validation import torch_flags, validate_hyperparameters, validate_seed
from .memory_layout import state_like

__all__ = ["load", "Loaded"]

# What a param group of another optimizer lacks (torch's AdamW has lr, betas, eps,
# weight_decay and maximize too).
_OWN_KEYS = ("clip", "bound_mode", "bound", "nonfinite", "stochastic_rounding", "state_dtype")
_ROUNDING_STREAM = 2


class Loaded(NamedTuple):
    state: Dict[Any, Dict[str, Any]]
    param_groups: List[Dict[str, Any]]
    seed: int
    skipped: torch.Tensor  # 0-dim int64 on the CPU


def _int_count(value: Any, what: str) -> int:
    """A count saved as an int, a float or a one-element tensor: whole and >= 0."""
    if isinstance(value, torch.Tensor):
        if value.numel() != 1:
            raise ValueError(f"{what} must be one number, got a tensor of shape "
                             f"{tuple(value.shape)}")
        value = local_tensor(value).item()
    if isinstance(value, bool) or not isinstance(value, numbers.Real):
        raise ValueError(f"{what} must be a whole number >= 0, got {value!r}")
    if not math.isfinite(float(value)) or float(value) != int(value) or value < 0:
        raise ValueError(f"{what} must be a whole number >= 0, got {value!r}")
    return int(value)


def load(opt, state_dict: Dict[str, Any]) -> Loaded:
    if not isinstance(state_dict, dict) or not isinstance(state_dict.get("param_groups"), list) \
            or not isinstance(state_dict.get("state"), dict):
        raise ValueError("this is not an optimizer state dict: it needs 'state' (a dict) and "
                         "'param_groups' (a list); pass what optimizer.state_dict() returned")
    groups = opt.param_groups
    saved_groups = copy.deepcopy(state_dict["param_groups"])
    # torch.optim's checks and messages
    if len(groups) != len(saved_groups):
        raise ValueError("loaded state dict has a different number of parameter groups")
    if any(len(g["params"]) != len(s.get("params", ())) for g, s in zip(groups, saved_groups)):
        raise ValueError("loaded state dict contains a parameter group that doesn't match the "
                         "size of optimizer's group")
    for gi, saved in enumerate(saved_groups):
        missing = [k for k in _OWN_KEYS if k not in saved]
        if missing:
            raise ValueError(
                f"the state dict's param group {gi} has no {', '.join(map(repr, missing))}: it "
                f"was saved by another optimizer (torch.optim.AdamW?), not by LuminaMoon. Load "
                f"a LuminaMoon state dict; to start from another optimizer's moments, copy its "
                f"'exp_avg' and 'exp_avg_sq' into optimizer.state[p] after the first step")
    # param groups: the saved values, the current params (and names, as torch does)
    new_groups = []
    seeds = []
    skipped_values = []
    for gi, (group, saved) in enumerate(zip(groups, saved_groups)):
        where = f" (param group {gi} of the loaded state dict)"
        new = dict(saved)
        new["params"] = group["params"]
        if "param_names" in group and "param_names" not in new:
            new["param_names"] = group["param_names"]
        for key in ("foreach", "fused", "capturable", "differentiable"):
            new.setdefault(key, opt.defaults.get(key))
        # q8 moments and float moments convert into each other on load (with a warning): the
        # optimizer keeps its own state_dtype where either side is q8
        mine, theirs = group.get("state_dtype"), new.get("state_dtype")
        if Q8 in (_q8_name(mine), _q8_name(theirs)):
            new["state_dtype"] = mine
        torch_flags(new["foreach"], new["fused"], new["capturable"], new["differentiable"])
        validate_hyperparameters(new, where=where)
        if new.get("seed") is None:  # (saved without one: the group keeps the optimizer's)
            new["seed"] = opt.seed
        else:
            validate_seed(new["seed"], where)
            new["seed"] = int(new["seed"])
            seeds.append(new["seed"])
        stream = new.get("rounding_stream")
        if stream is None or stream == 1:
            if gi == 0:
                warnings.warn(
                    f"the state dict was saved with rounding stream format "
                    f"{'1' if stream == 1 else 'unknown (none recorded)'}; LuminaMoon draws "
                    f"format {_ROUNDING_STREAM} (docs/tdclm.md): the stochastic rounding bits "
                    f"change from the next step on", UserWarning, stacklevel=4)
        elif stream != _ROUNDING_STREAM:
            raise ValueError(f"rounding_stream{where} is {stream!r}; this LuminaMoon draws "
                             f"format {_ROUNDING_STREAM} (and reads 1): upgrade luminamoon")
        new["rounding_stream"] = _ROUNDING_STREAM
        if "skipped_steps" in new:
            skipped_values.append(_int_count(new["skipped_steps"], f"skipped_steps{where}"))
        new_groups.append(new)
    top = state_dict.get("skipped_steps")  # where state dicts of earlier releases kept it
    if top is not None:
        skipped_values.append(_int_count(top, "skipped_steps"))
    skipped = torch.tensor(max(skipped_values) if skipped_values else 0, dtype=torch.int64)
    # the optimizer's own seed (what a group added later takes) is the first saved group's
    seed = seeds[0] if seeds else opt.seed
    # per-parameter state
    ids = [i for s in saved_groups for i in s["params"]]
    params = [p for g in groups for p in g["params"]]
    owner = dict(zip(ids, params))
    group_of = {id(p): g for g in new_groups for p in g["params"]}
    index_of = {id(p): k for k, p in enumerate(params)}
    state: Dict[Any, Dict[str, Any]] = {}
    converted: Dict[tuple, int] = {}
    for saved_id, values in state_dict["state"].items():
        p = owner.get(saved_id)
        if p is None:  # state of no current parameter: kept as it is (as torch does)
            state[saved_id] = values
            continue
        state[p] = _param_state(p, values, group_of[id(p)], f"parameter {index_of[id(p)]}",
                                converted)
    for (src, dst), count in converted.items():
        warnings.warn(
            f"the state dict holds the moments of {count} parameter(s) as {src}; this "
            f"optimizer keeps them as {dst} (state_dtype): converted on load"
            f"{' (each value rounded to its nearest q8 code)' if dst == 'q8' else ''}",
            UserWarning, stacklevel=4)
    return Loaded(state, new_groups, seed, skipped)


def _q8_name(state_dtype: Any) -> Any:
    return Q8 if isinstance(state_dtype, str) and state_dtype == Q8 else None


def _param_state(p: torch.Tensor, values: Any, group: Dict[str, Any], name: str,
                 converted: Dict[tuple, int]) -> Dict[str, Any]:
    if not isinstance(values, dict):
        raise ValueError(f"the state dict's state of {name} must be a dict, got "
                         f"{type(values).__name__}")
    if not values:
        return {}
    local = local_tensor(p)
    out: Dict[str, Any] = {}
    for key in ("step", "exp_avg", "exp_avg_sq"):
        if key not in values:
            raise ValueError(f"the state dict's state of {name} has no {key!r} (it holds "
                             f"{sorted(values)}); load a LuminaMoon state dict")
    out["step"] = torch.tensor(_int_count(values["step"], f"the state dict's step of {name}"),
                               dtype=torch.int64, device=local.device)
    state_dtype = group["state_dtype"]
    sr = bool(group["stochastic_rounding"]) and torch.bfloat16 in (p.dtype, state_dtype)
    moments, conversion = _q8_state.load_moments(p, values, state_dtype, sr, name)
    if conversion is not None:
        converted[conversion] = converted.get(conversion, 0) + 1
    out.update(moments)
    # (under q8 a tensor below the size rule keeps float32 moments)
    float_moments = torch.float32 if _q8_name(state_dtype) else state_dtype
    wanted = {"exp_avg": float_moments, "exp_avg_sq": float_moments, "p_init": p.dtype}
    # (a bounded group's state without p_init loads: the step then names the repair,
    # optimizer.reset_p_init(), before it changes anything)
    for key, value in values.items():
        if key == "step" or key in moments or key in _q8_state.SCALE_KEYS.values():
            continue
        if key not in wanted:
            out[key] = value
            continue
        if not isinstance(value, torch.Tensor):
            raise ValueError(f"the state dict's {key!r} of {name} must be a tensor, got "
                             f"{type(value).__name__}")
        if not value.is_floating_point():
            # (a floating point state of another precision is converted, as torch.optim
            # converts it to the parameter's; integers, booleans and complex numbers are no
            # moments of this optimizer)
            raise ValueError(
                f"the state dict's {key!r} for {name} has dtype {value.dtype}; it must be a "
                f"floating point tensor (it is stored as {wanted[key]}): the state dict belongs "
                f"to another optimizer or was altered")
        if tuple(value.shape) != tuple(p.shape):
            raise ValueError(
                f"the state dict's {key!r} for {name} has shape {tuple(value.shape)} but the "
                f"parameter has shape {tuple(p.shape)}: the state dict belongs to another model "
                f"or another parameter order")
        if is_dtensor(p) != is_dtensor(value):
            raise ValueError(f"the state dict's {key!r} for {name} is "
                             f"{'a DTensor' if is_dtensor(value) else 'a plain tensor'} but the "
                             f"parameter is {'a DTensor' if is_dtensor(p) else 'not'}; load a "
                             f"state dict saved with the same sharding, or through "
                             f"torch.distributed.checkpoint")
        if is_dtensor(value):
            out[key] = value.detach().to(dtype=wanted[key], copy=True)
        else:
            out[key] = state_like(p, wanted[key], sr).copy_(value.detach())
    return out

