"""``luminamoon aot build | inspect | verify`` (also ``python -m luminamoon.aot``)."""
from __future__ import annotations

import argparse
import os
import sys
from typing import Any, List, Optional, Sequence, Tuple

from . import manifest as mf
from .manifest import BundleError, read_manifest, verify_bundle

PROG = "luminamoon aot"
USAGE = f"""usage: {PROG} <command> ...

commands:
  build    --arch 80,90,gfx942 --out DIR [--dtypes fp32:fp32:fp32,bf16:bf16:fp32 ...] [--jobs N]
           compile every kernel variant for each arch (no GPU needed) into a bundle folder;
           NVIDIA compute capabilities (90, sm_90, cuda:90) and AMD archs (gfx90a, gfx942,
           gfx950, hip:gfx942) may be mixed
  inspect  DIR    list the bundle's kernels: key, kernel, arch, warps, shared memory, trailing
                  scratch pointers, cubin or hsaco file and size
  verify   DIR    check the manifest schema, every cubin's and hsaco's sha256 and ABI; exit 0
                  when sound
  default         print the folder of the default bundle (the one the wheel ships, or
                  $LUMINAMOON_AOT_BUNDLE); exit 1 when there is none
"""

# Storage dtype names accepted by --dtypes (param:grad:state).
DTYPE_NAMES = {
    "fp32": "float32", "float32": "float32", "f32": "float32",
    "bf16": "bfloat16", "bfloat16": "bfloat16",
    "fp16": "float16", "float16": "float16", "f16": "float16", "half": "float16",
}


def parse_archs(text: str) -> Tuple[Any, ...]:
    """``"80,sm_90,gfx942"`` -> ``(Target("cuda", 80), Target("cuda", 90), Target("hip",
    "gfx942"))`` (:func:`.compat.parse_target`)."""
    from .compat import parse_target

    out = []
    for part in text.split(","):
        try:
            out.append(parse_target(part))
        except ValueError as exc:
            raise ValueError(f"--arch takes comma-separated archs such as 80,90,gfx942: {exc}") \
                from None
    return tuple(out)


def parse_dtype_combos(texts: Sequence[str]) -> List[Tuple[Any, Any, Any]]:
    """``["fp32:fp32:fp32,bf16:bf16:q8"]`` -> ``[(torch.float32,)*3, (bf16, bf16, "q8")]``."""
    import torch

    combos = []
    for text in texts:
        for combo in text.split(","):
            combo = combo.strip()
            if not combo:
                continue
            parts = combo.split(":")
            if len(parts) != 3:
                raise ValueError(f"--dtypes entries are param:grad:state, e.g. bf16:bf16:fp32; "
                                 f"got {combo!r}")
            dtypes = []
            for i, p in enumerate(parts):
                if i == 2 and p.strip().lower() == "q8":  # q8 moments (docs/tdclm.md)
                    dtypes.append("q8")
                    continue
                name = DTYPE_NAMES.get(p.strip().lower())
                if name is None:
                    raise ValueError(f"unknown dtype {p!r} in --dtypes {combo!r}; use fp32, bf16 "
                                     "or fp16 (and q8 for the state)")
                dtypes.append(getattr(torch, name))
            combos.append(tuple(dtypes))
    if not combos:
        raise ValueError("--dtypes is empty; give e.g. fp32:fp32:fp32")
    return combos


def _build(argv: Sequence[str]) -> int:
    ap = argparse.ArgumentParser(prog=f"{PROG} build",
                                 description="Compile the Triton kernels ahead of time.")
    ap.add_argument("--arch", default="80,90",
                    help="comma-separated archs: NVIDIA compute capabilities (80, sm_90, "
                         "cuda:90) and AMD gfx90a, gfx942, gfx950 (default 80,90)")
    ap.add_argument("--out", required=True, help="bundle folder to write")
    ap.add_argument("--dtypes", action="append", default=None,
                    help="param:grad:state dtype combos, comma-separated (repeatable); "
                         "default: every default combination")
    ap.add_argument("--jobs", type=int, default=1, help="compile processes (default 1)")
    ap.add_argument("--quiet", action="store_true", help="no progress output")
    args = ap.parse_args(argv)
    from .builder import BuildError, build_bundle

    try:
        archs = parse_archs(args.arch)
        combos = parse_dtype_combos(args.dtypes) if args.dtypes else None
        manifest = build_bundle(args.out, archs=archs, dtype_combos=combos, jobs=args.jobs,
                                progress=not args.quiet)
    except (ValueError, BuildError, BundleError) as exc:
        print(f"{PROG} build: error: {exc}", file=sys.stderr)
        return 1
    print(f"{len(manifest['kernels'])} kernel(s) in {args.out}")
    return 0


def _table(rows: List[Tuple[str, ...]], right: Sequence[int]) -> str:
    widths = [max(len(r[i]) for r in rows) for i in range(len(rows[0]))]
    lines = []
    for r in rows:
        cells = [c.rjust(w) if i in right else c.ljust(w) for i, (c, w) in enumerate(zip(r, widths))]
        lines.append("  ".join(cells).rstrip())
    return "\n".join(lines)


def _inspect(argv: Sequence[str]) -> int:
    ap = argparse.ArgumentParser(prog=f"{PROG} inspect", description="List a bundle's kernels.")
    ap.add_argument("dir")
    args = ap.parse_args(argv)
    try:
        manifest = read_manifest(args.dir)
    except BundleError as exc:
        print(f"{PROG} inspect: error: {exc}", file=sys.stderr)
        return 1
    rows = [("key", "kernel", "arch", "warps", "shared", "trailing scratch", "file", "bytes")]
    for e in manifest["kernels"]:
        name = mf.code_object_file(e)
        path = os.path.join(args.dir, name)
        size = str(os.path.getsize(path)) if os.path.isfile(path) else "missing"
        rows.append((e["key"], e["kernel"], _arch(e), str(e["num_warps"]),
                     str(e["shared_mem"]), str(e["num_trailing_scratch_ptrs"]),
                     name.rsplit(".", 1)[-1], size))
    print(f"{args.dir}: format {manifest['format']} v{manifest['format_version']} "
          f"({mf.table_cols(manifest)}-column tables), "
          f"{manifest['created_by']}, Triton {manifest['triton_version']}, "
          f"{len(manifest['kernels'])} kernel(s)")
    if len(rows) > 1:
        print(_table(rows, right=(3, 4, 5, 7)))
    return 0


def _arch(entry: Any) -> str:
    arch = entry["target"]["arch"]
    return arch if isinstance(arch, str) else f"sm_{arch}"


def _verify(argv: Sequence[str]) -> int:
    ap = argparse.ArgumentParser(prog=f"{PROG} verify",
                                 description="Check a bundle's schema, hashes and ABI.")
    ap.add_argument("dir")
    args = ap.parse_args(argv)
    manifest, problems = verify_bundle(args.dir)
    for p in problems:
        print(f"FAIL {p}", file=sys.stderr)  # the message ends with [code]
    if problems:
        print(f"{args.dir}: {len(problems)} problem(s); the runtime would refuse this bundle",
              file=sys.stderr)
        return 1
    assert manifest is not None
    archs = sorted({_arch(e) for e in manifest["kernels"]})
    print(f"{args.dir}: OK, {len(manifest['kernels'])} kernel(s) for "
          f"{', '.join(archs) or 'no arch'}; hashes, schema and ABI agree")
    return 0


def _default(argv: Sequence[str]) -> int:
    argparse.ArgumentParser(prog=f"{PROG} default",
                            description="Print the default bundle's folder.").parse_args(argv)
    from .default import NoDefaultBundleError, require_default_bundle

    try:
        print(require_default_bundle())
    except NoDefaultBundleError as exc:
        print(f"{PROG} default: {exc}", file=sys.stderr)
        return 1
    return 0


COMMANDS = {"build": _build, "inspect": _inspect, "verify": _verify, "default": _default}


def main(argv: Optional[List[str]] = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    if not argv or argv[0] in ("-h", "--help", "help"):
        print(USAGE)
        return 0 if argv else 2
    command = COMMANDS.get(argv[0])
    if command is None:
        print(f"{PROG}: unknown command {argv[0]!r}\n\n{USAGE}", file=sys.stderr)
        return 2
    try:
        return command(argv[1:])
    except SystemExit as exc:  # argparse: --help (0) or a usage error (2)
        return exc.code if isinstance(exc.code, int) else 2
