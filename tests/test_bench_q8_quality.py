"""benchmarks/bench_q8_quality.py --quick on the CPU: LuminaMoon with float32 and with q8 moments
trains the tiny GPT from the same weights and batches, q8 keeps a quarter of the state and stays
within the 0.5 % target, and the CSV and markdown are written (torchao's run: a row saying why
where it is not installed)."""
import csv
import math
import os
import subprocess
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
SCRIPT = os.path.join(os.path.dirname(HERE), "benchmarks", "bench_q8_quality.py")


def test_quick_run_on_cpu(tmp_path):
    out = tmp_path / "q8"
    res = subprocess.run([sys.executable, SCRIPT, "--quick", "--device", "cpu", "--runs",
                          "lumina-fp32m,lumina-q8,torchao-8bit", "--out", str(out)],
                         capture_output=True, text=True, timeout=600, check=False)
    assert res.returncode == 0, res.stderr + res.stdout
    rows = list(csv.DictReader(open(f"{out}.csv")))
    curves = {}
    for r in rows:
        curves.setdefault(r["run"], []).append(r)
    for run in ("lumina-fp32m", "lumina-q8"):
        vals = [float(r["val_loss"]) for r in curves[run]]
        assert [int(r["step"]) for r in curves[run]] == [0, 20, 40], run
        assert all(math.isfinite(v) for v in vals) and vals[-1] < vals[0] - 0.3, (run, vals)
        assert float(curves[run][-1]["tokens_per_s"]) > 0
    fp32m, q8 = curves["lumina-fp32m"][-1], curves["lumina-q8"][-1]
    # the same first evaluation (the same weights), then q8 within 0.5 % of float32 moments
    assert curves["lumina-q8"][0]["val_loss"] == curves["lumina-fp32m"][0]["val_loss"]
    rel = float(q8["val_loss"]) / float(fp32m["val_loss"]) - 1
    # (the CSV holds each loss and the ratio to 5 decimals)
    assert abs(float(q8["rel_vs_fp32m"]) - rel) < 1e-4, (q8["rel_vs_fp32m"], rel)
    assert abs(rel) < 0.005, rel
    # one byte a moment and element (and the small tensors' float32 moments) against eight
    assert float(q8["state_bytes_per_param"]) < float(fp32m["state_bytes_per_param"]) / 3
    ao = curves["torchao-8bit"]
    assert ao[-1]["val_loss"] or ao[0]["note"].startswith("not run"), ao
    assert "| lumina-q8 |" in open(f"{out}.md").read()
