"""scripts/gpu/campaign_common.py: what the bundle campaign's modules share: the repository's
paths (tests/ and python/ on sys.path), the campaign's limits and mutation families, the clock
and the log."""
from __future__ import annotations

import os
import sys
import time
from typing import Any, Optional

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
sys.path.insert(0, os.path.join(ROOT, "tests"))
if os.path.join(ROOT, "python") not in sys.path:
    sys.path.insert(0, os.path.join(ROOT, "python"))

VERIFY_TIMEOUT_S = 30
DRIVER_TIMEOUT_S = 20
# A worker whose CUDA context a sticky error broke ends with this status after writing that
# item's result (marked "exits"): the parent waits for it and starts a fresh one; it is no crash
WORKER_EXITS = 3
AOT_TIMEOUT_S = 60
CUBIN_PROBE_MAX = 64 << 20
SHAPES = [(1000,), (37, 129), (4099,)]
FAMILIES = {  # name -> share of --count
    "elf_header": 150, "elf_section": 300, "elf_symbol": 120, "elf_nvinfo": 150,
    "elf_bytes": 120, "elf_truncate": 40, "manifest_field": 200, "manifest_text": 60,
    "keys": 40, "files": 20,
}
T0 = time.monotonic()
_LOG: Optional[Any] = None  # bundle_campaign.log, opened by bundle_campaign.py main


def log(msg: str) -> None:
    line = f"[{time.monotonic() - T0:6.1f} s] {msg}"
    print(line, file=sys.stderr, flush=True)
    if _LOG is not None:
        _LOG.write(line + "\n")
        _LOG.flush()

