"""Sweeps the Triton kernels' launch shapes (BLOCK, num_warps, reduce RBLOCK) on one large
tensor and prints device time per step for each, per mode and dtype mix.

The shapes live in luminamoon.kernels.catalog (ELEMENTWISE_BLOCK/WARPS, REDUCE_RBLOCK/
WARPS); this script sets them before building each optimizer. Results feed the comments there.
Run: PYTHONPATH=python python benchmarks/tune_launch.py [--numel N] [--out CSV]
"""
from __future__ import annotations

import argparse
import datetime as _dt
import os
import statistics
import sys

import torch

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(os.path.dirname(HERE), "python"))

from luminamoon import LuminaMoon  # noqa: E402
from luminamoon.kernels import catalog
import triton  # noqa: E402

sys.path.insert(0, HERE)
import bench_step as bs  # noqa: E402

F32, BF16 = torch.float32, torch.bfloat16
MODES = {
    "adamw": dict(clip=0.0, nonfinite="propagate"),
    "clip": dict(clip=4.0, nonfinite="skip"),
}
MIXES = {  # (param/grad dtype, state dtype)
    "fp32": (F32, F32),
    "bf16/fp32": (BF16, F32),
    "bf16/bf16": (BF16, BF16),
}


def bytes_per_elem(pdt, sdt, mode):
    p, s = (4 if pdt == F32 else 2), (4 if sdt == F32 else 2)
    single = 2 * p + p + 2 * s + 2 * s  # p r/w, g, m r/w, v r/w
    return single if mode == "adamw" else single + p + 2 * s  # pass 1 reads g, m, v again


def time_opt(opt, steps=10, warmup=3):
    for _ in range(warmup):
        opt.step()
    torch.cuda.synchronize()
    times = []
    for _ in range(steps):
        a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        a.record()
        opt.step()
        b.record()
        b.synchronize()
        times.append(a.elapsed_time(b) * 1e3)
    return statistics.median(times)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--numel", type=int, default=256 * 2**20)
    ap.add_argument("--configs", default="2048x8,1024x4,1024x8,4096x8,2048x4,4096x16,512x4")
    ap.add_argument("--rblocks", default="1024x4,8192x8")
    ap.add_argument("--mixes", default=",".join(MIXES))
    ap.add_argument("--out", default=None)
    args = ap.parse_args()
    dev = torch.device("cuda")
    name = torch.cuda.get_device_name(dev)
    print(f"{name} | torch {torch.__version__} | triton {triton.__version__} | n={args.numel}")
    rows = []
    for mix in args.mixes.split(","):
        pdt, sdt = MIXES[mix]
        p = torch.randn(args.numel, device=dev, dtype=pdt, requires_grad=True)
        p.grad = torch.randn_like(p)
        for cfg in args.configs.split(","):
            block, warps = map(int, cfg.split("x"))
            for rcfg in args.rblocks.split(","):
                rblock, rwarps = map(int, rcfg.split("x"))
                catalog.ELEMENTWISE_BLOCK, catalog.ELEMENTWISE_WARPS = block, warps
                catalog.REDUCE_RBLOCK, catalog.REDUCE_WARPS = rblock, rwarps
                for mode, kw in MODES.items():
                    if mode == "adamw" and rcfg != args.rblocks.split(",")[0]:
                        continue  # no reduce in the single pass
                    opt = LuminaMoon([p], lr=1e-4, weight_decay=0.0, state_dtype=sdt, seed=1,
                                     backend="triton", **kw)
                    us = time_opt(opt)
                    tbs = bytes_per_elem(pdt, sdt, mode) * args.numel / us / 1e6
                    rows.append((mix, mode, block, warps, rblock, rwarps, us, tbs))
                    print(f"{mix:<10} {mode:<6} B{block:<5} w{warps:<3} R{rblock:<5} w{rwarps:<3} "
                          f"{us:9.1f} us {tbs:6.3f} TB/s", flush=True)
                    del opt
                    torch.cuda.empty_cache()
        del p
        torch.cuda.empty_cache()
    if args.out:
        bs.append_csv(args.out, ["date", "device", "torch", "triton", "numel", "mix", "mode",
                                 "block", "warps", "rblock", "rwarps", "us", "TBps"],
                      [[_dt.date.today().isoformat(), name, torch.__version__,
                        triton.__version__, args.numel, *r] for r in rows])


if __name__ == "__main__":
    main()
