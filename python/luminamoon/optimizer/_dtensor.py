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
from typing import Any, Tuple

import torch

__all__ = ["MeshDim", "ShardLayout", "is_dtensor", "local_tensor", "shard_layout"]

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
    ``reduce_dims``: the mesh dimensions that shard it, sorted (S is summed over these)."""

    elem_offset: int
    global_numel: int
    reduce_dims: Tuple[MeshDim, ...] = ()
    mesh_dims: Tuple[MeshDim, ...] = ()  # every dimension of its mesh, sorted


def shard_layout(p: torch.Tensor, name: str) -> ShardLayout:
    """The :class:`ShardLayout` of ``p``; raises ValueError for a placement the kernels cannot
    step (naming the parameter, its placements and the fix)."""
    if not is_dtensor(p):
        return ShardLayout(0, p.numel())
    _, compute = _dtensor_api()
    mesh = p.device_mesh
    shard_dims = []
    for d, placement in enumerate(p.placements):
        if placement.is_replicate():
            continue
        if placement.is_shard() and placement.dim == 0:
            shard_dims.append(d)
            continue
        raise ValueError(
            f"{name} is a DTensor with placements {tuple(p.placements)}; LuminaMoon steps "
            f"DTensors sharded on dim 0 (Shard(0), as FSDP2 does) or replicated; redistribute it")
    all_dims = tuple(sorted(mesh_dim(mesh, d) for d in range(mesh.ndim)))
    if not shard_dims:
        return ShardLayout(0, p.numel(), (), all_dims)
    _, global_offset = compute(p.shape, mesh, p.placements)
    row = math.prod(p.shape[1:]) if p.dim() > 1 else 1
    offset = int(global_offset[0]) * row if p.dim() > 0 else 0
    reduce = tuple(sorted(mesh_dim(mesh, d) for d in shard_dims))
    return ShardLayout(offset, p.numel(), reduce, all_dims)


def dims_of_step(layouts) -> Tuple[MeshDim, ...]:
    """Every mesh dimension of the step's DTensor parameters, in the canonical order."""
    return tuple(sorted({d for lay in layouts for d in lay.mesh_dims}))

