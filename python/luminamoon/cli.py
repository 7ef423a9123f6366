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
  doctor    what this machine has (versions, devices, the native module, the default AOT
            bundle) and whether backend="aot" runs here, with a verdict line
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


def _dist_version(name: str) -> Optional[str]:
    """An installed distribution's version, read from its metadata (no import: Triton's takes
    seconds)."""
    from importlib import metadata

    try:
        return metadata.version(name)
    except metadata.PackageNotFoundError:
        return None


def _bundle_report(rows, native) -> dict:
    """Rows about the default bundle; returns what the verdict needs: path, per-arch keys, the
    first problem (None when sound)."""
    from .aot.default import NoDefaultBundleError, default_bundle_dir, ENV_VAR

    out = {"path": None, "keys": {}, "problem": None}
    try:
        path = default_bundle_dir()
    except NoDefaultBundleError as exc:
        rows.append(("default bundle", f"none: {exc}"))
        out["problem"] = str(exc)
        return out
    if path is None:
        rows.append(("default bundle", "none (a source checkout, or a wheel built with "
                                       "LUMINAMOON_DEFAULT_BUNDLE=OFF): backend='aot' needs "
                                       "aot_bundle=DIR"))
        return out
    out["path"] = path
    where = f"${ENV_VAR}" if os.environ.get(ENV_VAR) else "shipped with the package"
    rows.append(("default bundle", f"{path} ({where})"))
    from .aot.manifest import BundleError, read_manifest

    try:
        manifest = read_manifest(path)
    except BundleError as exc:
        rows.append(("  manifest", f"REFUSED: {exc}"))
        out["problem"] = str(exc)
        return out
    from .aot.manifest import code_object_file

    keys = {}
    for e in manifest["kernels"]:
        keys.setdefault(e["target"]["arch"], set()).add(e["key"])
    out["keys"] = keys
    every = set().union(*keys.values()) if keys else set()
    files = [os.path.join(path, code_object_file(e)) for e in manifest["kernels"]]
    size = sum(os.path.getsize(f) for f in files if os.path.isfile(f))
    rows.append(("  archs", ", ".join(_arch_names(keys)) or "none"))
    hsacos = sum(1 for e in manifest["kernels"] if "hsaco" in e)
    cubins = len(manifest["kernels"]) - hsacos
    objects = ", ".join(f"{n} {what}" for n, what in ((cubins, "cubins"), (hsacos, "hsacos"))
                        if n) or "0 code objects"
    rows.append(("  variants", f"{len(every)} per arch, {objects}, {size / 2**20:.1f} MiB"))
    rows.append(("  manifest", f"format {manifest['format']} v{manifest['format_version']}, "
                               f"{manifest['created_by']}, Triton {manifest['triton_version']}"))
    incomplete = [a for a in keys if keys[a] != every]
    if incomplete:
        out["problem"] = (f"the bundle lacks variants for {', '.join(_arch_names(incomplete))}"
                          f" that its other archs have")
    if native is not None:
        # The runtime's own loader, every cubin now: ELF checks and its SHA-256 against the manifest.
        try:
            native.load_manifest(path)
            rows.append(("  verified", f"all {objects}: SHA-256 as recorded, whole ELF images "
                                       "(the C++ loader)"))
        except (RuntimeError, ValueError, LookupError) as exc:
            rows.append(("  verified", f"REFUSED by the C++ loader: {exc}"))
            out["problem"] = out["problem"] or str(exc)
    else:
        from .aot.manifest import verify_bundle

        _, problems = verify_bundle(path)
        if problems:
            rows.append(("  verified", f"{len(problems)} problem(s), first: {problems[0]}"))
            out["problem"] = out["problem"] or str(problems[0])
        else:
            rows.append(("  verified", f"all {objects}: SHA-256, ELF and ABI (Python's checker; "
                                       "the native module is not built)"))
    return out


def _arch_names(archs) -> List[str]:
    """sm_80, sm_90, gfx942 ...: compute capabilities (ints) first, then gfx archs."""
    return [a if isinstance(a, str) else f"sm_{a}"
            for a in sorted(archs, key=lambda a: (isinstance(a, str), str(a).zfill(8)))]


def _gpu_rows(torch, rows, devices) -> None:
    """Rows for torch's GPU build and devices; appends (index, name, arch) to ``devices``: arch
    the compute capability (an int, 90) on CUDA, the gfx arch (a string, "gfx942") on ROCm."""
    hip = getattr(torch.version, "hip", None)
    if hip:  # a ROCm build: torch.cuda devices are AMD GPUs driven through HIP
        rows.append(("torch", f"{torch.__version__} (ROCm build, HIP {hip})"))
    else:
        rows.append(("torch", f"{torch.__version__} (CUDA build {torch.version.cuda or 'none'})"))
    cuda = torch.cuda.is_available()
    rows.append(("cuda devices" + (" (HIP)" if hip else ""),
                 str(torch.cuda.device_count()) if cuda else "none"))
    if not cuda:
        return
    for i in range(torch.cuda.device_count()):
        props = torch.cuda.get_device_properties(i)
        if hip:
            full = str(getattr(props, "gcnArchName", "") or "unknown")
            arch = full.split(":")[0]
            shown = arch + (f" ({full})" if full != arch else "")
        else:
            arch = props.major * 10 + props.minor
            shown = f"sm_{arch}"
        devices.append((i, props.name, arch))
        rows.append((f"  cuda:{i}", f"{props.name}, {shown}, {props.total_memory / 2**30:.0f} GiB"))


def doctor(argv: Optional[List[str]] = None) -> int:
    """What this machine has, and whether backend="aot" runs here with the default bundle; the
    last line is the verdict (exit status 1 when it says FAIL)."""
    argparse.ArgumentParser(prog="luminamoon doctor",
                            description="Report versions, the default AOT bundle, the native "
                                        "module and the GPUs, with a verdict.").parse_args(argv)
    from . import __version__

    rows = [("luminamoon", f"{__version__} ({os.path.dirname(os.path.abspath(__file__))})"),
            ("python", f"{platform.python_version()} ({sys.executable})"),
            ("platform", platform.platform())]
    devices = []  # (index, name, arch)
    try:
        import torch

        _gpu_rows(torch, rows, devices)
        xpu = getattr(torch, "xpu", None)
        rows.append(("xpu devices", str(xpu.device_count()) if xpu is not None and xpu.is_available() else "none"))
        mps = getattr(torch.backends, "mps", None)
        rows.append(("mps", "available" if mps is not None and mps.is_available() else "none"))
    except ImportError:
        rows.append(("torch", "not installed (pip install torch)"))
    triton_version = _dist_version("triton")
    if triton_version:
        n = trailing_scratch_ptrs_for(triton_version)
        names = ["global_scratch", "profile_scratch"][:n]
        rows.append(("triton", f"{triton_version} (AOT ABI: {n} trailing scratch pointer(s)"
                               + (f": {', '.join(names)})" if n else ")")))
        rows.append(("TRITON_INTERPRET", os.environ.get("TRITON_INTERPRET", "unset")))
    else:
        rows.append(("triton", "not installed: backend 'triton' is unavailable; 'aot' needs none"))
    native = None
    try:
        native = importlib.import_module("luminamoon._luminav")
        rows.append(("native module", f"luminav {getattr(native, '__version__', '?')} "
                                      f"(C API v{native.api_version()}, {native.__file__})"))
        rows.append(("CUDA driver (dlopen)", "found" if native.has_cuda_driver() else "not found"))
        if hasattr(native, "has_hip_runtime"):  # the HIP layer beside the CUDA driver layer
            rows.append(("HIP runtime (dlopen)",
                         "found" if native.has_hip_runtime() else "not found"))
        kind, threads = native.cpu_thread_pool()
        rows.append(("cpu engine", f"{native.cpu_isa()}, {kind}, {threads} thread"
                                   + ("s" if threads != 1 else "")))
    except ImportError as exc:
        rows.append(("native module", f"not built ({exc}); `pip install .` builds it"))
    bundle = _bundle_report(rows, native)

    verdict = _verdict(devices, native, bundle)
    width = max(len(k) for k, _ in rows)
    for key, value in rows:
        print(f"{key:<{width}}  {value}")
    print(verdict)
    return 1 if verdict.startswith("verdict: FAIL") else 0


def _verdict(devices, native, bundle) -> str:
    from .aot.default import cubin_loads_on

    if native is None:
        return ("verdict: FAIL: the native module is not built, so backends 'cpu' and 'aot' are "
                "unavailable (pip install . builds it); 'reference' works")
    if bundle["problem"]:
        return (f"verdict: FAIL: the default bundle cannot be used: {bundle['problem']} "
                "(reinstall luminamoon, or pass aot_bundle=DIR)")
    archs = list(bundle["keys"])
    have = ", ".join(_arch_names(archs))
    if not devices:
        if bundle["path"] is None:
            return "verdict: OK (CPU): no CUDA GPU here; backend 'cpu' runs, and there is no default bundle"
        return (f"verdict: OK (CPU): no CUDA GPU here; backend 'cpu' runs; the default bundle "
                f"({have}) is sound and serves backend='aot' on those GPUs")
    if bundle["path"] is None:
        return ("verdict: FAIL: no default bundle, so backend='aot' needs aot_bundle=DIR "
                "(luminamoon aot build --arch "
                f"{','.join(str(a) for _, _, a in devices)} --out DIR); 'triton' needs Triton")
    hip = [(i, name, a) for i, name, a in devices if isinstance(a, str)]
    if hip:
        return _hip_verdict(hip, native, archs, have)
    if not native.has_cuda_driver():
        return "verdict: FAIL: torch sees a GPU but libcuda.so.1 does not load for the native runtime"
    misses = [(i, name, a) for i, name, a in devices
              if not any(isinstance(c, int) and cubin_loads_on(c, a) for c in archs)]
    if misses:
        i, name, a = misses[0]
        return (f"verdict: FAIL: cuda:{i} ({name}) is sm_{a} and the default bundle has {have} "
                f"only (a cubin of sm_90 or newer loads on its own arch alone); build one with "
                f"`luminamoon aot build --arch {a} --out DIR` and pass aot_bundle=DIR")
    where = ", ".join(f"cuda:{i} ({name}, sm_{a})" for i, name, a in devices)
    return f"verdict: OK: backend='aot' runs on {where} with the default bundle, no Triton needed"


def _hip_verdict(devices, native, archs, have) -> str:
    """The verdict on a ROCm machine (devices with gfx archs)."""
    misses = [(i, name, a) for i, name, a in devices if a not in archs]
    if misses:
        i, name, a = misses[0]
        return (f"verdict: FAIL: cuda:{i} ({name}) is {a} and the default bundle has "
                f"{have or 'no arch'}; build one with `luminamoon aot build --arch {a} --out DIR` "
                "and pass aot_bundle=DIR, or use backend='triton'")
    has_hip = getattr(native, "has_hip_runtime", None)
    if has_hip is None or not has_hip():
        return ("verdict: FAIL: torch sees an AMD GPU but the native runtime cannot launch on it "
                "(no HIP runtime: libamdhip64.so does not load, or this luminav predates it); "
                "backend='triton' runs the kernels on ROCm")
    where = ", ".join(f"cuda:{i} ({name}, {a})" for i, name, a in devices)
    return (f"verdict: OK: the default bundle has code objects for {where}; no AMD GPU has run "
            "these kernels yet (docs/amd.md)")


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
