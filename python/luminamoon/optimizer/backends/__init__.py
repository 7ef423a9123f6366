"""optimizer/backends: the backends (reference, triton, cpu, aot) and choosing one by name.

Only the reference backend is imported eagerly; the others load on first use, and a missing
piece (Triton, the compiled module, an AOT bundle) is reported as a
:class:`BackendUnavailableError` (an ImportError) naming the backend and the fix.
"""
from __future__ import annotations

import os
import threading
from typing import Dict, Optional, Tuple

import torch

from ...kernels.quant import Q8
from .._groups import LaunchGroup
from .._q8_state import whole_blocks
from .base import BACKEND_NAMES, Backend
from .reference import ReferenceBackend

__all__ = ["BACKEND_NAMES", "BackendUnavailableError", "aot_bundle_dir", "get_backend",
           "select_backend"]

# The backends that step q8 moments (state_dtype="q8"); "auto" falls back to the reference
# backend for them where its first choice does not (on CPU it picks the cpu engine, as for
# other groups).
Q8_BACKENDS = ("reference", "triton", "cpu", "aot")

_FIXES = {
    "triton": "install Triton (pip install 'luminamoon[triton]'), or pass backend='reference'",
    "cpu": "build the native module (pip install . or make dev), or pass backend='reference'",
    "aot": "build the native module (pip install .: the wheel also ships a default bundle) or "
           "pass aot_bundle=<directory written by 'luminamoon aot build'>, or pass "
           "backend='triton' or 'reference'",
}

_LOCK = threading.Lock()
_INSTANCES: Dict[Tuple[str, Optional[str]], Backend] = {}
# Names whose import failed, with the error, so "auto" does not retry an import every step.
_UNAVAILABLE: Dict[str, BaseException] = {}


class BackendUnavailableError(ImportError):
    """A backend cannot be loaded on this machine."""


def _unavailable(name: str, cause: BaseException) -> BackendUnavailableError:
    return BackendUnavailableError(
        f"backend {name!r} is unavailable: {type(cause).__name__}: {cause}; fix: {_FIXES[name]}")


def _construct(name: str, aot_bundle: Optional[str]) -> Backend:
    if name == "reference":
        return ReferenceBackend()
    try:
        if name == "triton":
            from .triton import TritonBackend

            return TritonBackend()
        if name == "cpu":
            from .cpu import CpuBackend

            return CpuBackend()
        if name == "aot":
            from .aot import AotBackend
    except ImportError as exc:
        raise _unavailable(name, exc) from exc
    return AotBackend(aot_bundle)


def aot_bundle_dir(aot_bundle=None) -> str:
    """The bundle folder backend "aot" loads: ``aot_bundle`` when given, else the default one
    (:func:`luminamoon.aot.default.default_bundle_dir`: ``$LUMINAMOON_AOT_BUNDLE`` or the bundle
    the wheel ships). Raises ValueError (``NoDefaultBundleError``) saying how to get one."""
    if aot_bundle is not None:
        return os.fspath(aot_bundle)
    from ...aot.default import require_default_bundle

    return require_default_bundle()


def _instance(name: str, aot_bundle: Optional[str] = None) -> Backend:
    if name == "aot":
        aot_bundle = aot_bundle_dir(aot_bundle)
    key = (name, aot_bundle if name == "aot" else None)
    with _LOCK:
        backend = _INSTANCES.get(key)
        if backend is None:
            backend = _construct(name, key[1])
            _INSTANCES[key] = backend
        return backend


def _try_instance(name: str) -> Optional[Backend]:
    """The backend, or None when it cannot load here (remembered: no retry per step)."""
    if name in _UNAVAILABLE:
        return None
    try:
        return _instance(name)
    except (ImportError, OSError, RuntimeError) as exc:  # "auto": any load failure falls back
        _UNAVAILABLE[name] = exc
        return None


def is_rocm() -> bool:
    """A ROCm build of torch (``torch.version.hip`` set): its ``torch.cuda`` devices are AMD GPUs
    driven through HIP."""
    return getattr(torch.version, "hip", None) is not None


def _auto_name(device: torch.device) -> str:
    # On a ROCm build of torch a "cuda" device is a HIP device; Triton compiles the same kernels
    # for it (GPUTarget("hip", <gfx arch>, 64)), so it takes the Triton kernels as CUDA does.
    if device.type in ("cuda", "xpu"):
        return "triton"
    if device.type == "cpu":
        return "cpu"
    return "reference"


def get_backend(name: str, device, *, aot_bundle=None) -> Backend:
    """The backend called ``name`` for tensors on ``device``.

    ``"auto"`` picks Triton on CUDA/XPU (a ROCm torch's HIP devices included) and the native
    CPU engine on CPU when they load,
    else the reference backend (always on MPS and other devices).
    """
    if name not in BACKEND_NAMES:
        raise ValueError(f"backend must be one of {BACKEND_NAMES}, got {name!r}")
    device = torch.device(device)
    if name != "auto":
        return _instance(name, aot_bundle)
    preferred = _auto_name(device)
    if preferred != "reference":
        backend = _try_instance(preferred)
        if backend is not None:
            return backend
    return _instance("reference")


def _describe(group: LaunchGroup) -> str:
    return (f"{len(group)} tensor(s) on {group.device} (param {group.param_dtype}, grad "
            f"{group.grad_dtype}, state {group.state_dtype}; parameter indices "
            f"{list(group.param_indices)[:8]}{'...' if len(group) > 8 else ''})")


def select_backend(choice, group: LaunchGroup, *, aot_bundle=None) -> Backend:
    """The backend that steps ``group`` under the user's ``choice``.

    ``choice`` is a name or a Backend instance. An explicit choice that cannot step the group
    raises ValueError; ``"auto"`` falls back to the reference backend.
    """
    if isinstance(choice, Backend):
        backend = choice
    else:
        backend = get_backend(choice, group.device, aot_bundle=aot_bundle)
    if not whole_blocks(group) and not backend.q8_cut_blocks:
        if choice == "auto":
            return _instance("reference")
        raise ValueError(
            f"backend {backend.name!r} cannot step {_describe(group)}: they are q8 moments of "
            f"DTensor parameters whose shard boundaries can cut a block of 256 elements (a "
            f"1-D parameter sharded on dim 0, or a Shard(1) or later dim), whose scale needs "
            f"the block's largest value over its ranks (only backend 'reference' reduces it). "
            f"Fix: backend='auto' or 'reference' for them, shard them on dim 0 (parameters of "
            f"two or more dims), or state_dtype=torch.bfloat16")
    if group.index_maps is not None and not backend.index_maps:
        if choice == "auto":
            return _instance("reference")
        raise ValueError(
            f"backend {backend.name!r} cannot step {_describe(group)}: they are DTensor shards "
            f"whose local elements are not one run of the whole tensor's indices (e.g. "
            f"Shard(1)), and stochastic rounding keys each stored value on its global index, "
            f"which only the reference backend maps. Fix: backend='auto' or 'reference' for "
            f"them, stochastic_rounding=False, or shard them on dim 0")
    if backend.supports(group):
        return backend
    if choice == "auto":
        return _instance("reference")
    if group.state_dtype == Q8 and backend.name not in Q8_BACKENDS:
        raise ValueError(
            f"backend {backend.name!r} does not step state_dtype='q8' yet ({_describe(group)}); "
            f"the backends that support q8 moments: {', '.join(Q8_BACKENDS)}. Fix: "
            f"backend='auto' or 'reference', or state_dtype=torch.float32 or torch.bfloat16")
    raise ValueError(
        f"backend {backend.name!r} cannot step {_describe(group)}; use backend='auto' or "
        f"'reference', or move those parameters to a device and dtype that {backend.name!r} "
        f"supports")
