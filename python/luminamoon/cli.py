"""The `luminamoon` command line: demo, bench, aot build|inspect|verify, doctor."""
from __future__ import annotations

import argparse
import importlib
import os
import platform
import sys
from typing import List, Optional

USAGE = """usage: luminamoon <command> [options]

commands:
  demo      a character-level GPT on the standard library's sources: AdamW vs LuminaMoon in
            fp32, in pure bf16 (rounding), under injected faults; optimizer step time per backend
  bench     time one optimizer step per backend (see benchmarks/bench_step.py for the full suite)
  aot       build | inspect | verify ahead-of-time kernel bundles
  doctor    what this machine has: torch, Triton, devices, the native runtime, Triton's AOT ABI
"""


def _version_tuple(text: str):
    parts = []
    for piece in text.split("+")[0].split(".")[:3]:
        digits = "".join(ch for ch in piece if ch.isdigit())
        parts.append(int(digits) if digits else 0)
    return tuple(parts)


def trailing_scratch_ptrs_for(triton_version: str) -> int:
    """Implicit pointer parameters Triton appends after the user arguments (docs/triton-abi.md)."""
    v = _version_tuple(triton_version)
    if v < (3, 3):
        return 0
    if v < (3, 5):
        return 1
    return 2


def doctor(argv: Optional[List[str]] = None) -> int:
    argparse.ArgumentParser(prog="luminamoon doctor").parse_args(argv)
    rows = [("python", platform.python_version()), ("platform", platform.platform())]
    try:
        import torch

        rows.append(("torch", torch.__version__))
        cuda = torch.cuda.is_available()
        rows.append(("cuda devices", str(torch.cuda.device_count()) if cuda else "none"))
        if cuda:
            for i in range(torch.cuda.device_count()):
                props = torch.cuda.get_device_properties(i)
                rows.append((f"  cuda:{i}", f"{props.name}, sm_{props.major}{props.minor}, "
                                            f"{props.total_memory / 2**30:.0f} GiB"))
        xpu = getattr(torch, "xpu", None)
        rows.append(("xpu devices", str(xpu.device_count()) if xpu is not None and xpu.is_available() else "none"))
        mps = getattr(torch.backends, "mps", None)
        rows.append(("mps", "available" if mps is not None and mps.is_available() else "none"))
        rows.append(("torch.accelerator", "yes" if hasattr(torch, "accelerator") else "no (torch < 2.6)"))
    except ImportError:
        rows.append(("torch", "not installed (pip install torch)"))
    try:
        import triton

        rows.append(("triton", triton.__version__))
        n = trailing_scratch_ptrs_for(triton.__version__)
        names = ["global_scratch", "profile_scratch"][:n]
        rows.append(("triton AOT ABI", f"{n} trailing scratch pointer(s)" + (f": {', '.join(names)}" if n else "")))
        rows.append(("TRITON_INTERPRET", os.environ.get("TRITON_INTERPRET", "unset")))
    except ImportError:
        rows.append(("triton", "not installed: the triton backend is unavailable (pip install triton)"))
    try:
        native = importlib.import_module("luminamoon._luminav")
        rows.append(("native runtime", f"luminav {getattr(native, '__version__', '?')}"))
        has_driver = getattr(native, "has_cuda_driver", None)
        if has_driver is not None:
            rows.append(("CUDA driver (dlopen)", "found" if has_driver() else "not found"))
    except ImportError as exc:
        rows.append(("native runtime", f"not built ({exc}); `pip install .` builds it"))
    width = max(len(k) for k, _ in rows)
    for key, value in rows:
        print(f"{key:<{width}}  {value}")
    return 0


def bench(argv: Optional[List[str]] = None) -> int:
    from .bench import main as bench_main

    return bench_main(argv)


def main(argv: Optional[List[str]] = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    if not argv or argv[0] in ("-h", "--help", "help"):
        print(USAGE)
        return 0 if argv else 2
    command, rest = argv[0], argv[1:]
    if command == "demo":
        from .demo import main as demo_main

        return demo_main(rest)
    if command == "aot":
        from .aot.cli import main as aot_main

        return aot_main(rest)
    if command == "doctor":
        return doctor(rest)
    if command == "bench":
        return bench(rest)
    print(f"luminamoon: unknown command {command!r}\n\n{USAGE}", file=sys.stderr)
    return 2


if __name__ == "__main__":  # pragma: no cover
    raise SystemExit(main())
