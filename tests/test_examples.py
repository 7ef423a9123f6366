"""The training stacks of examples/ with tiny sizes, on the CPU: a Hugging Face Trainer run, a
PyTorch Lightning run and torch.compile, each asserting that the loss falls and, where there is
a checkpoint, that a resumed run continues the interrupted one exactly (the same global step,
the optimizer state as saved, the same losses bit for bit).

Each example's ``main(argv)`` runs in this process and returns what it measured. The
transformers and lightning tests skip where those packages are not installed (the version
matrix installs neither).
"""
from __future__ import annotations

import os
import subprocess
import sys

import pytest
import torch

from conftest import needs, require

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
EXAMPLES = os.path.join(ROOT, "examples")


@pytest.fixture(autouse=True)
def _examples_env(monkeypatch):
    """examples/ importable, no hub access, one intra-op thread; then the environment, torch's
    RNG and thread count as they were.

    One thread: these models are tiny, and on a machine whose cores are busy with other work
    torch's threads wait at every parallel region's barrier for a thread that is not running
    (a 2 ms step measured at 370 ms, with torch.optim.AdamW as with LuminaMoon)."""
    monkeypatch.syspath_prepend(EXAMPLES)
    environ = dict(os.environ)
    os.environ["HF_HUB_OFFLINE"] = "1"
    os.environ["TRANSFORMERS_NO_ADVISORY_WARNINGS"] = "1"
    rng = torch.get_rng_state()
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)
    torch.set_rng_state(rng)
    os.environ.clear()
    os.environ.update(environ)


def _falls(losses, n=3, margin=0.05):
    """Whether the mean of the last ``n`` losses is below the mean of the first ``n`` by more
    than ``margin`` (nats)."""
    values = [l for _, l in losses] if isinstance(losses[0], tuple) else list(losses)
    first, last = sum(values[:n]) / n, sum(values[-n:]) / n
    return last < first - margin, (first, last)


@pytest.mark.parametrize("script", ["hf_trainer.py", "lightning_train.py", "compiled_model.py",
                                    "fsdp_tp.py"])
def test_example_scripts_have_help(script):
    out = subprocess.run([sys.executable, os.path.join(EXAMPLES, script), "--help"],
                         capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stderr
    assert "usage:" in out.stdout and "--" in out.stdout


# ---------------------------------------------------------------------------------------------
# Hugging Face Transformers Trainer
# ---------------------------------------------------------------------------------------------
HF_TINY = ["--max-steps", "12", "--save-steps", "6", "--text-bytes", "60000",
           "--block-size", "32", "--batch-size", "4", "--n-embd", "32", "--n-layer", "1",
           "--n-head", "2", "--warmup-steps", "3", "--eval-batches", "2", "--logging-steps", "1",
           "--quiet"]


def _hf():
    require("transformers", "accelerate")
    import hf_trainer

    return hf_trainer


@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
def test_hf_trainer_trains_and_resume_continues(tmp_path, dtype):
    hf_trainer = _hf()
    common = HF_TINY + ["--dtype", dtype]
    first = hf_trainer.main(["--out", str(tmp_path / "a"), "--opt-seed", "777"] + common)
    assert first["global_step"] == 12
    assert [s for s, _ in first["losses"]] == list(range(1, 13))
    falls, means = _falls(first["losses"])
    assert falls, means
    assert first["eval_after"] < first["eval_before"] - 0.1, first
    assert first["opt_seed"] == 777
    ckpt = tmp_path / "a" / "checkpoint-6"
    assert (ckpt / "optimizer.pt").is_file() and (ckpt / "scheduler.pt").is_file()

    # resume from step 6 with another --opt-seed: the checkpoint's seed must win
    second = hf_trainer.main(["--out", str(tmp_path / "b"), "--opt-seed", "999",
                              "--resume-from", str(ckpt)] + common)
    resume = second["resume"]
    assert resume["global_step"] == 6  # where the resumed run starts
    assert second["resume_problems"] == []  # the optimizer state as loaded == optimizer.pt
    saved = second["saved_state_dict"]
    assert saved["state"], "the checkpoint's optimizer state is empty"
    for state in saved["state"].values():
        assert int(state["step"]) == 6
        assert state["exp_avg"].abs().sum() > 0 and state["exp_avg_sq"].abs().sum() > 0
    assert {g["seed"] for g in saved["param_groups"]} == {777}
    assert resume["seed"] == 777 and second["opt_seed"] == 777
    assert second["global_step"] == 12
    assert [s for s, _ in second["losses"]] == list(range(7, 13))
    # the resumed steps are the uninterrupted run's, bit for bit (same data, RNG, state)
    assert second["losses"] == first["losses"][6:]
    assert second["eval_after"] == first["eval_after"]
    # and so is the optimizer state both runs saved at step 12
    from optim_state import compare_states

    end_a = torch.load(tmp_path / "a" / "checkpoint-12" / "optimizer.pt", weights_only=True)
    end_b = torch.load(tmp_path / "b" / "checkpoint-12" / "optimizer.pt", weights_only=True)
    assert compare_states(end_b, end_a) == []


@needs("named params")
def test_hf_trainer_named_parameters(tmp_path):
    """torch.optim optimizers take (name, parameter) pairs (torch >= 2.6): the state dict then
    carries each group's 'param_names', and a checkpoint resumes as with bare parameters."""
    hf_trainer = _hf()
    common = HF_TINY + ["--named-params"]
    first = hf_trainer.main(["--out", str(tmp_path / "a"), "--opt-seed", "5"] + common)
    falls, means = _falls(first["losses"])
    assert falls, means
    ckpt = tmp_path / "a" / "checkpoint-6"
    saved = torch.load(ckpt / "optimizer.pt", weights_only=True)
    names = [n for g in saved["param_groups"] for n in g.get("param_names", [])]
    assert "transformer.wte.weight" in names and "transformer.h.0.ln_1.bias" in names, names
    second = hf_trainer.main(["--out", str(tmp_path / "b"), "--resume-from", str(ckpt)] + common)
    assert second["resume_problems"] == []
    assert second["losses"] == first["losses"][6:]


# ---------------------------------------------------------------------------------------------
# PyTorch Lightning
# ---------------------------------------------------------------------------------------------
# dropout 0: Lightning checkpoints do not hold torch's RNG state, so dropout masks after a
# resume would differ from the uninterrupted run's
LIGHTNING_TINY = ["--max-epochs", "3", "--text-bytes", "20000", "--block-size", "32",
                  "--batch-size", "16", "--d-model", "32", "--n-layer", "1", "--n-head", "2",
                  "--warmup-steps", "5", "--dropout", "0", "--accelerator", "cpu", "--quiet"]


@pytest.mark.parametrize("precision", ["32-true", "bf16-true"])
def test_lightning_trains_and_resume_continues(tmp_path, precision):
    require("lightning")
    import lightning_train

    common = LIGHTNING_TINY + ["--precision", precision]
    first = lightning_train.main(["--out", str(tmp_path / "a"), "--opt-seed", "777"] + common)
    spe = first["steps_per_epoch"]
    assert first["global_step"] == 3 * spe and first["epoch"] == 3
    assert first["param_dtype"] == ("torch.bfloat16" if precision == "bf16-true"
                                    else "torch.float32")
    falls, means = _falls(first["losses"])
    assert falls, means
    val = [v for _, v in first["val_losses"]]
    assert len(val) == 3 and val[-1] < val[0], first["val_losses"]
    ckpts = sorted(os.listdir(first["checkpoint_dir"]))
    assert f"epoch=0-step={spe}.ckpt" in ckpts and "last.ckpt" in ckpts, ckpts

    resume_from = os.path.join(first["checkpoint_dir"], f"epoch=0-step={spe}.ckpt")
    second = lightning_train.main(["--out", str(tmp_path / "b"), "--opt-seed", "999",
                                   "--resume-from", resume_from] + common)
    restored = second["restored"]
    assert second["saved_global_step"] == spe
    assert restored["global_step"] == spe and restored["epoch"] == 1
    assert second["resume_problems"] == []  # optimizer state as restored == the checkpoint's
    for state in second["saved_optimizer_state"]["state"].values():
        assert int(state["step"]) == spe
    assert restored["seed"] == 777 and second["opt_seed"] == 777
    assert second["global_step"] == 3 * spe and second["epoch"] == 3
    assert [s for s, _ in second["losses"]] == list(range(spe + 1, 3 * spe + 1))
    assert second["losses"] == first["losses"][spe:]
    assert second["val_losses"] == first["val_losses"][1:]

    if precision == "bf16-true":
        # the control: bf16 stores are rounded from the seed, so another seed trains other
        # weights; the resumed run above matching means the checkpoint's seed was restored
        other = lightning_train.main(["--out", str(tmp_path / "c"), "--opt-seed", "999"]
                                     + common)
        assert other["losses"][spe:] != first["losses"][spe:]


# ---------------------------------------------------------------------------------------------
# torch.compile
# ---------------------------------------------------------------------------------------------
COMPILE_TINY = ["--steps", "6", "--text-bytes", "20000", "--block-size", "32",
                "--batch-size", "8", "--d-model", "32", "--n-layer", "1", "--n-head", "2",
                "--device", "cpu", "--no-fullgraph-check"]


def _compiled_model():
    require("torch.compile")
    import compiled_model

    return compiled_model


def _runs(result):
    """The runs of compiled_model.main, raising the first one's error (its traceback)."""
    for r in result["runs"].values():
        if "error" in r:
            raise r["error"]
    return result["runs"]


def test_compiled_module_matches_eager_bitwise():
    """torch.compile(model) with aot_eager runs eager's ATen ops: the same losses and weights,
    bit for bit, with LuminaMoon stepping outside the compiled code."""
    compiled_model = _compiled_model()
    result = compiled_model.main(COMPILE_TINY + ["--backend", "aot_eager",
                                                 "--modes", "eager,module"])
    eager, module = _runs(result)["eager"], _runs(result)["module"]
    falls, means = _falls(eager["losses"], n=2)
    assert falls, means
    assert module["bitwise_losses"], (module["losses"], eager["losses"])
    assert module["bitwise_params"]
    assert module["skipped"] == 0


_INDUCTOR_RUN = """
import json, sys
sys.path.insert(0, sys.argv[1])
import compiled_model
result = compiled_model.main(json.loads(sys.argv[2]))
runs = result["runs"]
print("RESULT " + json.dumps({m: dict(losses=r.get("losses"), error=repr(r.get("error")),
                                      diff=r.get("max_loss_diff")) for m, r in runs.items()}))
"""


def _inductor_run(optimizer: str):
    """eager vs inductor-compiled module in a fresh process: the kernels inductor builds may
    set the CPU's flush-to-zero mode for the whole process (torch 2.4/2.5), which must not
    reach the tests that follow."""
    import json
    import subprocess

    argv = COMPILE_TINY + ["--backend", "inductor", "--modes", "eager,module", "--steps", "4",
                           "--optimizer", optimizer]
    proc = subprocess.run([sys.executable, "-c", _INDUCTOR_RUN, str(EXAMPLES), json.dumps(argv)],
                          capture_output=True, text=True, timeout=600)
    lines = [ln for ln in proc.stdout.splitlines() if ln.startswith("RESULT ")]
    assert proc.returncode == 0 and lines, proc.stdout[-3000:] + proc.stderr[-3000:]
    return json.loads(lines[-1][len("RESULT "):])


def test_compiled_module_inductor_close_to_eager():
    """inductor's generated kernels order float arithmetic differently: close, not bitwise.
    How close depends on torch's inductor (torch 2.5.1's moves torch's own AdamW by 6.5e-3 on
    this run): LuminaMoon's run may move no further than 1e-3, or than half again as far as
    AdamW's does."""
    runs = _inductor_run("luminamoon")
    module = runs["module"]
    assert module["losses"] is not None, module["error"]
    falls, means = _falls(module["losses"], n=2)
    assert falls, means
    if module["diff"] >= 1e-3:
        adamw = _inductor_run("adamw")["module"]
        assert adamw["diff"] is not None, adamw["error"]
        assert module["diff"] <= 1.5 * adamw["diff"], (module, adamw)


def _aot_eager_run_as_eager(mode: str):
    """compiled_model's run ``mode`` beside eager with aot_eager: its loss falls, and its losses
    and final weights are eager's, bit for bit; returns the run."""
    compiled_model = _compiled_model()
    result = compiled_model.main(COMPILE_TINY + ["--backend", "aot_eager",
                                                 "--modes", f"eager,{mode}"])
    run = _runs(result)[mode]
    falls, means = _falls(run["losses"], n=2)
    assert falls, means
    assert run["bitwise_losses"], (run["losses"], result["runs"]["eager"]["losses"])
    assert run["bitwise_params"]
    return run


def test_compiled_train_step_calling_opt_step_matches_eager():
    """A training step compiled whole (zero_grad, forward, backward, opt.step()): Dynamo breaks
    the graph around the backward pass and LuminaMoon's step, and the run equals eager's."""
    _aot_eager_run_as_eager("step")


def test_compiled_train_step_resumed_from_a_checkpoint_continues_as_eager():
    """The compiled training step stopped halfway, its model's and optimizer's state dicts
    saved and loaded into a new model, optimizer and compiled step: the resumed run's losses
    and final weights are eager's uninterrupted ones, bit for bit (the step counts, moments and
    rounding seed came back)."""
    resume = _aot_eager_run_as_eager("resume")
    steps = {int(v["step"]) for v in resume["state"]["state"].values()}
    assert steps == {6}, steps


def test_fullgraph_compile_of_opt_step_says_luminamoon_cannot_be_one_graph():
    """fullgraph=True forbids graph breaks, and LuminaMoon's step launches kernels Dynamo does
    not trace: the compile must fail with Dynamo's Unsupported error, and its explanation (the
    text before Dynamo's 'from user code:' trace) must name LuminaMoon, not some incidental
    call inside it."""
    compiled_model = _compiled_model()
    args = compiled_model.parse_args(["--device", "cpu", "--backend", "eager"])
    err = compiled_model.fullgraph_step_error(args, "cpu")
    assert err is not None, "a fullgraph=True compile of opt.step() compiled"
    assert isinstance(err, torch._dynamo.exc.Unsupported), repr(err)
    explanation = str(err).split("from user code:")[0]
    assert "LuminaMoon" in explanation, explanation


# ------------------------------------------------------------------------------------------
# FSDP2 over tensor parallelism (examples/fsdp_tp.py) on four CPU ranks
# ------------------------------------------------------------------------------------------
FSDP_TP_TINY = ["--dp", "2", "--tp", "2", "--text-bytes", "20000", "--d-model", "32",
                "--n-layer", "1", "--block-size", "16", "--batch-size", "4", "--save-every", "3"]


def _torchrun(args, cwd):
    import json

    require("gloo", "fsdp2")
    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone",
           "--nproc-per-node", "4", os.path.join(EXAMPLES, "fsdp_tp.py")] + args
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=300, cwd=cwd,
                          env={**os.environ, "OMP_NUM_THREADS": "1"})
    lines = [ln for ln in proc.stdout.splitlines() if ln.startswith("RESULT ")]
    assert proc.returncode == 0 and lines, proc.stdout[-3000:] + proc.stderr[-5000:]
    return json.loads(lines[-1][len("RESULT "):])


@pytest.mark.parametrize("bf16", [False, True], ids=["fp32", "bf16-sr"])
def test_fsdp_tp_trains_and_resumes_bitwise(tmp_path, bf16):
    """Six steps on a (dp 2, tp 2) mesh with a checkpoint after the third; a second launch
    resumes from it and repeats steps 4-6: the same losses, bit for bit."""
    ckpt = str(tmp_path / "ckpt")
    extra = ["--bf16"] if bf16 else []
    straight = _torchrun(FSDP_TP_TINY + ["--steps", "6", "--ckpt", ckpt] + extra, tmp_path)
    falls, means = _falls(straight["losses"], n=2)
    assert falls, means
    assert straight["skipped"] == 0
    # the optimizer stepped the 2-D placements FSDP2 over TP gives (not only dim-0 shards)
    assert any("Shard(dim=1)" in p for p in straight["placements"])
    assert any("_StridedShard" in p for p in straight["placements"])
    # the checkpoint of step 6 overwrote the one of step 3: save again at 3 to resume from
    _torchrun(FSDP_TP_TINY + ["--steps", "3", "--ckpt", ckpt] + extra, tmp_path)
    resumed = _torchrun(FSDP_TP_TINY + ["--steps", "3", "--resume", "--ckpt", ckpt,
                                        "--save-every", "100"] + extra, tmp_path)
    assert resumed["start"] == 3
    assert resumed["losses"] == straight["losses"][3:]
