"""Ahead-of-time bundles of LuminaMoon's Triton kernels (built here, loaded by the C++ runtime).

``build_bundle`` compiles every kernel variant for the chosen GPU archs on a machine with no GPU
and writes a bundle folder (``manifest.json`` + one ``.cubin`` per variant and NVIDIA arch, one
``.hsaco`` per variant and AMD arch);
``load_bundle`` / ``verify_bundle`` check one as the C++ loader does; ``default_bundle_dir`` is
the bundle the wheel ships. The command line is ``python -m luminamoon.aot
build|inspect|verify|default`` (or ``luminamoon aot ...``). The format is described in
docs/bundle-format.md.

Importing this package imports neither Triton nor torch, and none of its modules: each name
below loads its module on first use (``from luminamoon.aot.default import ...`` on the aot
backend's path reads nothing else).
"""
from importlib import import_module
from typing import Any

_EXPORTS = {
    "DEFAULT_ARCHS": "builder",
    "BuildError": "builder",
    "build_bundle": "builder",
    "compile_variant": "builder",
    "Target": "compat",
    "parse_target": "compat",
    "plan_kernel": "builder",
    "FORMAT": "manifest",
    "FORMAT_VERSION": "manifest",
    "BundleError": "manifest",
    "derive_key": "manifest",
    "find_kernel": "manifest",
    "load_bundle": "manifest",
    "read_manifest": "manifest",
    "runs_on": "manifest",
    "validate_manifest": "manifest",
    "verify_bundle": "manifest",
    "CODES": "rules",
    "NoDefaultBundleError": "default",
    "default_bundle_dir": "default",
}

__all__ = sorted(_EXPORTS)


def __getattr__(name: str) -> Any:
    module = _EXPORTS.get(name)
    if module is None:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    value = getattr(import_module(f".{module}", __name__), name)
    globals()[name] = value
    return value


def __dir__():
    return sorted(set(globals()) | set(_EXPORTS))
