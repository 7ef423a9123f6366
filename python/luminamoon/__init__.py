"""LuminaMoon: a two-pass, soft-clipped, decoupled-decay PyTorch optimizer (TDCLM).

Importing the package defines things and does nothing else: no device probing, no
compilation, no kernel loading.
"""
from .optimizer import LuminaMoon, q8_state, tdclm
from .optimizer.in_backward import InBackward, step_in_backward
from .optimizer.offload import CpuOffload, offload


def _read_version() -> str:
    """The installed distribution's version; in a source checkout that is not installed, the
    repository's VERSION file (the one both builds read)."""
    from importlib import metadata

    try:
        return metadata.version("luminamoon")
    except metadata.PackageNotFoundError:
        import os
        import re

        path = os.path.join(os.path.dirname(os.path.abspath(__file__)), os.pardir, os.pardir, "VERSION")
        with open(path, encoding="utf-8") as f:
            return re.match(r"\s*([0-9]+\.[0-9]+\.[0-9]+)", f.read()).group(1)


__version__ = _read_version()

__all__ = ["LuminaMoon", "tdclm", "q8_state", "step_in_backward", "InBackward", "offload", "CpuOffload",
           "__version__"]
