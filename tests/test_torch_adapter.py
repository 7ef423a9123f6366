"""luminav/torch.hpp: a libtorch program (examples/cpp_torch/train_mlp.cpp) built against the
installed luminav and the libtorch inside this environment's torch wheel
(torch.utils.cmake_prefix_path) trains a small MLP, and takes the very steps the Python optimizer
takes: the same losses and the same final parameters, bit for bit, from the same data, seed and
hyperparameters (backend "cpu" on the CPU; "aot" with the default bundle on CUDA, marker gpu).

The program writes its data, its parameters before and after, its losses and the hyperparameters
as the engine holds them (--dump); the replay here reads them and repeats the forward and
backward pass with the same ops (F.linear, relu, mse_loss) on the same thread count.

Marker ``slow``: a libtorch translation unit takes a minute or two to compile on two cores.
"""
from __future__ import annotations

import json
import os
import re
import shlex

import numpy as np
import pytest
import torch
import torch.nn.functional as F

from conftest import assert_bitwise_equal, needs, skip_because
from native_build import ROOT, build_project, run

pytestmark = pytest.mark.slow

BOUND_MODES = {0: "none", 1: "abs", 2: "rel"}
NONFINITE = {0: "skip", 1: "raise", 2: "propagate"}
STATE_DTYPES = {0: torch.float32, 1: torch.bfloat16}
PARAMS = ("w1", "w2", "b1", "b2")


@pytest.fixture(scope="module")
def train_mlp(luminav_prefix, tmp_path_factory) -> str:
    defines = []
    if torch.version.cuda:
        # A CUDA build of torch: find_package(Torch) needs the CUDA toolkit; point CMake at the
        # one torch's own extension builder finds (nvcc may be a wrapper outside the toolkit).
        from torch.utils.cpp_extension import CUDA_HOME

        if CUDA_HOME:
            defines += [f"-DCUDA_TOOLKIT_ROOT_DIR={CUDA_HOME}", f"-DCUDAToolkit_ROOT={CUDA_HOME}"]
    try:
        return build_project(os.path.join(ROOT, "examples", "cpp_torch"),
                             str(tmp_path_factory.mktemp("cpp_torch")),
                             [luminav_prefix, torch.utils.cmake_prefix_path], *defines)
    except AssertionError as exc:
        # Only this: a CUDA wheel of torch on a machine without a GPU whose CUDA toolkit is not
        # the one that wheel was built against (its cudart/nvrtc/nvtx are not found). The CPU
        # wheel (make test) and the GPU machine build and run the program.
        text = str(exc)
        if (torch.version.cuda and not torch.cuda.is_available() and "CMake Error" in text
                and ("CUDA" in text or "nvrtc" in text or "nvToolsExt" in text)):
            first = next((ln.strip() for ln in text.splitlines() if "CUDA" in ln), "")
            skip_because("cuda torch build", f"torch {torch.__version__}, CUDA "
                                             f"{torch.version.cuda} ({first})")
        raise


def _exe(build: str) -> str:
    return os.path.join(build, "luminav_train_mlp")


def _f32(path: str, shape) -> torch.Tensor:
    return torch.from_numpy(np.fromfile(path, dtype="<f4").reshape(shape).copy())


def replay(dump: str, *, backend: str, device: str, seed=None):
    """The program's run repeated with luminamoon.LuminaMoon: (losses, final params)."""
    meta = json.load(open(os.path.join(dump, "meta.json"), encoding="utf-8"))
    x = _f32(os.path.join(dump, "x.f32"), meta["x"]).to(device)
    y = _f32(os.path.join(dump, "y.f32"), meta["y"]).to(device)
    params = {n: _f32(os.path.join(dump, f"init_{n}.f32"), meta["shapes"][n]).to(device)
              .requires_grad_() for n in PARAMS}
    groups = []
    for g in meta["groups"]:
        groups.append(dict(
            params=[params[n] for n in g["params"]], lr=g["lr"], betas=tuple(g["betas"]),
            eps=g["eps"], weight_decay=g["weight_decay"], clip=g["clip"],
            bound_mode=BOUND_MODES[g["bound_mode"]], bound=g["bound"],
            maximize=bool(g["maximize"]), nonfinite=NONFINITE[g["nonfinite"]],
            stochastic_rounding=bool(g["stochastic_rounding"]),
            state_dtype=STATE_DTYPES[g["state_dtype"]]))
    from luminamoon import LuminaMoon

    opt = LuminaMoon(groups, seed=meta["seed"] if seed is None else seed, backend=backend)
    threads = torch.get_num_threads()
    torch.set_num_threads(meta["torch_threads"])
    try:
        losses = []
        batch, n = meta["batch"], meta["x"][0]
        for step in range(meta["steps"]):
            start = (step * batch) % n
            xb, yb = x[start:start + batch], y[start:start + batch]
            h = torch.relu(F.linear(xb, params["w1"], params["b1"]))
            loss = F.mse_loss(F.linear(h, params["w2"], params["b2"]), yb)
            loss.backward()
            opt.step()
            opt.zero_grad(set_to_none=True)
            losses.append(loss.detach().float().cpu())
    finally:
        torch.set_num_threads(threads)
    return torch.stack(losses), {n: p.detach().cpu() for n, p in params.items()}


def _program_run(build: str, dump, *args, env=None):
    os.makedirs(dump, exist_ok=True)
    out = run([_exe(build), "--dump", str(dump), *args], env=env)
    meta = json.load(open(os.path.join(dump, "meta.json"), encoding="utf-8"))
    losses = _f32(os.path.join(dump, "losses.f32"), [meta["steps"]])
    finals = {n: _f32(os.path.join(dump, f"final_{n}.f32"), meta["shapes"][n]) for n in PARAMS}
    return out.stdout, meta, losses, finals


def test_the_program_is_built_with_the_wheels_libtorch_abi(train_mlp, tmp_path):
    """The example's own compile line (torch's flags, whether or not they spell the ABI out) gives
    _GLIBCXX_USE_CXX11_ABI the value the torch wheel was built with."""
    commands = json.load(open(os.path.join(train_mlp, "compile_commands.json"), encoding="utf-8"))
    command = next(c for c in commands if c["file"].endswith("train_mlp.cpp"))
    args = command.get("arguments") or shlex.split(command["command"])
    flags, skip = [], False
    for a in args[1:]:
        if skip:
            skip = False
        elif a in ("-o", "-c"):
            skip = True
        else:
            flags.append(a)
    include = os.path.join(os.path.dirname(os.path.dirname(torch.utils.cmake_prefix_path)), "include")
    assert include in flags, flags  # the wheel's own headers
    probe = tmp_path / "abi.cpp"
    probe.write_text("#include <string>\n")
    out = run([args[0], *flags, "-E", "-dM", str(probe)], cwd=command["directory"]).stdout
    abi = re.search(r"^#define _GLIBCXX_USE_CXX11_ABI (\d+)$", out, re.M).group(1)
    assert abi == str(int(torch.compiled_with_cxx11_abi()))


@needs("native")
def test_cpu_training_matches_the_python_optimizer_bitwise(train_mlp, tmp_path):
    stdout, meta, losses, finals = _program_run(train_mlp, tmp_path / "run", "--steps", "40",
                                                "--seed", "1234")
    assert "0 skipped" in stdout
    assert float(losses[-1]) < 0.5 * float(losses[0]), stdout  # it trains
    # the weights' moments are stochastically rounded bf16: the seed reaches every element
    assert meta["groups"][0]["state_dtype"] == 1 and meta["groups"][0]["stochastic_rounding"] == 1
    py_losses, py_finals = replay(str(tmp_path / "run"), backend="cpu", device="cpu")
    assert_bitwise_equal(losses, py_losses, "losses")
    for n in PARAMS:
        assert_bitwise_equal(finals[n], py_finals[n], n)
        initial = _f32(str(tmp_path / "run" / f"init_{n}.f32"), meta["shapes"][n])
        assert not torch.equal(finals[n], initial), f"{n} did not move"
    # a different seed gives different rounding, so the comparison above can fail
    _, other = replay(str(tmp_path / "run"), backend="cpu", device="cpu", seed=1235)
    assert not torch.equal(other["w1"], finals["w1"])


@pytest.mark.gpu
@needs("cuda")
def test_cuda_training_matches_the_python_optimizer_bitwise(train_mlp, tmp_path, monkeypatch):
    from luminamoon.aot.default import require_default_bundle

    bundle = require_default_bundle()
    # cuBLAS picks the same kernels in both processes with a fixed workspace
    monkeypatch.setenv("CUBLAS_WORKSPACE_CONFIG", ":4096:8")
    env = dict(os.environ)
    stdout, meta, losses, finals = _program_run(train_mlp, tmp_path / "run", "--device", "cuda",
                                                "--bundle", bundle, "--steps", "40", env=env)
    assert meta["device"].startswith("cuda") and "0 skipped" in stdout
    assert re.search(r"on cuda", stdout)
    py_losses, py_finals = replay(str(tmp_path / "run"), backend="aot", device="cuda")
    assert_bitwise_equal(losses, py_losses, "losses")
    for n in PARAMS:
        assert_bitwise_equal(finals[n], py_finals[n], n)
