"""Cold start: wall time from process launch to the first finished optimizer step.

Every measurement runs in a FRESH process; the parent's clock (CLOCK_MONOTONIC, which every
process of the machine shares) starts just before the spawn. The model is small (default: 8
tensors of 1M bf16 elements, fp32 moments, LuminaMoon's default hyperparameters: clip 4,
nonfinite "skip"), so the numbers are start-up costs, not bandwidth.

Cases:
  luminav      `luminav bench BUNDLE --steps 1 --warmup 0`: the C++ engine, no Python. Also the
               process's own report (from main() to the first step synchronised).
  aot          python + torch + LuminaMoon(backend="aot", aot_bundle=BUNDLE).
  triton-cold  backend="triton" with an EMPTY Triton cache (TRITON_CACHE_DIR = a fresh folder):
               the first step JIT-compiles its kernels.
  triton-warm  the same again with the folder the cold run filled (cache hits).
The Python children report, on their own clock, when their first statement ran, when
`import torch` finished and when the first step was synchronised.

Columns (milliseconds; median over --repeats fresh processes, and the minimum):
  launch->step   the parent's spawn to the child's first finished step (stream synchronised);
  after torch    `import torch` done to the first finished step (Python cases);
  self           the child's own count: main() (luminav) or its first statement (Python) to the
                 first finished step;
  data           of that, creating the params and grads (host RNG + upload for luminav, torch
                 on the device for Python), which is the benchmark's, not the optimizer's;
  to main        spawn to main() / the first statement: the runtime's own start;
  process        spawn to exit (includes tearing down CUDA).

Rows are appended to benchmarks/results/<date>-<device>-cold-start.csv (--out to choose) with
the device, torch, triton and driver versions and the date.

Without --bundle, a bundle is built for the device's arch and the model's dtype combination
with luminamoon.aot.builder into a temporary folder (removed afterwards). Without --luminav the
newest build/*/optimizer/luminav of this checkout is used.

  PYTHONPATH=python python benchmarks/bench_cold_start.py [--bundle DIR] [--luminav PATH]
      [--repeats N] [--cases luminav,aot,triton-cold,triton-warm] [--out CSV]

Needs a CUDA device; `--device cpu` is a smoke run of the CPU paths only (`luminav bench -
--device cpu` and backend="cpu"), for machines without one.
"""
from __future__ import annotations

import argparse
import csv
import datetime as _dt
import glob
import json
import os
import re
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, field
from typing import Dict, List, Optional, Sequence

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)
PYTHON_DIR = os.path.join(ROOT, "python")

CUDA_CASES = ("luminav", "aot", "triton-cold", "triton-warm")
CPU_CASES = ("luminav", "cpu")
MARK = "LUMINAMOON_COLD_START "

# The child: time stamps first, then torch, then the optimizer; one JSON line at the end.
# Its configuration comes as one JSON argument.
CHILD = r"""
import time
T_START = time.monotonic()
import json, sys
cfg = json.loads(sys.argv[1])
import torch
T_TORCH = time.monotonic()
from luminamoon import LuminaMoon
T_IMPORT = time.monotonic()
device = torch.device(cfg["device"])
dtype = getattr(torch, cfg["dtype"])
gen = torch.Generator(device=device).manual_seed(0)
params = []
for _ in range(cfg["tensors"]):
    p = torch.empty(cfg["numel"], device=device, dtype=dtype).normal_(generator=gen).mul_(0.02)
    p.grad = torch.empty_like(p).normal_(generator=gen).mul_(1e-3)
    params.append(p)
sync = (lambda: torch.cuda.synchronize(device)) if device.type == "cuda" else (lambda: None)
sync()
T_DATA = time.monotonic()
opt = LuminaMoon(params, seed=0, backend=cfg["backend"], aot_bundle=cfg["bundle"],
                 state_dtype=getattr(torch, cfg["state_dtype"]))
opt.step()
sync()
T_STEP = time.monotonic()
steps = [int(opt.state[p]["step"]) for p in params]
if steps != [1] * len(params) or int(opt.skipped_steps) != 0:
    sys.exit(f"the first step was not applied: steps {steps}, skipped {int(opt.skipped_steps)}")
print("LUMINAMOON_COLD_START " + json.dumps(dict(
    start=T_START, torch=T_TORCH, imported=T_IMPORT, data=T_DATA, step=T_STEP,
    backends=sorted({type(b).__name__
                     for b in getattr(getattr(opt, "_plan", None), "backends", ())}))), flush=True)
"""


class BenchError(RuntimeError):
    """The benchmark cannot run as asked; the message names the value and the fix."""


@dataclass
class Run:
    """One fresh process: times in ms, None where the case has no such number."""

    launch_to_step: float
    process: float
    to_main: float
    self_ms: float
    data: float
    after_torch: Optional[float] = None


@dataclass
class CaseResult:
    case: str
    runs: List[Run] = field(default_factory=list)
    failure: Optional[str] = None
    extra: Dict[str, str] = field(default_factory=dict)  # e.g. the driver version luminav saw


# ------------------------------------------------------------------------------------------
# Finding the tools
# ------------------------------------------------------------------------------------------
def find_luminav(given: Optional[str]) -> str:
    if given:
        if not (os.path.isfile(given) and os.access(given, os.X_OK)):
            raise BenchError(f"--luminav {given!r} is not an executable file; give the luminav "
                             "binary of a build (e.g. build/gpu/optimizer/luminav)")
        return given
    found = sorted((p for p in glob.glob(os.path.join(ROOT, "build", "*", "optimizer", "luminav"))
                    if os.path.isfile(p) and os.access(p, os.X_OK)),
                   key=os.path.getmtime, reverse=True)
    for path in found:  # the newest build that has the bench subcommand
        probe = subprocess.run([path, "bench", "--help"], stdout=subprocess.DEVNULL,
                               stderr=subprocess.DEVNULL)
        if probe.returncode == 0:
            return path
    raise BenchError(f"no luminav binary with the bench subcommand under build/*/optimizer/ "
                     f"(found {len(found)} without it); build one (cmake -S . -B build/gpu -G "
                     "Ninja && cmake --build build/gpu --target luminav_cli) or pass --luminav PATH")


def build_bundle(arch: int, dtype: str, state_dtype: str, out_dir: str) -> None:
    """Every variant of one (param, grad, state) dtype combination for one arch."""
    import torch

    sys.path.insert(0, PYTHON_DIR)
    from luminamoon.aot.builder import build_bundle as build

    combo = (getattr(torch, dtype), getattr(torch, dtype), getattr(torch, state_dtype))
    t = time.monotonic()
    manifest = build(out_dir, archs=(arch,), dtype_combos=[combo], jobs=min(16, os.cpu_count() or 1),
                     progress=False)
    print(f"built a bundle of {len(manifest['kernels'])} kernels for sm_{arch} "
          f"({dtype}:{dtype}:{state_dtype}) in {time.monotonic() - t:.1f} s: {out_dir}")


# ------------------------------------------------------------------------------------------
# Children
# ------------------------------------------------------------------------------------------
def child_env(extra: Optional[Dict[str, str]] = None) -> Dict[str, str]:
    env = dict(os.environ)
    env.pop("TRITON_INTERPRET", None)  # the children run the compiled kernels
    env["PYTHONPATH"] = PYTHON_DIR + (os.pathsep + env["PYTHONPATH"] if env.get("PYTHONPATH") else "")
    env.update(extra or {})
    return env


def spawn(cmd: Sequence[str], env: Dict[str, str], timeout: float):
    """(parent clock at spawn, at exit, CompletedProcess)."""
    t0 = time.monotonic()
    proc = subprocess.run(list(cmd), env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                          text=True, timeout=timeout)
    return t0, time.monotonic(), proc


def _tail(text: str, lines: int = 6) -> str:
    return " | ".join(line for line in text.strip().splitlines()[-lines:])


def run_luminav(luminav: str, bundle: Optional[str], args, timeout: float, extra: Dict[str, str]
                ) -> Run:
    with tempfile.TemporaryDirectory(prefix="lv-cold-") as tmp:
        row_file = os.path.join(tmp, "row.csv")
        cmd = [luminav, "bench", bundle or "-", "--device", args.device, "--steps", "1",
               "--warmup", "0", "--tensors", str(args.tensors), "--numel", str(args.numel),
               "--dtype", args.dtype_word, "--state-dtype", args.state_dtype_word,
               "--csv", row_file]
        if args.device == "cuda":
            cmd += ["--device-index", str(args.device_index)]
        t0, t1, proc = spawn(cmd, child_env(), timeout)
        if proc.returncode != 0:
            raise BenchError(f"luminav bench exited with {proc.returncode}: "
                             f"{_tail(proc.stderr or proc.stdout)}")
        with open(row_file, newline="") as f:
            rows = list(csv.DictReader(f))
    if len(rows) != 1:
        raise BenchError(f"luminav bench wrote {len(rows)} CSV rows, expected 1")
    row = rows[0]
    extra.update(driver=row["driver"], device=row["device"])
    cold = float(row["cold_start_ms"])
    return Run(launch_to_step=(float(row["first_step_done_monotonic_s"]) - t0) * 1e3,
               process=(t1 - t0) * 1e3,
               to_main=(float(row["main_start_monotonic_s"]) - t0) * 1e3,
               self_ms=cold, data=cold - float(row["cold_start_excl_data_ms"]))


def run_python(backend: str, bundle: Optional[str], args, timeout: float,
               env_extra: Optional[Dict[str, str]], extra: Dict[str, str]) -> Run:
    cfg = dict(device=args.device_spec, dtype=args.dtype, state_dtype=args.state_dtype,
               tensors=args.tensors, numel=args.numel, backend=backend, bundle=bundle)
    t0, t1, proc = spawn([sys.executable, "-c", CHILD, json.dumps(cfg)], child_env(env_extra),
                         timeout)
    lines = [ln for ln in proc.stdout.splitlines() if ln.startswith(MARK)]
    if proc.returncode != 0 or not lines:
        raise BenchError(f"the Python child ({backend}) exited with {proc.returncode}: "
                         f"{_tail(proc.stderr or proc.stdout)}")
    r = json.loads(lines[-1][len(MARK):])
    extra["backends"] = ",".join(r["backends"])
    return Run(launch_to_step=(r["step"] - t0) * 1e3, process=(t1 - t0) * 1e3,
               to_main=(r["start"] - t0) * 1e3, self_ms=(r["step"] - r["start"]) * 1e3,
               data=(r["data"] - r["imported"]) * 1e3,
               after_torch=(r["step"] - r["torch"]) * 1e3)


# ------------------------------------------------------------------------------------------
# Report
# ------------------------------------------------------------------------------------------
def _med(values: Sequence[Optional[float]]) -> Optional[float]:
    vals = [v for v in values if v is not None]
    return statistics.median(vals) if vals else None


def _fmt(v: Optional[float]) -> str:
    return "-" if v is None else f"{v:.1f}"


COLUMNS = ("launch->step", "min", "after torch", "self", "data", "to main", "process")


def summary(res: CaseResult) -> Dict[str, Optional[float]]:
    runs = res.runs
    return {
        "launch->step": _med([r.launch_to_step for r in runs]),
        "min": min(r.launch_to_step for r in runs) if runs else None,
        "after torch": _med([r.after_torch for r in runs]),
        "self": _med([r.self_ms for r in runs]),
        "data": _med([r.data for r in runs]),
        "to main": _med([r.to_main for r in runs]),
        "process": _med([r.process for r in runs]),
    }


def print_table(results: List[CaseResult]) -> None:
    header = f"{'case':<12} " + " ".join(f"{c:>12}" for c in COLUMNS)
    print(header)
    print("-" * len(header))
    for res in results:
        if res.failure:
            print(f"{res.case:<12} failed: {res.failure}")
            continue
        s = summary(res)
        print(f"{res.case:<12} " + " ".join(f"{_fmt(s[c]):>12}" for c in COLUMNS))


def write_csv(path: str, results: List[CaseResult], meta: Dict[str, str]) -> int:
    rows = []
    for res in results:
        if res.failure or not res.runs:
            continue
        s = summary(res)
        row = dict(meta)
        row.update(case=res.case, repeats=len(res.runs),
                   launch_to_step_ms_median=_fmt(s["launch->step"]),
                   launch_to_step_ms_min=_fmt(s["min"]),
                   after_torch_ms_median=_fmt(s["after torch"]),
                   self_ms_median=_fmt(s["self"]), data_ms_median=_fmt(s["data"]),
                   to_main_ms_median=_fmt(s["to main"]), process_ms_median=_fmt(s["process"]),
                   backends=res.extra.get("backends", "luminav-engine"))
        rows.append(row)
    if not rows:
        return 0
    os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
    new = not os.path.exists(path) or os.path.getsize(path) == 0
    if not new:
        with open(path, newline="") as f:
            existing = next(csv.reader(f), [])
        if existing != list(rows[0]):
            raise BenchError(f"--out {path} holds other columns; append to a new file instead")
    with open(path, "a", newline="") as f:
        w = csv.DictWriter(f, fieldnames=list(rows[0]))
        if new:
            w.writeheader()
        w.writerows(rows)
    return len(rows)


# ------------------------------------------------------------------------------------------
# Main
# ------------------------------------------------------------------------------------------
DTYPES = {"bf16": "bfloat16", "fp32": "float32"}


def parse_args(argv: Optional[List[str]]):
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--device", choices=("cuda", "cpu"), default="cuda",
                    help="cuda (default); cpu is a smoke run of the CPU paths")
    ap.add_argument("--device-index", type=int, default=0)
    ap.add_argument("--bundle", default=None,
                    help="AOT bundle folder (default: build one for this device's arch)")
    ap.add_argument("--luminav", default=None,
                    help="the luminav binary (default: the newest build/*/optimizer/luminav)")
    ap.add_argument("--repeats", type=int, default=3, help="fresh processes per case (default 3)")
    ap.add_argument("--cases", default=None,
                    help=f"comma-separated subset (cuda: {','.join(CUDA_CASES)}; "
                         f"cpu: {','.join(CPU_CASES)})")
    ap.add_argument("--tensors", type=int, default=8)
    ap.add_argument("--numel", type=int, default=1 << 20)
    ap.add_argument("--dtype", choices=sorted(DTYPES), default="bf16", help="params and grads")
    ap.add_argument("--state-dtype", choices=sorted(DTYPES), default="fp32")
    ap.add_argument("--timeout", type=float, default=600.0, help="seconds per child process")
    ap.add_argument("--out", default=None, help="CSV file to append to")
    args = ap.parse_args(argv)
    if args.repeats < 1:
        ap.error(f"--repeats must be >= 1, got {args.repeats}")
    if args.tensors < 1 or args.numel < 1:
        ap.error(f"--tensors and --numel must be >= 1, got {args.tensors} and {args.numel}")
    if args.device_index < 0:
        ap.error(f"--device-index must be >= 0, got {args.device_index}")
    known = CUDA_CASES if args.device == "cuda" else CPU_CASES
    args.case_list = list(known) if args.cases is None else [c for c in args.cases.split(",") if c]
    for c in args.case_list:
        if c not in known:
            ap.error(f"unknown case {c!r} for --device {args.device}; known: {', '.join(known)}")
    if args.device == "cpu" and args.bundle:
        ap.error("--bundle is for --device cuda; the CPU paths need none")
    args.dtype_word, args.state_dtype_word = args.dtype, args.state_dtype
    args.dtype, args.state_dtype = DTYPES[args.dtype], DTYPES[args.state_dtype]
    args.device_spec = f"cuda:{args.device_index}" if args.device == "cuda" else "cpu"
    return args


def main(argv: Optional[List[str]] = None) -> int:
    args = parse_args(argv)
    import torch

    try:
        import triton
        triton_version = triton.__version__
    except ImportError:
        triton_version = "none"
    if args.device == "cuda":
        if not torch.cuda.is_available():
            print("bench_cold_start: no CUDA device: torch.cuda.is_available() is False "
                  f"(torch {torch.__version__}, CUDA build {torch.version.cuda}); this benchmark "
                  "times the GPU paths. Run it on a CUDA machine, or pass --device cpu for a "
                  "smoke run of the CPU paths.", file=sys.stderr)
            return 1
        if args.device_index >= torch.cuda.device_count():
            print(f"bench_cold_start: --device-index {args.device_index} does not exist: torch "
                  f"sees {torch.cuda.device_count()} CUDA device(s)", file=sys.stderr)
            return 1
        device_name = torch.cuda.get_device_name(args.device_index)
        major, minor = torch.cuda.get_device_capability(args.device_index)
        arch = major * 10 + minor
    else:
        device_name, arch = "cpu", None

    date = _dt.date.today().isoformat()
    out = args.out or os.path.join(
        HERE, "results",
        f"{date}-{re.sub(r'[^A-Za-z0-9.]+', '-', device_name).strip('-')}-cold-start.csv")
    workdir = tempfile.mkdtemp(prefix="luminamoon-cold-start-")
    try:
        luminav = find_luminav(args.luminav) if "luminav" in args.case_list else None
        bundle = args.bundle
        needs_bundle = args.device == "cuda" and ({"luminav", "aot"} & set(args.case_list))
        if needs_bundle and bundle is None:
            bundle = os.path.join(workdir, "bundle")
            build_bundle(arch, args.dtype, args.state_dtype, bundle)
        if bundle is not None and not os.path.isfile(os.path.join(bundle, "manifest.json")):
            raise BenchError(f"--bundle {bundle!r} has no manifest.json; build one with "
                             f"`luminamoon aot build --arch {arch} --out DIR`")

        print(f"device {device_name} | torch {torch.__version__} | triton {triton_version} | "
              f"{date}")
        print(f"model: {args.tensors} tensors of {args.numel:,} {args.dtype_word} elements, "
              f"{args.state_dtype_word} moments; {args.repeats} fresh process(es) per case"
              + (f"; luminav {luminav}" if luminav else "") + (f"; bundle {bundle}" if bundle else ""))
        results = {c: CaseResult(c) for c in args.case_list}
        for rep in range(args.repeats):
            cache = os.path.join(workdir, f"triton-cache-{rep}")  # empty for triton-cold
            for case in args.case_list:
                res = results[case]
                if res.failure:
                    continue
                try:
                    if case == "luminav":
                        run = run_luminav(luminav, bundle if args.device == "cuda" else None, args,
                                          args.timeout, res.extra)
                    elif case == "triton-cold":
                        os.makedirs(cache, exist_ok=False)
                        run = run_python("triton", None, args, args.timeout,
                                         {"TRITON_CACHE_DIR": cache}, res.extra)
                    elif case == "triton-warm":
                        if not os.path.isdir(cache) or not os.listdir(cache):
                            # run alone: fill the cache with an untimed cold run first
                            os.makedirs(cache, exist_ok=True)
                            run_python("triton", None, args, args.timeout,
                                       {"TRITON_CACHE_DIR": cache}, {})
                        run = run_python("triton", None, args, args.timeout,
                                         {"TRITON_CACHE_DIR": cache}, res.extra)
                    else:  # "aot" or "cpu"
                        run = run_python(case, bundle if case == "aot" else None, args,
                                         args.timeout, None, res.extra)
                    res.runs.append(run)
                except (BenchError, subprocess.TimeoutExpired, OSError, ValueError) as exc:
                    res.failure = f"{type(exc).__name__}: {exc}"
        print()
        print_table(list(results.values()))
        driver = results["luminav"].extra.get("driver", "") if "luminav" in results else ""
        meta = dict(device=device_name, driver=driver, torch=torch.__version__,
                    triton=triton_version, date=date, tensors=args.tensors, numel=args.numel,
                    dtype=args.dtype_word, state_dtype=args.state_dtype_word)
        n = write_csv(out, list(results.values()), meta)
        if n:
            print(f"appended {n} rows to {out}")
        return 1 if any(r.failure for r in results.values()) else 0
    except BenchError as exc:
        print(f"bench_cold_start: {exc}", file=sys.stderr)
        return 1
    finally:
        shutil.rmtree(workdir, ignore_errors=True)


if __name__ == "__main__":
    sys.exit(main())
