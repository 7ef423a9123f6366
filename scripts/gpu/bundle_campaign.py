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

Beside this file (the setup, the loaders' checks, the phases): campaign_mutations.py (the
mutants), campaign_workers.py (the driver and aot workers, started as this script with
--driver-worker / --aot-worker), campaign_report.py (the summary) and campaign_common.py (the
limits, the families and the log they share).
"""
from __future__ import annotations

import argparse
import concurrent.futures as cf
import csv
import datetime
import json
import os
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from collections import Counter
from typing import Any, Dict, List, Optional, Tuple

# The campaign's modules (campaign_*.py) sit beside this script
_HERE = os.path.dirname(os.path.abspath(__file__))
if _HERE not in sys.path:
    sys.path.insert(0, _HERE)

import campaign_common  # noqa: E402  (it puts tests/ and python/ on sys.path)
from campaign_common import (AOT_TIMEOUT_S, CUBIN_PROBE_MAX, DRIVER_TIMEOUT_S,  # noqa: E402
                             ROOT, T0, VERIFY_TIMEOUT_S, log)

import bundle_corpus  # noqa: E402  (tests/bundle_corpus.py: the corpus and its operations)
from campaign_mutations import apply_ops, generate  # noqa: E402
from campaign_report import _drv_class, summarise, versions, write_summary  # noqa: E402
from campaign_workers import (Lanes, aot_verdict, aot_worker, cubins_touched,  # noqa: E402
                              driver_verdict, driver_worker)


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
        if campaign_common._LOG is not None:
            campaign_common._LOG.write(p.stdout[-20000:] + p.stderr[-20000:])
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
# The campaign: the command line and its phases
# --------------------------------------------------------------------------------------------
def main(argv: Optional[List[str]] = None) -> int:
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
    campaign_common._LOG = open(os.path.join(args.out, "bundle_campaign.log"), "w")
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
        campaign_common._LOG.write(p.stdout[-5000:] + p.stderr[-20000:])
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
        # the corpus base's HIP entries (an "hsaco", no "cubin") are not for the CUDA driver
        corpus_entries = {e["cubin"]: e["entry"] for e in json.load(f)["kernels"] if "cubin" in e}
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
    campaign_common._LOG.write(text)
    campaign_common._LOG.close()
    return 0 if summary["ok"] else 1


if __name__ == "__main__":
    raise SystemExit(main())
