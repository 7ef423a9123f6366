"""LuminaMoon: a two-pass, soft-clipped, decoupled-decay PyTorch optimizer (TDCLM).

Importing the package defines things and does nothing else: no device probing, no
compilation, no kernel loading.
"""
from .optimizer import LuminaMoon, tdclm

__version__ = "0.1.0"

__all__ = ["LuminaMoon", "tdclm", "__version__"]
