"""benchmarks/bench_bf16_convergence.py: runs end to end on CPU and writes every run's curves."""
import csv
import importlib.util
import math
import os

HERE = os.path.dirname(os.path.abspath(__file__))


def _module():
    path = os.path.join(os.path.dirname(HERE), "benchmarks", "bench_bf16_convergence.py")
    spec = importlib.util.spec_from_file_location("bench_bf16_convergence", path)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def test_quick_run_writes_finite_curves_for_each_run(tmp_path, capsys):
    out = tmp_path / "curves.csv"
    runs = "fp32-adamw,bf16-lumina,bf16-lumina-rtn"
    assert _module().main(["--device", "cpu", "--quick", "--steps", "40", "--eval-every", "20",
                           "--runs", runs, "--csv", str(out)]) == 0
    printed = capsys.readouterr().out
    rows = list(csv.DictReader(open(out)))
    for run in runs.split(","):
        mine = [r for r in rows if r["run"] == run]
        assert len([r for r in mine if r["train_loss"]]) == 40, run
        vals = [float(r["val_loss"]) for r in mine if r["val_loss"]]
        assert len(vals) == 3 and all(math.isfinite(v) for v in vals), (run, vals)
        assert vals[-1] < vals[0], (run, vals)  # it learns
        assert run in printed
