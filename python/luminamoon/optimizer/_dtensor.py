"""DTensor parameters: their local shard, where it sits in the whole tensor, and the mesh
dimensions its statistics are reduced over.

Every collective a step issues is ordered by :class:`MeshDim`'s key, which every rank computes
from data all ranks share (the mesh's rank layout and the dimension's index), never from object
identities: ranks that entered collectives in different orders would exchange the wrong
tensors or hang.
"""
from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any, Optional, Tuple

import torch

__all__ = ["MeshDim", "ShardLayout", "global_indices", "is_dtensor", "local_tensor",
           "shard_layout"]

_DTENSOR_API = None


def _dtensor_api():
    """(DTensor class, compute_local_shape_and_global_offset) or (None, None).

    torch.distributed.tensor from torch 2.5; torch.distributed._tensor in 2.4."""
    global _DTENSOR_API
    if _DTENSOR_API is None:
        try:
            from torch.distributed.tensor import DTensor
            from torch.distributed.tensor._utils import compute_local_shape_and_global_offset
        except Exception:  # torch built without distributed, or the 2.4 layout
            try:
                from torch.distributed._tensor import DTensor
                from torch.distributed._tensor._utils import (
                    compute_local_shape_and_global_offset,
                )
            except Exception:
                DTensor, compute_local_shape_and_global_offset = None, None
        _DTENSOR_API = (DTensor, compute_local_shape_and_global_offset)
    return _DTENSOR_API


def is_dtensor(t: Any) -> bool:
    cls = _dtensor_api()[0]
    return cls is not None and isinstance(t, cls)


def local_tensor(t: torch.Tensor) -> torch.Tensor:
    """The local storage of ``t`` (its shard for a DTensor)."""
    return t.to_local() if is_dtensor(t) else t


@dataclass(frozen=True)
class MeshDim:
    """One dimension of a device mesh, as every rank of it names it.

    ``key``: (device type, the mesh's shape, its ranks in mesh order, the dimension's index):
    the same tuple on every rank of the mesh, so sorting by it gives every rank the same order
    of collectives. ``group``: this rank's process group along the dimension (not compared)."""

    key: Tuple[Any, ...]
    group: Any = None

    def __eq__(self, other: object) -> bool:
        return isinstance(other, MeshDim) and self.key == other.key

    def __hash__(self) -> int:
        return hash(self.key)

    def __lt__(self, other: "MeshDim") -> bool:
        return self.key < other.key


def mesh_dim(mesh: Any, dim: int) -> MeshDim:
    ranks = tuple(int(r) for r in mesh.mesh.flatten().tolist())
    return MeshDim((str(mesh.device_type), tuple(mesh.mesh.shape), ranks, int(dim)),
                   mesh.get_group(dim))


@dataclass(frozen=True)
class ShardLayout:
    """Where a parameter's local elements sit in the whole tensor.

    ``elem_offset``: global flat index of the first local element (0 unsharded);
    ``global_numel``: the whole tensor's element count (the n of its RMS);
    ``reduce_dims``: the mesh dimensions that shard it, sorted (S is summed over these);
    ``index_map``: None when the local elements are one run of consecutive global indices
    (Shard(0), Replicate, a shard on a later dim whose earlier dims are of size one); else
    (global shape, local shape, global offset of the local box): the local element at
    multi-index l has the global flat index sum((offset[d] + l[d]) * stride[d]), what a
    Shard(1) of tensor parallelism gives (see :func:`global_indices`)."""

    elem_offset: int
    global_numel: int
    reduce_dims: Tuple[MeshDim, ...] = ()
    mesh_dims: Tuple[MeshDim, ...] = ()  # every dimension of its mesh, sorted
    index_map: Optional[Tuple[Tuple[int, ...], Tuple[int, ...], Tuple[int, ...]]] = None


def _box_is_one_run(global_shape, local_shape) -> bool:
    """Whether a box of ``local_shape`` inside ``global_shape`` covers consecutive row-major
    indices: some dim d with every earlier dim of size one and every later dim whole."""
    if math.prod(local_shape) == 0:
        return True
    n = len(global_shape)
    for d in range(n):
        if all(local_shape[i] == 1 for i in range(d)) and all(
                local_shape[i] == global_shape[i] for i in range(d + 1, n)):
            return True
    return n == 0


def global_indices(index_map, device) -> torch.Tensor:
    """The global flat index of every local element of a box (``ShardLayout.index_map``), in
    the local tensor's row-major order: an int64 tensor of the local element count."""
    global_shape, local_shape, offset = index_map
    idx = torch.zeros((), dtype=torch.int64, device=device)
    stride = 1
    strides = []
    for size in reversed(global_shape):
        strides.append(stride)
        stride *= int(size)
    strides.reverse()
    for d, (n_local, off, st) in enumerate(zip(local_shape, offset, strides)):
        shape = [1] * len(local_shape)
        shape[d] = int(n_local)
        axis = (torch.arange(int(n_local), dtype=torch.int64, device=device) + int(off)) * st
        idx = idx + axis.reshape(shape)
    return idx.expand(tuple(int(n) for n in local_shape)).reshape(-1)


def shard_layout(p: torch.Tensor, name: str) -> ShardLayout:
    """The :class:`ShardLayout` of ``p``; raises ValueError for a placement the kernels cannot
    step (naming the parameter, its placements and the fix).

    Every placement torch's parallelisms give a parameter is stepped: Replicate, Shard(d) on
    any tensor dim (FSDP2's Shard(0), tensor parallelism's Shard(0)/Shard(1), their strided
    composition on a 2-D mesh), on meshes of any dimension. Partial is refused: its local
    values are addends of the parameter, not its elements."""
    if not is_dtensor(p):
        return ShardLayout(0, p.numel())
    _, compute = _dtensor_api()
    mesh = p.device_mesh
    shard_dims = []
    for d, placement in enumerate(p.placements):
        if placement.is_replicate():
            continue
        # Shard(d), and FSDP2's _StridedShard over a tensor-parallel Shard (is_shard() is False
        # for it in some releases; its local elements are still one box of the tensor)
        if placement.is_shard() or (not placement.is_partial()
                                    and isinstance(getattr(placement, "dim", None), int)):
            shard_dims.append(d)
            continue
        raise ValueError(
            f"{name} is a DTensor with placements {tuple(p.placements)}; a Partial placement "
            f"holds addends of the parameter, not its elements, and cannot be stepped. Fix: "
            f"redistribute it to Replicate() or Shard(d) before the step (e.g. "
            f"p.redistribute(placements=[Replicate()]))")
    all_dims = tuple(sorted(mesh_dim(mesh, d) for d in range(mesh.ndim)))
    if not shard_dims:
        return ShardLayout(0, p.numel(), (), all_dims)
    local_shape, global_offset = compute(p.shape, mesh, p.placements)
    local_shape = tuple(int(n) for n in local_shape)
    global_offset = tuple(int(o) for o in global_offset)
    actual = tuple(int(n) for n in p.to_local().shape)
    if local_shape != actual:
        raise ValueError(
            f"{name} is a DTensor with placements {tuple(p.placements)} whose local tensor has "
            f"shape {actual}, not the {local_shape} its placements give this rank; its local "
            f"elements are not one box of the whole tensor. Fix: redistribute it to Shard(d) "
            f"or Replicate() placements")
    global_shape = tuple(int(n) for n in p.shape)
    stride, offset = 1, 0
    for size, off in zip(reversed(global_shape), reversed(global_offset)):
        offset += off * stride
        stride *= size
    reduce = tuple(sorted(mesh_dim(mesh, d) for d in shard_dims))
    index_map = None
    if not _box_is_one_run(global_shape, local_shape):
        index_map = (global_shape, local_shape, global_offset)
    if math.prod(local_shape) == 0:
        offset = 0
    return ShardLayout(offset, p.numel(), reduce, all_dims, index_map)


def dims_of_step(layouts) -> Tuple[MeshDim, ...]:
    """Every mesh dimension of the step's DTensor parameters, in the canonical order."""
    return tuple(sorted({d for lay in layouts for d in lay.mesh_dims}))

