"""optimizer/_groups.py: launch groups, the unit every backend works on, and the one bucketing
of tensors into them.

The optimizer and the functional ``tdclm`` both cut a step with :func:`group_tensors` into
groups of tensors that share a device, the three storage dtypes, a DTensor sharding and every
hyperparameter except ``lr``. A backend runs each group with one launch per pass
(docs/internals.md for the flow and the kernel ABI).
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Dict, Iterable, List, NamedTuple, Optional, Tuple, Union

import torch

from ..kernels.quant import Q8, block_rows, q8_eligible
from ..kernels.layout import BOUND_MODES, DTYPE_CODES, NONFINITE_POLICIES, LaunchFlags  # noqa: F401
from . import _q8_state
from ._dtensor import local_tensor, shard_layout
from .memory_layout import DIRECT, FLAT, STAGED, flat_view, layout_mode


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
    # Shards whose local elements are not one run of global indices (a Shard(1) of tensor
    # parallelism) when stochastic rounding draws words for them: each tensor's
    # ShardLayout.index_map (None for a tensor that is one run); None when no tensor has one.
    # Only the reference backend keys rounding words on such a map.
    index_maps: Optional[List[Optional[tuple]]] = None
    # Filled by pass 1 (float32 [ntensors] on `device`): S_j = sum of u*u over tensor j.
    stats: Optional[torch.Tensor] = None
    # The data_ptr() of every param and grad when the caller vouches for them (the optimizer
    # checks both on every step); None: a backend reads them itself.
    param_ptrs: Optional[tuple] = None
    grad_ptrs: Optional[tuple] = None
    # Backend-private cache (device tables, compiled launchers...), keyed by the backend.
    cache: Dict[str, Any] = field(default_factory=dict)
    # Tensors whose memory is not a plain contiguous run (layout.py): None when there is
    # none; else each tensor's mode ("direct", "flat" or "staged"), and the copies a step
    # makes before its launches (user tensor -> contiguous buffer) and after them (back).
    modes: Optional[Tuple[str, ...]] = None
    stage_in: List[Tuple[torch.Tensor, torch.Tensor]] = field(default_factory=list)
    stage_out: List[Tuple[torch.Tensor, torch.Tensor]] = field(default_factory=list)
    # q8 moments (state_dtype "q8", kernels/quant.py): exp_avgs/exp_avg_sqs hold uint8 codes;
    # these hold each tensor's float32 scales (local) and (rows, K): K the global shape's row
    # length, rows the whole rows the local elements form (all R for a plain tensor) where no
    # block is cut. None for groups of float moments.
    exp_avg_scales: Optional[List[torch.Tensor]] = None
    exp_avg_sq_scales: Optional[List[torch.Tensor]] = None
    q8_rows: Optional[List[Tuple[int, int]]] = None
    # DTensor q8 tensors that a shard boundary can cut into pieces of a block
    # (_q8_state.cut_mesh_dims): the mesh dims over which each block's largest |m'| and v' is
    # MAX-reduced between the passes (sorted; empty where no block is cut), each tensor's
    # _q8_state.BlockMap, and, filled by pass 1, each tensor's partial block maxima of m' and
    # of v' (local scales, flat: [m_0, v_0, m_1, v_1, ...]), which the step reduces in place.
    q8_max_dims: tuple = ()
    q8_maps: Optional[List[Any]] = None
    q8_partials: Optional[List[torch.Tensor]] = None

    def __len__(self) -> int:
        return len(self.params)

    @property
    def needs_pass1(self) -> bool:
        """Pass 1 runs for the clip statistic, for the device-side skip decision, and for the
        block maxima of q8 blocks cut by shard boundaries."""
        return self.hyper.needs_pass1 or bool(self.q8_max_dims)

    @property
    def flags(self) -> LaunchFlags:
        """The normalised flags that pick this group's kernel variants."""
        h = self.hyper
        return LaunchFlags.normalised(self.param_dtype, self.state_dtype,
                                      stochastic_rounding=h.stochastic_rounding,
                                      bound_mode=h.bound_mode, clip=h.clip, nonfinite=h.nonfinite)


class TensorRef(NamedTuple):
    """One tensor of a step as its caller holds it (DTensors allowed): what group_tensors takes."""

    param: torch.Tensor
    grad: torch.Tensor
    exp_avg: torch.Tensor
    exp_avg_sq: torch.Tensor
    p_init: Optional[torch.Tensor]  # None unless bounded
    step: torch.Tensor
    index: int  # k, the parameter's index in the rounding streams
    name: str  # how errors name it
    exp_avg_scale: Optional[torch.Tensor] = None  # q8 moments: the float32 scales
    exp_avg_sq_scale: Optional[torch.Tensor] = None


def group_tensors(tensors: Iterable[TensorRef], *, hyper: Hyper, state_dtype: torch.dtype,
                  lr: Union[float, torch.Tensor], seed: int
                  ) -> List[Tuple[LaunchGroup, List[torch.Tensor]]]:
    """Buckets ``tensors`` (one set of hyperparameters) into launch groups, in order of first
    appearance: one group per (device, param dtype, grad dtype, sharding). Returns each group
    with the parameters it was built from (as given: DTensors stay DTensors), in order.

    Every tensor a group hands its backend is contiguous: a tensor of another layout enters as
    a flat view of its memory or, where that would change the result, as a contiguous buffer
    the step fills and writes back (optimizer/memory_layout.py)."""
    buckets: Dict[tuple, Tuple[LaunchGroup, List[torch.Tensor]]] = {}
    for t in tensors:
        layout = shard_layout(t.param, t.name)
        local = local_tensor(t.param)
        # state_dtype "q8": the tensors the rule makes eligible (global numel) step q8 moments,
        # the others float32 moments, in groups of their own
        tensor_state = _tensor_state_dtype(t, layout, state_dtype)
        q8 = tensor_state == Q8
        # an index map matters only where stochastic rounding draws words (bf16 storage; q8
        # codes are always rounded stochastically)
        sr = hyper.stochastic_rounding and torch.bfloat16 in (t.param.dtype, tensor_state)
        index_map = layout.index_map if sr or q8 else None
        bmap = _q8_state.block_map(t.param, t.name) if q8 else None
        max_dims = bmap.max_dims if bmap is not None else ()
        key = (local.device, t.param.dtype, t.grad.dtype, layout.reduce_dims, layout.mesh_dims,
               index_map is not None, tensor_state, max_dims)
        entry = buckets.get(key)
        if entry is None:
            group = LaunchGroup(
                device=local.device, param_dtype=t.param.dtype, grad_dtype=t.grad.dtype,
                state_dtype=tensor_state, hyper=hyper, lr=lr, seed=int(seed), params=[],
                grads=[], exp_avgs=[], exp_avg_sqs=[],
                p_inits=[] if hyper.bound_mode else None, steps=[], param_indices=[],
                elem_offsets=[], global_numels=[], reduce_dims=layout.reduce_dims,
                mesh_dims=layout.mesh_dims, q8_max_dims=max_dims)
            if q8:
                group.exp_avg_scales, group.exp_avg_sq_scales, group.q8_rows = [], [], []
                if max_dims:
                    group.q8_maps = []
            entry = buckets[key] = (group, [])
        group, owners = entry
        tensors_of = [local, local_tensor(t.grad), local_tensor(t.exp_avg),
                      local_tensor(t.exp_avg_sq)]
        if hyper.bound_mode:
            tensors_of.append(local_tensor(t.p_init))
        # (q8 blocks follow the logical element order: never the flat mode)
        mode = layout_mode(tensors_of, sr=group.flags.sr or q8)
        if mode != DIRECT and group.modes is None:
            group.modes = (DIRECT,) * len(group.params)
        if group.modes is not None:
            group.modes = group.modes + (mode,)
        views = _launch_tensors(group, tensors_of, mode)
        group.params.append(views[0])
        group.grads.append(views[1])
        group.exp_avgs.append(views[2])
        group.exp_avg_sqs.append(views[3])
        if hyper.bound_mode:
            group.p_inits.append(views[4])
        group.steps.append(t.step)
        group.param_indices.append(int(t.index))
        group.elem_offsets.append(layout.elem_offset)
        group.global_numels.append(layout.global_numel)
        if q8:
            group.exp_avg_scales.append(local_tensor(t.exp_avg_scale))
            group.exp_avg_sq_scales.append(local_tensor(t.exp_avg_sq_scale))
            rows, k = block_rows(t.param.shape)
            group.q8_rows.append((rows, k) if bmap is not None else (local.numel() // k, k))
            if bmap is not None:
                group.q8_maps.append(bmap)
        if index_map is not None:
            if group.index_maps is None:
                group.index_maps = []
            group.index_maps.append(index_map)
        owners.append(t.param)
    return list(buckets.values())


def _tensor_state_dtype(t: TensorRef, layout, state_dtype) -> Union[torch.dtype, str]:
    """The storage of one tensor's moments: ``state_dtype``, except under "q8" a tensor below
    the size rule (kernels/quant.py, decided on the global shape), which keeps float32."""
    if state_dtype != Q8:
        return state_dtype
    if not q8_eligible(layout.global_numel):
        return torch.float32
    for what, codes, scales in (("exp_avg", t.exp_avg, t.exp_avg_scale),
                                ("exp_avg_sq", t.exp_avg_sq, t.exp_avg_sq_scale)):
        if local_tensor(codes).dtype != torch.uint8 or scales is None:
            raise ValueError(f"{t.name}: state_dtype='q8' needs uint8 codes in {what!r} and "
                             f"float32 scales in {what + '_scale'!r}; got {codes.dtype} codes "
                             f"and {'no' if scales is None else 'given'} scales")
    return Q8


def _launch_tensors(group: LaunchGroup, tensors: List[torch.Tensor], mode: str
                    ) -> List[torch.Tensor]:
    """What the backend sees of one tensor's (param, grad, exp_avg, exp_avg_sq[, p_init])."""
    if mode == DIRECT:
        return tensors
    if mode == FLAT:
        return [flat_view(t) for t in tensors]
    out = []
    for i, t in enumerate(tensors):
        if t.is_contiguous():
            out.append(t)
            continue
        buf = t.contiguous()  # a copy, filled again at every step (stage_in)
        out.append(buf)
        if i != 1:  # the grad is handed anew each step (launch_grads)
            group.stage_in.append((t, buf))
        if i in (0, 2, 3):  # param and moments come back; p_init and the grad are only read
            group.stage_out.append((buf, t))
    return out


def launch_grads(group: LaunchGroup, grads: List[torch.Tensor],
                 owners: List[torch.Tensor]) -> Optional[List[torch.Tensor]]:
    """This step's gradients (local tensors) as ``group``'s backend sees them, where
    ``group.modes`` is set: flat views, or contiguous copies for staged tensors. None when a
    gradient no longer has the layout its mode was chosen for (the plan is then rebuilt)."""
    out = []
    for mode, g, p in zip(group.modes, grads, owners):
        if mode == DIRECT:
            if not g.is_contiguous():
                return None
            out.append(g)
        elif mode == FLAT:
            if g.stride() != local_tensor(p).stride():
                return None
            out.append(flat_view(g))
        else:
            out.append(g.contiguous())
    return out
