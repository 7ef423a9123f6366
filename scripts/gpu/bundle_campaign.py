"""A mutation campaign against the bundle loaders on a GPU: corrupted bundles must be refused,
never crash the process, never launch (docs/bundle-format.md, "The rule book").

The command, from the repository root on a machine with a CUDA GPU (the H200: python3 3.12,
torch 2.11, Triton 3.6, CMake, Ninja, nanobind), with `.deps` carried (the nlohmann-json,
OpenSSL and GoogleTest prefix the native build uses where the image lacks them), run tool
timeout 420 s; it takes about 3-4 minutes and never more than --budget-s (280 s) plus the last
writes:

    PYTHONUNBUFFERED=1 python3 scripts/gpu/bundle_campaign.py --out "$OUT" --require-gpu

With no --luminav it builds the luminav CLI and the in-tree module luminamoon._luminav
(build/campaign); with no --bundle it compiles, with this tree's builder, the four variants a
default LuminaMoon's first step runs (pass 1, reduce, pass 2, commit; fp32) for the device's
arch (build/campaign/bundle). Results in OUT: bundle_campaign_summary.md (the short text:
mutants, refusals by reason code, what reached the driver and what the driver did, crashes),
bundle_campaign_summary.json (the same and more), bundle_campaign.csv (a row per bundle, with
its operations) and bundle_campaign.log. Exit status 0 when there was no crash, hang,
disagreement or bad launch; 1 when there was; 2 when the campaign could not start (the build,
the bundle, or the base refused: the summary says why).

What it does. The base bundle must pass every loader (its aot step is the reference, and is
compared with the triton backend's, recorded as triton_equal). Then ``--count`` seeded
(reproducible) mutations of the base:

  elf_header, elf_section, elf_symbol, elf_nvinfo, elf_bytes, elf_truncate
      a cubin corrupted in its ELF header, a section header, a symbol, an .nv.info record, the
      bytes of its header tables, or cut short; always with its sha256 updated to match
  manifest_field, manifest_text, keys, files
      a kernel entry's field set to an edge or a wrong type; the manifest's text edited; keys
      swapped (and cubins swapped, entries reordered); FIFOs, /dev/zero, links, huge files

plus every case of the shared corpus (tests/data/bundles). Each bundle goes through
  1. ``luminav verify [--require-gpu]`` in a subprocess: a signal exit is a crash, a timeout a
     hang; the first ``FAIL [code]`` is the C++ loader's refusal. A bundle the loader accepts
     reaches the driver there (cuModuleLoadData of each sm_XY variant the device runs): what
     the driver did is its "N loaded, M failed" and first on-device refusal;
  2. ``luminamoon.aot.load_bundle`` (Python's refusal, which must be the same code and field);
  3. the driver alone: every mutated cubin handed straight to cuModuleLoadData and
     cuModuleGetFunction(entry) in a crash-isolated worker (ctypes, no loader), to show what
     the loader's refusals spare the process (crashes, errors) and that nothing it accepts
     crashes the driver;
  4. the ``aot`` backend's first step, in worker processes (a signal exit of a worker is a
     crash of the bundle it had): a refusal must leave the parameters untouched, and an
     accepted bundle must give exactly the base bundle's result. A step that runs a bundle the
     loaders refuse, or whose result differs, is a launch of a bad bundle.
Each phase stops taking new bundles at its share of the time budget; what it left out is
counted as not run.
"""
from __future__ import annotations

import argparse
import concurrent.futures as cf
import csv
import datetime
import json
import os
import platform
import queue
import random
import re
import select
import shutil
import signal
import struct
import subprocess
import sys
import tempfile
import threading
import time
from collections import Counter
from typing import Any, Dict, List, Optional, Tuple

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
sys.path.insert(0, os.path.join(ROOT, "tests"))
if os.path.join(ROOT, "python") not in sys.path:
    sys.path.insert(0, os.path.join(ROOT, "python"))

import bundle_corpus  # noqa: E402  (tests/bundle_corpus.py: the corpus and its operations)

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
_LOG: Optional[Any] = None


def log(msg: str) -> None:
    line = f"[{time.monotonic() - T0:6.1f} s] {msg}"
    print(line, file=sys.stderr, flush=True)
    if _LOG is not None:
        _LOG.write(line + "\n")
        _LOG.flush()


# --------------------------------------------------------------------------------------------
# Setting up: the native build, the device, the base bundle
# --------------------------------------------------------------------------------------------
def find_luminav(build_dir: str) -> Optional[str]:
    p = os.path.join(build_dir, "optimizer", "luminav")
    return p if os.path.isfile(p) and os.access(p, os.X_OK) else None


def build_native(build_dir: str, jobs: int, timeout: float) -> str:
    """The luminav CLI and the in-tree module python/luminamoon/_luminav (for this Python)."""
    args = ["cmake", "-S", ROOT, "-B", build_dir, "-DCMAKE_BUILD_TYPE=Release",
            "-DLUMINAV_BUILD_TESTS=OFF", "-DLUMINAV_BUILD_PYTHON=ON",
            "-DLUMINAV_BUILD_EXAMPLES=OFF", f"-DPython_EXECUTABLE={sys.executable}"]
    if shutil.which("ninja") and not os.path.exists(os.path.join(build_dir, "CMakeCache.txt")):
        args += ["-G", "Ninja"]
    deps = os.path.join(ROOT, ".deps")
    if os.path.isdir(deps):
        args += [f"-DCMAKE_PREFIX_PATH={deps}", f"-DOPENSSL_ROOT_DIR={deps}",
                 "-DOPENSSL_USE_STATIC_LIBS=TRUE"]
    for cmd in (args, ["cmake", "--build", build_dir, "-j", str(jobs), "--target", "luminav_cli",
                       "_luminav"]):
        log(" ".join(cmd))
        try:
            p = subprocess.run(cmd, stdin=subprocess.DEVNULL, capture_output=True, text=True,
                               errors="replace", timeout=timeout)
        except subprocess.TimeoutExpired:
            raise SystemExit(f"the native build took more than {timeout:.0f} s") from None
        if _LOG is not None:
            _LOG.write(p.stdout[-20000:] + p.stderr[-20000:])
        if p.returncode != 0:
            raise SystemExit(f"the native build failed (rc {p.returncode}):\n"
                             f"{(p.stdout + p.stderr)[-3000:]}")
    cli = find_luminav(build_dir)
    if cli is None:
        raise SystemExit(f"the build left no luminav CLI in {build_dir}/optimizer")
    return cli


def device_arch() -> Optional[int]:
    """The compute capability of device 0 as an arch (90 for 9.0), from nvidia-smi; None without
    a GPU. (The parent never initialises CUDA: its process pool forks.)"""
    try:
        p = subprocess.run(["nvidia-smi", "--query-gpu=compute_cap,name", "--format=csv,noheader"],
                           capture_output=True, text=True, timeout=30)
        cap = p.stdout.strip().splitlines()[0].split(",")[0].strip()
        major, minor = cap.split(".")
        return int(major) * 10 + int(minor)
    except (OSError, IndexError, ValueError, subprocess.SubprocessError):
        return None


def step_variants():
    """The variants the first step of LuminaMoon(params, lr) on float32 CUDA tensors runs."""
    import torch
    from luminamoon.kernels.catalog import variants_for
    from luminamoon.kernels.layout import LaunchFlags
    from luminamoon.optimizer._validation import make_hyper
    from luminamoon.optimizer.optimizer import LuminaMoon

    d = LuminaMoon([torch.zeros(1)], lr=3e-2).param_groups[0]
    h = make_hyper(d)  # as a launch group keys it (LaunchGroup.flags)
    flags = LaunchFlags.normalised(torch.float32, d["state_dtype"],
                                   stochastic_rounding=h.stochastic_rounding,
                                   bound_mode=h.bound_mode, clip=h.clip, nonfinite=h.nonfinite)
    return list(variants_for(torch.float32, torch.float32, d["state_dtype"], flags).values())


def step_keys() -> List[str]:
    return sorted(v.key() for v in step_variants())


def make_bundle_main(out: str, arch: int, jobs: int) -> int:
    """--make-bundle: this tree's builder, the step's variants only, for one arch."""
    from luminamoon.aot.builder import build_bundle

    variants = step_variants()
    man = build_bundle(out, archs=(arch,), variants=variants, jobs=min(jobs, len(variants)),
                       progress=False)
    print(f"{len(man['kernels'])} kernel(s) for sm_{arch} in {out}")
    return 0


def make_base(src: str, dst: str, arch: Optional[int]) -> Dict[str, Any]:
    with open(os.path.join(src, "manifest.json")) as f:
        man = json.load(f)
    keys = step_keys()
    kernels = [e for e in man["kernels"] if e["key"] in keys
               and (arch is None or e["target"]["arch"] == arch)]
    found = {e["key"] for e in kernels}
    if found != set(keys):
        raise SystemExit(f"{src} lacks the variants {sorted(set(keys) - found)} of the aot "
                         f"step (for sm_{arch}); build it with `luminamoon aot build --arch "
                         f"{arch or 90} --dtypes fp32:fp32:fp32 --out {src}`")
    os.makedirs(dst)
    for e in kernels:
        shutil.copyfile(os.path.join(src, e["cubin"]), os.path.join(dst, e["cubin"]))
    man["kernels"] = kernels
    with open(os.path.join(dst, "manifest.json"), "w") as f:
        json.dump(man, f, indent=2)
    return man


# --------------------------------------------------------------------------------------------
# Mutations (operations in tests/bundle_corpus.py's format, plus "splice")
# --------------------------------------------------------------------------------------------
SH_FIELDS = [("name", 0, 4), ("type", 4, 4), ("flags", 8, 8), ("addr", 16, 8), ("offset", 24, 8),
             ("size", 32, 8), ("link", 40, 4), ("info", 44, 4), ("align", 48, 8),
             ("entsize", 56, 8)]
EH_FIELDS = [("ident", 0, 1), ("class", 4, 1), ("data", 5, 1), ("version", 6, 1),
             ("osabi", 7, 1), ("abiversion", 8, 1), ("type", 16, 2), ("machine", 18, 2),
             ("e_version", 20, 4), ("entry", 24, 8), ("phoff", 32, 8), ("shoff", 40, 8),
             ("flags", 48, 4), ("ehsize", 52, 2), ("phentsize", 54, 2), ("phnum", 56, 2),
             ("shentsize", 58, 2), ("shnum", 60, 2), ("shstrndx", 62, 2)]
SYM_FIELDS = [("name", 0, 4), ("info", 4, 1), ("other", 5, 1), ("shndx", 6, 2), ("value", 8, 8),
              ("size", 16, 8)]
BAD_VALUES = [None, True, False, -1, 0, 1, 2, 3, 7, 17, 31, 33, 64, 65, 255, 1 << 31,
              (1 << 31) - 1, 1 << 40, (1 << 41), (1 << 63) - 1, -(1 << 63), "", "x", "0", "90",
              "*i32", "i8", "../a", "a/b", "pass9", "3.6.0", "3.2.0", "\u0000", [], {}, [1], {"a": 1}]
TOKENS = [b"{", b"}", b"[", b"]", b'"', b",", b":", b"-", b"0", b"9" * 25, b"1e999", b"0.5",
          b"true", b"null", b"NaN", b"\\ud800", b"\\u0000", b"\xff", b"\xc0\x80", b"\xed\xa0\x80",
          b"\xef\xbb\xbf", b"[" * 40, b"\x00"]


class CubinView:
    def __init__(self, data: bytes) -> None:
        from luminamoon.aot.cubin import parse_cubin

        self.data, self.info = data, parse_cubin(data)
        self.shoff = struct.unpack_from("<Q", data, 0x28)[0]
        self.shnum = struct.unpack_from("<H", data, 0x3C)[0]
        self.phoff = struct.unpack_from("<Q", data, 0x20)[0]
        self.phnum = struct.unpack_from("<H", data, 0x38)[0]

    def regions(self) -> List[Tuple[int, int]]:
        out = [(0, 64), (self.shoff, self.shoff + 64 * self.shnum),
               (self.phoff, self.phoff + 56 * self.phnum)]
        for s in self.info.sections:
            if s.name in (".symtab", ".strtab", ".shstrtab", ".nv.callgraph") or \
                    s.name.startswith((".nv.info", ".rela", ".rel.")):
                out.append((s.offset, s.offset + s.size))
        return [r for r in out if r[1] > r[0]]

    def nvinfo_records(self) -> List[Tuple[int, int, int]]:
        """(record offset, value offset, value size) of every .nv.info record."""
        out = []
        for s in self.info.sections:
            if s.type != 0x70000000:
                continue
            p = 0
            while p + 4 <= s.size:
                fmt = self.data[s.offset + p]
                size = struct.unpack_from("<H", self.data, s.offset + p + 2)[0] if fmt == 4 else 0
                out.append((s.offset + p, s.offset + p + (4 if fmt == 4 else 2),
                            size if fmt == 4 else 2))
                p += 4 + size if fmt == 4 else 4
        return out


def _edge(rng: random.Random, width: int, old: int, view: CubinView) -> int:
    n = len(view.data)
    pool = [0, 1, 2, 0x7F, 0xFF, n, n - 1, n + 1, view.shnum, view.shnum - 1, view.shnum + 1,
            1 << 31, (1 << 32) - 1, 1 << 63, (1 << 64) - 1, old + 1, old - 1, old ^ 1,
            old << 1, rng.getrandbits(8 * width)]
    return rng.choice(pool) & ((1 << (8 * width)) - 1)


def _patch(file: str, offset: int, value: int, width: int) -> Dict[str, Any]:
    return {"op": "patch", "file": file, "offset": offset,
            "hex": value.to_bytes(width, "little").hex()}


def generate(base: str, man: Dict[str, Any], count: int, seed: int) -> List[Dict[str, Any]]:
    rng = random.Random(seed)
    raw = open(os.path.join(base, "manifest.json"), "rb").read()
    cubins = [e["cubin"] for e in man["kernels"]]
    views = {c: CubinView(open(os.path.join(base, c), "rb").read()) for c in cubins}
    total = sum(FAMILIES.values())
    plan = {k: max(1, round(v * count / total)) for k, v in FAMILIES.items()}
    out: List[Dict[str, Any]] = []

    def add(family: str, what: str, ops: List[Dict[str, Any]]) -> None:
        out.append({"id": f"{family}-{len(out):05d}", "family": family, "what": what, "ops": ops})

    for _ in range(plan["elf_header"]):
        c = rng.choice(cubins)
        v = views[c]
        name, off, width = rng.choice(EH_FIELDS)
        old = int.from_bytes(v.data[off:off + width], "little")
        new = _edge(rng, width, old, v)
        add("elf_header", f"{c}: {name} {old:#x} -> {new:#x}",
            [_patch(c, off, new, width), {"op": "rehash", "file": c}])
    for _ in range(plan["elf_section"]):
        c = rng.choice(cubins)
        v = views[c]
        i = rng.randrange(v.shnum)
        name, off, width = rng.choice(SH_FIELDS)
        at = v.shoff + 64 * i + off
        old = int.from_bytes(v.data[at:at + width], "little")
        new = _edge(rng, width, old, v)
        sec = v.info.sections[i].name or "(null)"
        add("elf_section", f"{c}: section {i} {sec} sh_{name} {old:#x} -> {new:#x}",
            [_patch(c, at, new, width), {"op": "rehash", "file": c}])
    for _ in range(plan["elf_symbol"]):
        c = rng.choice(cubins)
        v = views[c]
        symtab = next(s for s in v.info.sections if s.type == 2)
        j = rng.randrange(symtab.size // 24)
        name, off, width = rng.choice(SYM_FIELDS)
        at = symtab.offset + 24 * j + off
        old = int.from_bytes(v.data[at:at + width], "little")
        new = _edge(rng, width, old, v)
        add("elf_symbol", f"{c}: symbol {j} {v.info.symbols[j].name or '(null)'} st_{name} "
            f"{old:#x} -> {new:#x}", [_patch(c, at, new, width), {"op": "rehash", "file": c}])
    for _ in range(plan["elf_nvinfo"]):
        c = rng.choice(cubins)
        v = views[c]
        rec, val, size = rng.choice(v.nvinfo_records())
        where = rng.choice(["format", "attribute", "size", "value"])
        if where == "format":
            at, width = rec, 1
        elif where == "attribute":
            at, width = rec + 1, 1
        elif where == "size":
            at, width = rec + 2, 2
        else:
            width = rng.choice([w for w in (1, 2, 4) if w <= max(size, 1)])
            at = val + rng.randrange(max(size - width + 1, 1))
        old = int.from_bytes(v.data[at:at + width], "little")
        new = _edge(rng, width, old, v)
        add("elf_nvinfo", f"{c}: .nv.info record at {rec:#x} {where} {old:#x} -> {new:#x}",
            [_patch(c, at, new, width), {"op": "rehash", "file": c}])
    for _ in range(plan["elf_bytes"]):
        c = rng.choice(cubins)
        v = views[c]
        ops = []
        for _ in range(rng.randint(1, 4)):
            lo, hi = rng.choice(v.regions())
            ops.append(_patch(c, rng.randrange(lo, hi), rng.getrandbits(8), 1))
        add("elf_bytes", f"{c}: {len(ops)} byte(s) of its header tables",
            ops + [{"op": "rehash", "file": c}])
    for _ in range(plan["elf_truncate"]):
        c = rng.choice(cubins)
        n = rng.randrange(len(views[c].data))
        add("elf_truncate", f"{c}: cut to {n} bytes",
            [{"op": "truncate", "file": c, "size": n}, {"op": "rehash", "file": c}])
    fields = ["key", "kernel", "name", "entry", "cubin", "sha256", "target", "target/backend",
              "target/arch", "target/warp_size", "triton_version", "num_warps", "num_ctas",
              "num_stages", "shared_mem", "arg_names", "signature", "signature/0",
              "constexprs", "num_params", "num_trailing_scratch_ptrs", "global_scratch_size",
              "global_scratch_align", "profile_scratch_size", "profile_scratch_align"]
    for _ in range(plan["manifest_field"]):
        i = rng.randrange(len(man["kernels"]))
        field = rng.choice(fields + [f"constexprs/{k}" for k in man["kernels"][i]["constexprs"]])
        if rng.random() < 0.15:
            op = {"op": "json", "path": f"/kernels/{i}/{field}", "remove": True}
            what = f"kernels[{i}].{field} removed"
        else:
            value = rng.choice(BAD_VALUES)
            op = {"op": "json", "path": f"/kernels/{i}/{field}", "value": value}
            what = f"kernels[{i}].{field} = {json.dumps(value)[:40]}"
        add("manifest_field", what, [op])
    for _ in range(plan["manifest_text"]):
        ops = []
        for _ in range(rng.randint(1, 4)):
            pos = rng.randrange(len(raw))
            kind = rng.randrange(3)
            if kind == 0:
                ops.append({"op": "splice", "file": "manifest.json", "offset": pos, "delete": 0,
                            "hex": rng.choice(TOKENS).hex()})
            elif kind == 1:
                ops.append({"op": "splice", "file": "manifest.json", "offset": pos, "delete": 1,
                            "hex": bytes([rng.getrandbits(8)]).hex()})
            else:
                ops.append({"op": "splice", "file": "manifest.json", "offset": pos,
                            "delete": rng.randint(1, 32), "hex": ""})
        add("manifest_text", f"{len(ops)} edit(s) of the text", ops)
    n_k = len(man["kernels"])
    for _ in range(plan["keys"]):
        a, b = rng.sample(range(n_k), 2)
        kind = rng.choice(["swap_keys", "swap_cubins", "swap_entries", "constexpr", "warps"])
        ka, kb = man["kernels"][a], man["kernels"][b]
        if kind == "swap_keys":
            ops = [{"op": "json", "path": f"/kernels/{a}/key", "value": kb["key"]},
                   {"op": "json", "path": f"/kernels/{b}/key", "value": ka["key"]}]
        elif kind == "swap_cubins":
            ops = [{"op": "json", "path": f"/kernels/{a}/cubin", "value": kb["cubin"]},
                   {"op": "json", "path": f"/kernels/{a}/sha256", "value": kb["sha256"]},
                   {"op": "json", "path": f"/kernels/{b}/cubin", "value": ka["cubin"]},
                   {"op": "json", "path": f"/kernels/{b}/sha256", "value": ka["sha256"]}]
        elif kind == "swap_entries":  # a reordering: a good bundle
            ops = [{"op": "json", "path": f"/kernels/{a}", "value": kb},
                   {"op": "json", "path": f"/kernels/{b}", "value": ka}]
        elif kind == "constexpr":
            name = rng.choice(sorted(ka["constexprs"]))
            ops = [{"op": "json", "path": f"/kernels/{a}/constexprs/{name}",
                    "value": ka["constexprs"][name] + rng.choice([1, -1, 1024])}]
        else:
            ops = [{"op": "json", "path": f"/kernels/{a}/num_warps",
                    "value": rng.choice([1, 2, 4, 8, 16, 32])}]
        add("keys", f"{kind} kernels[{a}] / kernels[{b}]", ops)
    file_ops = [
        ("manifest FIFO", lambda c: [{"op": "remove", "file": "manifest.json"},
                                     {"op": "mkfifo", "file": "manifest.json"}]),
        ("manifest -> /dev/zero", lambda c: [{"op": "remove", "file": "manifest.json"},
                                             {"op": "symlink", "file": "manifest.json",
                                              "target": "/dev/zero"}]),
        ("cubin FIFO", lambda c: [{"op": "remove", "file": c}, {"op": "mkfifo", "file": c}]),
        ("cubin -> /dev/zero", lambda c: [{"op": "remove", "file": c},
                                          {"op": "symlink", "file": c, "target": "/dev/zero"}]),
        ("cubin -> /etc/passwd", lambda c: [{"op": "remove", "file": c},
                                            {"op": "symlink", "file": c, "target": "/etc/passwd"}]),
        ("cubin a directory", lambda c: [{"op": "remove", "file": c}, {"op": "mkdir", "file": c}]),
        ("cubin 1 TiB (sparse)", lambda c: [{"op": "truncate", "file": c, "size": 1 << 40}]),
        ("cubin missing", lambda c: [{"op": "remove", "file": c}]),
        ("cubin link loop", lambda c: [{"op": "remove", "file": c},
                                       {"op": "symlink", "file": c, "target": c}]),
        ("manifest 1 TiB (sparse)", lambda c: [{"op": "truncate", "file": "manifest.json",
                                                "size": 1 << 40}]),
    ]
    for _ in range(plan["files"]):
        c = rng.choice(cubins)
        what, make = rng.choice(file_ops)
        add("files", f"{what} ({c})", make(c))
    return out


def apply_ops(ops: List[Dict[str, Any]], folder: str) -> None:
    for op in ops:
        if op["op"] == "splice":
            path = os.path.join(folder, op["file"])
            data = bytearray(open(path, "rb").read())
            at = min(op["offset"], len(data))
            data[at:at + op["delete"]] = bytes.fromhex(op["hex"])
            open(path, "wb").write(bytes(data))
        else:
            try:
                bundle_corpus.apply([op], folder)
            except (KeyError, IndexError, TypeError, ValueError, json.JSONDecodeError):
                pass  # an operation on a manifest an earlier one made unreadable: skipped


# --------------------------------------------------------------------------------------------
# The loaders: luminav verify, load_bundle
# --------------------------------------------------------------------------------------------
_LOADED = re.compile(r"^(\d+) loaded, (\d+) failed")


def run_verify(luminav: str, folder: str, require_gpu: bool) -> Dict[str, Any]:
    cmd = [luminav, "verify", folder] + (["--require-gpu"] if require_gpu else [])
    t0 = time.monotonic()
    try:
        p = subprocess.run(cmd, stdin=subprocess.DEVNULL, capture_output=True, text=True,
                           errors="replace", timeout=VERIFY_TIMEOUT_S)
    except subprocess.TimeoutExpired:
        return {"cpp_rc": "timeout", "cpp_code": "", "cpp_field": "", "cpp_s": VERIFY_TIMEOUT_S,
                "cpp_cpu_ok": False, "gpu": "hang"}
    code = field = ""
    lines = p.stdout.splitlines()
    for line in lines:
        if line.startswith("FAIL ["):
            code = line[6:line.index("]")]
            field = line[line.index("]") + 2:].split(": ", 1)[0]
            break
    if p.returncode != 0 and not code:
        code = "other"  # e.g. "FAIL on-device checks: no CUDA driver" or a driver error
        field = (p.stdout.strip().splitlines() or p.stderr.strip().splitlines() or [""])[-1][:120]
    row = {"cpp_rc": p.returncode, "cpp_code": code, "cpp_field": field,
           "cpp_s": round(time.monotonic() - t0, 3),
           "cpp_cpu_ok": any(line.startswith("ok  schema") for line in lines)}
    # What the driver did with a bundle the loader passed: "device N: ..." opens the on-device
    # part; "N loaded, M failed" closes it.
    dev = next((i for i, line in enumerate(lines) if line.startswith("device ")), None)
    if p.returncode < 0:
        row["gpu"] = f"crash: signal {-p.returncode}" if row["cpp_cpu_ok"] else ""
    elif dev is not None:
        m = next((_LOADED.match(line) for line in lines[dev:] if _LOADED.match(line)), None)
        fail = next((line for line in lines[dev:] if line.startswith("FAIL")), "")
        if m and int(m.group(2)) == 0 and not fail:
            row["gpu"] = f"loaded {m.group(1)}"
        else:
            row["gpu"] = "refused: " + _driver_error(fail)
    else:
        row["gpu"] = ""  # never reached the driver (refused, or no --require-gpu)
    return row


def _driver_error(line: str) -> str:
    m = re.search(r"CUDA_ERROR_[A-Z_]+", line)
    if m:
        return m.group(0)
    m = re.match(r"FAIL \[([a-z_]+)\]", line)
    return m.group(1) if m else line[:80]


def run_python(folder: str) -> Dict[str, Any]:
    from luminamoon.aot.manifest import load_bundle
    from luminamoon.aot.rules import BundleError

    def alarm(*_):
        raise TimeoutError

    signal.signal(signal.SIGALRM, alarm)
    signal.alarm(VERIFY_TIMEOUT_S)
    try:
        load_bundle(folder)
        return {"py_code": "", "py_field": ""}
    except BundleError as exc:
        return {"py_code": exc.code, "py_field": exc.field}
    except TimeoutError:
        return {"py_code": "timeout", "py_field": ""}
    except BaseException as exc:  # noqa: BLE001 - anything else escaping is what we count
        return {"py_code": f"escaped:{type(exc).__name__}", "py_field": str(exc)[:120]}
    finally:
        signal.alarm(0)


def check_one(job: Tuple[Dict[str, Any], str, str, str, bool]) -> Dict[str, Any]:
    m, base, work, luminav, require_gpu = job
    folder = os.path.join(work, m["id"])
    shutil.copytree(base, folder)
    apply_ops(m["ops"], folder)
    row = {"id": m["id"], "family": m["family"], "what": m["what"], "ran": True}
    row.update(run_verify(luminav, folder, require_gpu))
    row.update(run_python(folder))
    return row


def run_checks(jobs: List[Tuple], n: int, deadline: float) -> Dict[str, Dict[str, Any]]:
    """check_one over ``jobs`` in ``n`` processes; what has not started by ``deadline`` is left
    out."""
    done: Dict[str, Dict[str, Any]] = {}
    ex = cf.ProcessPoolExecutor(n)
    futs = {ex.submit(check_one, j): j[0]["id"] for j in jobs}
    pending = set(futs)
    while pending and time.monotonic() < deadline:
        finished, pending = cf.wait(pending, timeout=min(5.0, max(deadline - time.monotonic(), 0.1)))
        for f in finished:
            done[futs[f]] = f.result()
    if pending:
        log(f"checks: the phase's time is up, {len(pending)} bundles not run")
    ex.shutdown(wait=True, cancel_futures=True)
    for f in pending:
        if f.done() and not f.cancelled():
            done[futs[f]] = f.result()
    return done


# --------------------------------------------------------------------------------------------
# The driver alone: cuModuleLoadData of each mutated cubin, in crash-isolated workers
# --------------------------------------------------------------------------------------------
def result_stream():
    """A worker's result stream: the original stdout, moved to a descriptor of its own; fd 1
    (Python's and C libraries' prints) goes to stderr, so nothing else can write to it."""
    fd = os.dup(1)
    os.dup2(2, 1)
    sys.stdout = sys.stderr
    return os.fdopen(fd, "w")


def driver_worker() -> int:
    """--driver-worker: reads "cubin path<TAB>entry" lines; writes one JSON line each."""
    import ctypes

    out = result_stream()
    try:
        cu = ctypes.CDLL("libcuda.so.1")
    except OSError as exc:
        out.write(json.dumps({"skip": f"no CUDA driver: {exc}"}) + "\n")
        out.flush()
        return 0
    vp = ctypes.c_void_p

    def name(rc: int) -> str:
        s = ctypes.c_char_p()
        if rc == 0:
            return "CUDA_SUCCESS"
        if cu.cuGetErrorName(rc, ctypes.byref(s)) == 0 and s.value:
            return s.value.decode()
        return f"CUresult {rc}"

    dev, ctx = ctypes.c_int(), vp()
    for rc in (cu.cuInit(0), cu.cuDeviceGet(ctypes.byref(dev), 0),
               cu.cuDevicePrimaryCtxRetain(ctypes.byref(ctx), dev), cu.cuCtxSetCurrent(ctx)):
        if rc != 0:
            out.write(json.dumps({"skip": f"the CUDA driver did not start: {name(rc)}"}) + "\n")
            out.flush()
            return 0
    out.write(json.dumps({"ready": True}) + "\n")
    out.flush()
    for line in sys.stdin:
        path, entry = line.rstrip("\n").split("\t")
        with open(path, "rb") as f:
            data = f.read()
        buf = ctypes.create_string_buffer(data, len(data) + 1)  # NUL after: text is read as PTX
        mod = vp()
        rc = cu.cuModuleLoadData(ctypes.byref(mod), buf)
        res = {"load": name(rc)}
        if rc == 0:
            fn = vp()
            res["function"] = name(cu.cuModuleGetFunction(ctypes.byref(fn), mod, entry.encode()))
            res["unload"] = name(cu.cuModuleUnload(mod))
        res["sync"] = name(cu.cuCtxSynchronize())
        if res["sync"] != "CUDA_SUCCESS":
            res["exits"] = WORKER_EXITS  # the context is broken: the parent starts a fresh worker
        out.write(json.dumps(res) + "\n")
        out.flush()
        if res.get("exits"):
            return WORKER_EXITS
    return 0


def driver_verdict(res: Dict[str, Any]) -> str:
    if "worker" in res:
        return "not run: " + res["worker"]
    if "crash" in res or "hang" in res:
        return res.get("crash") or "hang"
    if res["load"] != "CUDA_SUCCESS":
        return res["load"]
    if res.get("function") != "CUDA_SUCCESS":
        return "loaded, " + res.get("function", "?")
    if res.get("sync") != "CUDA_SUCCESS":
        return "loaded, context " + res["sync"]
    return "loaded"


class Lanes:
    """``n`` worker processes of this script (``flag``), each fed one line at a time; a worker
    that dies takes its item with it (a crash) and is replaced, one that stays silent past
    ``timeout`` is killed (a hang). A worker that ends on purpose after an item (its result says
    ``exits``: a sticky CUDA error broke its context) is waited for and replaced before the
    next item, so its exit is charged to no one. Each result of a worker that had run items
    before names the last of them (``after``): a crash, hang or sticky error can come from the
    state an earlier bundle left; :meth:`alone` runs items again, each in a fresh worker."""

    def __init__(self, flag: str, n: int, timeout: float, deadline: float,
                 env: Optional[Dict[str, str]] = None) -> None:
        self.flag, self.n, self.timeout, self.deadline = flag, n, timeout, deadline
        self.env = dict(os.environ, **(env or {}))
        self.starts = 0

    def start(self) -> Tuple[Optional[subprocess.Popen], Optional[str], Dict[str, Any]]:
        self.starts += 1
        p = subprocess.Popen([sys.executable, os.path.abspath(__file__), self.flag],
                             stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True,
                             env=self.env)
        first = self._read(p, max(self.deadline - time.monotonic(), 10.0))
        try:
            msg = json.loads(first or "")
        except ValueError:
            p.kill()
            return None, f"the worker did not start in time (rc {p.wait()})", {}
        if "skip" in msg:
            p.wait()
            return None, msg["skip"], msg
        return p, None, msg

    @staticmethod
    def _read(p: subprocess.Popen, timeout: float) -> Optional[str]:
        """One line, "" at the end of the stream, None on timeout."""
        r, _, _ = select.select([p.stdout], [], [], timeout)
        if not r:
            return None
        return p.stdout.readline()

    def alone(self, items: List[Tuple[str, str]]) -> Tuple[Dict[str, Dict[str, Any]],
                                                            Optional[str]]:
        """The same as :meth:`run`, each item in a worker of its own (started for it)."""
        return self.run(items, one_each=True)

    def run(self, items: List[Tuple[str, str]], first: Optional[Any] = None,
            one_each: bool = False) -> Tuple[Dict[str, Dict[str, Any]], Optional[str]]:
        """{id: result} for (id, line) items, or ({}, why) when the workers cannot start.
        ``first``: an already started (process, message) to use as lane 0; ``one_each``: a
        fresh worker for every item."""
        q: "queue.Queue[Tuple[str, str]]" = queue.Queue()
        for it in items:
            q.put(it)
        results: Dict[str, Dict[str, Any]] = {}
        whys: List[str] = []

        def lane(k: int) -> None:
            try:
                lane_items(k)
            except Exception as exc:  # noqa: BLE001 - one lane's failure is logged, not fatal
                log(f"{self.flag} lane {k}: {exc!r}")

        def close(p: subprocess.Popen) -> None:
            try:
                p.stdin.close()
            except BrokenPipeError:
                pass
            try:
                p.wait(timeout=30)
            except subprocess.TimeoutExpired:
                p.kill()
                p.wait()

        def lane_items(k: int) -> None:
            p = None
            prev = None  # the item the current worker ran last
            if k == 0 and first is not None:
                p = first
            while time.monotonic() < self.deadline:
                try:
                    ident, line = q.get_nowait()
                except queue.Empty:
                    break
                if p is None or p.poll() is not None:
                    if p is not None:
                        p.wait()
                    p, why, _ = self.start()
                    prev = None
                    if p is None:  # no worker starts here (no driver, no device): stop
                        whys.append(why)
                        q.put((ident, line))
                        break
                try:
                    p.stdin.write(line + "\n")
                    p.stdin.flush()
                    out = self._read(p, self.timeout)
                except BrokenPipeError:
                    out = ""
                after = {"after": prev} if prev is not None else {}
                prev = ident
                if out is None:
                    p.kill()
                    p.wait()
                    results[ident] = {"hang": f"hang ({self.timeout:.0f} s)", **after}
                    p = None
                    continue
                if not out:
                    rc = p.wait()
                    results[ident] = {"crash": f"crash: signal {-rc}" if rc < 0 else
                                      f"crash: exit {rc}", **after}
                    p = None
                    continue
                try:
                    results[ident] = dict(json.loads(out), **after)
                except ValueError:
                    results[ident] = {"worker": f"bad output {out[:80]!r}", **after}
                    p.kill()
                if results[ident].get("exits"):
                    # it ends on purpose (a sticky error): wait for it, charged to no one
                    try:
                        p.wait(timeout=30)
                    except subprocess.TimeoutExpired:
                        p.kill()
                        p.wait()
                    p = None
                elif one_each:
                    close(p)
                    p = None
                elif p.poll() is not None:
                    p.wait()
                    p = None
            if p is not None:
                close(p)

        threads = [threading.Thread(target=lane, args=(k,)) for k in range(self.n)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        left = q.qsize()
        if left:
            log(f"{self.flag}: {left} items not run ("
                + (f"no worker: {whys[0]}" if whys else "the phase's time is up") + ")")
        if not results and whys:
            return {}, whys[0]
        return results, None


def aot_verdict(a: Dict[str, Any]) -> str:
    """One aot step's result in words: crash, hang, sticky (a sticky CUDA error), or its
    outcome and code."""
    if "crash" in a or "hang" in a:
        return a.get("crash") or a.get("hang")
    if "aot_sticky" in a:
        return "sticky: " + a["aot_sticky"][:120]
    if "worker" in a:
        return "not run: " + a["worker"]
    return a.get("aot_outcome", "?") + (f":{a['aot_code']}" if a.get("aot_code") else "")


def _reproduced(r: Dict[str, Any], what: Tuple[str, ...]) -> bool:
    """Whether the aot step's crash, hang or sticky error (``what``: verdict prefixes) is the
    bundle's own: it recurs alone in a fresh worker, or the worker had run nothing before it,
    or it could not be run alone (then it counts, unconfirmed)."""
    if not r.get("aot_after"):
        return True
    return r.get("aot_alone", "not run").startswith(what + ("not run",))


def cubins_touched(m: Dict[str, Any]) -> List[str]:
    """The cubin files whose bytes a mutation changes."""
    out: List[str] = []
    for op in m["ops"]:
        f = op.get("to") if op["op"] == "copy" else op.get("file")
        if op["op"] in ("patch", "truncate", "splice", "write", "copy") and f and \
                f.endswith(".cubin") and f not in out:
            out.append(f)
    return out


# --------------------------------------------------------------------------------------------
# The aot backend's first step (worker processes)
# --------------------------------------------------------------------------------------------
def aot_worker() -> int:
    """--aot-worker: reads bundle folders from stdin, one a line; writes one JSON line each.

    The reference is the base bundle's aot step ($CAMPAIGN_BASE), computed by the first worker
    (which also compares it with the triton backend's step, unless $CAMPAIGN_NO_TRITON) and
    saved to $CAMPAIGN_REFERENCE for the others."""
    out = result_stream()
    import torch

    if not torch.cuda.is_available():
        out.write(json.dumps({"skip": "no CUDA device"}) + "\n")
        out.flush()
        return 0
    from luminamoon.aot.rules import BundleError
    from luminamoon.optimizer import LuminaMoon

    gen = torch.Generator().manual_seed(0)
    init = [torch.randn(s, generator=gen) for s in SHAPES]
    grads = [torch.randn(s, generator=gen) for s in SHAPES]

    def step(backend: str, bundle: Optional[str]):
        """(parameters after one step, the exception it raised or None)."""
        params = [p.clone().cuda().requires_grad_() for p in init]
        error = None
        try:
            opt = LuminaMoon(params, lr=3e-2, seed=11, backend=backend, aot_bundle=bundle)
            for p, g in zip(params, grads):
                p.grad = g.cuda()
            opt.step()
        except Exception as exc:  # noqa: BLE001 - judged by the caller
            error = exc
        torch.cuda.synchronize()  # a launch fault surfaces here (and ends the worker)
        return [p.detach().cpu() for p in params], error

    ref_path = os.environ["CAMPAIGN_REFERENCE"]
    hello: Dict[str, Any] = {"ready": True}
    if os.path.exists(ref_path):
        reference = torch.load(ref_path)
        hello["reference"] = "loaded"
    else:
        reference, error = step("aot", os.environ["CAMPAIGN_BASE"])
        if error is not None:
            out.write(json.dumps({"skip": f"the base bundle's aot step failed: {error!r}"}) + "\n")
            out.flush()
            return 0
        hello["reference"] = "computed"
        hello["base_changed"] = not all(torch.equal(a, b) for a, b in zip(reference, init))
        if not os.environ.get("CAMPAIGN_NO_TRITON"):
            t0 = time.monotonic()
            tri, error = step("triton", None)
            hello["triton_equal"] = None if error is not None else \
                all(torch.equal(a, b) for a, b in zip(tri, reference))
            hello["triton_error"] = repr(error)[:200] if error is not None else ""
            hello["triton_s"] = round(time.monotonic() - t0, 1)
        torch.save(reference, ref_path + ".tmp")
        os.replace(ref_path + ".tmp", ref_path)
    out.write(json.dumps(hello) + "\n")
    out.flush()
    for line in sys.stdin:
        bundle = line.strip()
        if not bundle:
            continue
        res: Dict[str, Any] = {}
        try:
            params, error = step("aot", bundle)
        except Exception as exc:  # noqa: BLE001 - a sticky CUDA error: the context is gone
            res.update(aot_outcome="error", aot_code=type(exc).__name__,
                       aot_sticky=" ".join(str(exc).split())[:300] or repr(exc)[:300])
        else:
            if error is None:
                res["aot_outcome"] = "accepted"
                res["aot_same"] = all(torch.equal(a, b) for a, b in zip(params, reference))
            else:
                if isinstance(error, BundleError):
                    res.update(aot_outcome="refused", aot_code=error.code, aot_field=error.field)
                else:  # a driver error, another exception
                    res.update(aot_outcome="error", aot_code=type(error).__name__,
                               aot_field=str(error).splitlines()[0][:160] if str(error) else "")
                # nothing may have been launched: the parameters are untouched
                res["aot_untouched"] = all(torch.equal(a, b) for a, b in zip(params, init))
        if "aot_sticky" in res:
            res["exits"] = WORKER_EXITS  # the context is broken: the parent starts a fresh worker
        out.write(json.dumps(res) + "\n")
        out.flush()
        if res.get("exits"):
            return WORKER_EXITS
    return 0


# --------------------------------------------------------------------------------------------
# The record
# --------------------------------------------------------------------------------------------
def versions() -> Dict[str, str]:
    v = {"python": platform.python_version(), "host": platform.node()}
    for mod in ("torch", "triton"):
        try:
            v[mod] = __import__(mod).__version__
        except Exception:  # noqa: BLE001
            pass
    try:
        p = subprocess.run(["nvidia-smi", "--query-gpu=name,driver_version",
                            "--format=csv,noheader"], capture_output=True, text=True, timeout=30)
        v["device"], v["driver"] = [x.strip() for x in p.stdout.splitlines()[0].split(",")][:2]
    except (OSError, IndexError, ValueError, subprocess.SubprocessError):
        v["device"] = "no GPU (nvidia-smi)"
    return v


def _drv_class(v: str) -> str:
    if not v:
        return ""
    if v.startswith(("crash", "hang")):
        return v.split(":")[0].split(" ")[0]
    return "loaded" if v == "loaded" else "error"


def summarise(rows: List[Dict[str, Any]], meta: Dict[str, Any]) -> Dict[str, Any]:
    s: Dict[str, Any] = dict(meta)
    ran = [r for r in rows if r.get("ran")]
    mut = [r for r in rows if r["family"] != "corpus"]
    s["bundles"] = len(rows)
    s["mutants"] = len(mut)
    s["corpus_cases"] = len(rows) - len(mut)
    s["not_run"] = len(rows) - len(ran)
    s["by_family"] = dict(Counter(r["family"] for r in rows))
    s["loader_cpp_by_code"] = dict(Counter(r["cpp_code"] or "accepted" for r in ran).most_common())
    s["loader_python_by_code"] = dict(Counter(r["py_code"] or "accepted"
                                              for r in ran).most_common())
    mran = [r for r in ran if r["family"] != "corpus"]
    s["mutants_refused_on_cpu"] = sum(1 for r in mran if not r["cpp_cpu_ok"])
    s["mutants_accepted_on_cpu"] = sum(1 for r in mran if r["cpp_cpu_ok"])
    # what reached the driver through the loader (luminav verify --require-gpu)
    reached = [r for r in ran if r.get("gpu")]
    s["reached_driver_via_loader"] = len(reached)
    s["driver_via_loader"] = dict(Counter(
        r["gpu"] if not r["gpu"].startswith("loaded") else "loaded" for r in reached).most_common())
    # the driver alone, beside the loader's verdict
    probed = [r for r in rows if r.get("drv")]
    s["driver_probe"] = {
        "bundles_probed": len(probed),
        "control": meta.get("driver_control", ""),
        "by_verdict": dict(Counter(r["drv"] for r in probed).most_common()),
        "loader_vs_driver": dict(Counter(
            f"{'accepted' if r.get('cpp_cpu_ok') else 'refused'} by the loader, "
            f"{_drv_class(r['drv'])} in the driver" for r in probed if r.get("ran")).most_common()),
    }
    s["driver_crashes_spared"] = [r["id"] for r in probed if r.get("ran") and not r["cpp_cpu_ok"]
                                  and _drv_class(r["drv"]) in ("crash", "hang")]
    s["driver_crashes_accepted"] = [r["id"] for r in probed if r.get("ran") and r["cpp_cpu_ok"]
                                    and _drv_class(r["drv"]) in ("crash", "hang")]
    s["aot_steps"] = sum(1 for r in rows if r.get("aot_outcome") not in (None, "", "skipped"))
    s["aot_by_outcome"] = dict(Counter(
        (r.get("aot_outcome") or "skipped") + (f":{r['aot_code']}" if r.get("aot_code") else "")
        for r in rows if r["family"] != "corpus").most_common())
    # an aot step's crash, hang or sticky error counts only where it recurs alone in a fresh
    # worker; the others are listed with the bundle the worker had run before
    s["crashes"] = [r["id"] for r in ran
                    if (isinstance(r["cpp_rc"], int) and r["cpp_rc"] < 0)
                    or (r.get("aot_outcome") == "crash" and _reproduced(r, ("crash",)))]
    s["hangs"] = [r["id"] for r in ran if r["cpp_rc"] == "timeout" or r["py_code"] == "timeout"
                  or (r.get("aot_outcome") == "hang" and _reproduced(r, ("hang",)))]
    s["aot_sticky"] = {r["id"]: r["aot_sticky"] for r in ran if r.get("aot_sticky")
                       and _reproduced(r, ("sticky",))}
    s["aot_not_alone"] = {r["id"]: {"was": r["aot_sticky"] and "sticky" or r["aot_code"],
                                    "after": r["aot_after"], "alone": r.get("aot_alone", "")}
                          for r in ran if (r.get("aot_outcome") in ("crash", "hang")
                                           or r.get("aot_sticky"))
                          and r["id"] not in s["crashes"] + s["hangs"]
                          and r["id"] not in s["aot_sticky"]}
    s["python_escapes"] = [r["id"] for r in ran if r["py_code"].startswith("escaped:")]
    s["disagreements"] = [r["id"] for r in ran if r["disagree"]]
    s["device_only_refusals"] = sum(1 for r in ran if r["cpp_code"] == "device")
    s["bad_launches"] = [r["id"] for r in rows if r.get("bad_launch")]
    s["corpus_unexpected"] = [r["id"] for r in ran if r.get("expected_ok") is False]
    s["ok"] = not (s["crashes"] or s["hangs"] or s["aot_sticky"] or s["python_escapes"]
                   or s["disagreements"]
                   or s["bad_launches"] or s["corpus_unexpected"] or s["driver_crashes_accepted"]
                   or (meta["require_gpu"] and meta.get("aot_skipped")))
    return s


def write_summary(path: str, s: Dict[str, Any]) -> None:
    def table(d: Dict[str, Any]) -> str:
        return "\n".join(f"| {k} | {v} |" for k, v in d.items()) or "| - | - |"

    dp = s["driver_probe"]
    lines = [
        f"# Bundle mutation campaign, {s['date']}",
        "",
        f"{s['device']} (driver {s.get('driver', '-')}) on {s['host']}; torch "
        f"{s.get('torch', '-')}, Triton {s.get('triton', '-')}, Python {s['python']}; luminav "
        f"verify{' --require-gpu' if s['require_gpu'] else ' (no --require-gpu)'}; seed "
        f"{s['seed']}; {s['elapsed_s']} s ({s['phases']}).",
        "",
        f"- mutants: {s['mutants']} of the base bundle {', '.join(s['base_keys'])} (sm_"
        f"{s['base_arch']}), plus {s['corpus_cases']} corpus cases; not run (time): "
        f"{s['not_run']}",
        f"- refused by the loader (C++, before the driver): {s['mutants_refused_on_cpu']} "
        f"mutants; accepted: {s['mutants_accepted_on_cpu']}",
        f"- reached the driver through the loader (luminav verify): "
        f"{s['reached_driver_via_loader']}: {s['driver_via_loader']}",
        f"- the driver alone on the mutated cubins of {dp['bundles_probed']} bundles (control, "
        f"the base's: {dp['control']}): {dp['loader_vs_driver']}",
        f"- driver crashes or hangs the loader spared: {len(s['driver_crashes_spared'])}; on "
        f"cubins the loader accepts: {len(s['driver_crashes_accepted'])} "
        f"{s['driver_crashes_accepted'][:20]}",
        f"- aot first steps: {s['aot_steps']}" + (f" (skipped: {s['aot_skipped']})"
                                                  if s.get("aot_skipped") else "")
        + f"; base step equals the triton backend's: {s.get('triton_equal', '-')}",
        f"- crashes: {len(s['crashes'])} {s['crashes'][:20]}; hangs: {len(s['hangs'])}; "
        f"Python exceptions other than BundleError: {len(s['python_escapes'])}",
        f"- sticky CUDA errors in a bundle's own aot step (a launch that broke the context; "
        f"the loader should have refused it): {len(s['aot_sticky'])} "
        f"{dict(list(s['aot_sticky'].items())[:10])}",
        f"- crashes, hangs or sticky errors that did not recur alone in a fresh worker (the "
        f"bundle run before them in the worker: `after`): {len(s['aot_not_alone'])} "
        f"{dict(list(s['aot_not_alone'].items())[:10])}",
        f"- C++/Python disagreements: {len(s['disagreements'])} {s['disagreements'][:20]}; "
        f"refusals only a device makes (`device`): {s['device_only_refusals']}",
        f"- launches of a refused bundle or results other than the base's: "
        f"{len(s['bad_launches'])} {s['bad_launches'][:20]}",
        f"- corpus cases not refused with their expected code: {len(s['corpus_unexpected'])} "
        f"{s['corpus_unexpected'][:20]}",
        f"- verdict: {'OK' if s['ok'] else 'FAILED'}",
        "",
        "| family | bundles |", "|---|---|", table(s["by_family"]), "",
        "| C++ loader (`luminav verify`) | bundles |", "|---|---|",
        table(s["loader_cpp_by_code"]), "",
        "| Python loader (`load_bundle`) | bundles |", "|---|---|",
        table(s["loader_python_by_code"]), "",
        "| the driver alone (cuModuleLoadData) | cubins |", "|---|---|",
        table(dp["by_verdict"]), "",
        "| aot first step | bundles |", "|---|---|", table(s["aot_by_outcome"]), "",
    ]
    with open(path, "w") as f:
        f.write("\n".join(lines) + "\n")


def main(argv: Optional[List[str]] = None) -> int:
    global _LOG
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--aot-worker", action="store_true", help=argparse.SUPPRESS)
    ap.add_argument("--driver-worker", action="store_true", help=argparse.SUPPRESS)
    ap.add_argument("--make-bundle", metavar="DIR", help=argparse.SUPPRESS)
    ap.add_argument("--out", default=os.environ.get("OUT"), help="results folder (default $OUT)")
    ap.add_argument("--bundle", help="a bundle holding the fp32 step's variants (default: built "
                    "into BUILD_DIR/bundle for the device's arch)")
    ap.add_argument("--luminav", help="the luminav CLI (default: built in BUILD_DIR, with the "
                    "in-tree module luminamoon._luminav)")
    ap.add_argument("--build-dir", default=os.path.join(ROOT, "build", "campaign"))
    ap.add_argument("--count", type=int, default=1200, help="mutations (default 1200)")
    ap.add_argument("--budget-s", type=float, default=280.0,
                    help="wall-clock budget from the start, builds included (default 280)")
    ap.add_argument("--jobs", type=int, default=os.cpu_count() or 2)
    ap.add_argument("--aot-workers", type=int, default=4)
    ap.add_argument("--driver-workers", type=int, default=4)
    ap.add_argument("--require-gpu", action="store_true",
                    help="pass --require-gpu to luminav verify (loads every variant on the GPU)")
    ap.add_argument("--arch", type=int, default=None,
                    help="the base's arch (default: the device's, else 90)")
    ap.add_argument("--no-triton", action="store_true",
                    help="skip comparing the base's aot step with the triton backend's")
    ap.add_argument("--seed", type=int, default=20261201)
    ap.add_argument("--keep", action="store_true", help="keep the mutated bundles")
    args = ap.parse_args(argv)
    if args.aot_worker:
        return aot_worker()
    if args.driver_worker:
        return driver_worker()
    if args.make_bundle:
        return make_bundle_main(args.make_bundle, args.arch or 90, args.jobs)
    if not args.out:
        ap.error("--out (or $OUT) is required")
    os.makedirs(args.out, exist_ok=True)
    _LOG = open(os.path.join(args.out, "bundle_campaign.log"), "w")
    try:
        return campaign(args)
    except SystemExit as exc:  # the campaign could not start: say why, in the results too
        if isinstance(exc.code, int) or exc.code is None:
            raise
        log(str(exc.code))
        with open(os.path.join(args.out, "bundle_campaign_summary.json"), "w") as f:
            json.dump({"ok": False, "error": str(exc.code)[-4000:],
                       "date": datetime.date.today().isoformat()}, f, indent=1)
        with open(os.path.join(args.out, "bundle_campaign_summary.md"), "w") as f:
            f.write(f"# Bundle mutation campaign: not run\n\n```\n{str(exc.code)[-4000:]}\n```\n")
        return 2


def campaign(args: argparse.Namespace) -> int:
    end = T0 + args.budget_s
    phases: Dict[str, float] = {}
    t = time.monotonic()
    cc = device_arch()
    arch = args.arch or cc or 90
    log(f"device arch: {cc}; base arch sm_{arch}")

    # 1. the luminav CLI and the native module
    luminav = args.luminav
    if luminav is None:
        luminav = build_native(args.build_dir, args.jobs, max(end - 90 - time.monotonic(), 30))
    luminav = os.path.abspath(luminav)
    phases["build"] = round(time.monotonic() - t, 1)
    log(f"luminav: {luminav}")
    # 2. the bundle
    t = time.monotonic()
    bundle = args.bundle
    if bundle is None:
        bundle = os.path.join(args.build_dir, "bundle")
        shutil.rmtree(bundle, ignore_errors=True)
        env = dict(os.environ, PYTHONPATH=os.path.join(ROOT, "python") + os.pathsep +
                   os.environ.get("PYTHONPATH", ""))
        limit = max(end - 75 - time.monotonic(), 30)
        try:
            p = subprocess.run([sys.executable, os.path.abspath(__file__), "--make-bundle",
                                bundle, "--arch", str(arch), "--jobs", str(args.jobs)], env=env,
                               stdin=subprocess.DEVNULL, capture_output=True, text=True,
                               timeout=limit)
        except subprocess.TimeoutExpired:
            raise SystemExit(f"the bundle build took more than {limit:.0f} s") from None
        _LOG.write(p.stdout[-5000:] + p.stderr[-20000:])
        if p.returncode != 0:
            raise SystemExit(f"the bundle build failed (rc {p.returncode}):\n{p.stderr[-3000:]}")
    phases["bundle"] = round(time.monotonic() - t, 1)
    log(f"bundle: {bundle}")

    work = tempfile.mkdtemp(prefix="bundle-campaign-")
    base = os.path.join(work, "base")
    man = make_base(bundle, base, arch)
    # 3. the base must pass everything, or the campaign measures nothing
    ok = check_one(({"id": "base", "family": "base", "what": "", "ops": []}, base,
                    os.path.join(work, "check"), luminav, args.require_gpu))
    log(f"base: {ok}")
    if ok["cpp_code"] or ok["py_code"]:
        raise SystemExit(f"the base bundle is refused, nothing to measure: {ok}")
    mutations = generate(base, man, args.count, args.seed)
    corpus = [{"id": f"corpus-{c['name']}", "family": "corpus", "what": c["name"],
               "ops": c["ops"], "expected": (c["code"] or "", c["field"] or "")}
              for c in bundle_corpus.load_cases()]
    corpus_base = os.path.join(work, "corpus-base")
    shutil.copytree(bundle_corpus.BASE, corpus_base)
    jobs = [(m, base, work, luminav, args.require_gpu) for m in mutations]
    jobs += [(m, corpus_base, work, luminav, args.require_gpu) for m in corpus]

    # 4. the loaders, every bundle
    t = time.monotonic()
    log(f"checks: {len(mutations)} mutations + {len(corpus)} corpus cases, {args.jobs} at a time")
    done = run_checks(jobs, args.jobs, t + 0.5 * (end - 20 - t))
    phases["loaders"] = round(time.monotonic() - t, 1)
    rows: List[Dict[str, Any]] = []
    for m in mutations + corpus:
        r = done.get(m["id"]) or {"id": m["id"], "family": m["family"], "what": m["what"],
                                  "ran": False, "cpp_rc": "", "cpp_code": "", "cpp_field": "",
                                  "py_code": "", "py_field": "", "cpp_cpu_ok": False, "gpu": ""}
        r["disagree"] = r["ran"] and r["cpp_code"] not in ("device", "other") and \
            (r["cpp_code"], r["cpp_field"]) != (r["py_code"], r["py_field"])
        if "expected" in m and r["ran"]:
            r["expected_ok"] = (r["cpp_code"], r["cpp_field"]) == m["expected"] and \
                (r["py_code"], r["py_field"]) == m["expected"]
        r["ops"] = json.dumps(m["ops"], separators=(",", ":"))[:2000]
        rows.append(r)
    log(f"checks done: {sum(r['ran'] for r in rows)} of {len(rows)}")

    # 5. the driver alone on every mutated cubin (and the base's, as the control)
    t = time.monotonic()
    entries = {e["cubin"]: e["entry"] for e in man["kernels"]}
    with open(os.path.join(corpus_base, "manifest.json")) as f:
        corpus_entries = {e["cubin"]: e["entry"] for e in json.load(f)["kernels"]}
    items: List[Tuple[str, str]] = [(f"control/{c}", f"{os.path.join(base, c)}\t{e}")
                                    for c, e in entries.items()]
    for m, r in zip(mutations + corpus, rows):
        if not r["ran"]:
            continue
        names = entries if m["family"] != "corpus" else corpus_entries
        for c in cubins_touched(m):
            path = os.path.join(work, m["id"], c)
            try:
                st = os.lstat(path)
            except OSError:
                continue
            if c in names and st.st_mode & 0o170000 == 0o100000 and st.st_size <= CUBIN_PROBE_MAX:
                items.append((f"{m['id']}/{c}", f"{path}\t{names[c]}"))
    drv, drv_skip = Lanes("--driver-worker", args.driver_workers, DRIVER_TIMEOUT_S,
                          t + 0.35 * (end - 20 - t)).run(items)
    control = Counter(driver_verdict(v) for k, v in drv.items() if k.startswith("control/")
                      and "worker" not in v)
    by_row: Dict[str, List[str]] = {}
    for k, v in drv.items():
        if not k.startswith("control/") and "worker" not in v:
            by_row.setdefault(k.split("/", 1)[0], []).append(driver_verdict(v))
    order = ("crash", "hang", "error", "loaded")
    for r in rows:
        vs = by_row.get(r["id"])
        if vs:  # the worst of its cubins
            r["drv"] = min(vs, key=lambda v: order.index(_drv_class(v)))
    phases["driver"] = round(time.monotonic() - t, 1)
    log(f"driver probe: {len(drv)} of {len(items)} cubins; control {dict(control)}; "
        f"skipped: {drv_skip}")

    # 6. the aot backend's first step, for every mutation of the base
    t = time.monotonic()
    aot_env = {"CAMPAIGN_REFERENCE": os.path.join(work, "reference.pt"), "CAMPAIGN_BASE": base}
    if args.no_triton:
        aot_env["CAMPAIGN_NO_TRITON"] = "1"
    lanes = Lanes("--aot-worker", args.aot_workers, AOT_TIMEOUT_S, end - 15, aot_env)
    p0, aot_skip, hello = lanes.start()  # the first worker makes the reference
    log(f"aot reference: {hello or aot_skip}")
    aot: Dict[str, Dict[str, Any]] = {}
    alone: Dict[str, Dict[str, Any]] = {}
    if p0 is not None:
        aot, aot_skip = lanes.run([(r["id"], os.path.join(work, r["id"])) for r in rows
                                   if r["family"] != "corpus" and r["ran"]], first=p0)
        # a crash, hang or sticky error may be an earlier bundle's doing (the state it left in
        # the worker): each such bundle again, alone in a fresh worker, decides
        suspects = [i for i, a in aot.items() if "crash" in a or "hang" in a or "aot_sticky" in a]
        if suspects:
            again = Lanes("--aot-worker", min(args.aot_workers, len(suspects)), AOT_TIMEOUT_S,
                          end - 5, aot_env)
            alone, _ = again.alone([(i, os.path.join(work, i)) for i in suspects])
            log(f"aot suspects run alone: {len(alone)} of {len(suspects)}: " + ", ".join(
                f"{i} ({aot_verdict(aot[i])}, after {aot[i].get('after')}; alone: "
                f"{aot_verdict(alone[i]) if i in alone else 'not run'})" for i in suspects))
    for r in rows:
        if r["family"] == "corpus":
            continue
        a = aot.get(r["id"], {})
        r["aot_after"] = a.get("after") or ""
        r["aot_sticky"] = a.get("aot_sticky", "")
        if r["id"] in alone:
            r["aot_alone"] = aot_verdict(alone[r["id"]])
            r["aot_alone_sticky"] = alone[r["id"]].get("aot_sticky", "")
        if "crash" in a or "hang" in a:
            a = {"aot_outcome": "crash" if "crash" in a else "hang",
                 "aot_code": a.get("crash") or a.get("hang")}
        r["aot_outcome"] = a.get("aot_outcome", "skipped")
        r["aot_code"] = a.get("aot_code", "")
        r["aot_same"] = a.get("aot_same", "")
        refused = bool(r["cpp_code"] or r["py_code"])
        r["bad_launch"] = (r["aot_outcome"] == "accepted" and (refused or not a.get("aot_same"))) \
            or (r["aot_outcome"] in ("refused", "error") and a.get("aot_untouched") is False)
    phases["aot"] = round(time.monotonic() - t, 1)
    log(f"aot steps: {len(aot)}; worker starts {lanes.starts}")
    if not args.keep:
        shutil.rmtree(work, ignore_errors=True)

    date = datetime.date.today().isoformat()
    meta = dict(date=date, luminav=luminav, require_gpu=args.require_gpu, seed=args.seed,
                base_keys=sorted({e["key"] for e in man["kernels"]}), base_arch=arch,
                elapsed_s=round(time.monotonic() - T0, 1),
                phases=", ".join(f"{k} {v} s" for k, v in phases.items()),
                aot_skipped=aot_skip, aot_reference=hello,
                triton_equal=hello.get("triton_equal", "-") if hello else "-",
                driver_control=dict(control) if control else (drv_skip or "not run"),
                **versions())
    summary = summarise(rows, meta)
    cols = ["date", "id", "family", "what", "cpp_rc", "cpp_code", "cpp_field", "gpu", "py_code",
            "py_field", "disagree", "drv", "aot_outcome", "aot_code", "aot_same", "bad_launch",
            "aot_sticky", "aot_after", "aot_alone", "aot_alone_sticky", "cpp_s", "ops"]
    with open(os.path.join(args.out, "bundle_campaign.csv"), "w", newline="") as f:
        w = csv.DictWriter(f, fieldnames=cols, extrasaction="ignore")
        w.writeheader()
        for r in rows:
            w.writerow(dict(r, date=date))
    with open(os.path.join(args.out, "bundle_campaign_summary.json"), "w") as f:
        json.dump(summary, f, indent=1)
    write_summary(os.path.join(args.out, "bundle_campaign_summary.md"), summary)
    with open(os.path.join(args.out, "bundle_campaign_summary.md")) as f:
        text = f.read()
    print(text)
    _LOG.write(text)
    _LOG.close()
    return 0 if summary["ok"] else 1


if __name__ == "__main__":
    raise SystemExit(main())
