"""Experiment (not part of the package): launch shapes (num_warps, register cap) of the 16-bit
stochastic-rounding kernels on one 256M-element bf16 tensor, each against the catalog's own in
the same run. A shape changes which elements a thread owns, not what is computed (pass 1's
block sum may associate differently). Prints device time per step and the share of the copy
ceiling, by the spec's byte count.

    PYTHONPATH=python python3 scripts/gpu/exp_warps.py [--numel N] [--steps K]
"""
import argparse
import dataclasses
import sys
import types

import torch

sys.path.insert(0, "python")
from luminamoon import LuminaMoon  # noqa: E402
from luminamoon.optimizer.backends import triton as tb  # noqa: E402

sys.path.insert(0, "benchmarks")
from tune_launch import time_opt  # noqa: E402  (device time of a step, CUDA events)

MODES = {  # name: (state dtype, optimizer keywords, bytes an element)
    "adamw-bf16m": (torch.bfloat16, dict(clip=0.0, nonfinite="propagate"), 14),
    "clip-bf16m": (torch.bfloat16, dict(clip=4.0, nonfinite="skip"), 20),
    "adamw": (torch.float32, dict(clip=0.0, nonfinite="propagate"), 22),
    "clip": (torch.float32, dict(clip=4.0, nonfinite="skip"), 32),
}
# name: {kernel: (num_warps, maxnreg or None or "keep")}
CONFIGS = {
    "catalog": {},
    "p1w2": {"pass1": (2, "keep")},
    "p1w2r64": {"pass1": (2, 64)},
    "p1w2free": {"pass1": (2, None)},
    "p1w1r96": {"pass1": (1, 96)},
    "p2w2": {"pass2": (2, "keep")},
    "p2w2r80": {"pass2": (2, 80)},
    "p1w2p2w2": {"pass1": (2, "keep"), "pass2": (2, "keep")},
    "p1w2r64p2w2r80": {"pass1": (2, 64), "pass2": (2, 80)},
    "spw2": {"single_pass": (2, "keep")},
    "spw2r80": {"single_pass": (2, 80)},
    "spw2free": {"single_pass": (2, None)},
    "spw1r96": {"single_pass": (1, 96)},
}
_ORIG = tb.variants_for


def _patched(overrides):
    def variants_for(*args, **kw):
        out = dict(_ORIG(*args, **kw))
        for name, (w, nreg) in overrides.items():
            if name in out:
                v = out[name]
                out[name] = dataclasses.replace(v, num_warps=w,
                                                maxnreg=v.maxnreg if nreg == "keep" else nreg)
        return out
    return variants_for


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--numel", type=int, default=256 * 2**20)
    ap.add_argument("--steps", type=int, default=10)
    ap.add_argument("--modes", default=",".join(MODES))
    ap.add_argument("--configs", default=",".join(CONFIGS))
    args = ap.parse_args()
    n = args.numel
    src = torch.empty(n // 2, dtype=torch.float32, device="cuda")
    dst = torch.empty_like(src)
    copy_us = time_opt(types.SimpleNamespace(step=lambda: dst.copy_(src)), 20)  # a copy as a "step"
    ceiling = 2 * src.numel() * 4 / (copy_us * 1e-6)
    del src, dst
    print(f"# {torch.cuda.get_device_name(0)}; torch {torch.__version__}; copy ceiling "
          f"{ceiling / 1e12:.3f} TB/s; {n} elements, bf16 params; median of {args.steps} steps")
    gen = torch.Generator(device="cuda").manual_seed(0)
    p = torch.nn.Parameter(torch.randn(n, device="cuda", generator=gen).to(torch.bfloat16))
    p.grad = (torch.randn(n, device="cuda", generator=gen) * 1e-2).to(torch.bfloat16)
    for mode in args.modes.split(","):
        sdt, kw, nbytes = MODES[mode]
        for cname in args.configs.split(","):
            overrides = CONFIGS[cname]
            kinds = {"single_pass"} if "clip" not in mode else {"pass1", "pass2"}
            if overrides and not set(overrides) & kinds:
                continue
            tb.variants_for = _patched(overrides)
            try:
                opt = LuminaMoon([p], lr=1e-5, seed=1, backend="triton", state_dtype=sdt, **kw)
                us = time_opt(opt, args.steps)
            finally:
                tb.variants_for = _ORIG
            eff = nbytes * n / (us * 1e-6) / ceiling
            print(f"{mode:12s} {cname:16s} {us:9.1f} us {100 * eff:6.1f} %", flush=True)
            del opt
            torch.cuda.empty_cache()


if __name__ == "__main__":
    main()
