"""Where a step's host time goes: cProfile over steps of the GPT-2 shapes (fp32, AdamW mode).
Run on a CUDA machine: python3 scripts/gpu/host_profile.py [--mode adamw] [--src DIR]
(--src: import luminamoon from DIR, e.g. another tree's python/; default this tree's)."""
import argparse
import cProfile
import os
import pstats
import sys

import torch

ap = argparse.ArgumentParser()
ap.add_argument("--case", default="gpt2-124m/fp32")
ap.add_argument("--mode", default="adamw")
ap.add_argument("--steps", type=int, default=300)
ap.add_argument("--src", default=None, help="import luminamoon from this folder")
args = ap.parse_args()
if args.src:  # imported before bench_step, which would put this tree's python/ first
    sys.path.insert(0, os.path.abspath(args.src))
    import luminamoon  # noqa: F401,E402
    print("luminamoon from", os.path.dirname(luminamoon.__file__))
sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..",
                                "benchmarks"))
import bench_step as bs  # noqa: E402
case = next(c for c in bs.all_cases() if c.label == args.case)
params = bs.make_params(case, torch.device("cuda"))
opt, _, _ = bs.build("luminamoon-triton", args.mode, params)
for _ in range(5):
    opt.step()
torch.cuda.synchronize()
prof = cProfile.Profile()
prof.enable()
for i in range(args.steps):
    opt.step()
    if i % 50 == 49:
        torch.cuda.synchronize()
prof.disable()
torch.cuda.synchronize()
st = pstats.Stats(prof)
st.sort_stats("tottime").print_stats(25)
