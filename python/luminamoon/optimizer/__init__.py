"""The LuminaMoon optimizer, its functional form and its backends."""
from .functional import q8_state, tdclm
from .optimizer import LuminaMoon

__all__ = ["LuminaMoon", "tdclm", "q8_state"]
