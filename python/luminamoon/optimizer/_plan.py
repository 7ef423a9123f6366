"""Launch groups: the unit every backend works on.

The optimizer (and the functional ``tdclm``) cut a step into groups of tensors that share a
device, the three storage dtypes and every hyperparameter except ``lr``. A backend runs each
group with one launch per pass (see docs/internals.md for the flow and the kernel ABI).
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Dict, List, Optional, Union

import torch

BOUND_MODES = {"none": 0, "abs": 1, "rel": 2}
NONFINITE_POLICIES = ("skip", "raise", "propagate")
DTYPE_CODES = {torch.float32: 0, torch.bfloat16: 1, torch.float16: 2}


@dataclass(frozen=True)
class Hyper:
    """Hyperparameters of one launch group (lr is kept apart: it may change every step)."""

    beta1: float
    beta2: float
    eps: float
    weight_decay: float
    clip: float
    bound_mode: int  # 0 none, 1 abs, 2 rel
    bound: float
    maximize: bool
    nonfinite: str  # "skip" | "raise" | "propagate"
    stochastic_rounding: bool

    @property
    def needs_pass1(self) -> bool:
        """Pass 1 runs for the clip statistic or for the device-side skip decision."""
        return self.clip > 0 or self.nonfinite == "skip"


@dataclass
class LaunchGroup:
    """Tensors stepped together by one launch per pass.

    Every list has one entry per tensor, in the optimizer's parameter order. Tensors are the
    local storage (for a DTensor, its local shard), contiguous.
    """

    device: torch.device
    param_dtype: torch.dtype
    grad_dtype: torch.dtype
    state_dtype: torch.dtype
    hyper: Hyper
    lr: Union[float, torch.Tensor]
    seed: int  # 64-bit base seed of the rounding streams (0 <= seed < 2**64)
    params: List[torch.Tensor]
    grads: List[torch.Tensor]
    exp_avgs: List[torch.Tensor]
    exp_avg_sqs: List[torch.Tensor]
    p_inits: Optional[List[torch.Tensor]]  # None when bound_mode == 0
    steps: List[torch.Tensor]  # 0-dim int64 tensors on `device`: applied steps so far
    param_indices: List[int]  # k of each tensor
    elem_offsets: List[int]  # global flat index of each local first element (0 unsharded)
    global_numels: List[int]  # element count of each whole tensor
    # DTensor parameters (optimizer._dtensor): the mesh dimensions that shard every tensor of
    # the group (S is summed over them) and every dimension of their mesh (the skip flag is
    # combined over those); both sorted, empty for plain tensors.
    reduce_dims: tuple = ()
    mesh_dims: tuple = ()
    # Filled by pass 1 (float32 [ntensors] on `device`): S_j = sum of u*u over tensor j.
    stats: Optional[torch.Tensor] = None
    # The data_ptr() of every param and grad when the caller vouches for them (the optimizer
    # checks both on every step); None: a backend reads them itself.
    param_ptrs: Optional[tuple] = None
    grad_ptrs: Optional[tuple] = None
    # Backend-private cache (device tables, compiled launchers...), keyed by the backend.
    cache: Dict[str, Any] = field(default_factory=dict)

    def __len__(self) -> int:
        return len(self.params)
