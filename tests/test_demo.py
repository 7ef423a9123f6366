"""`luminamoon demo` trains on the shipped digits data and reports both optimizers."""
from __future__ import annotations

import pytest


def test_demo_trains_both_optimizers_and_writes_the_plot(tmp_path, capsys):
    pytest.importorskip("sklearn", reason="the demo's data ships with scikit-learn")
    from luminamoon.demo import main

    assert main(["--epochs", "3", "--out", str(tmp_path)]) == 0
    out = capsys.readouterr().out
    rows = [line for line in out.splitlines()
            if line.startswith(("LuminaMoon", "AdamW")) and line.split()[-2].endswith("%")]
    assert len(rows) == 2, out
    accuracies = [float(r.split()[-2].rstrip("%")) for r in rows]
    # 3 epochs of a 64-128-128-10 MLP already separate the ten digits far above chance (10 %)
    assert all(a > 80.0 for a in accuracies), rows
    if "loss curves:" in out:
        assert (tmp_path / "loss_curves.png").stat().st_size > 1000
