"""kernels/launch.py: the host launchers of the kernels, one per (variant, device); every launch
of the ``triton`` backend goes through one.
"""
import inspect
import os
from typing import Dict, Optional, Tuple

import torch
import triton

from .catalog import Variant, variant_options
from .rounding import INTERPRET as _INTERPRET

__all__ = ["launcher"]


def _direct_launch_supported() -> bool:
    """Whether this Triton's JIT hands every bound argument (constexprs included) to the
    compiled kernel's launcher (``kernel.run(..., *bound_args.values())``, Triton 3.3+), so a
    launcher may call ``CompiledKernel.run`` the same way. Decided from Triton's own source,
    not from a version table; any doubt means no."""
    try:
        from triton.runtime.jit import JITFunction
        src = inspect.getsource(JITFunction.run)
    except Exception:  # noqa: BLE001 - any failure here only disables the fast path
        return False
    return ("kernel.run(grid_0, grid_1, grid_2, stream, kernel.function, kernel.packed_metadata"
            in src and "*bound_args.values())" in src)


def _hook_active(hook) -> bool:
    """None and an empty hook chain (Triton 3.6+: ``knobs.HookChain``) call nothing."""
    if hook is None:
        return False
    calls = getattr(hook, "calls", None)
    return calls is None or len(calls) > 0


_HOOK_HOLDER = None  # where this Triton keeps its launch hooks: knobs.runtime or CompiledKernel


def _hook_holder():
    global _HOOK_HOLDER
    if _HOOK_HOLDER is None:
        knobs = getattr(triton, "knobs", None)
        runtime = getattr(knobs, "runtime", None) if knobs is not None else None
        if runtime is None:
            try:
                from triton.compiler import CompiledKernel as runtime
            except ImportError:
                return None
        _HOOK_HOLDER = runtime
    return _HOOK_HOLDER


def _launch_hooks_set() -> bool:
    """A launch hook (profilers) needs the JIT's own path, which builds its metadata."""
    holder = _hook_holder()
    if holder is None:
        return True
    return (_hook_active(getattr(holder, "launch_enter_hook", None))
            or _hook_active(getattr(holder, "launch_exit_hook", None)))


_DIRECT_LAUNCH: Optional[bool] = None


def _direct_launch_enabled() -> bool:
    global _DIRECT_LAUNCH
    if _DIRECT_LAUNCH is None:
        env = os.environ.get("LUMINAMOON_TRITON_DIRECT_LAUNCH", "1")
        _DIRECT_LAUNCH = (not _INTERPRET) and env not in ("0", "") and _direct_launch_supported()
    return _DIRECT_LAUNCH


class _Launcher:
    """Launches one kernel variant on one device with exactly the variant's constexprs,
    num_warps, num_stages and register cap (what the AOT build compiles), so the two are bitwise
    equal.

    The first launch goes through ``kernel[grid](...)`` (compiles, caches, returns the compiled
    kernel). Later launches call the compiled kernel's launcher directly where Triton's calling
    convention is known (see ``_direct_launch_supported``), skipping the JIT's per-call argument
    binding and cache lookup; otherwise, or with a launch hook installed, they keep the JIT path.
    The direct path is safe because every argument keeps its type and its alignment class from
    launch to launch (the backend passes only its own buffers and checked tensors). It hands
    over the arguments with tensors replaced by their addresses (``_bind``): Triton's launcher
    then neither calls each tensor's data_ptr() nor asks the driver about each pointer, a
    driver call per pointer argument per launch. The backend re-reads the
    address of every tensor it did not allocate (lr, the flag, the skip counter) every step.
    """

    __slots__ = ("variant", "fn", "cx_kwargs", "cx_values", "options", "compiled_kernel",
                 "direct", "device_index", "_get_stream", "_get_device")

    def __init__(self, variant: Variant, device: torch.device):
        self.variant = variant
        self.fn = variant.spec.fn
        self.cx_kwargs = variant.constexpr_dict()
        self.cx_values = tuple(v for _, v in variant.constexprs)
        # on a ROCm build of torch the device is a HIP one: no NVIDIA-only option (maxnreg)
        self.options = variant_options(variant, hip=torch.version.hip is not None)
        self.compiled_kernel = None  # what the JIT compiled for this variant (None: interpreter)
        self.direct = False
        # None: the device's current index (the launch runs under its device context)
        self.device_index = device.index
        self._get_stream = None
        self._get_device = None

    def __call__(self, grid: int, bound: Tuple[tuple, tuple]) -> None:
        """``bound``: the arguments and the same with every tensor an address (``_bind``)."""
        if grid <= 0:
            return
        args, addresses = bound
        if self.direct and not _launch_hooks_set():
            ck = self.compiled_kernel
            index = self.device_index if self.device_index is not None else self._get_device()
            ck.run(grid, 1, 1, self._get_stream(index), ck.function,
                   ck.packed_metadata, None, None, None, *addresses, *self.cx_values)
            return
        ret = self.fn[(grid,)](*args, **self.cx_kwargs, **self.options)
        if self.compiled_kernel is None and ret is not None and hasattr(ret, "asm"):
            self.compiled_kernel = ret
            if (_direct_launch_enabled() and getattr(ret, "function", None) is not None
                    and hasattr(ret, "packed_metadata") and hasattr(ret, "run")):
                from triton.runtime.driver import driver
                self._get_stream = driver.active.get_current_stream
                self._get_device = driver.active.get_current_device
                self.direct = True


# One launcher per (variant, device) for the process: groups rebuilt (new params, or the
# functional form's fresh groups) keep the compiled kernels and the direct launch path.
_LAUNCHERS: Dict[Tuple[Variant, str, int], _Launcher] = {}


def launcher(variant: Variant, device: torch.device) -> _Launcher:
    """The launcher of ``variant`` on ``device`` (made once per process)."""
    key = (variant, device.type, device.index if device.index is not None else -1)
    found = _LAUNCHERS.get(key)
    if found is None:
        found = _LAUNCHERS[key] = _Launcher(variant, device)
    return found


