"""`luminamoon demo --quick`: every run of the comparison reports, the faults do what they must.

Timings are printed by the demo but never asserted here: they are benchmarks.
"""
from __future__ import annotations

import csv
import math

import pytest

from conftest import import_or_skip, require

# The rows of the run table, in order (the quick demo leaves out the round-to-nearest control).
Q8 = "LuminaMoon, fp32, q8 moments"
RUNS = ["AdamW, fp32", "LuminaMoon, fp32", Q8, "AdamW, bf16 round-to-nearest",
        "LuminaMoon, bf16 stochastic rounding", "AdamW, fp32, faults", "LuminaMoon, fp32, faults"]
# The fault-free runs that train wherever the demo runs (the q8 run needs a backend that steps
# q8 moments, else its row says why).
TRAINED = [RUNS[0], RUNS[1], RUNS[3], RUNS[4]]


@pytest.fixture(scope="module")
def quick_demo(tmp_path_factory):
    require("tqdm")
    import contextlib
    import io

    from luminamoon.demo import main

    out = tmp_path_factory.mktemp("demo")
    text = io.StringIO()
    with contextlib.redirect_stdout(text):
        assert main(["--quick", "--device", "cpu", "--out", str(out)]) == 0
    with open(out / "results.csv", newline="") as fh:
        rows = list(csv.DictReader(fh))
    return out, text.getvalue(), rows


def _runs(rows):
    return {r["name"]: r for r in rows if r["kind"] == "run"}


def test_the_table_has_every_run(quick_demo):
    _, stdout, rows = quick_demo
    assert list(_runs(rows)) == RUNS
    printed = [line for line in stdout.splitlines() if line.startswith(tuple(RUNS))]
    assert [line for line in printed if "  " in line], stdout
    for name in RUNS:
        assert any(line.startswith(name) for line in printed), (name, stdout)


def test_losses_are_finite_where_they_must_be(quick_demo):
    runs = _runs(quick_demo[2])
    for name in TRAINED:
        loss = float(runs[name]["val_loss"])
        # a character model of ~97 symbols starts near ln(97) = 4.57; 120 steps of any of these
        # runs reach about 2.65 (measured), far below where they started
        assert math.isfinite(loss) and loss < 3.5, (name, loss)
    # the poisoned batches set LuminaMoon back (about 4.0 in the quick run), but it trains on
    assert math.isfinite(float(runs["LuminaMoon, fp32, faults"]["val_loss"]))


def test_the_nan_step_is_skipped_by_luminamoon_and_poisons_adamw(quick_demo):
    runs = _runs(quick_demo[2])
    lumina, adamw = runs["LuminaMoon, fp32, faults"], runs["AdamW, fp32, faults"]
    assert int(lumina["skipped_steps"]) == 1
    assert lumina["nan_from_step"] == ""
    assert math.isnan(float(adamw["val_loss"]))
    assert adamw["nan_from_step"] != ""
    # no fault-free run skips anything
    for name in TRAINED:
        assert int(runs[name]["skipped_steps"]) == 0, name


def test_every_run_reports_its_state_bytes(quick_demo):
    """Two float32 moments a parameter are 8 bytes, two bf16 ones 4 (plus step counters);
    q8 moments about 2 (one byte a moment, a scale a block, the small tensors' float32)."""
    runs = _runs(quick_demo[2])
    for name, moments in (("AdamW, fp32", 8), ("LuminaMoon, fp32", 8),
                          ("AdamW, bf16 round-to-nearest", 4),
                          ("LuminaMoon, bf16 stochastic rounding", 4)):
        state = float(runs[name]["state_bytes_per_param"])
        assert moments <= state < moments + 0.05, (name, state)
    q8 = runs[Q8]
    if q8["note"]:  # no backend of this demo steps q8 moments: the row says so, no numbers
        assert q8["note"].startswith("not run: ") and "q8" in q8["note"], q8
        assert q8["val_loss"] == q8["state_bytes_per_param"] == "", q8
        assert Q8 in quick_demo[1] and "not run: " in quick_demo[1]
    else:
        assert math.isfinite(float(q8["val_loss"])) and float(q8["val_loss"]) < 3.5, q8
        assert float(q8["state_bytes_per_param"]) < 8 / 3, q8


def test_the_q8_run_trains_and_keeps_a_quarter_of_the_state():
    """The demo's q8 run on the reference backend (which steps q8 moments wherever the demo
    runs), on a smaller model: it learns, from the same weights and batches as float32
    moments, within 0.5 % of their loss, with under a third of their state."""
    from luminamoon.demo import cli
    from luminamoon.demo.config import QUICK, Config
    from luminamoon.demo.runs import Session, run_specs, train

    cfg = Config(**{**QUICK, "steps": 30, "eval_every": 15, "d_model": 64, "n_layer": 1,
                    "batch": 8, "ctx": 32})
    session = Session(cfg, "cpu", "reference", None, seed=0)
    specs = {s.key: s for s in run_specs(cfg)}
    fp32, q8 = (train(session, specs[k], cli._PlainProgress) for k in ("fp32-lumina", "q8-lumina"))
    assert q8.note == "" and q8.backend == "reference"
    assert q8.val_loss[0] == fp32.val_loss[0] and q8.val_loss[-1] < q8.val_loss[0] - 0.3
    assert abs(q8.final_val / fp32.final_val - 1) < 0.005, (q8.val_loss, fp32.val_loss)
    assert q8.state_bytes < fp32.state_bytes / 3, (q8.state_bytes, fp32.state_bytes)


def test_step_times_are_reported_for_luminamoon_and_torch(quick_demo):
    rows = [r for r in quick_demo[2] if r["kind"] == "step_time"]
    names = {r["name"] for r in rows}
    assert any(n.startswith("LuminaMoon") for n in names), names
    assert any(n.startswith("torch AdamW") for n in names), names
    assert {r["dtype"] for r in rows} == {"float32", "bfloat16"}


def test_outputs_are_written(quick_demo):
    out, stdout, _ = quick_demo
    assert (out / "results.md").read_text().count("|") > 20
    require("matplotlib")
    for name in ("loss_curves.png", "step_time.png"):
        assert (out / name).stat().st_size > 10_000, name
    assert "wrote" in stdout


def test_help_documents_every_option(capsys):
    from luminamoon.demo import build_parser

    text = build_parser().format_help()
    for option in ("--quick", "--steps", "--device", "--out", "--seed", "--backend",
                   "--no-plot", "--aot-bundle", "--lr", "--threads"):
        assert option in text, option
    actions = [a for a in build_parser()._actions if a.option_strings and a.dest != "help"]
    assert all(a.help for a in actions), [a.dest for a in actions if not a.help]


def test_the_step_time_table_includes_the_cpu_engine_where_it_is_built(quick_demo):
    """On CPU with the native module built, the step-time table times LuminaMoon's own engine
    (backend "cpu"), not only the reference."""
    require("native")
    import torch

    from luminamoon.demo import available_backends

    assert available_backends(torch.device("cpu"), None)[0] == "cpu"
    names = {r["name"] for r in quick_demo[2] if r["kind"] == "step_time"}
    assert "LuminaMoon cpu" in names, names


def test_threads_option_reaches_the_native_cpu_engine():
    """`--threads N` gives LuminaMoon's cpu engine N threads (not silently the default)."""
    native = import_or_skip("luminamoon.optimizer.backends.cpu", "native")
    import torch

    from luminamoon.demo.config import QUICK, Config
    from luminamoon.demo.runs import RunSpec, Session

    session = Session(Config(**QUICK), "cpu", "cpu", None, seed=0, cpu_threads=1)
    params = [torch.zeros(4, requires_grad=True)]
    opt = session.make_optimizer(RunSpec("t", "t", "", "luminamoon", "float32"), params)
    backends = [b for b in vars(opt).values() if isinstance(b, native.CpuBackend)]
    backends += [b for g in opt.param_groups for b in g.values()
                 if isinstance(b, native.CpuBackend)]
    assert backends and all(b.num_threads == 1 for b in backends), vars(opt)


def test_on_cuda_the_demo_finds_the_bundle_the_wheel_ships(monkeypatch, tmp_path):
    """Without --aot-bundle, $LUMINAMOON_AOT_BUNDLE or ./bundle, a CUDA demo takes the
    installation's default bundle (so its panel has the aot backend); a CPU demo takes none."""
    from luminamoon.aot import default as aot_default
    from luminamoon.demo import cli

    shipped = tmp_path / "shipped"
    monkeypatch.chdir(tmp_path)
    monkeypatch.delenv("LUMINAMOON_AOT_BUNDLE", raising=False)
    monkeypatch.setattr(aot_default, "packaged_bundle_dir", lambda: str(shipped))
    assert cli.default_aot_bundle("cuda") == str(shipped)
    assert cli.default_aot_bundle("cpu") is None
    (tmp_path / "bundle").mkdir()
    (tmp_path / "bundle" / "manifest.json").write_text("{}")
    assert cli.default_aot_bundle("cuda") == "bundle"
    monkeypatch.setenv("LUMINAMOON_AOT_BUNDLE", "/somewhere")
    assert cli.default_aot_bundle("cpu") == "/somewhere"


def test_throughput_leaves_out_the_warm_up_steps():
    """A run's tokens/s is taken after its first steps (a GPU run's first step compiles its
    kernels), as its optimizer time is."""
    from luminamoon.demo.runs import RunResult, RunSpec

    r = RunResult(RunSpec("t", "t", "", "luminamoon", "float32"), tokens_per_step=100,
                  step_seconds=[5.0] + [0.01] * 9)
    assert r.tokens_per_s(1) == pytest.approx(100 / 0.01)
    assert r.tokens_per_s(0) == pytest.approx(1000 / 5.09)
