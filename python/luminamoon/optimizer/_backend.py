"""The interface every backend implements (reference, triton, aot, cpu).

A step is: ``found_inf.zero_()``; ``pass1`` for every group that needs it (writes
``group.stats`` and raises ``found_inf``); ``pass2`` for every group; ``commit`` for every
group; then the optimizer adds ``found_inf`` to its skipped-step counter. ``found_inf`` is an
int32 0-dim tensor on the group's device; nothing here may synchronise with the host.
"""
from __future__ import annotations

import torch

from ._plan import LaunchGroup


class Backend:
    name = "abstract"

    def supports(self, group: LaunchGroup) -> bool:  # pragma: no cover - interface
        raise NotImplementedError

    def pass1(self, group: LaunchGroup, found_inf: torch.Tensor) -> None:  # pragma: no cover
        """Per-tensor S into ``group.stats``; raises ``found_inf`` on a non-finite grad."""
        raise NotImplementedError

    def pass2(self, group: LaunchGroup, found_inf: torch.Tensor) -> None:  # pragma: no cover
        """The update (masked off entirely when ``check`` and ``found_inf`` is set)."""
        raise NotImplementedError

    def commit(self, group: LaunchGroup, found_inf: torch.Tensor) -> None:  # pragma: no cover
        """Step counters += 1 - found_inf (or += 1 when the group does not check)."""
        raise NotImplementedError
