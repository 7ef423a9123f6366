"""optimizer/functional.py: ``tdclm(...)``, the functional form of TDCLM.

One road into the backends, as torch's ``adamw()`` is: the arguments are checked, the tensors
are bucketed by :func:`~luminamoon.optimizer._groups.group_tensors` (the same bucketing the
``LuminaMoon`` class plans its steps with) and the step runs through
:func:`~luminamoon.optimizer._step.run_launch_groups`.
"""
from __future__ import annotations

from typing import List, Optional, Tuple, Union

import torch

from ..kernels.quant import MIN_NUMEL, Q8, q8_eligible
from . import _q8_state
from ._dtensor import local_tensor
from ._groups import TensorRef, group_tensors
from ._step import run_launch_groups
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
from .backends.base import Backend

__all__ = ["tdclm", "q8_state"]


def q8_state(p: torch.Tensor) -> Tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    """Fresh q8 moments for ``p`` as :func:`tdclm` takes them: (exp_avg codes, exp_avg_sq
    codes, exp_avg scales, exp_avg_sq scales), every code the codebook's zero and every scale
    0. ValueError for a parameter below the size rule (it keeps float32 moments)."""
    if not q8_eligible(p.numel()):
        raise ValueError(f"a parameter of {p.numel()} elements is below q8's size rule "
                         f"(numel >= {MIN_NUMEL}); it keeps float32 moments: torch.zeros_like(p, "
                         f"dtype=torch.float32)")
    s = _q8_state.new_state(p)
    return s["exp_avg"], s["exp_avg_sq"], s["exp_avg_scale"], s["exp_avg_sq_scale"]


def tdclm(params: List[torch.Tensor], grads: List[torch.Tensor], exp_avgs: List[torch.Tensor],
          exp_avg_sqs: List[torch.Tensor], p_inits: Optional[List[torch.Tensor]],
          steps: List[torch.Tensor], *, param_indices: Optional[List[int]] = None,
          lr: Union[float, torch.Tensor], betas: Tuple[float, float], eps: float,
          weight_decay: float, clip: float, bound_mode: str, bound: float, maximize: bool,
          nonfinite: str, stochastic_rounding: bool, seed: int,
          found_inf: Optional[torch.Tensor] = None, skipped: Optional[torch.Tensor] = None,
          exp_avg_scales: Optional[List[Optional[torch.Tensor]]] = None,
          exp_avg_sq_scales: Optional[List[Optional[torch.Tensor]]] = None,
          backend: Union[str, Backend] = "reference", aot_bundle=None) -> None:
    """One TDCLM step (docs/tdclm.md) of ``params`` in place, with one set of hyperparameters.

    ``exp_avgs``/``exp_avg_sqs`` are the moments (float32 or bfloat16, shaped as their
    parameter), ``p_inits`` the initial values (required when ``bound_mode`` is not "none",
    else None), ``steps`` 0-dim int64 tensors on each parameter's device holding the applied
    step counts (updated in place). ``param_indices`` gives each tensor's index k in the
    rounding streams (default 0, 1, ...). ``found_inf``: an int32 0-dim tensor that receives
    the step's skip decision (zeroed first); ``skipped``: an int64 0-dim counter increased by it.

    q8 moments (docs/tdclm.md, "Quantized moments (q8)"): give ``exp_avg_scales`` and
    ``exp_avg_sq_scales``, one entry a parameter. A parameter the size rule makes eligible
    (numel >= 4096) then holds uint8 codes of its shape in ``exp_avgs``/``exp_avg_sqs`` and its
    float32 scales in the two lists (:func:`q8_state` makes fresh ones); a smaller one keeps
    float32 moments and None as its scales.
    """
    n = len(params)
    lists = {"grads": grads, "exp_avgs": exp_avgs, "exp_avg_sqs": exp_avg_sqs, "steps": steps}
    if bound_mode != "none" and p_inits is not None:
        lists["p_inits"] = p_inits
    for key, values in lists.items():
        if len(values) != n:
            raise ValueError(f"{key} has {len(values)} entries but params has {n}; give one per "
                             f"parameter")
    q8 = exp_avg_scales is not None or exp_avg_sq_scales is not None
    if q8:
        for key, values in (("exp_avg_scales", exp_avg_scales),
                            ("exp_avg_sq_scales", exp_avg_sq_scales)):
            if values is None or len(values) != n:
                raise ValueError(f"q8 moments need both exp_avg_scales and exp_avg_sq_scales, "
                                 f"one entry a parameter ({n}); {key} has "
                                 f"{'none' if values is None else len(values)}")
        state_dtype = Q8
    elif not exp_avgs:
        state_dtype = torch.float32
    else:
        state_dtype = exp_avgs[0].dtype
        if state_dtype == torch.uint8:
            raise ValueError("exp_avgs holds uint8 codes but no scales were given: q8 moments "
                             "need exp_avg_scales and exp_avg_sq_scales (see q8_state())")
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
    refs = []
    for i in range(n):
        name = f"params[{i}]"
        p, g = params[i], grads[i]
        check_param(p, name)
        check_grad(p, g, name)
        scales = (None, None)
        if _q8_state.is_q8(p, state_dtype):
            scales = (exp_avg_scales[i], exp_avg_sq_scales[i])
            _q8_state.check_state(p, {"exp_avg": exp_avgs[i], "exp_avg_sq": exp_avg_sqs[i],
                                      "exp_avg_scale": scales[0],
                                      "exp_avg_sq_scale": scales[1]}, name)
        else:
            if q8 and (exp_avg_scales[i] is not None or exp_avg_sq_scales[i] is not None):
                raise ValueError(f"{name} has {p.numel()} elements, below q8's size rule "
                                 f"(numel >= {MIN_NUMEL}): it keeps "
                                 f"float32 moments; give None as its scales")
            moment_dtype = torch.float32 if q8 else state_dtype
            check_state_tensor(p, exp_avgs[i], "exp_avg", moment_dtype, name)
            check_state_tensor(p, exp_avg_sqs[i], "exp_avg_sq", moment_dtype, name)
        if hyper.bound_mode:
            check_state_tensor(p, p_inits[i], "p_init", p.dtype, name)
        step = steps[i]
        if not isinstance(step, torch.Tensor) or step.dim() != 0 or step.dtype != torch.int64:
            raise ValueError(f"steps[{i}] must be a 0-dim int64 tensor, got {step!r}")
        device = local_tensor(p).device
        if step.device != device:
            raise ValueError(f"steps[{i}] lives on {step.device} but {name} on {device}; keep "
                             f"each step counter on its parameter's device")
        refs.append(TensorRef(p, g, exp_avgs[i], exp_avg_sqs[i],
                              p_inits[i] if hyper.bound_mode else None, step,
                              int(param_indices[i]), name, *scales))
    groups = [group for group, _ in group_tensors(refs, hyper=hyper, state_dtype=state_dtype,
                                                   lr=lr, seed=int(seed))]
    chosen = [select_backend(backend, group, aot_bundle=aot_bundle) for group in groups]
    position = {int(k): i for i, k in enumerate(param_indices)}
    if found_inf is not None:
        found_inf.zero_()
    run_launch_groups(groups, chosen, flags={}, scratch={}, skipped=skipped,
                      describe=lambda k: f"params[{position[k]}] (param_indices {k})",
                      decision=found_inf)
