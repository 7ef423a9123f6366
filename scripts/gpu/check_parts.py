"""The plan check's per-tensor reads, each timed alone over 1000 tiny CUDA tensors (Parameters
and plain tensors): data_ptr through Python, torch's one-call pointer comparison, TensorGuards,
the .grad getter. Median of --repeat timings of one pass over the list, in us.
Run on a CUDA machine: python3 scripts/gpu/check_parts.py"""
import argparse
import operator
import os
import statistics
import sys
import time

import torch

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..",
                                "benchmarks"))
from bench_step import tiny_shapes  # noqa: E402  (bench_step's tiny-1000 case)

ap = argparse.ArgumentParser()
ap.add_argument("--tensors", type=int, default=1000)
ap.add_argument("--repeat", type=int, default=300)
args = ap.parse_args()
dev = torch.device(os.environ.get("CHECK_DEVICE", "cuda"))
plain = [torch.randn(s, device=dev) for s in tiny_shapes()[:args.tensors]]
params = [torch.nn.Parameter(t.clone()) for t in plain]
for p, g in zip(params, plain):
    p.grad = g
from torch._C._dynamo.guards import TensorGuards  # noqa: E402

ptrs_equal = getattr(torch._C, "_tensors_data_ptrs_at_indices_equal", None)
data_ptr = torch.Tensor.data_ptr


def timed(fn):
    fn()
    out = []
    for _ in range(args.repeat):
        t0 = time.perf_counter_ns()
        fn()
        out.append(time.perf_counter_ns() - t0)
    return statistics.median(out) / 1e3


rows = []
for name, ts in (("params", params), ("plain", plain)):
    ptrs = [t.data_ptr() for t in ts]
    tup = tuple(ptrs)
    idx = list(range(len(ts)))
    guards = TensorGuards(*ts, dynamic_dims_sizes=[list(t.shape) for t in ts],
                          dynamic_dims_strides=[list(t.stride()) for t in ts])
    rows.append((name, "map(data_ptr) == tuple", timed(lambda: tuple(map(data_ptr, ts)) == tup)))
    if ptrs_equal is not None:
        rows.append((name, "_tensors_data_ptrs_at_indices_equal",
                     timed(lambda: ptrs_equal(ts, ptrs, idx))))
    rows.append((name, "TensorGuards.check", timed(lambda: guards.check(*ts))))
    rows.append((name, "set(map(dtype))", timed(lambda: set(map(operator.attrgetter("dtype"), ts)))))
    rows.append((name, "map(is_)", timed(lambda: all(map(operator.is_, ts, ts)))))
rows.append(("params", "list(map(grad))", timed(lambda: list(map(operator.attrgetter("grad"), params)))))
print(torch.__version__, torch.cuda.get_device_name(0) if dev.type == "cuda" else dev, f"{args.tensors} tensors")
for name, what, us in rows:
    print(f"{name:7s} {what:40s} {us:8.1f} us")
