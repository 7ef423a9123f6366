"""demo/data.py: the demo's data: the standard library's own sources, as characters."""
from __future__ import annotations

import os
import string
import sysconfig
from typing import Dict, List, Tuple


# --------------------------------------------------------------------------------------------
# data: the standard library's own sources
# --------------------------------------------------------------------------------------------

UNK = "\x1a"  # every character outside printable ASCII folds into this one
_KEEP = set(string.printable) - set("\r\x0b\x0c")


def stdlib_sources(train_bytes: int, val_bytes: int) -> Tuple[str, str, List[str], List[str]]:
    """Text of the standard library's top-level modules: (train, val, train files, val files).

    The modules are the sorted ``*.py`` files directly under ``sysconfig``'s stdlib folder;
    every tenth of them (index 5, 15, ...) goes to validation, the others to training, each
    side until its byte budget is filled (the last file is cut). Deterministic for a given
    Python installation.
    """
    root = sysconfig.get_paths()["stdlib"]
    names = sorted(f for f in os.listdir(root) if f.endswith(".py"))
    parts: Dict[str, List[str]] = {"train": [], "val": []}
    used: Dict[str, List[str]] = {"train": [], "val": []}
    budget = {"train": train_bytes, "val": val_bytes}
    for i, name in enumerate(names):
        side = "val" if i % 10 == 5 else "train"
        if budget[side] <= 0:
            if budget["train"] <= 0 and budget["val"] <= 0:
                break
            continue
        with open(os.path.join(root, name), encoding="utf-8", errors="replace") as fh:
            text = fh.read()[:budget[side]]
        parts[side].append(text)
        used[side].append(name)
        budget[side] -= len(text)
    if not parts["train"] or not parts["val"]:
        raise RuntimeError(f"found too few .py files under {root} to build the demo's text")
    return "".join(parts["train"]), "".join(parts["val"]), used["train"], used["val"]


class CharVocab:
    """Characters of the training text (outside printable ASCII folded into UNK)."""

    def __init__(self, text: str):
        self.chars = sorted(set(self.fold(text)) | {UNK})
        self.index = {c: i for i, c in enumerate(self.chars)}

    @staticmethod
    def fold(text: str) -> str:
        return "".join(c if c in _KEEP else UNK for c in text)

    def encode(self, text: str):
        import torch

        unk = self.index[UNK]
        return torch.tensor([self.index.get(c, unk) for c in self.fold(text)], dtype=torch.int64)

    def __len__(self) -> int:
        return len(self.chars)
