"""Ahead-of-time bundles of LuminaMoon's Triton kernels (built here, loaded by the C++ runtime).

``build_bundle`` compiles every kernel variant for the chosen GPU archs on a machine with no GPU
and writes a bundle folder (``manifest.json`` + one ``.cubin`` per variant and arch);
``load_bundle`` / ``verify_bundle`` check one as the C++ loader does. The command line is
``python -m luminamoon.aot build|inspect|verify`` (or ``luminamoon aot ...``). The format is
described in docs/bundle-format.md.

Importing this package imports neither Triton nor torch.
"""
from .builder import DEFAULT_ARCHS, BuildError, build_bundle, compile_variant, plan_kernel
from .manifest import (FORMAT, FORMAT_VERSION, BundleError, derive_key, find_kernel,
                       load_bundle, read_manifest, runs_on, validate_manifest, verify_bundle)
from .rules import CODES

__all__ = [
    "DEFAULT_ARCHS",
    "FORMAT",
    "FORMAT_VERSION",
    "BuildError",
    "BundleError",
    "CODES",
    "build_bundle",
    "compile_variant",
    "derive_key",
    "find_kernel",
    "load_bundle",
    "plan_kernel",
    "read_manifest",
    "runs_on",
    "validate_manifest",
    "verify_bundle",
]
