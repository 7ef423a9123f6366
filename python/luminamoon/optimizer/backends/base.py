"""optimizer/backends/base.py: the interface every backend implements (reference, triton, aot,
cpu), called by optimizer/_step.py.

A step is: ``pass1`` for every group that needs it (writes ``group.stats`` and raises
``found_inf``); ``pass2`` for every group; ``commit`` for every group but, on each device, the
last one that reads the skip flag, which calls ``commit_last``. ``found_inf`` is an int32 0-dim
tensor on the group's device, zero when the step starts; every call runs under the group's
device context, and nothing here may synchronise with the host. A backend may instead run a
whole step at once (``step_groups``), where it can do it faster than call by call.
"""
from __future__ import annotations

from typing import Optional, Sequence

import torch

from .._groups import LaunchGroup


# Every name a backend can be chosen by (``backend=``); "auto" picks one per group.
BACKEND_NAMES = ("auto", "reference", "triton", "cpu", "aot")


class Backend:
    name = "abstract"
    # Whether the backend keys rounding words on LaunchGroup.index_maps (shards that are not one
    # run of global indices); the others step a group only where it has none.
    index_maps = False
    # Whether the backend steps q8 groups whose blocks shard boundaries cut (the rule:
    # optimizer._q8_state.whole_blocks): their scales need pass 1's partial block maxima,
    # MAX-reduced over the ranks, in pass 2.
    q8_cut_blocks = False

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

    def step_groups(self, groups: Sequence[LaunchGroup], flags: Sequence[torch.Tensor],
                    skip_flag: Optional[torch.Tensor], skipped: Optional[torch.Tensor]) -> bool:
        """The whole step of ``groups`` (every one this backend's, on one device, none staged or
        sharded) in one call, where the backend can: pass 1 of each that needs it, pass 2 and
        commit of each, ``skipped += skip_flag`` (when both are given), every flag in ``flags``
        (group by group) cleared. Returns False, having done nothing, where it cannot; the
        step then runs pass by pass. The default cannot."""
        return False

    def commit_last(self, group: LaunchGroup, found_inf: torch.Tensor,
                    skipped: Optional[torch.Tensor]) -> None:
        """``commit`` of the step's last group that reads ``found_inf`` (a group with
        nonfinite="skip"), then ``skipped += found_inf`` (when given) and ``found_inf = 0``, in
        stream order: the one place a skipped step is counted and the flag cleared. Backends
        may do it in fewer launches (the triton backend: one kernel)."""
        self.commit(group, found_inf)
        if skipped is not None:
            skipped.add_(found_inf.to(skipped.device, non_blocking=True)
                         if found_inf.device != skipped.device else found_inf)
        found_inf.zero_()
