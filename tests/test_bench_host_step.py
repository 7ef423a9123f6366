"""benchmarks/bench_host_step.py: times a step and its plan check, and the check's parts."""
import os
import re
import subprocess
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
SCRIPT = os.path.join(os.path.dirname(HERE), "benchmarks", "bench_host_step.py")


def test_breakdown_prints_every_part_of_the_check():
    out = subprocess.run(
        [sys.executable, SCRIPT, "--backend", "reference", "--device", "cpu", "--tensors", "6",
         "--modes", "adamw,clip", "--steps", "4", "--warmup", "1", "--breakdown"],
        capture_output=True, text=True, timeout=300, check=True).stdout
    rows = re.findall(r"^\s+6 (adamw|clip)\s+([\d.]+)\s+([\d.]+)\s+([\d.]+)\s+([\d.]+)$", out, re.M)
    assert [r[0] for r in rows] == ["adamw", "clip"], out
    assert all(float(r[1]) > 0 and float(r[3]) > 0 for r in rows), out
    parts = re.findall(r"check parts \(us\): (.*)$", out, re.M)
    assert len(parts) == 2, out
    for line in parts:
        names = [p.split()[0] for p in line.split(", ")]
        assert names == ["params", "grads", "dtypes", "ptrs", "grad_ptrs", "layouts"], line
    assert len(re.findall(r"layout guard: (torch TensorGuards|tuples in Python)$", out, re.M)) == 2
