"""Per-kernel device time of one LuminaMoon step (torch.profiler), and where the host time goes.

For a case and mode of bench_step.py: the device time of each kernel of a step (median over
steps), the bytes the spec counts for it and its fraction of the copy ceiling measured in the
same run; then the host time of the step's parts (planning, launches), without a sync.

    python benchmarks/bench_kernels.py --case one-256M/fp32 --mode clip
"""
from __future__ import annotations

import argparse
import collections
import datetime
import os
import statistics
import sys
import time

import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import bench_step as bs  # noqa: E402


def _set_steps(opt, t: int) -> None:
    for state in opt.state.values():
        state["step"].fill_(t)


def kernel_times(opt, steps: int, reset_to=None):
    """Median device time of each kernel over ``steps`` steps. ``reset_to``: every step starts
    from that step count (written in place), so the kernels never find the step's constants
    in their cache and compute them."""
    from torch.profiler import ProfilerActivity, profile

    for _ in range(3):
        opt.step()
    torch.cuda.synchronize()
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        for _ in range(steps):
            if reset_to is not None:
                _set_steps(opt, reset_to)
            opt.step()
        torch.cuda.synchronize()
    per = collections.defaultdict(list)
    for ev in prof.events():
        if ev.device_type == torch.autograd.DeviceType.CUDA:
            per[ev.name].append(ev.device_time if hasattr(ev, "device_time") else ev.cuda_time)
    return {name: (statistics.median(v), len(v) / steps) for name, v in per.items()}


def host_parts(opt, steps: int):
    """Mean host microseconds of the plan check and of the whole step (no sync)."""
    from luminamoon.optimizer._step import run_launch_groups

    plan_t, run_t, total_t = [], [], []
    for _ in range(steps):
        t0 = time.perf_counter_ns()
        plan = opt._current_plan()
        t1 = time.perf_counter_ns()
        run_launch_groups(plan.groups, plan.backends, flags=opt._flags, scratch=opt._scratch,
                          skipped=opt.skipped_steps, describe=opt._describe_flat)
        t2 = time.perf_counter_ns()
        plan.release_grads()
        plan_t.append((t1 - t0) / 1e3)
        run_t.append((t2 - t1) / 1e3)
    torch.cuda.synchronize()
    for _ in range(steps):
        t0 = time.perf_counter_ns()
        opt.step()
        total_t.append((time.perf_counter_ns() - t0) / 1e3)
    torch.cuda.synchronize()
    return statistics.median(plan_t), statistics.median(run_t), statistics.median(total_t)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--case", default="one-256M/fp32")
    ap.add_argument("--mode", default="clip")
    ap.add_argument("--steps", type=int, default=10)
    ap.add_argument("--out", default=None, help="CSV file to append to")
    ap.add_argument("--start-step", type=int, default=0,
                    help="step count to start from; also times steps that recompute the "
                         "step constants (counters written back before each step)")
    args = ap.parse_args()
    device = torch.device("cuda")
    case = next(c for c in bs.all_cases() if c.label == args.case)
    ceiling = bs.copy_ceiling_tbps(device)
    params = bs.make_params(case, device)
    opt, dtypes, hp = bs.build("luminamoon-triton", args.mode, params)
    numel = case.numel
    if args.start_step:
        opt.step()
        _set_steps(opt, args.start_step)
        missed = kernel_times(opt, args.steps, reset_to=args.start_step)
        print(f"{args.case} {args.mode} from step {args.start_step}, constants computed by "
              f"every program: " + ", ".join(f"{n.split('_kernel')[0]} {t:.1f} us"
                                             for n, (t, _) in missed.items() if "lumina" in n))
        _set_steps(opt, args.start_step)
    times = kernel_times(opt, args.steps)
    total = sum(t * k for t, k in times.values())
    nbytes = bs.bytes_per_element(*dtypes, hp.get("clip", 0.0), hp.get("bound_mode", "none"),
                                  hp.get("nonfinite", "skip")) * numel
    print(f"{torch.cuda.get_device_name(device)} | torch {torch.__version__} | "
          f"{bs._versions()[1]} | {datetime.date.today()} | copy ceiling {ceiling:.3f} TB/s")
    print(f"{args.case} {args.mode}: {total:.1f} us per step of kernels, "
          f"{nbytes / (total * 1e-6) / 1e12 / ceiling:.1%} of the ceiling by the spec's bytes")
    rows = []
    for name, (t, k) in sorted(times.items(), key=lambda kv: -kv[1][0]):
        print(f"  {t:9.1f} us  x{k:.0f}  {name[:90]}")
        rows.append((name, t, k))
    plan_us, run_us, step_us = host_parts(opt, 200)
    print(f"host: plan check {plan_us:.1f} us, launches {run_us:.1f} us, step() {step_us:.1f} us "
          f"(medians, no sync)")
    if args.out and not bs.append_csv(
            args.out, ["date", "device", "torch", "triton", "case", "mode", "kernel", "us",
                       "per_step", "ceiling_TBps", "host_plan_us", "host_launch_us",
                       "host_step_us"],
            [[datetime.date.today(), torch.cuda.get_device_name(device), torch.__version__,
              bs._versions()[1], args.case, args.mode, name, f"{t:.1f}", f"{k:.0f}",
              f"{ceiling:.3f}", f"{plan_us:.1f}", f"{run_us:.1f}", f"{step_us:.1f}"]
             for name, t, k in rows]):
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
