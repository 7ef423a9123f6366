"""demo/cli.py: `luminamoon demo`: the command (options, progress bars, main)."""
from __future__ import annotations

import argparse
import os
import sys
import sysconfig
import time
from typing import Optional

from .config import Config, QUICK
from .report import (findings, format_markdown, format_text, machine_line, plot_losses,
                     plot_step_times, results_table, state_bytes_note, timing_table,
                     usable_cores, write_csv)
from .runs import Session, available_backends, run_specs, time_optimizer_steps, train

# --------------------------------------------------------------------------------------------
# command line
# --------------------------------------------------------------------------------------------


class _PlainProgress:
    """Progress printer for when tqdm is not installed."""

    def __init__(self, total: int, desc: str = ""):
        self.total, self.n, self.desc, self.postfix = total, 0, desc, ""

    def update(self, n: int) -> None:
        self.n += n
        if self.n == self.total or self.n % max(1, self.total // 4) == 0:
            print(f"{self.desc} [{self.n:>5}/{self.total}] {self.postfix}", flush=True)

    def set_postfix_str(self, text: str) -> None:
        self.postfix = text

    def close(self) -> None:
        pass


def _progress_factory():
    try:
        from tqdm import tqdm
    except ImportError:
        return _PlainProgress
    return lambda total, desc: tqdm(total=total, desc=desc, unit="step", dynamic_ncols=True,
                                    leave=True, mininterval=0.5)


def _description() -> str:
    """The package's docstring without its first line (what the demo compares, and writes)."""
    doc = sys.modules[__package__].__doc__ or ""
    return doc.split("\n", 1)[1].strip() if "\n" in doc else doc


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="luminamoon demo", formatter_class=argparse.RawDescriptionHelpFormatter,
        description=_description())
    parser.add_argument("--quick", action="store_true",
                        help=f"a short run for tests and smoke checks ({QUICK['steps']} steps, "
                             "less text, no LuminaMoon round-to-nearest control run, the "
                             "reference backend left out of the step timing): under a minute on "
                             "2 idle CPU cores")
    parser.add_argument("--steps", type=int, default=None,
                        help=f"training steps per run (default {Config.steps}, "
                             f"{QUICK['steps']} with --quick); the faults run's spikes start "
                             f"at {100 * Config.spike_at:.0f}%% of the run, its poisoned "
                             f"batches at {100 * Config.poison_at:.0f}%%, its NaN step is at "
                             f"{100 * Config.nan_at:.0f}%%")
    parser.add_argument("--device", default="auto",
                        help="where to train: 'auto' (the CUDA GPU when there is one, else the "
                             "CPU), 'cpu', 'cuda' or 'cuda:N'")
    parser.add_argument("--backend", default="auto",
                        choices=["auto", "reference", "triton", "aot", "cpu"],
                        help="LuminaMoon's backend in the training runs (default auto: triton on "
                             "CUDA, the native cpu engine on CPU); the step-time panel times "
                             "every backend that runs here regardless")
    parser.add_argument("--aot-bundle", default=None,
                        help="folder of an ahead-of-time bundle ('luminamoon aot build --out "
                             "DIR'); on CUDA it adds the aot backend to the step-time panel "
                             "(default: $LUMINAMOON_AOT_BUNDLE, else ./bundle when it holds a "
                             "manifest.json, else on CUDA the bundle the installed wheel "
                             "ships, else none)")
    parser.add_argument("--seed", type=int, default=0,
                        help="seed of the initial weights, the batch order and LuminaMoon's "
                             "rounding streams (default 0)")
    parser.add_argument("--lr", type=float, default=None,
                        help=f"peak learning rate of every run (default {Config.lr:g}; linear "
                             "warm-up, then cosine decay)")
    parser.add_argument("--out", default="demo-out",
                        help="folder for loss_curves.png, step_time.png, results.md and "
                             "results.csv (default demo-out)")
    parser.add_argument("--no-plot", action="store_true",
                        help="write the tables only, no PNGs (also what happens without "
                             "matplotlib)")
    parser.add_argument("--threads", type=int, default=None,
                        help="CPU threads of torch and of LuminaMoon's native cpu engine "
                             "(default: torch takes one per core this process may use, the "
                             "engine one per hardware thread)")
    return parser


def default_aot_bundle(device_type: str = "cuda") -> Optional[str]:
    """$LUMINAMOON_AOT_BUNDLE, else ./bundle (where docs/aot.md's build command writes one), else,
    on CUDA, the bundle this installation ships (a wheel built with its default bundle)."""
    from ..aot.default import ENV_VAR, packaged_bundle_dir

    env = os.environ.get(ENV_VAR)
    if env:
        return env
    if os.path.isfile(os.path.join("bundle", "manifest.json")):
        return "bundle"
    return packaged_bundle_dir() if device_type == "cuda" else None


def _load_average() -> str:
    """The 1-minute load average (other processes on the machine move every timing)."""
    try:
        return f"{os.getloadavg()[0]:.1f}"
    except (AttributeError, OSError):
        return "n/a"


def resolve_device(text: str):
    import torch

    if text == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    device = torch.device(text)
    if device.type == "cuda" and not torch.cuda.is_available():
        raise SystemExit(f"luminamoon demo: --device {text} but torch sees no CUDA device "
                         f"(torch {torch.__version__}); use --device cpu or auto")
    return device


def main(argv=None) -> int:
    args = build_parser().parse_args(argv)
    wall_start = time.perf_counter()
    load_start = _load_average()

    import torch

    cfg = Config(**QUICK) if args.quick else Config()
    if args.steps is not None:
        if args.steps < 20:
            raise SystemExit(f"luminamoon demo: --steps must be >= 20, got {args.steps}")
        cfg.steps = args.steps
        cfg.warmup = min(cfg.warmup, max(1, cfg.steps // 10))
    if args.lr is not None:
        if not args.lr > 0:
            raise SystemExit(f"luminamoon demo: --lr must be > 0, got {args.lr}")
        cfg.lr = args.lr
    if args.threads is not None and args.threads < 1:
        raise SystemExit(f"luminamoon demo: --threads must be >= 1, got {args.threads}")
    torch.set_num_threads(args.threads or usable_cores())
    device = resolve_device(args.device)
    if args.aot_bundle is None:
        args.aot_bundle = default_aot_bundle(device.type)
    if args.backend == "aot" and not args.aot_bundle:
        raise SystemExit("luminamoon demo: --backend aot needs --aot-bundle DIR (written by "
                         "'luminamoon aot build')")

    session = Session(cfg, device, args.backend, args.aot_bundle, args.seed,
                      cpu_threads=args.threads or 0)
    machine = machine_line(device)
    print(f"data: {len(session.train_data):,} training / {len(session.val_data):,} validation "
          f"characters from {len(session.train_files)} + {len(session.val_files)} standard-"
          f"library modules ({sysconfig.get_paths()['stdlib']}), vocabulary {len(session.vocab)}")
    n_params = sum(v.numel() for v in session.init_state.values())
    print(f"model: GPT, {cfg.n_layer} layers, d_model {cfg.d_model}, {cfg.n_head} heads, context "
          f"{cfg.ctx}, {n_params:,} parameters in {len(session.init_state)} tensors; batch "
          f"{cfg.batch}, {cfg.steps} steps, lr {cfg.lr:g} (warm-up {cfg.warmup}, cosine to "
          f"{cfg.min_lr_ratio:g}x), betas {cfg.betas}, weight decay {cfg.weight_decay:g}, "
          f"LuminaMoon clip {cfg.clip:g}")
    print(f"device: {device} ({machine}); torch AdamW: {session.adamw}")

    progress = _progress_factory()
    results = [train(session, spec, progress) for spec in run_specs(cfg)]
    backends = available_backends(device, args.aot_bundle)
    if not cfg.bench_reference and len(backends) > 1:
        backends.remove("reference")
    timings = time_optimizer_steps(session, backends)

    run_rows, time_rows = results_table(results, cfg), timing_table(timings)
    notes = findings(results, timings, cfg, device)
    print()
    print(format_text(run_rows))
    print(f"({state_bytes_note(device)})")
    print()
    print(format_text(time_rows))
    print()
    for line in notes:
        print("- " + line)
    failed = [t for t in timings if t.note]
    for t in failed:
        print(f"  ({t.name}, {t.dtype}: {t.note})")

    os.makedirs(args.out, exist_ok=True)
    wall = time.perf_counter() - wall_start
    header = (f"{machine}; {cfg.steps} steps per run, {n_params:,} parameters; demo wall time "
              f"{wall:.0f} s; load average {load_start} at the start, {_load_average()} at "
              f"the end")
    with open(os.path.join(args.out, "results.md"), "w") as fh:
        fh.write(f"{header}\n\n{format_markdown(run_rows)}\n\n({state_bytes_note(device)})\n\n"
                 f"{format_markdown(time_rows)}\n\n")
        fh.write("\n".join("- " + line for line in notes) + "\n")
    write_csv(results, timings, cfg, os.path.join(args.out, "results.csv"), machine)
    written = [os.path.join(args.out, "results.md"), os.path.join(args.out, "results.csv")]
    if not args.no_plot:
        for png in (plot_losses(results, cfg, os.path.join(args.out, "loss_curves.png"),
                                f"char-level GPT on Python's standard library: {header}"),
                    plot_step_times(timings, os.path.join(args.out, "step_time.png"),
                                    f"optimizer step on this model ({n_params:,} parameters, "
                                    f"{len(session.init_state)} tensors), {device.type}: "
                                    f"{machine}")):
            if png:
                written.append(png)
    print(f"\n{header}")
    print(f"wrote {', '.join(written)}")
    print(f"demo wall time {time.perf_counter() - wall_start:.1f} s")
    return 0


if __name__ == "__main__":  # pragma: no cover
    raise SystemExit(main())
