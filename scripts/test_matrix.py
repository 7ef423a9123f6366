#!/usr/bin/env python3
"""scripts/test_matrix.py: the PyTorch x Triton compatibility matrix (``make test-matrix``).

For every supported torch release (with the Triton its build pins) this makes a fresh virtual
environment, installs that torch, its Triton and LuminaMoon's own wheel (built once: the native
module does not link torch), and runs

  1. the whole pytest suite but test_cmake_install.py (it links no torch) and the FSDP2+TP
     example's torchrun test (make test runs both) (CPU tests; the
     Triton kernels under the interpreter run in the suite's child process; DTensor on two
     and four gloo ranks; the AOT builder; the libtorch adapter), and
  2. the command lines on a bundle this Triton builds: ``luminamoon aot build`` (sm_90, one
     dtype combination), ``luminamoon aot inspect`` and ``verify``, and the C++ loader's
     ``luminav verify`` (the trailing scratch pointers of this Triton's ABI).

Downloads go to one wheelhouse per pair, fetched while the pair before is being tested; pip's
own cache serves the packages pairs share. Each pair has a time limit. The summary (pair,
versions, passed, failed, skipped, seconds, trailing scratch pointers) is printed as a table,
written to ``--out``/summary.json and summary.md, and ends with ``N passed, N failed``; the exit
status is 1 when any pair failed or could not be installed.

A run in which every pair passed rewrites the documentation's compatibility table
(docs/compatibility-table.md, included by docs/compatibility.md); ``--table SUMMARY`` rewrites it
from a summary.json instead. The documentation names the supported torch and Triton range from
PAIRS below (docs/conf.py imports this module).
"""
from __future__ import annotations

import argparse
import datetime
import json
import os
import platform
import re
import shutil
import subprocess
import sys
import threading
import time
import xml.etree.ElementTree as ET
from dataclasses import dataclass, field
from pathlib import Path
from typing import Dict, List, Optional, Sequence

ROOT = Path(__file__).resolve().parent.parent


@dataclass(frozen=True)
class Pair:
    torch: str
    triton: str  # major.minor of the Triton torch's build pins (pip resolves it with torch)
    pins: tuple = ()  # extra requirements of this pair, each with its reason below
    above_pip_cap: bool = False  # newer than this kind of machine's pip cap (torch <= 2.14.1)

    @property
    def name(self) -> str:
        return f"torch {self.torch} + triton {self.triton}"


# Triton 3.0 and 3.1's interpreter (TRITON_INTERPRET=1) silently drops every tl.store with numpy
# 2.x (a one-line kernel leaves its output unchanged); numpy 1.26 works.
_NUMPY_1 = ("numpy<2",)

PAIRS: List[Pair] = [
    Pair("2.4.1", "3.0", _NUMPY_1),
    Pair("2.5.1", "3.1", _NUMPY_1),
    Pair("2.6.0", "3.2"),
    Pair("2.7.1", "3.3"),
    Pair("2.8.0", "3.4"),
    Pair("2.9.1", "3.5"),
    Pair("2.12.1", "3.7"),
    Pair("2.14.1", "3.8"),
    Pair("2.15.0", "3.9", above_pip_cap=True),
]

TEST_REQUIREMENTS = ("pytest", "pytest-timeout", "hypothesis", "msgpack")
# LuminaMoon's own run-time requirement besides torch (its wheel is installed with --no-deps).
RUNTIME_REQUIREMENTS = ("numpy",)


def _log(msg: str) -> None:
    print(f"[matrix {time.strftime('%H:%M:%S')}] {msg}", flush=True)


def _pip_env(pair: Optional["Pair"] = None, work: Optional[Path] = None) -> Dict[str, str]:
    env = dict(os.environ)
    env.pop("PYTHONPATH", None)
    # pip's own cache would keep a second copy of every pair's ~3 GB of CUDA wheels until the
    # disk is full; the wheelhouses below are the cache (see Prefetch)
    env["PIP_NO_CACHE_DIR"] = "1"
    if pair is not None and pair.above_pip_cap and work is not None:
        # This kind of machine caps pip at torch 2.14.1 (/etc/xdg/pip); for this pair's own
        # downloads and installs the constraint file is replaced by an empty one.
        empty = work / "no-constraints.txt"
        empty.write_text("")
        env["PIP_CONSTRAINT"] = str(empty)
    return env


def _requirements(pair: Pair) -> List[str]:
    numpy = [] if any(p.startswith("numpy") for p in pair.pins) else list(RUNTIME_REQUIREMENTS)
    return [f"torch=={pair.torch}", *pair.pins, *numpy, *TEST_REQUIREMENTS]


# Wheels of at most this size are kept in the shared wheelhouse after a pair installed them
# (pytest, numpy, sympy, ...: what pairs share); torch, Triton and the nvidia packages, which
# differ from release to release, are deleted once installed.
SHARED_WHEEL_MAX_BYTES = 64 << 20
DOWNLOAD_TIMEOUT_S = 1200
TEST_TIMEOUT_S = 240  # one test's limit in a pair (pytest-timeout)


class Prefetch:
    """``pip download`` of one pair's wheels into its wheelhouse, in a background thread;
    wheels the shared wheelhouse already holds are copied from there, not downloaded again."""

    def __init__(self, pair: Pair, wheelhouse: Path, python: str, shared: Path):
        self.pair, self.wheelhouse, self.python, self.shared = pair, wheelhouse, python, shared
        self.returncode: Optional[int] = None
        self.output = ""
        self.seconds = 0.0
        self.thread = threading.Thread(target=self._run, daemon=True)
        self.thread.start()

    def _run(self) -> None:
        t0 = time.monotonic()
        self.wheelhouse.mkdir(parents=True, exist_ok=True)
        self.shared.mkdir(parents=True, exist_ok=True)
        cmd = [self.python, "-m", "pip", "download", "-q", "--disable-pip-version-check",
               "--find-links", str(self.shared), "-d", str(self.wheelhouse),
               *_requirements(self.pair)]
        try:
            proc = subprocess.run(cmd, env=_pip_env(self.pair, self.wheelhouse.parent),
                                  stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                                  timeout=DOWNLOAD_TIMEOUT_S)
            self.returncode, self.output = proc.returncode, proc.stdout
        except subprocess.TimeoutExpired as e:
            out = e.stdout.decode(errors="replace") if isinstance(e.stdout, bytes) else (e.stdout or "")
            self.returncode = -1
            self.output = out + f"\nerror: download timed out after {DOWNLOAD_TIMEOUT_S} s\n"
        self.seconds = time.monotonic() - t0

    def wait(self) -> None:
        self.thread.join()

    def release(self) -> None:
        """After the install: the small wheels move to the shared wheelhouse, the rest go."""
        if self.wheelhouse.is_dir():
            for whl in self.wheelhouse.iterdir():
                if whl.suffix == ".whl" and whl.stat().st_size <= SHARED_WHEEL_MAX_BYTES:
                    dest = self.shared / whl.name
                    if not dest.exists():
                        shutil.move(str(whl), dest)
        shutil.rmtree(self.wheelhouse, ignore_errors=True)


@dataclass
class Result:
    pair: Pair
    status: str = "not run"  # "ok", "failed", "install failed", "timeout"
    versions: Dict[str, str] = field(default_factory=dict)
    passed: int = 0
    failed: int = 0
    skipped: int = 0
    errors: int = 0
    seconds: float = 0.0
    install_seconds: float = 0.0
    download_seconds: float = 0.0
    trailing_scratch: Optional[int] = None
    detail: str = ""


def _run(cmd: Sequence[str], *, timeout: float, cwd: Path = ROOT, env=None, log: Path):
    """Runs ``cmd`` with its output appended to ``log``; returns the exit status or None on
    timeout (the process group is killed)."""
    with open(log, "a") as fh:
        fh.write(f"\n$ {' '.join(map(str, cmd))}\n")
        fh.flush()
        proc = subprocess.Popen(list(map(str, cmd)), cwd=cwd, env=env, stdout=fh,
                                stderr=subprocess.STDOUT, start_new_session=True)
        try:
            return proc.wait(timeout=max(timeout, 1))
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, 9)
            proc.wait()
            fh.write(f"\n[timed out after {timeout:.0f} s]\n")
            return None


def _junit_counts(path: Path) -> Dict[str, int]:
    root = ET.parse(path).getroot()
    suites = [root] if root.tag == "testsuite" else list(root)
    counts = dict(tests=0, failures=0, errors=0, skipped=0)
    for s in suites:
        for k in counts:
            counts[k] += int(s.get(k, 0))
    return counts


def run_pair(pair: Pair, prefetch: Prefetch, wheel: Path, work: Path, timeout: float,
             keep_bundles: Optional[Path], on_installed=lambda: None) -> Result:
    """Installs and tests one pair. The time limit counts from the end of its download (which
    ran while the pair before was tested); ``on_installed`` is called once its wheelhouse is
    gone (the next pair's download starts then, so at most one pair's wheels and one venv are on
    disk). Whatever way it ends, its venv, caches and temporary files are removed."""
    res = Result(pair)
    log = work / f"torch-{pair.torch}.log"
    log.write_text(f"{pair.name}\n")
    venv = work / "venv"
    scratch = [venv, work / f"triton-cache-{pair.torch}", work / f"inductor-cache-{pair.torch}",
               work / f"pytest-tmp-{pair.torch}", work / f"bundle-torch-{pair.torch}"]
    for d in scratch:
        shutil.rmtree(d, ignore_errors=True)
    t_wait = time.monotonic()
    prefetch.wait()
    res.download_seconds = prefetch.seconds
    try:
        with open(log, "a") as fh:
            fh.write(prefetch.output)
            fh.write(f"[download {prefetch.seconds:.0f} s, waited {time.monotonic() - t_wait:.0f}"
                     f" s; {_free_gb(work):.1f} GB free]\n")
        t0 = time.monotonic()
        if prefetch.returncode != 0:
            res.status, res.detail = "install failed", _last_error(prefetch.output)
            return res
        _pair_body(res, pair, prefetch, wheel, work, t0 + timeout, keep_bundles, log, venv,
                   lambda: (prefetch.release(), on_installed()))
        return res
    finally:
        prefetch.release()  # a no-op when the install released it
        _kill_strays(venv)
        for d in scratch:
            shutil.rmtree(d, ignore_errors=True)
        res.seconds = time.monotonic() - t_wait


def _kill_strays(venv: Path) -> None:
    """Kills what still runs from ``venv`` once its pair is done: torchrun starts its workers in
    sessions of their own, so a rank a hung test leaves behind outlives the killed pytest (and
    would hold its rendezvous port and CPU through the pairs after it)."""
    prefix = str(venv) + os.sep
    mine = os.getpid()
    for entry in Path("/proc").iterdir() if Path("/proc").is_dir() else []:
        if not entry.name.isdigit() or int(entry.name) == mine:
            continue
        try:
            argv0 = (entry / "cmdline").read_bytes().split(b"\0", 1)[0].decode(errors="replace")
        except OSError:
            continue
        if argv0.startswith(prefix):
            try:
                os.kill(int(entry.name), 9)
                _log(f"killed pid {entry.name} left running from {venv.name}: {argv0}")
            except OSError:
                pass


def _free_gb(path: Path) -> float:
    return shutil.disk_usage(path).free / 2**30


def _pair_body(res: Result, pair: Pair, prefetch: Prefetch, wheel: Path, work: Path,
               deadline: float, keep_bundles: Optional[Path], log: Path, venv: Path,
               installed) -> None:
    t0 = time.monotonic()
    env = _pip_env(pair, work)
    py = venv / "bin" / "python"
    steps = [
        [sys.executable, "-m", "venv", str(venv)],
        [py, "-m", "pip", "install", "-q", "--disable-pip-version-check", "--no-index",
         "--find-links", str(prefetch.wheelhouse), "--find-links", str(prefetch.shared),
         *_requirements(pair)],
        [py, "-m", "pip", "install", "-q", "--disable-pip-version-check", "--no-deps",
         str(wheel)],
    ]
    for cmd in steps:
        rc = _run(cmd, timeout=deadline - time.monotonic(), env=env, log=log)
        if rc != 0:
            res.status = "timeout" if rc is None else "install failed"
            res.detail = _last_error(log.read_text())
            return
    installed()  # the wheels are installed: their space is needed for the next pair's
    res.install_seconds = time.monotonic() - t0
    probe = subprocess.run(
        [str(py), "-c", "import json, numpy, torch, triton, luminamoon; print(json.dumps({"
         "'torch': torch.__version__, 'triton': triton.__version__, "
         "'numpy': numpy.__version__, 'luminamoon': luminamoon.__version__}))"],
        env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, cwd=work)
    if probe.returncode != 0:
        res.status, res.detail = "failed", _last_error(probe.stdout)
        return
    res.versions = json.loads(probe.stdout.strip().splitlines()[-1])
    if not res.versions["triton"].startswith(pair.triton + "."):
        res.status = "failed"
        res.detail = f"torch {pair.torch} brought Triton {res.versions['triton']}, not {pair.triton}"
        return

    # 1. the suite
    junit = work / f"torch-{pair.torch}.xml"
    # its own Triton cache: compiled kernels of other releases (other pairs, the main suite)
    # never meet this one's
    test_env = dict(env, LUMINAMOON_REQUIRE_NATIVE="1",
                    TRITON_CACHE_DIR=str(work / f"triton-cache-{pair.torch}"),
                    TORCHINDUCTOR_CACHE_DIR=str(work / f"inductor-cache-{pair.torch}"))
    test_env.pop("TRITON_INTERPRET", None)
    rc = _run([py, "-m", "pytest", "-q", "-ra", "-p", "no:cacheprovider", "--rootdir", ROOT,
               "-c", ROOT / "pyproject.toml", f"--junitxml={junit}",
               f"--basetemp={work / f'pytest-tmp-{pair.torch}'}",
               # a test that hangs fails alone, with its stack, and the pair goes on
               f"--timeout={TEST_TIMEOUT_S}",
               # make test runs these once: the C/C++ install, the bundle rule book and pip's
               # isolated build (test_pip_install.py) use no torch and no Triton; the FSDP2+TP
               # example's three torchrun launches of four
               # ranks (its placements run in every pair through test_dist_wrappers.py)
               # (ignore takes paths from tests/, deselect node ids from the rootdir)
               "--ignore=test_cmake_install.py", "--ignore=test_bundle_rules.py",
               "--ignore=test_pip_install.py",
               "--deselect=tests/test_examples.py::test_fsdp_tp_trains_and_resumes_bitwise",
               "."],
              timeout=deadline - time.monotonic(), cwd=ROOT / "tests", env=test_env, log=log)
    if junit.exists():
        c = _junit_counts(junit)
        res.failed, res.errors, res.skipped = c["failures"], c["errors"], c["skipped"]
        res.passed = c["tests"] - c["failures"] - c["errors"] - c["skipped"]
    if rc is None:
        res.status = "timeout"
    elif rc != 0 or not junit.exists():
        res.status = "failed"
        res.detail = _failed_tests(log.read_text()) or _last_error(log.read_text())

    # 2. the command lines on a bundle of this Triton
    if res.status == "not run":
        bundle = work / f"bundle-torch-{pair.torch}"
        shutil.rmtree(bundle, ignore_errors=True)
        luminav = str(Path(py).parent / "luminav")  # the wheel's script, on the venv's PATH
        cli = [
            [py, "-m", "luminamoon", "aot", "build", "--arch", "90", "--out", bundle,
             "--dtypes", "fp32:fp32:fp32", "--jobs", "2", "--quiet"],
            [py, "-m", "luminamoon", "aot", "inspect", bundle],
            [py, "-m", "luminamoon", "aot", "verify", bundle],
            [luminav, "verify", bundle],
        ]
        if keep_bundles is not None:  # kept for the GPU run: bf16 storage (SR) variants too
            cli[0] = [py, "-m", "luminamoon", "aot", "build", "--arch", "90", "--out", bundle,
                      "--dtypes", "fp32:fp32:fp32,bf16:bf16:fp32,bf16:bf16:bf16", "--jobs", "2",
                      "--quiet"]
        for cmd in cli:
            rc = _run(cmd, timeout=deadline - time.monotonic(), env=test_env, log=log, cwd=work)
            if rc != 0:
                res.status = "timeout" if rc is None else "failed"
                res.detail = f"{Path(str(cmd[0])).name} {' '.join(map(str, cmd[1:4]))}: " \
                             f"{_last_error(log.read_text())}"
                res.failed += 1
                break
        else:
            res.passed += 1
            man = json.loads((bundle / "manifest.json").read_text())
            res.trailing_scratch = sorted({k["num_trailing_scratch_ptrs"]
                                           for k in man["kernels"]})[0]
            if keep_bundles is not None:
                dest = keep_bundles / f"triton-{res.versions.get('triton', pair.triton)}"
                shutil.rmtree(dest, ignore_errors=True)
                shutil.copytree(bundle, dest)
        shutil.rmtree(bundle, ignore_errors=True)
    if res.status == "not run":
        res.status = "ok"


def _last_error(text: str) -> str:
    lines = [ln.strip() for ln in text.strip().splitlines() if ln.strip()]
    for ln in reversed(lines):
        if re.search(r"error|Error|ERROR|No matching|not find|Timed out|timed out", ln):
            return ln[:300]
    return lines[-1][:300] if lines else ""


def _failed_tests(text: str) -> str:
    names = re.findall(r"^(?:FAILED|ERROR) (\S+)", text, flags=re.M)
    return ", ".join(names[:6]) + (f" (+{len(names) - 6} more)" if len(names) > 6 else "")


# ------------------------------------------------------------------------------------- output
def _table(results: List[Result]) -> str:
    head = ["pair", "torch", "triton", "numpy", "status", "passed", "failed", "skipped",
            "scratch ptrs", "seconds"]
    rows = []
    for r in results:
        v = r.versions
        rows.append([r.pair.name, v.get("torch", "-"), v.get("triton", "-"),
                     v.get("numpy", "-"), r.status, str(r.passed), str(r.failed + r.errors),
                     str(r.skipped), "-" if r.trailing_scratch is None else str(r.trailing_scratch),
                     f"{r.seconds:.0f}"])
    widths = [max(len(h), *(len(row[i]) for row in rows)) for i, h in enumerate(head)]
    line = lambda cells: "| " + " | ".join(c.ljust(w) for c, w in zip(cells, widths)) + " |"
    out = [line(head), "|" + "|".join("-" * (w + 2) for w in widths) + "|"]
    out += [line(r) for r in rows]
    return "\n".join(out)


def _summary_line(results: List[Result]) -> str:
    ok = sum(r.status == "ok" for r in results)
    late = sum(r.status == "not run" for r in results)
    line = f"{ok} passed, {len(results) - ok - late} failed"
    return line + (f", {late} not run (--deadline-min)" if late else "")


def write_summary(results: List[Result], out: Path) -> None:
    data = {
        "date": datetime.date.today().isoformat(),
        "machine": f"{platform.machine()}, {os.cpu_count()} cores, {_cpu_name()}",
        "python": platform.python_version(),
        "pairs": [dict(torch=r.pair.torch, triton=r.pair.triton, pins=list(r.pair.pins),
                       status=r.status, versions=r.versions, passed=r.passed,
                       failed=r.failed + r.errors, skipped=r.skipped,
                       trailing_scratch=r.trailing_scratch, seconds=round(r.seconds, 1),
                       install_seconds=round(r.install_seconds, 1),
                       download_seconds=round(r.download_seconds, 1), detail=r.detail)
                  for r in results],
    }
    (out / "summary.json").write_text(json.dumps(data, indent=1) + "\n")
    (out / "summary.md").write_text(_table(results) + "\n\n" + _summary_line(results) + "\n")


def _cpu_name() -> str:
    try:
        for ln in Path("/proc/cpuinfo").read_text().splitlines():
            if ln.startswith("model name"):
                return ln.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or "unknown CPU"


TABLE_FILE = ROOT / "docs" / "compatibility-table.md"
TABLE_BEGIN = "<!-- compatibility table: written by scripts/test_matrix.py -->"
TABLE_END = "<!-- end of compatibility table -->"


def table_section(summary: dict) -> str:
    lines = [TABLE_BEGIN, "",
             f"Run of {summary['date']} on {summary['machine']}, Python {summary['python']} "
             f"(`make test-matrix`; every pair in a fresh virtual environment: the pytest "
             f"suite on CPU but the three parts `make test` runs once, the Triton kernels "
             f"under the interpreter, DTensor on two and four gloo ranks, and a bundle this "
             f"Triton builds through `luminamoon aot build`, `inspect`, `verify` and "
             f"`luminav verify`):", "",
             "| torch | Triton | numpy | result | tests passed / failed / skipped | "
             "trailing scratch pointers |",
             "|---|---|---|---|---|---|"]
    for p in summary["pairs"]:
        v = p["versions"]
        result = p["status"] if not p["detail"] else f"{p['status']}: {p['detail']}"
        pins = f" (pinned: {', '.join(p['pins'])})" if p["pins"] else ""
        scratch = "-" if p["trailing_scratch"] is None else str(p["trailing_scratch"])
        lines.append(f"| {v.get('torch', p['torch'])} | {v.get('triton', p['triton'])} | "
                     f"{v.get('numpy', '-')}{pins} | {result} | {p['passed']} / {p['failed']} / "
                     f"{p['skipped']} | {scratch} |")
    lines += ["", TABLE_END]
    return "\n".join(lines)


def write_table(summary_path: Path, table: Path = TABLE_FILE) -> None:
    """Writes the compatibility table the documentation includes from a summary.json."""
    summary = json.loads(summary_path.read_text())
    table.write_text(table_section(summary) + "\n")


def main(argv: Optional[Sequence[str]] = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--wheel", type=Path, help="the luminamoon wheel to install in every pair")
    ap.add_argument("--out", type=Path, default=ROOT / "build" / "matrix",
                    help="folder for logs and the summary (default build/matrix)")
    ap.add_argument("--pairs", default="", help="comma-separated torch releases to run "
                    "(default: all of " + ", ".join(p.torch for p in PAIRS) + ")")
    ap.add_argument("--timeout", type=float, default=1200,
                    help="seconds allowed per pair: install and tests (default 1200; a pair "
                    "takes 3 to 11 minutes on two cores, by the machine)")
    ap.add_argument("--keep-bundles", type=Path, default=None,
                    help="keep each Triton's bundle (sm_90; fp32 and bf16 storage) under this "
                    "folder as triton-<version>/ (for the GPU run)")
    ap.add_argument("--deadline-min", type=float, default=None,
                    help="start no pair after this many minutes (CI's time limit); the pairs "
                    "left are reported as not run and do not fail the run")
    ap.add_argument("--table", type=Path, default=None,
                    help="only rewrite docs/compatibility-table.md from this summary.json")
    args = ap.parse_args(argv)
    if args.table is not None:
        write_table(args.table)
        return 0
    if args.wheel is None or not args.wheel.is_file():
        ap.error("--wheel must name the built luminamoon wheel (make test-matrix builds it)")
    wanted = [p for p in PAIRS if not args.pairs or p.torch in args.pairs.split(",")]
    if not wanted:
        ap.error(f"--pairs {args.pairs!r} names none of {[p.torch for p in PAIRS]}")
    out = args.out.resolve()
    out.mkdir(parents=True, exist_ok=True)
    keep = args.keep_bundles.resolve() if args.keep_bundles else None
    if keep:
        keep.mkdir(parents=True, exist_ok=True)
    wheel = args.wheel.resolve()
    houses = out / "wheelhouse"
    shared = houses / "shared"
    results: List[Result] = []
    started = time.monotonic()
    fetch = lambda pair: Prefetch(pair, houses / pair.torch, sys.executable, shared)
    prefetch: Optional[Prefetch] = fetch(wanted[0])
    for i, pair in enumerate(wanted):
        nxt = wanted[i + 1] if i + 1 < len(wanted) else None
        if args.deadline_min is not None and time.monotonic() - started > 60 * args.deadline_min:
            results.append(Result(pair, detail=f"not started: past --deadline-min "
                                  f"{args.deadline_min:g}"))
            _log(f"{pair.name}: not run (past --deadline-min {args.deadline_min:g})")
            write_summary(results, out)
            continue
        if prefetch is None:
            prefetch = fetch(pair)
        _log(f"{pair.name}: downloading and installing ({_free_gb(out):.1f} GB free)")
        current, prefetch = prefetch, None
        started_next: List[Prefetch] = []
        # the next pair downloads while this one is tested, once this one's wheels are gone
        on_installed = (lambda: started_next.append(fetch(nxt))) if nxt else (lambda: None)
        res = run_pair(pair, current, wheel, out, args.timeout, keep, on_installed)
        prefetch = started_next[0] if started_next else None
        _log(f"{pair.name}: {res.status}, {res.passed} passed, {res.failed + res.errors} "
             f"failed, {res.skipped} skipped in {res.seconds:.0f} s (download "
             f"{res.download_seconds:.0f} s, install {res.install_seconds:.0f} s)"
             + (f" ({res.detail})" if res.detail else ""))
        results.append(res)
        write_summary(results, out)
    if prefetch is not None:
        prefetch.wait()
    shutil.rmtree(houses, ignore_errors=True)
    print()
    print(_table(results))
    print()
    print(_summary_line(results))
    if len(wanted) == len(PAIRS) and all(r.status == "ok" for r in results):
        write_table(out / "summary.json")
        _log(f"every pair passed: {TABLE_FILE.relative_to(ROOT)} rewritten")
    return 0 if all(r.status in ("ok", "not run") for r in results) else 1


if __name__ == "__main__":
    sys.exit(main())
