"""The LuminaMoon optimizer, its functional form and its backends."""
from .functional import tdclm
from .optimizer import LuminaMoon

__all__ = ["LuminaMoon", "tdclm"]
