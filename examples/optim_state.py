"""Copy and compare optimizer state dicts: what a resumed run's optimizer holds before its first
step against what the checkpoint saved. Shared by the examples in this folder."""
from __future__ import annotations

from typing import Any, Dict, List


def clone_state(value):
    """A detached copy of a state dict (tensors cloned to the CPU; containers rebuilt)."""
    import torch

    if isinstance(value, torch.Tensor):
        return value.detach().to("cpu", copy=True)
    if isinstance(value, dict):
        return {k: clone_state(x) for k, x in value.items()}
    if isinstance(value, (list, tuple)):
        return type(value)(clone_state(x) for x in value)
    return value


def _same(x, y) -> bool:
    import torch

    if isinstance(x, torch.Tensor) or isinstance(y, torch.Tensor):
        return (isinstance(x, torch.Tensor) and isinstance(y, torch.Tensor)
                and x.dtype == y.dtype and x.shape == y.shape and torch.equal(x.cpu(), y.cpu()))
    return x == y


def compare_states(live: Dict[str, Any], saved: Dict[str, Any]) -> List[str]:
    """What differs between two optimizer state dicts; empty when every state tensor (moments,
    step counts) is bitwise equal with its dtype and shape, every param-group entry (the seed
    included) is equal, and so is every other top-level entry (LuminaMoon's skipped_steps).
    The learning rate is left out: the scheduler sets it from its own restored state."""
    problems = []
    if set(live["state"]) != set(saved["state"]):
        problems.append(f"state keys {sorted(live['state'])} vs {sorted(saved['state'])}")
    for k in sorted(set(live["state"]) & set(saved["state"]), key=str):
        a, b = live["state"][k], saved["state"][k]
        if set(a) != set(b):
            problems.append(f"param {k}: state entries {sorted(a)} vs {sorted(b)}")
        for key in sorted(set(a) & set(b)):
            if not _same(a[key], b[key]):
                problems.append(f"param {k}: {key!r} differs")
    if len(live["param_groups"]) != len(saved["param_groups"]):
        problems.append(f"{len(live['param_groups'])} param groups vs "
                        f"{len(saved['param_groups'])}")
    for gi, (ga, gb) in enumerate(zip(live["param_groups"], saved["param_groups"])):
        for key in sorted((set(ga) | set(gb)) - {"lr"}):
            if not _same(ga.get(key), gb.get(key)):
                problems.append(f"param group {gi}: {key!r} {ga.get(key)!r} vs {gb.get(key)!r}")
    for key in sorted((set(live) | set(saved)) - {"state", "param_groups"}):
        if not _same(live.get(key), saved.get(key)):
            problems.append(f"{key!r} {live.get(key)!r} vs {saved.get(key)!r}")
    return problems
