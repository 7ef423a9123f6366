"""``LuminaMoon.step()`` captured in a CUDA graph: 100 replays equal 100 eager steps, bitwise.

For the "triton" backend (JIT kernels) and the "aot" backend (bundle kernels launched by the
C++ runtime). Both runs see the same sequence: the same parameters, the same gradients (copied
into gradient tensors allocated once, as a captured step needs), the same learning rates
(0-dim CUDA tensors written in place before every step, as a scheduler would), one gradient
holding a NaN (so that the graph replays a skipped step), and the same warm-up steps on a side
stream before the capture (torch's recipe; they count as steps in both runs). A capture that
fails because ``step()`` synchronises with the host or does something else a graph cannot hold
is a failure here, never a skip.

Markers ``gpu`` (and ``native`` for the aot cases): skipped without a CUDA device; the aot
cases also without the native module. The bundle is built once per session for the dtype
combinations used here, or taken from ``LUMINAMOON_TEST_BUNDLE`` when that bundle holds every
variant of those combinations for this GPU.
"""
from __future__ import annotations

import math
import os
from typing import Dict, List

import pytest
import torch

from conftest import assert_bitwise_equal, bits, require, requires_triton

pytestmark = [pytest.mark.gpu, requires_triton]

require("cuda", "compiled triton")

from luminamoon.optimizer import LuminaMoon  # noqa: E402

F32, BF16 = torch.float32, torch.bfloat16
# (param, grad, state) dtype combinations of the launch groups below: the aot bundle's content
GRAPH_COMBOS = [(F32, F32, F32), (BF16, BF16, F32), (F32, F32, "q8"), (BF16, BF16, "q8")]

SEED = 0x5EED_2024_0BAD_F00D
WARMUP = 3  # eager steps on a side stream before the capture (both runs take them)
REPLAYS = 100  # graph replays, against as many eager steps
TOTAL = WARMUP + REPLAYS
NAN_STEP = WARMUP + 41  # a replayed step whose gradient holds a NaN: skipped on the device
NAN_AT = (0, 17)  # (tensor, element) of that NaN, in the flat list of all parameters

# Param groups of each configuration. Odd sizes (no multiple of the 2048-element block, one
# tensor over two blocks, a one-element tensor); bounds small enough that some elements reach
# them within the run and most do not, so that both the bound and the lr stay visible.
CONFIGS: Dict[str, List[dict]] = {
    "bf16+fp32-clip-rel-abs": [
        dict(dtype=BF16, shapes=((3001,), (64, 65), (1,)), lr0=2e-3, clip=1.0,
             bound_mode="rel", bound=0.05, weight_decay=0.1),
        dict(dtype=F32, shapes=((2049,), (7, 13, 5)), lr0=1e-3, clip=2.5, bound_mode="abs",
             bound=0.01, weight_decay=0.0, maximize=True),
    ],
    "fp32+bf16-noclip-skip": [
        dict(dtype=F32, shapes=((4099,), (33, 3)), lr0=3e-3, clip=0.0, bound_mode="none",
             weight_decay=0.05),
        dict(dtype=BF16, shapes=((1,), (515,)), lr0=3e-3, clip=0.0, bound_mode="abs",
             bound=0.02, weight_decay=0.05),
    ],
}


def _lr_at(lr0: float, step: int) -> float:
    """A cosine schedule with a floor: a different lr at almost every step."""
    return lr0 * (0.1 + 0.9 * 0.5 * (1.0 + math.cos(math.pi * step / TOTAL)))


# ------------------------------------------------------------------------------------------
# bundle
# ------------------------------------------------------------------------------------------
def _arch() -> int:
    major, minor = torch.cuda.get_device_capability()
    return major * 10 + minor


def _holds_variants(bundle: str, combos, arch: int) -> bool:
    """Whether ``bundle`` has a cubin runnable on ``arch`` for every variant of ``combos``."""
    from luminamoon.aot.manifest import BundleError, find_kernel, read_manifest
    from luminamoon.kernels.catalog import all_variants

    try:
        manifest = read_manifest(bundle)
        for v in all_variants(combos):
            find_kernel(manifest, v.key(), arch)
    except (BundleError, OSError):
        return False
    return True


@pytest.fixture(scope="session")
def graph_bundle(tmp_path_factory) -> str:
    require("native")
    arch = _arch()
    given = os.environ.get("LUMINAMOON_TEST_BUNDLE")
    if given and _holds_variants(given, GRAPH_COMBOS, arch):
        return given
    from luminamoon.aot.builder import build_bundle

    out = tmp_path_factory.mktemp("graph_bundle")
    build_bundle(out, archs=[arch], dtype_combos=GRAPH_COMBOS,
                 jobs=max(1, min(8, os.cpu_count() or 1)), progress=False)
    return str(out)


# ------------------------------------------------------------------------------------------
# one run
# ------------------------------------------------------------------------------------------
def _make_inputs(config: List[dict]):
    """Initial parameters and the gradients of every step (on the GPU, made before any run)."""
    gen = torch.Generator().manual_seed(1234)
    params, grad_seq = [], []
    for spec in config:
        for shape in spec["shapes"]:
            params.append(torch.randn(shape, generator=gen).to(spec["dtype"]))
    for step in range(TOTAL):
        scale = 0.5 + (step % 7) / 4.0  # gradient magnitudes vary from step to step
        grads = [(torch.randn(p.shape, generator=gen) * scale).to(p.dtype) for p in params]
        if step == NAN_STEP:
            j, i = NAN_AT
            grads[j].view(-1)[i] = float("nan")
        grad_seq.append([g.cuda() for g in grads])
    return [p.cuda() for p in params], grad_seq


def _run(backend: str, config: List[dict], bundle, graphed: bool) -> dict:
    init, grad_seq = _make_inputs(config)
    params = [p.clone().requires_grad_() for p in init]
    static_grads = [torch.zeros_like(p) for p in init]  # allocated once, refilled in place
    for p, g in zip(params, static_grads):
        p.grad = g
    lrs = [torch.tensor(_lr_at(spec["lr0"], 0), dtype=torch.float32, device="cuda")
           for spec in config]
    groups, k = [], 0
    for spec, lr in zip(config, lrs):
        n = len(spec["shapes"])
        hyper = {key: v for key, v in spec.items() if key not in ("dtype", "shapes", "lr0")}
        groups.append(dict(params=params[k:k + n], lr=lr, **hyper))
        k += n
    opt = LuminaMoon(groups, nonfinite="skip", state_dtype=F32, seed=SEED, backend=backend,
                     aot_bundle=bundle)

    def load(step: int) -> None:
        """This step's gradients and lrs, written in place on the current stream."""
        for g, src in zip(static_grads, grad_seq[step]):
            g.copy_(src)
        for lr, spec in zip(lrs, config):
            lr.fill_(_lr_at(spec["lr0"], step))

    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        for step in range(WARMUP):
            load(step)
            opt.step()
    torch.cuda.current_stream().wait_stream(side)

    if graphed:
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph):  # an error here (a sync, an illegal call) fails the test
            opt.step()
        for step in range(WARMUP, TOTAL):
            load(step)
            graph.replay()
    else:
        for step in range(WARMUP, TOTAL):
            load(step)
            opt.step()
    torch.cuda.synchronize()

    out = {"params": [p.detach().cpu() for p in params],
           "init": [p.cpu() for p in init],
           "skipped_steps": opt.skipped_steps.cpu()}
    for key in ("exp_avg", "exp_avg_sq", "exp_avg_scale", "exp_avg_sq_scale", "step", "p_init"):
        out[key] = [opt.state[p][key].cpu() for p in params if key in opt.state[p]]
    return out


# ------------------------------------------------------------------------------------------
# tests
# ------------------------------------------------------------------------------------------
@pytest.mark.parametrize("config_name", sorted(CONFIGS))
@pytest.mark.parametrize("backend", ["triton", pytest.param("aot", marks=pytest.mark.native)])
def test_graph_replays_equal_eager_steps(backend, config_name, request):
    config = CONFIGS[config_name]
    bundle = request.getfixturevalue("graph_bundle") if backend == "aot" else None
    eager = _run(backend, config, bundle, graphed=False)
    graphed = _run(backend, config, bundle, graphed=True)

    # the run is not vacuous: the parameters moved, one step (the NaN one) was skipped
    for j, (p, p0) in enumerate(zip(eager["params"], eager["init"])):
        if p.numel() > 8:  # a lone bf16 element may walk back to its start; a tensor may not
            assert not torch.equal(bits(p), bits(p0)), f"param {j} unchanged after {TOTAL} steps"
    assert int(eager["skipped_steps"]) == 1, "the NaN step was not skipped by the eager run"
    assert all(int(s) == TOTAL - 1 for s in eager["step"]), [int(s) for s in eager["step"]]
    assert len(eager["p_init"]) == sum(len(s["shapes"]) for s in config
                                       if s.get("bound_mode", "none") != "none")

    for key in ("params", "exp_avg", "exp_avg_sq", "exp_avg_scale", "exp_avg_sq_scale", "step",
                "p_init"):
        assert len(graphed[key]) == len(eager[key]), key
        for j, (a, b) in enumerate(zip(graphed[key], eager[key])):
            assert_bitwise_equal(a, b, f"{backend} {config_name}: {key}[{j}] after {REPLAYS} "
                                       f"replays vs eager steps")
    assert int(graphed["skipped_steps"]) == int(eager["skipped_steps"]), (
        f"skipped_steps: graph {int(graphed['skipped_steps'])}, "
        f"eager {int(eager['skipped_steps'])}")
