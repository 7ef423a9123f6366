"""benchmarks/bench_step.py on the CPU: the q8 modes step with the reference backend, their state
bytes a parameter are those of q8's layout, the byte count is the spec's, and an implementation
that cannot run gets a row that says why."""
import csv
import importlib.util
import math
import os
import sys

import pytest
import torch

from luminamoon.kernels import quant

HERE = os.path.dirname(os.path.abspath(__file__))


def _module():
    path = os.path.join(os.path.dirname(HERE), "benchmarks", "bench_step.py")
    spec = importlib.util.spec_from_file_location("bench_step", path)
    mod = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = mod  # (its dataclasses look their module up)
    saved = list(sys.path)
    try:
        spec.loader.exec_module(mod)
    finally:
        # the script puts its tree's python/ first (to time that tree's sources); the suite's
        # later processes (spawned ranks, the CLI's subprocesses) inherit sys.path and must keep
        # importing the installed package, with its compiled module
        sys.path[:] = saved
    return mod


def _state_bytes(shapes, q8: bool) -> int:
    """The moments' bytes: under q8 a tensor of >= 4096 elements keeps a uint8 code an element
    and a float32 scale a block of 256 along its rows, for m and for v; any other keeps two
    float32 moments."""
    total = 0
    for shape in shapes:
        n = math.prod(shape)
        if q8 and n >= 4096:
            total += 2 * (n + 4 * math.prod(quant.scale_shape(shape)))
        else:
            total += 2 * 4 * n
    return total


def test_the_q8_byte_count_is_the_specs():
    bs = _module()
    bf16 = torch.bfloat16
    # bf16 p and g (2 B), q8 moments: codes 1 B and scales 4/256 B, read and written
    assert bs.bytes_per_element(bf16, bf16, "q8", 0.0, "none", "propagate") == 3 * 2 + 4 * (
        1 + 4 / 256)
    assert bs.bytes_per_element(bf16, bf16, "q8", 4.0, "none", "skip") == 4 * 2 + 6 * (
        1 + 4 / 256)
    # a row of 300 elements has two blocks, so two scales a row
    shapes = [(1000, 300)]
    states = [bs.moment_storage("luminamoon-reference", s, bf16, "q8") for s in shapes]
    assert states == [("q8", 2000)]
    assert bs.step_bytes(shapes, bf16, bf16, states, 0.0, "none", "propagate") == (
        300_000 * 6 + 4 * (300_000 + 4 * 2000))
    # below 4096 elements LuminaMoon keeps float32 moments, torchao the parameter dtype
    assert bs.moment_storage("luminamoon-triton", (4095,), bf16, "q8") == (torch.float32, 0)
    assert bs.moment_storage("torchao-adamw8bit", (4095,), bf16, "q8") == (bf16, 0)


def test_q8_rows_run_on_cpu_with_the_reference_backend(tmp_path, capsys):
    bs = _module()
    out = tmp_path / "step.csv"
    impls = "luminamoon-reference,torchao-adamw8bit,bnb-adamw8bit"
    assert bs.main(["--device", "cpu", "--cases", "small-mixed/fp32", "--modes",
                    "adamw,adamw-q8,clip-q8", "--impls", impls, "--steps", "2", "--warmup", "1",
                    "--out", str(out)]) == 0
    printed = capsys.readouterr().out
    rows = {(r["mode"], r["impl"]): r for r in csv.DictReader(open(out))}
    shapes = bs.mixed_shapes()
    numel = sum(math.prod(s) for s in shapes)
    for mode, q8 in (("adamw", False), ("adamw-q8", True), ("clip-q8", True)):
        row = rows[(mode, "luminamoon-reference")]
        assert float(row["us_per_step"]) > 0 and row["note"] == "", row
        assert row["state_bytes_from"] == "storage"
        # the moments, and at most 64 bytes a tensor more (the step counters)
        state = float(row["state_bytes_per_param"]) * numel
        expected = _state_bytes(shapes, q8)
        assert expected <= state <= expected + 64 * len(shapes), (mode, state, expected)
    assert float(rows[("adamw-q8", "luminamoon-reference")]["state_bytes_per_param"]) < 2.2
    # the peers are timed on CUDA only: a row that says so, no numbers
    for impl in ("torchao-adamw8bit", "bnb-adamw8bit"):
        row = rows[("adamw-q8", impl)]
        assert row["us_per_step"] == "" and "needs CUDA" in row["note"], row
        assert f"{impl:<22} needs CUDA" in printed
    assert ("clip-q8", "torchao-adamw8bit") not in rows  # the peers only beside AdamW mode


def test_an_implementation_that_fails_gets_a_row_saying_why(tmp_path, monkeypatch):
    bs = _module()

    def refuse(impl, mode, params):
        raise ValueError("backend 'x' does not step state_dtype='q8' yet")

    monkeypatch.setattr(bs, "build", refuse)
    out = tmp_path / "step.csv"
    assert bs.main(["--device", "cpu", "--cases", "small-mixed/bf16", "--modes", "adamw-q8",
                    "--impls", "luminamoon-reference", "--steps", "1", "--warmup", "0",
                    "--out", str(out)]) == 0
    (row,) = list(csv.DictReader(open(out)))
    assert row["note"] == "failed: ValueError: backend 'x' does not step state_dtype='q8' yet"
    assert row["us_per_step"] == ""


@pytest.mark.parametrize("impl", ["torchao-adamw8bit", "bnb-adamw8bit"])
def test_a_peer_that_does_not_import_says_so(monkeypatch, impl):
    bs = _module()
    monkeypatch.setattr(bs, "_importable", lambda module: f"{module} does not import: boom")
    case = next(c for c in bs.all_cases() if c.label == "gpt2-124m/bf16")
    got = dict(bs.impls_for(case, "adamw-q8", torch.device("cuda"), [impl]))
    assert got[impl].endswith("does not import: boom"), got
