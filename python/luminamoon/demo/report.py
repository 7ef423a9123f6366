"""demo/report.py: the demo's report: the machine, tables, findings, CSV and plots."""
from __future__ import annotations

import csv
import datetime
import math
import os
import platform
import statistics
import textwrap
from typing import List, Optional, Tuple

from .config import Config
from .runs import RunResult, StepTiming

# --------------------------------------------------------------------------------------------
# reporting
# --------------------------------------------------------------------------------------------


def machine_line(device) -> str:
    import torch

    if device.type == "cuda":
        where = torch.cuda.get_device_name(device)
    else:
        where = cpu_model()
    return (f"{where}, {usable_cores()} cores, torch {torch.__version__}, "
            f"{datetime.date.today().isoformat()}")


def usable_cores() -> int:
    """Cores this process may run on (its affinity mask where the OS has one)."""
    try:
        return len(os.sched_getaffinity(0))
    except (AttributeError, OSError):
        return os.cpu_count() or 1


def cpu_model() -> str:
    try:
        with open("/proc/cpuinfo") as fh:
            for line in fh:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


def fault_response(result: RunResult, first: int, until: int) -> Tuple[float, float, float]:
    """Train loss around a fault that starts at step ``first``: (mean of the 10 steps before,
    the highest of the 20 steps from it, mean of the 10 steps before first+40 or, when the
    next fault comes sooner, before ``until``)."""
    by_step = dict(zip(result.steps, result.train_loss))

    def mean(steps):
        values = [by_step[s] for s in steps if s in by_step]
        return statistics.fmean(values) if values else math.nan

    peak = [by_step[s] for s in range(first, first + 20) if s in by_step]
    end = min(first + 40, until)
    return (mean(range(max(0, first - 10), first)), max(peak) if peak else math.nan,
            mean(range(max(first, end - 10), end)))


def results_table(results: List[RunResult], cfg: Config) -> List[List[str]]:
    warm = cfg.timing_warmup
    rows = [["run", "backend", "val loss", "tokens/s", "opt ms/step", "state B/param",
             "skipped steps", "note"]]
    for r in results:
        if r.note:  # a run that could not run here
            rows.append([r.spec.label, "", "n/a", "n/a", "n/a", "n/a", "", r.note])
            continue
        note = ""
        if r.nan_from is not None:
            note = f"weights NaN from step {r.nan_from}"
        elif r.spec.inject:
            note = "trained through"
        rows.append([r.spec.label, r.backend, f"{r.final_val:.4f}", f"{r.tokens_per_s(warm):,.0f}",
                     f"{r.opt_ms(warm):.3f}", f"{r.state_bytes:.3f}", str(r.skipped), note])
    return rows


def state_bytes_note(device) -> str:
    """How the table's state bytes were measured."""
    if device.type == "cuda":
        return ("state B/param: torch.cuda.memory_allocated after the first optimizer step minus "
                "before it, over the parameters' elements")
    return ("state B/param: the bytes of the optimizer state's tensors (their storages), over "
            "the parameters' elements")


def timing_table(timings: List[StepTiming]) -> List[List[str]]:
    names = list(dict.fromkeys(t.name for t in timings))
    by = {(t.name, t.dtype): t for t in timings}
    rows = [["optimizer step", "fp32 weights ms", "bf16 weights ms"]]
    for name in names:
        cells = []
        for dtype in ("float32", "bfloat16"):
            t = by.get((name, dtype))
            cells.append("n/a" if t is None or not math.isfinite(t.ms) else f"{t.ms:.3f}")
        rows.append([name] + cells)
    return rows


def format_text(rows: List[List[str]]) -> str:
    widths = [max(len(r[i]) for r in rows) for i in range(len(rows[0]))]
    lines = []
    for j, r in enumerate(rows):
        cells = [c.ljust(w) if i == 0 or j == 0 else c.rjust(w)
                 for i, (c, w) in enumerate(zip(r, widths))]
        lines.append("  ".join(cells).rstrip())
        if j == 0:
            lines.append("  ".join("-" * w for w in widths))
    return "\n".join(lines)


def _numeric(cell: str) -> bool:
    try:
        float(cell.replace(",", ""))
        return True
    except ValueError:
        return cell in ("", "n/a")


def format_markdown(rows: List[List[str]]) -> str:
    """A markdown table; columns of numbers right-aligned."""
    align = ["---:" if all(_numeric(r[i]) for r in rows[1:]) else "---"
             for i in range(len(rows[0]))]
    lines = ["| " + " | ".join(rows[0]) + " |", "|" + "|".join(align) + "|"]
    lines += ["| " + " | ".join(r) + " |" for r in rows[1:]]
    return "\n".join(lines)


def findings(results: List[RunResult], timings: List[StepTiming], cfg: Config,
             device) -> List[str]:
    """What the numbers say, in sentences computed from them."""
    by = {r.spec.key: r for r in results}
    lines = []
    a32, l32 = by.get("fp32-adamw"), by.get("fp32-lumina")
    if a32 and l32:
        lines.append(f"fp32: LuminaMoon val loss {l32.final_val:.4f}, AdamW {a32.final_val:.4f} "
                     f"({l32.final_val - a32.final_val:+.4f}).")
    q8 = by.get("q8-lumina")
    if q8 and l32 and not q8.note:
        lines.append(f"q8 moments: LuminaMoon val loss {q8.final_val:.4f} against "
                     f"{l32.final_val:.4f} with float32 moments "
                     f"({100 * (q8.final_val / l32.final_val - 1):+.2f}%), its state "
                     f"{q8.state_bytes:.2f} B a parameter against {l32.state_bytes:.2f}.")
    a16, l16, rtn = by.get("bf16-adamw"), by.get("bf16-lumina"), by.get("bf16-lumina-rtn")
    if a16 and l16:
        text = (f"bf16 weights: stochastic rounding {l16.final_val:.4f} vs AdamW's "
                f"round-to-nearest {a16.final_val:.4f} ({l16.final_val - a16.final_val:+.4f})")
        if a32:
            text += (f"; fp32 AdamW {a32.final_val:.4f}: round-to-nearest loses "
                     f"{a16.final_val - a32.final_val:+.4f}, stochastic rounding "
                     f"{l16.final_val - a32.final_val:+.4f}")
        if rtn:
            text += f"; LuminaMoon with round-to-nearest {rtn.final_val:.4f}"
        lines.append(text + ".")
    fa, fl = by.get("faults-adamw"), by.get("faults-lumina")
    if fa and fl:
        faults = ((f"{cfg.spike_layer} gradient x{cfg.spike_scale:g}", cfg.spike_range,
                   cfg.poison_range.start),
                  (f"poisoned batches (random characters, loss x{cfg.poison_scale:g})",
                   cfg.poison_range, cfg.nan_step))
        for what, rng, until in faults:
            a, b = fault_response(fa, rng.start, until), fault_response(fl, rng.start, until)
            lines.append(f"{what}, steps {rng.start}-{rng.stop - 1}: train loss before / peak "
                         f"/ {min(40, until - rng.start)} steps later: AdamW {a[0]:.3f} / "
                         f"{a[1]:.3f} / {a[2]:.3f}, LuminaMoon {b[0]:.3f} / {b[1]:.3f} / "
                         f"{b[2]:.3f}.")
        fate = (f"AdamW's weights are NaN from step {fa.nan_from}, its run stops"
                if fa.nan_from is not None else "AdamW's weights stayed finite")
        lines.append(f"NaN gradient at step {cfg.nan_step} ({cfg.nan_param}): {fate}; "
                     f"LuminaMoon skipped {fl.skipped} step(s) on the device and ended at val "
                     f"loss {fl.final_val:.4f} (no faults: {l32.final_val:.4f}).")
    for dtype in ("float32", "bfloat16"):
        theirs = [t for t in timings if t.dtype == dtype and t.name.startswith("torch")
                  and math.isfinite(t.ms)]
        ours = [t for t in timings if t.dtype == dtype and t.name.startswith("LuminaMoon")
                and "reference" not in t.name and math.isfinite(t.ms)]
        if not theirs or not ours:
            continue
        best = min(theirs, key=lambda t: t.ms)
        parts = []
        for t in ours:
            verdict = "faster" if t.ms < best.ms else ("equal" if t.ms == best.ms else "SLOWER")
            parts.append(f"{t.name} {t.ms:.3f} ms ({t.ms / best.ms:.2f}x, {verdict})")
        lines.append(f"optimizer step, {dtype} weights on {device.type}, against {best.name} "
                     f"{best.ms:.3f} ms: " + "; ".join(parts) + ".")
    return lines


def write_csv(results: List[RunResult], timings: List[StepTiming], cfg: Config, path: str,
              machine: str) -> None:
    warm = cfg.timing_warmup
    with open(path, "w", newline="") as fh:
        w = csv.writer(fh)
        w.writerow(["kind", "name", "backend", "dtype", "val_loss", "tokens_per_s",
                    "opt_ms_per_step", "skipped_steps", "nan_from_step", "machine",
                    "state_bytes_per_param", "note"])
        for r in results:
            if r.note:
                w.writerow(["run", r.spec.label, "", r.spec.dtype, "", "", "", "", "", machine,
                            "", r.note])
                continue
            w.writerow(["run", r.spec.label, r.backend, r.spec.dtype, f"{r.final_val:.6f}",
                        f"{r.tokens_per_s(warm):.1f}", f"{r.opt_ms(warm):.4f}", r.skipped,
                        "" if r.nan_from is None else r.nan_from, machine,
                        f"{r.state_bytes:.4f}", ""])
        for t in timings:
            w.writerow(["step_time", t.name, "", t.dtype, "", "", f"{t.ms:.4f}", "", "", machine,
                        "", t.note])


# --------------------------------------------------------------------------------------------
# plots
# --------------------------------------------------------------------------------------------


def _pyplot():
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        return None
    return plt


def _smooth(values: List[float], width: int) -> List[float]:
    """Trailing mean over ``width`` steps (NaN stays NaN)."""
    out, acc = [], []
    for v in values:
        acc.append(v)
        if len(acc) > width:
            acc.pop(0)
        out.append(statistics.fmean(acc) if all(math.isfinite(a) for a in acc) else math.nan)
    return out


def _log_axis(ax, lo: float, hi: float) -> None:
    """A log-scaled loss axis with plain-number ticks."""
    from matplotlib.ticker import FixedLocator, NullFormatter, ScalarFormatter

    ax.set_yscale("log")
    ax.set_ylim(lo, hi)
    ticks = [t for t in (1.6, 1.8, 2.0, 2.2, 2.5, 3.0, 3.5, 4.0, 5.0, 6.0) if lo <= t <= hi]
    ax.yaxis.set_major_locator(FixedLocator(ticks))
    ax.yaxis.set_major_formatter(ScalarFormatter())
    ax.yaxis.set_minor_formatter(NullFormatter())


def plot_losses(results: List[RunResult], cfg: Config, path: str, title: str) -> Optional[str]:
    """Four panels: fp32 runs, bf16 runs, each run's validation loss minus fp32 AdamW's, and
    the faults runs with the injected steps marked."""
    plt = _pyplot()
    if plt is None:
        return None
    results = [r for r in results if r.val_steps]  # (a run that did not run has no curve)
    fig, grid = plt.subplots(2, 2, figsize=(14, 9.5), dpi=110)
    (ax32, ax16), (axgap, axf) = grid
    width = max(1, cfg.steps // 60)
    finite = [v for r in results for v in r.val_loss + r.train_loss if math.isfinite(v)]
    lo, hi = 0.95 * min(finite), 1.05 * max(finite)

    def curves(ax, panel):
        for r in (r for r in results if r.spec.panel == panel):
            ax.plot(r.steps, _smooth(r.train_loss, width), color=r.spec.color,
                    linestyle=r.spec.style, linewidth=0.9, alpha=0.4)
            ax.plot(r.val_steps, r.val_loss, color=r.spec.color, linestyle=r.spec.style,
                    linewidth=2.0, marker="o", markersize=3,
                    label=f"{r.spec.label}: val {r.final_val:.4f}")
        ax.set_xlabel("step")
        ax.set_ylabel("cross-entropy (thin: train, smoothed; thick: validation)", fontsize=8)
        ax.grid(alpha=0.3)
        _log_axis(ax, lo, hi)

    curves(ax32, "fp32")
    ax32.set_title("fp32 weights: AdamW vs LuminaMoon")
    ax32.legend(fontsize=8, loc="upper right")
    curves(ax16, "bf16")
    ax16.set_title("pure bf16 weights and moments: how the optimizer rounds")
    ax16.legend(fontsize=8, loc="upper right")

    base = next((r for r in results if r.spec.key == "fp32-adamw"), None)
    if base is not None:
        ref = dict(zip(base.val_steps, base.val_loss))
        for r in results:
            if r.spec.panel not in ("fp32", "bf16") or r is base:
                continue
            pts = [(s, v - ref[s]) for s, v in zip(r.val_steps, r.val_loss) if s in ref]
            axgap.plot([s for s, _ in pts], [d for _, d in pts], color=r.spec.color,
                       linestyle=":" if r.spec.panel == "fp32" else r.spec.style,
                       linewidth=2.0 if r.spec.panel == "bf16" else 1.5, marker="o",
                       markersize=3, label=f"{r.spec.label}: {pts[-1][1]:+.4f}")
        axgap.axhline(0.0, color="C0", linewidth=1.5, label="AdamW, fp32 (the baseline)")
        axgap.set_title("validation loss minus AdamW fp32's (same data, seed, weights)")
        axgap.set_xlabel("step")
        axgap.set_ylabel("validation loss difference")
        axgap.grid(alpha=0.3)
        axgap.legend(fontsize=8, loc="upper left")

    curves(axf, "faults")
    s, q = cfg.spike_range, cfg.poison_range
    axf.axvspan(s.start - 0.5, s.stop - 0.5, color="orange", alpha=0.5,
                label=f"steps {s.start}-{s.stop - 1}: {cfg.spike_layer} gradient "
                      f"x{cfg.spike_scale:g}")
    axf.axvspan(q.start - 0.5, q.stop - 0.5, color="red", alpha=0.3,
                label=f"steps {q.start}-{q.stop - 1}: poisoned batches, loss x"
                      f"{cfg.poison_scale:g}")
    axf.axvline(cfg.nan_step, color="purple", linestyle=":", linewidth=1.5,
                label=f"step {cfg.nan_step}: a NaN in one gradient element")
    for r in (r for r in results if r.spec.panel == "faults"):
        if r.nan_from is not None:
            before = [v for st, v in zip(r.steps, r.train_loss) if st < r.nan_from
                      and math.isfinite(v)]
            y = _smooth(before, width)[-1] if before else hi / 1.1
            axf.plot([r.nan_from], [y], marker="X", markersize=13, color=r.spec.color,
                     linestyle="none")
            axf.annotate(f"{r.spec.label.split(',')[0]}: weights NaN\nfrom step {r.nan_from}, "
                         "run ends", (r.nan_from, y), textcoords="offset points",
                         xytext=(10, -28), color=r.spec.color, fontsize=8)
        elif r.skipped:
            axf.annotate(f"{r.spec.label.split(',')[0]}: skipped_steps = {r.skipped},\n"
                         "training goes on", (cfg.nan_step, r.final_val),
                         textcoords="offset points", xytext=(-8, 16), ha="right",
                         color=r.spec.color, fontsize=8)
    axf.set_title("fp32 with injected faults (the same in both runs)")
    axf.legend(fontsize=7, loc="lower left")
    fig.suptitle(textwrap.fill(title, 150), fontsize=10)  # the long line fits the figure
    fig.tight_layout()
    fig.savefig(path)
    plt.close(fig)
    return path


def plot_step_times(timings: List[StepTiming], path: str, title: str) -> Optional[str]:
    plt = _pyplot()
    if plt is None:
        return None
    names = list(dict.fromkeys(t.name for t in timings))
    by = {(t.name, t.dtype): t.ms for t in timings}
    fig, axes = plt.subplots(1, 2, figsize=(12, 0.55 * len(names) + 1.8), dpi=110)
    for ax, dtype in zip(axes, ("float32", "bfloat16")):
        values = [by.get((n, dtype), math.nan) for n in names]
        colors = ["C3" if n.startswith("LuminaMoon") else "C0" for n in names]
        ys = range(len(names))
        ax.barh(ys, [v if math.isfinite(v) else 0 for v in values], color=colors)
        for y, v in zip(ys, values):
            ax.text(v if math.isfinite(v) else 0, y, f" {v:.3f} ms" if math.isfinite(v) else " n/a",
                    va="center", fontsize=8)
        ax.set_yticks(list(ys))
        ax.set_yticklabels(names, fontsize=8)
        ax.invert_yaxis()
        ax.set_xscale("log")
        ax.set_xlabel("opt.step() wall time, ms (median; log scale)")
        ax.set_title(f"{dtype} weights")
        ax.grid(alpha=0.3, axis="x", which="both")
        finite = [v for v in values if math.isfinite(v) and v > 0]
        if finite:
            ax.set_xlim(min(finite) / 2, max(finite) * 4)
    fig.suptitle(title, fontsize=10)
    fig.text(0.01, 0.01, "LuminaMoon <backend>: TDCLM as trained (soft clip, device-side skip "
             "check; bf16: stochastic rounding of weights and bf16 moments, one Philox4x32-10 "
             "per eight stored values). AdamW mode: clip 0, no skip check, round to nearest, as torch's "
             "AdamW. Fresh gradient tensors before every step; median after warm-up.",
             fontsize=7, wrap=True)
    fig.tight_layout(rect=(0, 0.05, 1, 1))
    fig.savefig(path)
    plt.close(fig)
    return path
