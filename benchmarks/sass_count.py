"""benchmarks/sass_count.py: SASS instructions of each update kernel variant, per element.

Compiles the variants of the given dtype mixes for one arch (no GPU needed), disassembles each
cubin with the cuobjdump that ships in the Triton wheel, and counts the instructions of the
kernel. The passes have two copies of the element code (a full block and a masked tail), so
"per element" is the static count over 2 x (elements a thread owns); a ratio between kernels
or releases, not a cycle count. Appends CSV rows to --csv.

    python benchmarks/sass_count.py --arch 90 --csv benchmarks/results/<date>-sass.csv
"""
from __future__ import annotations

import argparse
import datetime
import os
import re
import subprocess
import sys
import tempfile
from collections import Counter

import torch


def _cuobjdump() -> str:
    import triton

    path = os.path.join(os.path.dirname(triton.__file__), "backends", "nvidia", "bin", "cuobjdump")
    if not os.path.exists(path):
        raise SystemExit(f"no cuobjdump in the Triton wheel ({path})")
    return path


_INSTR = re.compile(r"^\s+/\*[0-9a-f]{4,}\*/\s+([A-Z][A-Z0-9_.]*)")


def registers(cubin: bytes) -> int:
    """Registers a thread of the cubin's kernel uses (cuobjdump -res-usage)."""
    with tempfile.NamedTemporaryFile(suffix=".cubin") as fh:
        fh.write(cubin)
        fh.flush()
        out = subprocess.run([_cuobjdump(), "-res-usage", fh.name], capture_output=True,
                             text=True, check=True).stdout
    m = re.search(r"REG:(\d+)", out)
    return int(m.group(1)) if m else -1


def count_sass(cubin: bytes) -> Counter:
    with tempfile.NamedTemporaryFile(suffix=".cubin") as fh:
        fh.write(cubin)
        fh.flush()
        out = subprocess.run([_cuobjdump(), "-sass", fh.name], capture_output=True, text=True,
                             check=True).stdout
    ops = Counter()
    for line in out.splitlines():
        m = _INSTR.match(line)
        if m:
            ops[m.group(1).split(".")[0]] += 1
    return ops


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--arch", type=int, default=90)
    ap.add_argument("--csv", default=None, help="append rows here")
    ap.add_argument("--kernels", default="single_pass,pass2,pass1")
    ap.add_argument("--label", default="", help="a label for the rows (e.g. the tree)")
    args = ap.parse_args(argv)
    import triton

    try:
        from luminamoon.kernels import catalog
    except ImportError:  # an older tree
        from luminamoon.optimizer import gpu_backend as catalog
    from luminamoon.aot import builder

    combos = [(torch.float32, torch.float32, torch.float32),
              (torch.bfloat16, torch.bfloat16, torch.float32),
              (torch.bfloat16, torch.bfloat16, torch.bfloat16)]
    wanted = set(args.kernels.split(","))
    rows = []
    specs = catalog.KERNEL_SPECS
    for v in catalog.all_variants(combos):
        if v.kernel not in wanted:
            continue
        cx = v.constexpr_dict()
        if cx.get("BOUND_MODE", 0) != 0:
            continue  # the bounded variants add the p_init load: not what is compared here
        plan = builder.plan_kernel(specs[v.kernel])
        entry, cubin = builder.compile_variant(plan, v, args.arch)
        ops = count_sass(cubin)
        total = sum(ops.values())
        per_thread = cx.get("BLOCK", 1024) // (32 * v.num_warps)
        rows.append((v.key(), total, total / (2 * per_thread), ops["IMAD"] + ops["IMUL"],
                     ops["LOP3"], ops["SEL"] + ops["FSEL"], registers(cubin)))
    print(f"{'variant':44s} {'SASS':>6s} {'/elem':>7s} {'IMAD':>6s} {'LOP3':>6s} {'SEL':>5s} "
          f"{'regs':>5s}")
    for key, total, per, imad, lop, sel, regs in rows:
        print(f"{key:44s} {total:6d} {per:7.1f} {imad:6d} {lop:6d} {sel:5d} {regs:5d}")
    if args.csv:
        new = not os.path.exists(args.csv)
        with open(args.csv, "a") as fh:
            if new:
                fh.write("date,label,triton,arch,variant,sass,per_element,imad,lop3,sel,"
                         "registers\n")
            for key, total, per, imad, lop, sel, regs in rows:
                fh.write(f"{datetime.date.today()},{args.label},{triton.__version__},{args.arch},"
                         f"{key},{total},{per:.1f},{imad},{lop},{sel},{regs}\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
