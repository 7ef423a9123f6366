"""benchmarks/bench_memory.py --quick on the CPU: every method that runs here trains the tiny
GPT, LuminaMoon's in-backward and offload runs give the normal step's losses bitwise (the same
backend and math on CPU tensors), and the table is written as CSV and markdown."""
import csv
import os
import subprocess
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
SCRIPT = os.path.join(os.path.dirname(HERE), "benchmarks", "bench_memory.py")


def test_quick_run_on_cpu(tmp_path):
    out = tmp_path / "memory"
    res = subprocess.run([sys.executable, SCRIPT, "--quick", "--device", "cpu", "--out", str(out)],
                         capture_output=True, text=True, timeout=300, check=False)
    assert res.returncode == 0, res.stderr + res.stdout
    with open(f"{out}.csv") as f:
        rows = {r["method"]: r for r in csv.DictReader(f)}
    assert os.path.getsize(f"{out}.md") > 0
    for name in ("luminamoon", "luminamoon-in-backward", "luminamoon-offload",
                 "luminamoon-offload-in-backward", "torch-adamw-fused", "torch-in-backward"):
        assert float(rows[name]["ms_per_step"]) > 0, rows[name]
    for name in ("luminamoon-in-backward", "luminamoon-offload", "luminamoon-offload-in-backward"):
        assert rows[name]["vs_normal"] == "bitwise", rows[name]
    assert rows["torchao-cpu-offload"]["note"] == "needs CUDA"
