"""Which accelerator device is current, and its random generator.

Every lookup happens at call time through ``torch.cuda``, then ``torch.xpu``, then
``torch.accelerator`` (``current_device_index``, or ``current_device_idx`` on the torch
versions that named it so). The first two may be absent (a torch built without XPU) and the
last is missing before torch 2.6. A device with an explicit index always uses that index; an
index-less device ("cuda") means the current device of its type, never device 0.
"""
from __future__ import annotations

import contextlib
from typing import Dict, Optional, Tuple

import torch

# Devices that have no notion of a "current" index: kernels run there without a context.
_INDEXLESS_TYPES = ("cpu", "mps", "meta")

# (device type, index) -> generator. Filled on first use; holds the device's default
# generator, so torch.manual_seed governs it.
_GENERATORS: Dict[Tuple[str, Optional[int]], torch.Generator] = {}


def _accelerator_module():
    """torch.accelerator where this torch has it, else None."""
    return getattr(torch, "accelerator", None)


def _current_index(device_type: str) -> int:
    """Index of the current device of ``device_type``."""
    if device_type == "cuda":
        return int(torch.cuda.current_device())
    xpu = getattr(torch, "xpu", None)
    if device_type == "xpu" and xpu is not None:
        return int(xpu.current_device())
    acc = _accelerator_module()
    if acc is not None:
        getter = getattr(acc, "current_device_index", None) or getattr(acc, "current_device_idx", None)
        if getter is not None:
            return int(getter())
    backend = getattr(torch, device_type, None)
    if backend is not None and hasattr(backend, "current_device"):
        return int(backend.current_device())
    raise RuntimeError(
        f"cannot tell which {device_type!r} device is current: this torch has neither "
        f"torch.{device_type}.current_device() nor torch.accelerator; give the device an "
        f"explicit index (e.g. '{device_type}:1')"
    )


def _device_index(device) -> Optional[int]:
    """The index ``device`` refers to (None for CPU, MPS and meta)."""
    device = torch.device(device)
    if device.type in _INDEXLESS_TYPES:
        return None
    if device.index is not None:
        return device.index
    return _current_index(device.type)


@contextlib.contextmanager
def _set_index_context(getter, setter, index: int):
    previous = int(getter())
    if previous == index:
        yield
        return
    setter(index)
    try:
        yield
    finally:
        setter(previous)


# Reusable: nullcontext keeps no state between uses.
_NO_CHANGE = contextlib.nullcontext()

# The current CUDA device's index without torch.cuda.current_device()'s initialisation checks
# (taken only once CUDA is initialised); the public call where this torch lacks the binding.
_CUDA_GET_DEVICE = getattr(torch._C, "_cuda_getDevice", None) or torch.cuda.current_device
_CUDA_INITIALIZED = False


def _cuda_ready() -> bool:
    """torch.cuda.is_initialized(), remembered once true (CUDA stays initialised)."""
    global _CUDA_INITIALIZED
    if not _CUDA_INITIALIZED:
        _CUDA_INITIALIZED = torch.cuda.is_initialized()
    return _CUDA_INITIALIZED


def _get_device_context(device):
    """A context manager that makes ``device`` current for kernel launches.

    ``contextlib.nullcontext()`` for CPU, MPS and meta.
    """
    if not isinstance(device, torch.device):
        device = torch.device(device)
    if device.type == "cuda":
        # Already current (the common case, met several times per step): nothing to switch.
        # An index-less "cuda" means the current device.
        index = device.index
        if _cuda_ready():
            if index is None or index == _CUDA_GET_DEVICE():
                return _NO_CHANGE
            return torch.cuda.device(index)
        return torch.cuda.device(index if index is not None else _device_index(device))
    if device.type in _INDEXLESS_TYPES:
        return _NO_CHANGE
    index = _device_index(device)
    xpu = getattr(torch, "xpu", None)
    if device.type == "xpu" and xpu is not None:
        return xpu.device(index)
    acc = _accelerator_module()
    if acc is not None:
        if hasattr(acc, "device_index"):
            return acc.device_index(index)
        getter = getattr(acc, "current_device_index", None) or getattr(acc, "current_device_idx", None)
        setter = getattr(acc, "set_device_index", None) or getattr(acc, "set_device_idx", None)
        if getter is not None and setter is not None:
            return _set_index_context(getter, setter, index)
    backend = getattr(torch, device.type, None)
    if backend is not None and hasattr(backend, "device"):
        return backend.device(index)
    raise RuntimeError(
        f"cannot make {device} the current device: this torch has no torch.{device.type}.device "
        f"and no torch.accelerator; upgrade torch or run on a supported device"
    )


def _default_generator(device_type: str, index: Optional[int]) -> torch.Generator:
    if device_type == "cpu":
        return torch.default_generator
    if device_type == "cuda":
        torch.cuda.init()
        return torch.cuda.default_generators[index]
    xpu = getattr(torch, "xpu", None)
    if device_type == "xpu" and xpu is not None and hasattr(xpu, "default_generators"):
        if hasattr(xpu, "init"):
            xpu.init()
        return xpu.default_generators[index]
    # Other devices (MPS, out-of-tree backends): a generator of that device, seeded once from
    # the CPU default generator so that torch.manual_seed still decides it.
    gen_device = torch.device(device_type) if index is None else torch.device(device_type, index)
    gen = torch.Generator(device=gen_device)
    gen.manual_seed(int(torch.randint(0, 2**62, (), generator=torch.default_generator)))
    return gen


def _get_generator(device) -> torch.Generator:
    """The (cached) default random generator of ``device``'s index.

    For an index-less accelerator device this is the current device's generator.
    """
    device = torch.device(device)
    index = _device_index(device)
    key = (device.type, index)
    gen = _GENERATORS.get(key)
    if gen is None:
        gen = _default_generator(device.type, index)
        _GENERATORS[key] = gen
    return gen
