"""Training text that ships with Python: the standard library's own .py sources.

The files are the top-level ``*.py`` modules of ``sysconfig.get_paths()["stdlib"]``, read in
sorted order and concatenated (each preceded by a ``# file: NAME`` line) until ``max_bytes``:
the same bytes on every run of the same Python, with nothing downloaded. The tokenizer is
byte-level (UTF-8 bytes, vocabulary 256), so no tokenizer is downloaded either.

Shared by the examples in this folder (they put this folder on ``sys.path`` when run as
scripts).
"""
from __future__ import annotations

import glob
import os
import sysconfig
from typing import List, Tuple

VOCAB_SIZE = 256


def stdlib_files() -> List[str]:
    """The top-level standard-library modules, in sorted order."""
    root = sysconfig.get_paths()["stdlib"]
    files = sorted(glob.glob(os.path.join(root, "*.py")))
    if not files:
        raise RuntimeError(f"no .py files under the standard library folder {root!r}")
    return files


def stdlib_text(max_bytes: int) -> bytes:
    """The first ``max_bytes`` bytes of the concatenated standard-library sources."""
    parts, total = [], 0
    for path in stdlib_files():
        with open(path, "rb") as f:
            chunk = b"# file: " + os.path.basename(path).encode() + b"\n" + f.read() + b"\n"
        parts.append(chunk)
        total += len(chunk)
        if total >= max_bytes:
            break
    return b"".join(parts)[:max_bytes]


class ByteTokenizer:
    """UTF-8 bytes as token ids 0..255."""

    vocab_size = VOCAB_SIZE

    def encode(self, text) -> List[int]:
        return list(text.encode("utf-8") if isinstance(text, str) else bytes(text))

    def decode(self, ids) -> str:
        return bytes(int(i) for i in ids).decode("utf-8", errors="replace")


def token_blocks(max_bytes: int, block_size: int, eval_fraction: float = 0.1):
    """The text as two int64 tensors of non-overlapping blocks of ``block_size + 1`` tokens
    (inputs and their next-token targets), split into (train, eval): the last
    ``eval_fraction`` of the blocks is held out."""
    import torch

    ids = torch.tensor(ByteTokenizer().encode(stdlib_text(max_bytes)), dtype=torch.int64)
    n = (len(ids) - 1) // block_size
    if n < 2:
        raise ValueError(f"{max_bytes} bytes make fewer than two blocks of {block_size} tokens")
    blocks = ids[: n * block_size + 1].unfold(0, block_size + 1, block_size)
    n_eval = max(1, int(round(n * eval_fraction)))
    return blocks[:-n_eval].contiguous(), blocks[-n_eval:].contiguous()


def split_blocks(blocks) -> Tuple["torch.Tensor", "torch.Tensor"]:  # noqa: F821
    """Inputs (all but the last token) and targets (all but the first) of each block."""
    return blocks[:, :-1], blocks[:, 1:]
