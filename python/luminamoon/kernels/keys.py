"""kernels/keys.py: the variant key, written in one place for Python (no Triton, no torch).

A variant key names one compiled kernel variant (docs/internals.md, "Variant keys"): the
kernel, the dtype codes present joined (p, g, s), then the constexprs below in this order, then
w<num_warps>, e.g. ``pass2.p1g1s0.sr1.b2.c1.f1.B1024.w4``. The kernel catalog
(kernels/catalog.py, ``Variant.key``), the AOT builder and the bundle reader (aot/manifest.py)
all call :func:`variant_key`; the C++ twin is ``derive_variant_key`` (aot/manifest_kernel.cpp),
which the engine asks for its keys. tests/test_contract.py compares the two languages' keys.
"""
from typing import Mapping

__all__ = ["KEY_CONSTEXPRS", "KEY_DTYPE_LETTERS", "KEY_LETTERS", "variant_key"]

KEY_DTYPE_LETTERS = (("P_DTYPE", "p"), ("G_DTYPE", "g"), ("S_DTYPE", "s"))
KEY_LETTERS = (("SR", "sr"), ("BOUND_MODE", "b"), ("USE_CLIP", "c"), ("CHECK_FLAG", "f"),
               ("NEED_SUM", "n"), ("BLOCK", "B"), ("RBLOCK", "R"), ("TBLOCK", "T"))
# Every constexpr a key encodes; a variant's constexprs are a subset of these.
KEY_CONSTEXPRS = tuple(n for n, _ in KEY_DTYPE_LETTERS + KEY_LETTERS)


def variant_key(kernel: str, constexprs: Mapping[str, int], num_warps: int) -> str:
    """The variant key of ``kernel`` with these constexprs and warps (only the names of
    :data:`KEY_CONSTEXPRS` appear), e.g. ``pass2.p1g1s0.sr1.b2.c1.f1.B1024.w4``."""
    parts = [kernel]
    dtypes = "".join(f"{letter}{constexprs[name]}" for name, letter in KEY_DTYPE_LETTERS
                     if name in constexprs)
    if dtypes:
        parts.append(dtypes)
    parts += [f"{letter}{constexprs[name]}" for name, letter in KEY_LETTERS if name in constexprs]
    parts.append(f"w{num_warps}")
    return ".".join(parts)
