"""optimizer/gpu_backend.py: where the GPU backend's seed names stay importable.

The code lives by role now: the Triton kernels in ``luminamoon.kernels.tdclm``, their catalog
(specs, variants, launch shapes) in ``luminamoon.kernels.catalog``, the launchers in
``luminamoon.kernels.launch``, the ``triton`` backend in ``optimizer/backends/triton.py`` and
the device helpers in ``optimizer/_device.py``. Importing this module imports Triton.
"""
from ..kernels.tdclm import _lumina_tdclm_pass2_kernel, _triton_tanh_fast
from ._device import _get_device_context, _get_generator

__all__ = ["_get_device_context", "_get_generator", "_lumina_tdclm_pass2_kernel",
           "_triton_tanh_fast"]
