"""The interface every backend implements (reference, triton, aot, cpu).

A step is: ``found_inf`` clear (zero); ``pass1`` for every group that needs it (writes
``group.stats`` and raises ``found_inf``); ``pass2`` for every group; ``commit`` for every
group; then ``found_inf`` is added to the optimizer's skipped-step counter and cleared again
(by the last group's ``commit_last`` where its backend has one). ``found_inf`` is an int32 0-dim
tensor on the group's device; nothing here may synchronise with the host.
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

    def commit_last(self, group: LaunchGroup, found_inf: torch.Tensor,
                    skipped: torch.Tensor) -> bool:
        """``commit`` of a group with nonfinite="skip" whose launches are the step's last to read
        ``found_inf``, then ``skipped += found_inf`` and ``found_inf = 0``, in stream order.
        Returns False, having done nothing, where this backend cannot (the caller then commits
        and does the rest itself)."""
        return False
