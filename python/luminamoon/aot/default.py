"""aot/default.py: the default bundle, the one the wheel ships, found without Triton or torch.

The wheel's build (cmake/default_bundle.cmake) compiles every default kernel variant for
:data:`ARCHS` with the pinned Triton, caches the result and installs it as package data in
``luminamoon/bundle/``. ``LuminaMoon(..., backend="aot")`` without ``aot_bundle``, ``luminamoon
doctor`` and ``luminamoon aot default`` take it from here; ``LUMINAMOON_AOT_BUNDLE`` names another
folder instead. Importing this module imports only ``os``.
"""
from __future__ import annotations

import os
from typing import Optional

__all__ = ["ARCHS", "ENV_VAR", "NoDefaultBundleError", "cubin_loads_on", "default_bundle_dir",
           "packaged_bundle_dir", "require_default_bundle"]

# The archs the wheel's bundle is built for (cmake/default_bundle.cmake reads this line): Ampere
# and Hopper, and every newer arch the pinned Triton 3.6 compiles: sm_100 (B200), sm_103 (B300),
# sm_120 (RTX 50, RTX PRO 6000) and sm_121 (GB10). Measured 2026-12-01 with one kernel each: its
# ptxas compiles sm_101 too but refuses sm_110 ("Value 'sm_110a' is not defined"), the name
# CUDA 13 gave sm_101 (Jetson Thor), so sm_101 is left out.
ARCHS = (80, 90, 100, 103, 120, 121)
ENV_VAR = "LUMINAMOON_AOT_BUNDLE"
_PACKAGE_FOLDER = "bundle"
_MANIFEST = "manifest.json"


class NoDefaultBundleError(ValueError):
    """``backend="aot"`` without ``aot_bundle`` where no default bundle exists."""


def packaged_bundle_dir() -> Optional[str]:
    """``luminamoon/bundle/`` of this installation when it holds a manifest, else None (a source
    checkout, or a wheel built with ``LUMINAMOON_DEFAULT_BUNDLE=OFF``)."""
    package = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    path = os.path.join(package, _PACKAGE_FOLDER)
    return path if os.path.isfile(os.path.join(path, _MANIFEST)) else None


def default_bundle_dir() -> Optional[str]:
    """The folder ``backend="aot"`` uses when no ``aot_bundle`` is given: ``$LUMINAMOON_AOT_BUNDLE``
    where set, else the packaged bundle, else None.

    A ``LUMINAMOON_AOT_BUNDLE`` without a ``manifest.json`` raises :class:`NoDefaultBundleError`
    naming it (a typo must not fall back to another bundle silently)."""
    given = os.environ.get(ENV_VAR)
    if given:
        if not os.path.isfile(os.path.join(given, _MANIFEST)):
            raise NoDefaultBundleError(
                f"{ENV_VAR}={given!r} has no {_MANIFEST}; point it at a folder written by "
                "`luminamoon aot build --arch <major><minor> --out DIR`, or unset it to use the "
                "bundle this package ships")
        return os.path.abspath(given)
    return packaged_bundle_dir()


def require_default_bundle() -> str:
    """:func:`default_bundle_dir`, or :class:`NoDefaultBundleError` saying how to get one."""
    path = default_bundle_dir()
    if path is None:
        raise NoDefaultBundleError(
            "backend='aot' needs aot_bundle=<bundle directory> here: this installation of "
            "luminamoon ships no default bundle (a source checkout, or a wheel built with "
            "LUMINAMOON_DEFAULT_BUNDLE=OFF); build one with `luminamoon aot build --arch "
            f"<major><minor> --out DIR` and pass aot_bundle=DIR (or set {ENV_VAR}=DIR), or "
            "install the wheel (pip install .)")
    return path


def cubin_loads_on(cubin_arch: int, device_arch: int) -> bool:
    """Whether a cubin Triton compiled for sm_<cubin_arch> loads on a device of ``device_arch``.

    Triton compiles sm_90 and newer for the arch-specific target ``sm_XYa``
    (``sm_arch_from_capability`` in its NVIDIA backend), which only that very arch runs; older
    cubins run on the same major at an equal or higher minor (sm_80 on sm_86 and sm_89)."""
    if cubin_arch >= 90:
        return cubin_arch == device_arch
    return cubin_arch // 10 == device_arch // 10 and device_arch % 10 >= cubin_arch % 10
