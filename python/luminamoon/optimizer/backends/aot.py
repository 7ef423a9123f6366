"""optimizer/backends/aot.py: the ``aot`` backend, the Triton kernels of an AOT bundle
(``luminamoon aot build``) launched by the C++ runtime on the current stream: through the CUDA
driver on NVIDIA GPUs, through HIP on AMD GPUs (a ROCm build of torch, whose ``cuda`` devices
are HIP devices: the bundle's hsaco code objects for the device's gfx arch); bitwise equal to
the ``triton`` backend on the same device.

Per LaunchGroup it keeps the table state of backends/_tables.py (the device table and buffers,
the invalidation key, the gradient column, the lr slot) and the engine's ``AotGroup``, whose
launches are bound to those buffers at the first launch (the flag tensor is known then); later
launches rebind only the flag and lr addresses, where they moved.
"""
from __future__ import annotations

import os

import torch

from ...kernels.layout import DTYPE_CODES
from ...kernels.quant import Q8
from .._groups import LaunchGroup
from ._native import _luminav, group_config
from ._tables import TableState, step_state
from .base import Backend

__all__ = ["AotBackend"]

# q8 groups launch the bundle's q8 variants (S_DTYPE 3); a bundle without them is refused by
# name when the group is built (the variant key, the arch and the `aot build` that adds them).
_STATES = (torch.float32, torch.bfloat16, Q8)


class _AotState(TableState):
    """What AotBackend keeps for one LaunchGroup (``group.cache["aot"]``)."""

    __slots__ = ("kernels", "lr_bound")

    def __init__(self, group: LaunchGroup, bundle_dir: str) -> None:
        super().__init__(group, "aot", align=_luminav.ALIGN_BYTES, block=_luminav.GPU_BLOCK)
        device = group.device
        index = device.index if device.index is not None else torch.cuda.current_device()
        try:
            if torch.version.hip:  # the same launches through HIP, for the device's gfx arch
                arch = torch.cuda.get_device_properties(index).gcnArchName
                self.kernels = _luminav.HipAotGroup(bundle_dir, index, arch, group_config(group))
            else:
                self.kernels = _luminav.AotGroup(bundle_dir, index, group_config(group))
        except LookupError as exc:
            if group.state_dtype != Q8:
                raise
            raise LookupError(
                f"aot backend: bundle {bundle_dir} has no q8 variants (state_dtype='q8', S_DTYPE "
                f"3) for this group: {exc}. Fix: rebuild the bundle with q8 variants, or "
                f"backend='reference' for q8 groups, or state_dtype=torch.float32 or "
                f"torch.bfloat16") from exc
        self.lr_bound = 0  # the lr address pass 2 is bound to; 0: the launches are not bound yet

    def launches(self, found_inf: torch.Tensor, device: torch.device):
        """The group's kernels with ``found_inf`` as the flag every launch reads or raises."""
        if self.take_flag(found_inf, device):
            flag = self.flag_ptr
            if self.lr_bound == 0:
                self.kernels.bind(self.table.data_ptr(), self.block_map.data_ptr(), self.nblocks,
                                  self.partial_sum.data_ptr(), self.partial_bad.data_ptr(),
                                  self.stats.data_ptr(), self.lr_buf.data_ptr(), self.ntensors,
                                  flag, flag)
                self.lr_bound = self.lr_buf.data_ptr()
            else:
                self.kernels.set_flags(flag, flag)
        return self.kernels

    def bind_lr(self, lr, device: torch.device) -> None:
        """Points pass 2 at the step's lr, rebinding only when the address moved."""
        ptr = self.lr_tensor(lr, device).data_ptr()
        if ptr != self.lr_bound:
            self.kernels.set_lr(ptr)
            self.lr_bound = ptr


class AotBackend(Backend):
    """The Triton kernels of an AOT bundle (``luminamoon aot build``), launched by the C++
    runtime on the current CUDA stream; bitwise equal to the ``triton`` backend."""

    name = "aot"

    def __init__(self, bundle_dir):
        self.bundle_dir = os.path.abspath(os.fspath(bundle_dir))
        manifest = os.path.join(self.bundle_dir, "manifest.json")
        if not os.path.isfile(manifest):
            raise FileNotFoundError(
                f"aot backend: {manifest} does not exist; build a bundle with "
                "`luminamoon aot build --arch <major><minor> --out DIR` (an AMD GPU: --arch "
                "<gfx arch>, e.g. gfx942) and pass aot_bundle=DIR")

    def supports(self, group: LaunchGroup) -> bool:
        return (group.device.type == "cuda" and group.param_dtype in DTYPE_CODES
                and group.grad_dtype in DTYPE_CODES and group.state_dtype in _STATES
                and (_luminav.has_hip_runtime() if torch.version.hip
                     else _luminav.has_cuda_driver()))

    def _build(self, group: LaunchGroup) -> _AotState:
        if group.device.type != "cuda":
            raise ValueError(f"aot backend: the group is on {group.device}; it runs CUDA (or ROCm) "
                             "tensors only")
        return _AotState(group, self.bundle_dir)

    def _state(self, group: LaunchGroup) -> _AotState:
        st, grad_ptrs = step_state(group, "aot", self._build)
        if grad_ptrs is not None:
            st.write_grad_column(grad_ptrs)
        return st

    @staticmethod
    def _stream(group: LaunchGroup) -> int:
        return torch.cuda.current_stream(group.device).cuda_stream

    def pass1(self, group: LaunchGroup, found_inf: torch.Tensor) -> None:
        st = self._state(group)
        stream = self._stream(group)
        kernels = st.launches(found_inf, group.device)
        kernels.pass1(stream)
        kernels.reduce(stream)
        group.stats = st.stats_view

    def pass2(self, group: LaunchGroup, found_inf: torch.Tensor) -> None:
        st = self._state(group)
        stats = group.stats if group.hyper.clip > 0 else None
        if group.hyper.clip > 0 and stats is None:
            raise RuntimeError("pass2 with clip > 0 needs the statistics of pass1; run pass1 first")
        if stats is not None and stats.data_ptr() != st.stats.data_ptr():
            st.stats_view.copy_(stats)  # statistics all-reduced elsewhere (sharding)
        kernels = st.launches(found_inf, group.device)
        st.bind_lr(group.lr, group.device)
        kernels.update(self._stream(group))

    def commit(self, group: LaunchGroup, found_inf: torch.Tensor) -> None:
        st = self._state(group)
        st.launches(found_inf, group.device).commit(self._stream(group))
        st.end_step()  # the next step looks at its gradients again
