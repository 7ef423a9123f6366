"""Cold start, step by step: where a fresh Python process spends its time until its first
finished optimizer step, LuminaMoon beside torch's fused AdamW on the same small model.

Every run is a FRESH interpreter; the parent's clock (CLOCK_MONOTONIC, shared by every process of
the machine) starts just before the spawn. The child stamps each stage as it finishes:

  spawn           the parent's spawn to the child's first statement (the interpreter's start)
  import torch    `import torch`
  import lm       `import luminamoon`, on top of torch (the AdamW case imports nothing here)
  cuda init       torch.cuda.init() and a first allocation, synchronised (CUDA only)
  model           the parameters and their gradients, on the device, synchronised
  optimizer       the constructor: LuminaMoon(params, backend=...) with no aot_bundle (the
                  default bundle), or torch.optim.AdamW(params, fused=True)
  plan            LuminaMoon's step plan: groups, states, backends (imports the native module)
  bundle          LuminaMoon aot: reading the bundle's manifest in C++ (the AotGroup of the first
                  launch group; its cubins are read and hashed when their kernels first load)
  first launch    the rest of the first step() until it returns: LuminaMoon's device tables,
                  loading (read, SHA-256, cuModuleLoadData) the kernels it launches, the launches;
                  for AdamW its whole step()
  step done       the device finished the step (synchronised)
  = total         spawn to step done; "after torch" is total less spawn and import torch

The times are medians over --repeats runs per case, the cases interleaved run by run. The model
(default 8 tensors of 1M float32 elements; LuminaMoon's default hyperparameters: clip 4,
nonfinite "skip", so four kernels) keeps the step itself short: the numbers are start-up costs.

Cases: on CUDA `aot` (LuminaMoon, backend "aot", the default bundle) and `adamw-fused`; on CPU
(`--device cpu`, CUDA stages left out) `cpu` (LuminaMoon's C++ engine) and `adamw-fused`.

Writes a table to stdout, and to benchmarks/results/<date>-<device>-torch<version>-cold-start.md
and .csv (one row per case and stage, with device, versions and date); --out-stem to choose.

  python benchmarks/cold_start.py [--device cuda|cpu] [--repeats N] [--cases aot,adamw-fused]
      [--tensors N] [--numel N] [--dtype fp32|bf16] [--python PYTHON] [--out-stem PATH]

The children import luminamoon as the parent's interpreter finds it (an installed wheel, or
PYTHONPATH=python with a `make dev` build); backend "aot" needs the default bundle (`luminamoon
aot default` prints it) or LUMINAMOON_AOT_BUNDLE.
"""
from __future__ import annotations

import argparse
import csv
import datetime as _dt
import json
import os
import platform
import re
import statistics
import subprocess
import sys
import time
from typing import Dict, List, Optional

HERE = os.path.dirname(os.path.abspath(__file__))
MARK = "LUMINAMOON_COLD_START "

STAGES = ("spawn", "import torch", "import lm", "cuda init", "model", "optimizer", "plan",
          "bundle", "first launch", "step done")
CUDA_CASES = ("aot", "adamw-fused")
CPU_CASES = ("cpu", "adamw-fused")

# The child. Stamps (time.monotonic) go into T as each stage ends; the stage wrappers around the
# aot backend's first AotGroup add to B (seconds inside the C++ manifest read) without changing
# what the step does. Configuration: one JSON argument.
CHILD = r"""
import time
T = {"start": time.monotonic()}
import json, sys
cfg = json.loads(sys.argv[1])
import torch
T["import torch"] = time.monotonic()
case = cfg["case"]
if case != "adamw-fused":
    import luminamoon
T["import lm"] = time.monotonic()
dev = torch.device(cfg["device"])
if dev.type == "cuda":
    torch.cuda.init()
    torch.empty(1, device=dev)
    torch.cuda.synchronize(dev)
T["cuda init"] = time.monotonic()
sync = (lambda: torch.cuda.synchronize(dev)) if dev.type == "cuda" else (lambda: None)
dtype = getattr(torch, cfg["dtype"])
gen = torch.Generator(device=dev).manual_seed(0)
params = []
for _ in range(cfg["tensors"]):
    p = torch.empty(cfg["numel"], device=dev, dtype=dtype).normal_(generator=gen).mul_(0.02)
    p.requires_grad_()
    p.grad = torch.empty_like(p).normal_(generator=gen).mul_(1e-3)
    params.append(p)
sync()
T["model"] = time.monotonic()
B = {"bundle": 0.0}
if case == "adamw-fused":
    opt = torch.optim.AdamW(params, lr=1e-3, fused=True)
    T["optimizer"] = time.monotonic()
    T["plan"] = T["bundle"] = T["optimizer"]
    opt.step()
    T["first launch"] = time.monotonic()
else:
    from luminamoon import LuminaMoon
    opt = LuminaMoon(params, lr=1e-3, backend=case)
    T["optimizer"] = time.monotonic()
    plan = opt._current_plan()
    plan.release_grads()
    T["plan"] = time.monotonic()
    if case == "aot":
        from luminamoon.optimizer.backends import aot as native
        real = native._luminav.AotGroup
        def timed(*a, **k):
            t = time.monotonic()
            try:
                return real(*a, **k)
            finally:
                B["bundle"] += time.monotonic() - t
        native._luminav.AotGroup = timed
    opt.step()
    T["first launch"] = time.monotonic()
    T["bundle"] = T["plan"] + B["bundle"]
sync()
T["step done"] = time.monotonic()
steps = [int(opt.state[p]["step"]) for p in params]
if steps != [1] * len(params):
    sys.exit(f"the first step was not applied: steps {steps}")
info = dict(torch=torch.__version__, device_name=(torch.cuda.get_device_name(dev) if dev.type == "cuda"
                                                  else "cpu"))
try:
    import importlib.metadata as md
    info["triton"] = md.version("triton")
except Exception:
    info["triton"] = "none"
if case != "adamw-fused":
    info["luminamoon"] = luminamoon.__version__
    info["triton_imported"] = "triton" in sys.modules
    b = getattr(getattr(opt, "_plan", None), "backends", [])
    info["backends"] = sorted({type(x).__name__ for x in b})
    if case == "aot":
        info["bundle"] = b[0].bundle_dir if b else ""
print("LUMINAMOON_COLD_START " + json.dumps(dict(T=T, info=info)), flush=True)
"""


class BenchError(RuntimeError):
    """The benchmark cannot run as asked; the message names the value and the fix."""


def run_child(python: str, cfg: Dict, timeout: float) -> Dict:
    env = dict(os.environ)
    env.pop("TRITON_INTERPRET", None)
    t0 = time.monotonic()
    proc = subprocess.run([python, "-c", CHILD, json.dumps(cfg)], env=env, stdout=subprocess.PIPE,
                          stderr=subprocess.PIPE, text=True, timeout=timeout)
    lines = [ln for ln in proc.stdout.splitlines() if ln.startswith(MARK)]
    if proc.returncode != 0 or not lines:
        tail = " | ".join((proc.stderr or proc.stdout).strip().splitlines()[-6:])
        raise BenchError(f"the {cfg['case']} child exited with {proc.returncode}: {tail}")
    r = json.loads(lines[-1][len(MARK):])
    T = r["T"]
    stamps = [t0, T["start"]] + [T[s] for s in STAGES[1:]]
    stages = {s: (b - a) * 1e3 for s, a, b in zip(STAGES, stamps[:-1], stamps[1:])}
    stages["total"] = (T["step done"] - t0) * 1e3
    stages["after torch"] = (T["step done"] - T["import torch"]) * 1e3
    return dict(stages=stages, info=r["info"])


def median_stages(runs: List[Dict]) -> Dict[str, float]:
    keys = list(STAGES) + ["total", "after torch"]
    return {k: statistics.median(r["stages"][k] for r in runs) for k in keys}


def format_table(results: Dict[str, Dict[str, float]], device_type: str) -> List[str]:
    cases = list(results)
    shown = [s for s in STAGES if not (device_type != "cuda" and s == "cuda init")]
    head = f"| stage (ms) | " + " | ".join(cases) + " |"
    lines = [head, "|" + "---|" * (len(cases) + 1)]
    for s in shown + ["total", "after torch"]:
        cells = []
        for c in cases:
            v = results[c][s]
            cells.append("-" if (s in ("plan", "bundle") and c == "adamw-fused")
                         or (s == "bundle" and c != "aot") or (s == "import lm" and c == "adamw-fused")
                         else f"{v:.1f}")
        label = f"**{s}**" if s in ("total", "after torch") else s
        lines.append(f"| {label} | " + " | ".join(cells) + " |")
    return lines


def main(argv: Optional[List[str]] = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--device", choices=("cuda", "cpu"), default="cuda")
    ap.add_argument("--device-index", type=int, default=0)
    ap.add_argument("--repeats", type=int, default=5, help="fresh processes per case (default 5)")
    ap.add_argument("--cases", default=None, help="comma-separated subset (cuda: aot,adamw-fused; "
                                                  "cpu: cpu,adamw-fused)")
    ap.add_argument("--tensors", type=int, default=8)
    ap.add_argument("--numel", type=int, default=1 << 20)
    ap.add_argument("--dtype", choices=("fp32", "bf16"), default="fp32")
    ap.add_argument("--python", default=sys.executable, help="the children's interpreter")
    ap.add_argument("--timeout", type=float, default=600.0, help="seconds per child")
    ap.add_argument("--out-stem", default=None, help="results path without .md/.csv")
    args = ap.parse_args(argv)
    if args.repeats < 1:
        ap.error(f"--repeats must be >= 1, got {args.repeats}")
    if args.tensors < 1 or args.numel < 1:
        ap.error(f"--tensors and --numel must be >= 1, got {args.tensors} and {args.numel}")
    known = CUDA_CASES if args.device == "cuda" else CPU_CASES
    cases = list(known) if args.cases is None else [c for c in args.cases.split(",") if c]
    for c in cases:
        if c not in known:
            ap.error(f"unknown case {c!r} for --device {args.device}; known: {', '.join(known)}")

    device = f"cuda:{args.device_index}" if args.device == "cuda" else "cpu"
    if args.device == "cuda":
        probe = subprocess.run([args.python, "-c", "import torch; print(torch.cuda.device_count())"],
                               capture_output=True, text=True)
        count = int(probe.stdout.strip() or 0) if probe.returncode == 0 else 0
        if count <= args.device_index:
            print(f"cold_start: --device cuda needs a CUDA device {args.device_index}, torch sees "
                  f"{count}; run it on a GPU machine, or pass --device cpu (the CPU stages only)",
                  file=sys.stderr)
            return 1
    cfg = dict(device=device, tensors=args.tensors, numel=args.numel,
               dtype={"fp32": "float32", "bf16": "bfloat16"}[args.dtype])
    runs: Dict[str, List[Dict]] = {c: [] for c in cases}
    try:
        for _ in range(args.repeats):
            for c in cases:  # interleaved: drift of the machine spreads over every case
                runs[c].append(run_child(args.python, dict(cfg, case=c), args.timeout))
    except (BenchError, subprocess.TimeoutExpired) as exc:
        print(f"cold_start: {exc}", file=sys.stderr)
        return 1

    info = runs[cases[0]][0]["info"]
    lm = next((r[0]["info"] for c, r in runs.items() if c != "adamw-fused"), {})
    results = {c: median_stages(r) for c, r in runs.items()}
    date = _dt.date.today().isoformat()
    name = re.sub(r"[^A-Za-z0-9.]+", "-", info["device_name"]).strip("-").lower()
    stem = args.out_stem or os.path.join(
        HERE, "results", f"{date}-{name}-torch{info['torch'].split('+')[0]}-cold-start")
    header = (f"device {info['device_name']} | torch {info['torch']} | triton {info['triton']} | "
              f"luminamoon {lm.get('luminamoon', '-')} | python {platform.python_version()} | "
              f"{date}")
    load = os.getloadavg()[0] if hasattr(os, "getloadavg") else float("nan")
    model = (f"model: {args.tensors} tensors of {args.numel:,} {args.dtype} elements; "
             f"{args.repeats} fresh process(es) per case, medians; {os.cpu_count()} cores, load "
             f"average {load:.1f} at the end (other work on the machine moves every stage)")
    table = format_table(results, args.device)
    notes = []
    if lm:
        notes.append(f"LuminaMoon backends used: {', '.join(lm.get('backends', []))}; Triton "
                     f"imported by the LuminaMoon child: {lm.get('triton_imported')}")
        if lm.get("bundle"):
            notes.append(f"bundle: {lm['bundle']}")
    if "adamw-fused" in results and len(results) > 1:
        other = next(c for c in results if c != "adamw-fused")
        diff = results[other]["total"] - results["adamw-fused"]["total"]
        fastest = {c: min(r["stages"]["total"] for r in runs[c]) for c in results}
        notes.append(f"{other} - adamw-fused, total: {diff:+.1f} ms (medians; fastest runs "
                     f"{fastest[other]:.1f} vs {fastest['adamw-fused']:.1f} ms: "
                     f"{fastest[other] - fastest['adamw-fused']:+.1f} ms); import luminamoon on "
                     f"top of torch: {results[other]['import lm']:.1f} ms")
    text = [header, model, ""] + table + [""] + notes
    print("\n".join(text))

    os.makedirs(os.path.dirname(os.path.abspath(stem)), exist_ok=True)
    with open(stem + ".md", "w", encoding="utf-8") as f:
        f.write("# Cold start to the first finished step (benchmarks/cold_start.py)\n\n")
        f.write("```\npython benchmarks/cold_start.py " + " ".join(argv if argv is not None
                                                                   else sys.argv[1:]) + "\n```\n\n")
        f.write("\n".join(text) + "\n")
    with open(stem + ".csv", "w", newline="", encoding="utf-8") as f:
        w = csv.writer(f)
        w.writerow(["date", "device", "torch", "triton", "luminamoon", "case", "tensors", "numel",
                    "dtype", "repeats", "stage", "ms_median", "ms_min", "ms_max"])
        for c, rs in runs.items():
            for s in list(STAGES) + ["total", "after torch"]:
                vals = [r["stages"][s] for r in rs]
                w.writerow([date, info["device_name"], info["torch"], info["triton"],
                            lm.get("luminamoon", ""), c, args.tensors, args.numel, args.dtype,
                            len(rs), s, f"{statistics.median(vals):.2f}", f"{min(vals):.2f}",
                            f"{max(vals):.2f}"])
    print(f"\nwrote {stem}.md and {stem}.csv")
    return 0


if __name__ == "__main__":
    sys.exit(main())
