"""optimizer/_q8_state.py: the optimizer state of q8 moments (state_dtype "q8", docs/tdclm.md,
"Quantized moments (q8)"): creating it, checking it, converting moments between q8 and the
float state dtypes when a state dict of the other kind is loaded, and where the blocks of a
DTensor parameter sit on its ranks.

A q8 parameter's state holds, beside ``step`` (and ``p_init``): ``exp_avg`` and ``exp_avg_sq``,
uint8 codes of the parameter's shape, and ``exp_avg_scale`` and ``exp_avg_sq_scale``, float32
scales of shape (R, ceil(K/256)) ((ceil(n/256),) for a 1-D parameter). Plain tensors for a plain
parameter; for a DTensor parameter DTensors on its mesh: the codes placed like the parameter,
the scales as :func:`scale_placements` says (docs/distributed.md, "q8 moments").
"""
from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any, Dict, List, Optional, Tuple

import torch

from ..kernels import quant
from ..kernels.quant import Q8
from ._dtensor import (MeshDim, _dtensor_api, global_indices, is_dtensor, local_tensor,
                       mesh_dim, shard_layout)
from .memory_layout import state_like

__all__ = ["SCALE_KEYS", "BlockMap", "is_q8", "scale_placements", "cut_mesh_dims",
           "whole_blocks", "block_map", "new_state", "check_state", "load_moments"]

# moment key -> its scales' key
SCALE_KEYS = {"exp_avg": "exp_avg_scale", "exp_avg_sq": "exp_avg_sq_scale"}
_SIGNED = {"exp_avg": True, "exp_avg_sq": False}


def is_q8(p: torch.Tensor, state_dtype: Any) -> bool:
    """Whether ``p`` keeps q8 moments under ``state_dtype`` (the rule reads the whole tensor's
    element count: a DTensor's numel() is global, so every rank decides alike)."""
    return isinstance(state_dtype, str) and state_dtype == Q8 and quant.q8_eligible(p.numel())


# --------------------------------------------------------------------------------------------
# DTensor parameters: the scales' placements, and which shard boundaries cut blocks
# --------------------------------------------------------------------------------------------
def _shard_dim(placement: Any, ndim: int) -> Optional[int]:
    """The tensor dim a placement shards (Shard(d), _StridedShard(d); negative d normalised),
    or None for Replicate (Partial is refused by shard_layout before this is asked)."""
    if placement.is_replicate():
        return None
    dim = getattr(placement, "dim", None)
    return None if dim is None else int(dim) % max(ndim, 1)


def scale_placements(p: torch.Tensor) -> tuple:
    """The placements of a DTensor parameter's q8 scales, one per mesh dim: the parameter's own
    where it shards dim 0 of a tensor of two or more dims (its rows are whole there, and the
    scales' dim 0 has the same R rows, so torch's chunking gives both the same row ranges,
    uneven sizes included); Replicate elsewhere (a 1-D parameter sharded on dim 0, a shard of
    a later dim: such a boundary can cut a block, and every rank holds the whole scales)."""
    Replicate = _replicate_cls()
    out = []
    for placement in p.placements:
        whole_rows = _shard_dim(placement, p.dim()) == 0 and p.dim() >= 2
        if whole_rows and placement.dim != 0:  # a Shard(-ndim) names dim 0 of p only
            placement = type(placement)(0)
        out.append(placement if whole_rows else Replicate())
    return tuple(out)


def cut_mesh_dims(p: torch.Tensor) -> Tuple[int, ...]:
    """The mesh dims along which a shard boundary of DTensor ``p`` can cut a q8 block: those
    that shard ``p`` and on which its scales are Replicate (:func:`scale_placements`). The
    rule reads placements and the global shape only, so every rank decides alike."""
    if not is_dtensor(p):
        return ()
    scales = scale_placements(p)
    return tuple(d for d, (pl, sc) in enumerate(zip(p.placements, scales))
                 if _shard_dim(pl, p.dim()) is not None and sc.is_replicate())


def whole_blocks(group: Any) -> bool:
    """The one rule of which q8 launch groups a backend without the block-max reduction
    (triton, cpu, aot) can step: those whose tensors no shard boundary cuts into pieces of a
    block (plain tensors; DTensors Replicate or sharded on dim 0 of two or more dims), whose
    local codes and scales are whole blocks and rows. Groups with a cut block need each
    block's largest value over its ranks (a MAX all-reduce between the passes, which only the
    reference backend takes part in): ``backend="auto"`` steps them there, an explicit other
    backend refuses them by name."""
    return group.state_dtype != Q8 or not group.q8_max_dims


def _replicate_cls():
    try:
        from torch.distributed.tensor import Replicate
    except ImportError:  # torch 2.4
        from torch.distributed._tensor import Replicate
    return Replicate


def _contiguous_stride(shape) -> Tuple[int, ...]:
    stride, out = 1, []
    for size in reversed(tuple(shape)):
        out.append(stride)
        stride *= max(int(size), 1)
    return tuple(reversed(out))


def _scale_box(p: torch.Tensor) -> Tuple[tuple, Tuple[int, ...], Tuple[int, ...]]:
    """(placements, local shape, global offset) of DTensor ``p``'s scales on this rank."""
    _, compute = _dtensor_api()
    placements = scale_placements(p)
    local, offset = compute(quant.scale_shape(p.shape), p.device_mesh, placements)
    return placements, tuple(int(n) for n in local), tuple(int(o) for o in offset)


def _on_mesh(local: torch.Tensor, p: torch.Tensor, placements, shape) -> torch.Tensor:
    """A DTensor of global ``shape`` on ``p``'s mesh from this rank's ``local`` part."""
    DTensor, _ = _dtensor_api()
    return DTensor.from_local(local, p.device_mesh, placements, run_check=False,
                              shape=torch.Size(shape), stride=_contiguous_stride(shape))


@dataclass(frozen=True)
class BlockMap:
    """Where the local elements of a DTensor q8 parameter sit among its blocks, where a shard
    boundary can cut one (:func:`cut_mesh_dims`).

    ``rows``, ``k``: the global (R, K); ``row_offset``: the first global row of the local
    scales (0 where they hold every row); ``elem_offset``, ``index_map``: the local elements'
    global flat indices (ShardLayout's); ``max_dims``: the mesh dims over which each block's
    largest value is MAX-reduced, sorted (MeshDim order)."""

    rows: int
    k: int
    row_offset: int
    elem_offset: int
    index_map: Optional[tuple]
    max_dims: Tuple[MeshDim, ...]

    def global_index(self, numel: int, device) -> torch.Tensor:
        if self.index_map is not None:
            return global_indices(self.index_map, device)
        return torch.arange(numel, dtype=torch.int64, device=device) + self.elem_offset

    def block_index(self, numel: int, device) -> torch.Tensor:
        """Each local element's index into the flat local scales: (r - row_offset) * nb + b
        for its global row r and block b of the row."""
        i = self.global_index(numel, device)
        nb = -(-self.k // quant.BLOCK)
        row = torch.div(i, self.k, rounding_mode="floor")
        return (row - self.row_offset) * nb + torch.div(i - row * self.k, quant.BLOCK,
                                                        rounding_mode="floor")

    @staticmethod
    def partial_max(x: torch.Tensor, index: torch.Tensor, n_scales: int) -> torch.Tensor:
        """The largest |x| of the local elements of each block (0 where this rank holds none of
        it), float32 [n_scales]; +inf for a block with a non-finite local value, so that the
        MAX over the ranks keeps it (:func:`finish_scales` turns it into the NaN scale)."""
        out = torch.zeros(n_scales, dtype=torch.float32, device=x.device)
        if x.numel() == 0:
            return out
        mag = torch.where(torch.isfinite(x), x.abs(), torch.full_like(x, math.inf))
        return out.scatter_reduce_(0, index, mag.to(torch.float32), reduce="amax")

    @staticmethod
    def finish_scales(reduced: torch.Tensor) -> torch.Tensor:
        """Block scales from the MAX-reduced partial maxima: NaN where a block held a
        non-finite value (docs/tdclm.md)."""
        return torch.where(torch.isinf(reduced), torch.full_like(reduced, math.nan), reduced)


def block_map(p: torch.Tensor, name: str) -> Optional[BlockMap]:
    """The :class:`BlockMap` of a DTensor q8 parameter a shard boundary can cut; None for a
    plain tensor or one whose blocks are whole on every rank. Raises ValueError where the
    scales' rows would not match the parameter's local rows (naming the placements and the
    fix)."""
    if not is_dtensor(p):
        return None
    layout = shard_layout(p, name)
    placements, local, offset = _scale_box(p)
    if p.dim() >= 2:
        _, compute = _dtensor_api()
        p_local, p_offset = compute(p.shape, p.device_mesh, p.placements)
        if local[0] != int(p_local[0]) or (local[0] and offset[0] != int(p_offset[0])):
            raise ValueError(
                f"{name} is a DTensor with placements {tuple(p.placements)} whose local rows "
                f"({int(p_offset[0])}, {int(p_local[0])} rows) are not the rows its q8 scales "
                f"get with placements {placements} ({offset[0]}, {local[0]} rows). Fix: "
                f"state_dtype=torch.bfloat16 for this param group, or another placement")
    cut = cut_mesh_dims(p)
    if not cut:
        return None
    rows, k = quant.block_rows(p.shape)
    mesh = p.device_mesh
    return BlockMap(rows, k, offset[0] if p.dim() >= 2 else 0, layout.elem_offset,
                    layout.index_map, tuple(sorted(mesh_dim(mesh, d) for d in cut)))


def _all_reduce_max(parts: List[torch.Tensor], dims) -> None:
    """In place: the MAX over the ranks of each of ``dims`` (MeshDims, in their order) of every
    tensor of ``parts``, in one all-reduce per dim of their concatenation (the conversion on
    load; a step reduces its maxima beside its other collectives, optimizer/_step.py)."""
    import torch.distributed as dist

    if not parts:
        return
    buf = torch.cat([t.reshape(-1) for t in parts])
    for d in dims:
        dist.all_reduce(buf, op=dist.ReduceOp.MAX, group=d.group)
    at = 0
    for t in parts:
        t.copy_(buf[at:at + t.numel()].view(t.shape))
        at += t.numel()


# --------------------------------------------------------------------------------------------
# state
# --------------------------------------------------------------------------------------------
def new_state(p: torch.Tensor) -> Dict[str, torch.Tensor]:
    """Zero q8 moments for ``p``: every scale 0, every code the codebook's zero (DTensors on
    ``p``'s mesh for a DTensor ``p``; placements whose scales' rows would differ from the
    parameter's are refused by name when the step groups it: :func:`block_map`)."""
    local = local_tensor(p)
    device = local.device
    out = {}
    if is_dtensor(p):
        placements, scale_local, _ = _scale_box(p)
    for key, signed in _SIGNED.items():
        codes = torch.full(tuple(local.shape), quant.zero_code(signed), dtype=torch.uint8,
                           device=device)
        if is_dtensor(p):
            out[key] = _on_mesh(codes, p, p.placements, p.shape)
            out[SCALE_KEYS[key]] = _on_mesh(
                torch.zeros(scale_local, dtype=torch.float32, device=device), p, placements,
                quant.scale_shape(p.shape))
        else:
            out[key] = codes
            out[SCALE_KEYS[key]] = torch.zeros(quant.scale_shape(p.shape),
                                               dtype=torch.float32, device=device)
    return out


def _expected(p: torch.Tensor, what: str):
    """(global shape, dtype, placements or None, local shape) state ``what`` must have."""
    if what in _SIGNED:  # codes
        placements = tuple(p.placements) if is_dtensor(p) else None
        return tuple(p.shape), torch.uint8, placements, tuple(local_tensor(p).shape)
    if is_dtensor(p):
        placements, local, _ = _scale_box(p)
        return quant.scale_shape(p.shape), torch.float32, tuple(placements), local
    shape = quant.scale_shape(p.shape)
    return shape, torch.float32, None, shape


def check_state(p: torch.Tensor, state: Dict[str, Any], name: str) -> None:
    """The q8 state of ``p`` is one the step can read; ValueError naming what is wrong."""
    device = local_tensor(p).device
    for key, scale_key in SCALE_KEYS.items():
        for what in (key, scale_key):
            shape, dtype, placements, local_shape = _expected(p, what)
            t = state.get(what)
            if not isinstance(t, torch.Tensor):
                raise ValueError(f"{name}: state_dtype='q8' needs a tensor in state {what!r}, "
                                 f"got {type(t).__name__}; load a state dict saved with q8 "
                                 f"moments, or start from fresh state")
            local = local_tensor(t)
            if tuple(t.shape) != shape or t.dtype != dtype or local.device != device:
                raise ValueError(
                    f"{name}: state {what!r} must be {dtype} of shape {shape} on {device} "
                    f"(state_dtype='q8'), got {t.dtype} of shape {tuple(t.shape)} on "
                    f"{local.device}")
            if is_dtensor(t) != (placements is not None) or (placements is not None and (
                    tuple(t.placements) != placements or t.device_mesh != p.device_mesh
                    or tuple(local.shape) != local_shape)):
                want = ("a plain tensor" if placements is None else
                        f"a DTensor on the parameter's mesh with placements {placements}")
                got = (f"placements {tuple(t.placements)} on {t.device_mesh}" if is_dtensor(t)
                       else "a plain tensor")
                raise ValueError(
                    f"{name}: state {what!r} must be {want} (state_dtype='q8'), got {got}; "
                    f"load q8 state of DTensor parameters through torch.distributed.checkpoint "
                    f"(it reshards), or a state dict saved with the same placements")
            if not local.is_contiguous():
                raise ValueError(f"{name}: state {what!r} must be contiguous (q8 blocks are "
                                 f"runs of the flat index); use .contiguous()")


# --------------------------------------------------------------------------------------------
# conversion between q8 codes and float moments (a state dict of the other kind)
# --------------------------------------------------------------------------------------------
def _element_scales(p: torch.Tensor, scales: torch.Tensor, numel: int, name: str
                    ) -> torch.Tensor:
    """The whole block's scale of each local element of ``p``, flat; ``scales``: the local
    scales (the whole blocks' scales on every rank that holds a piece of them)."""
    bmap = block_map(p, name)
    rows, k = quant.block_rows(p.shape)
    if bmap is None:
        return quant.expand_scales(scales.to(torch.float32), numel // k if k else 0, k)
    return scales.reshape(-1).to(torch.float32)[bmap.block_index(numel, scales.device)]


def _placed(value: Any, p: torch.Tensor, placements, what: str, name: str) -> torch.Tensor:
    """``value`` (a state tensor of DTensor ``p``) as a DTensor with ``placements`` on ``p``'s
    mesh: as it is, redistributed on the same mesh, or refused naming the fix."""
    if is_dtensor(value) and value.device_mesh == p.device_mesh:
        if tuple(value.placements) != tuple(placements):
            value = value.redistribute(p.device_mesh, placements)
        return value
    raise ValueError(
        f"the state dict's {what!r} for {name} is "
        f"{'a DTensor on another mesh' if is_dtensor(value) else 'a plain tensor'} but the "
        f"parameter is a DTensor on {p.device_mesh}; load a state dict saved with the same "
        f"mesh, or through torch.distributed.checkpoint (it reshards)")


def _decoded(p: torch.Tensor, key: str, codes: torch.Tensor, scales: torch.Tensor, name: str
             ) -> torch.Tensor:
    """Float32 values of the local elements of ``p`` (flat) from local codes and scales."""
    table = quant.codebook(_SIGNED[key], device=codes.device)
    return quant.dequantize(codes, _element_scales(p, scales, codes.numel(), name), table)


def _encoded(p: torch.Tensor, xs: Dict[str, torch.Tensor], name: str
             ) -> Dict[str, torch.Tensor]:
    """Codes (nearest, ties to the lower) and whole-block scales of each moment in ``xs`` (flat
    float32 local values of ``p``): local tensors. Where a shard boundary cuts a block, each
    block's largest value comes from every rank that holds a piece of it (one MAX
    all-reduce per mesh dim, every moment in it: a collective, issued alike on every rank)."""
    bmap = block_map(p, name)
    rows, k = quant.block_rows(p.shape)
    scales: Dict[str, torch.Tensor] = {}
    if bmap is None:
        local_rows = next(iter(xs.values())).numel() // k
        for key, x in xs.items():
            scales[key] = quant.block_scales(x, local_rows, k).reshape(-1)
    else:
        n_scales = math.prod(_expected(p, "exp_avg_scale")[3])
        for key, x in xs.items():
            index = bmap.block_index(x.numel(), x.device)
            scales[key] = BlockMap.partial_max(x, index, n_scales)
        _all_reduce_max(list(scales.values()), bmap.max_dims)
        scales = {key: BlockMap.finish_scales(s) for key, s in scales.items()}
    out = {}
    for key, x in xs.items():
        signed = _SIGNED[key]
        per = (_element_scales(p, scales[key], x.numel(), name) if bmap is not None
               else quant.expand_scales(scales[key], x.numel() // k, k))
        out[key] = quant.quantize_nearest(x, per, quant.codebook(signed, device=x.device),
                                          quant.zero_code(signed))
        out[SCALE_KEYS[key]] = scales[key]
    return out


def load_moments(p: torch.Tensor, values: Dict[str, Any], state_dtype: Any, sr: bool,
                 name: str) -> Tuple[Dict[str, torch.Tensor], Optional[Tuple[str, str]]]:
    """The moments of ``p`` from a saved state ``values`` in the storage ``state_dtype`` gives
    ``p``, converting between q8 codes and float moments where the saved kind differs (for a
    DTensor ``p``, on the local shards with the whole blocks' scales).
    Returns (the moment entries of the new state, (from, to) when converted, else None)."""
    target_q8 = is_q8(p, state_dtype)
    saved_q8 = isinstance(values.get("exp_avg"), torch.Tensor) and \
        values["exp_avg"].dtype == torch.uint8
    local_p = local_tensor(p)
    device = local_p.device
    sharded = is_dtensor(p)
    out: Dict[str, torch.Tensor] = {}
    if saved_q8:
        saved = {k: values.get(k) for k in (*SCALE_KEYS, *SCALE_KEYS.values())}
        if sharded:
            for what in saved:
                if isinstance(saved[what], torch.Tensor):
                    saved[what] = _placed(saved[what], p, _expected(p, what)[2], what, name)
        check_state(p, {k: (v.to(device) if isinstance(v, torch.Tensor) else v)
                        for k, v in saved.items()}, f"the state dict's state of {name}")
        if target_q8:
            return {k: v.detach().to(device, copy=True).contiguous()
                    for k, v in saved.items()}, None
        dtype = torch.float32 if state_dtype == Q8 else state_dtype
        for key in SCALE_KEYS:
            x = _decoded(p, key, local_tensor(saved[key]).to(device),
                         local_tensor(saved[SCALE_KEYS[key]]).to(device), name)
            out[key] = state_like(p, dtype, sr)
            local_tensor(out[key]).copy_(x.view(local_p.shape))
        return out, ("q8", str(dtype).replace("torch.", ""))
    if not target_q8:
        return {}, None  # float moments into float moments: the caller's path
    xs = {}
    for key in SCALE_KEYS:
        value = values[key]
        if not isinstance(value, torch.Tensor) or not value.is_floating_point() \
                or tuple(value.shape) != tuple(p.shape):
            raise ValueError(
                f"the state dict's {key!r} for {name} must be a floating point tensor of shape "
                f"{tuple(p.shape)} (converted to q8), got "
                f"{value.dtype if isinstance(value, torch.Tensor) else type(value).__name__} "
                f"{tuple(getattr(value, 'shape', ()))}")
        if sharded:
            value = _placed(value, p, tuple(p.placements), key, name)
        xs[key] = local_tensor(value).detach().to(device).reshape(-1).to(torch.float32)
    encoded = _encoded(p, xs, name)
    for key in SCALE_KEYS:
        codes = encoded[key].view(local_p.shape).contiguous()
        shape, _, placements, local_shape = _expected(p, SCALE_KEYS[key])
        scales = encoded[SCALE_KEYS[key]].reshape(local_shape).contiguous()
        if sharded:
            codes = _on_mesh(codes, p, p.placements, p.shape)
            scales = _on_mesh(scales, p, placements, shape)
        out[key], out[SCALE_KEYS[key]] = codes, scales
    return out, (str(values["exp_avg"].dtype).replace("torch.", ""), "q8")
