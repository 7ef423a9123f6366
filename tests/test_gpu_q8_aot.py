"""q8 moments on the GPU: every q8 update variant of an AOT bundle (``backend="aot"``) equals
the Triton JIT (``backend="triton"``) bitwise, codes and scales included.

One bundle is built with exactly ``catalog.all_variants(Q8_DTYPE_COMBOS)`` for this GPU. Each
q8 update variant (``pass2`` / ``single_pass``, S_DTYPE 3) is mapped back to the optimizer
configuration that launches it; the configuration runs 3 steps on both backends from identical
inputs (three q8 tensors: 256-aligned rows, rows with a short last block, one row of 4100;
a NaN gradient on the second step of the "skip" configurations), and params, codes, scales,
step counters and skipped-step counts must agree to the bit.

Markers ``gpu`` and ``native``: skipped without a CUDA device or the native module.
"""
from __future__ import annotations

from typing import List

import pytest
import torch

from conftest import bits, import_or_skip, require, requires_triton, skip_because

pytestmark = [pytest.mark.gpu, pytest.mark.native, requires_triton]

require("cuda", "compiled triton")
_luminav = import_or_skip("luminamoon._luminav", "native")

from luminamoon.kernels import catalog  # noqa: E402
from luminamoon.optimizer import LuminaMoon  # noqa: E402
from luminamoon.optimizer._groups import BOUND_MODES, DTYPE_CODES  # noqa: E402

SHAPES = ((64, 512), (40, 300), (4100,))
STEPS = 3
NAN_STEP = 1
SEED = 0x0C8_2026
_DTYPE_OF_CODE = {code: dtype for dtype, code in DTYPE_CODES.items()}
_BOUND_OF_CODE = {code: name for name, code in BOUND_MODES.items()}
_BOUND_SIZE = {"none": 1.0, "abs": 0.015, "rel": 0.02}

ALL_VARIANTS = catalog.all_variants(catalog.Q8_DTYPE_COMBOS)
UPDATES = [v for v in ALL_VARIANTS if v.kernel in ("pass2", "single_pass")]


def _options(v) -> dict:
    cx = v.constexpr_dict()
    bound = _BOUND_OF_CODE[cx["BOUND_MODE"]]
    return dict(lr=3e-2, betas=(0.9, 0.999), eps=1e-8, weight_decay=0.1,
                clip=1.0 if cx.get("USE_CLIP", 0) else 0.0, bound_mode=bound,
                bound=_BOUND_SIZE[bound], maximize=bound == "abs",
                nonfinite="skip" if cx.get("CHECK_FLAG", 0) else "propagate",
                # SR is normalised to 0 without bf16 params: ask for it there
                stochastic_rounding=(bool(cx["SR"])
                                     or _DTYPE_OF_CODE[cx["P_DTYPE"]] != torch.bfloat16),
                state_dtype="q8")


@pytest.fixture(scope="session")
def q8_bundle(tmp_path_factory) -> str:
    major, minor = torch.cuda.get_device_capability()
    from luminamoon.aot.builder import build_bundle

    out = tmp_path_factory.mktemp("q8_bundle")
    build_bundle(out, archs=[major * 10 + minor], dtype_combos=catalog.Q8_DTYPE_COMBOS,
                 jobs=8, progress=False)
    return str(out)


def _run(v, backend: str, bundle=None) -> dict:
    cx = v.constexpr_dict()
    p_dtype, g_dtype = _DTYPE_OF_CODE[cx["P_DTYPE"]], _DTYPE_OF_CODE[cx["G_DTYPE"]]
    gen = torch.Generator().manual_seed(2026)
    params = [torch.randn(s, generator=gen).to(p_dtype).cuda().requires_grad_() for s in SHAPES]
    grads: List[List[torch.Tensor]] = []
    for step in range(STEPS):
        gs = [torch.randn(s, generator=gen).to(g_dtype) for s in SHAPES]
        if cx.get("CHECK_FLAG", 0) and step == NAN_STEP:
            gs[1].view(-1)[1234] = float("nan")
        grads.append(gs)
    if g_dtype != p_dtype:
        if not hasattr(params[0], "grad_dtype"):
            skip_because("grad dtype")
        for p in params:
            p.grad_dtype = None
    opt = LuminaMoon(params, seed=SEED, backend=backend, aot_bundle=bundle, **_options(v))
    for step in range(STEPS):
        for p, g in zip(params, grads[step]):
            p.grad = g.cuda()
        opt.step()
    torch.cuda.synchronize()
    out = {"params": [p.detach().cpu() for p in params], "skipped": int(opt.skipped_steps)}
    for key in ("exp_avg", "exp_avg_sq", "exp_avg_scale", "exp_avg_sq_scale", "step"):
        out[key] = [opt.state[p][key].cpu() for p in params]
    return out


@pytest.mark.parametrize("variant", UPDATES, ids=[v.key() for v in UPDATES])
def test_q8_aot_equals_jit_bitwise(variant, q8_bundle):
    jit = _run(variant, "triton")
    aot = _run(variant, "aot", q8_bundle)
    assert jit["skipped"] == aot["skipped"]
    for key in ("params", "exp_avg", "exp_avg_sq", "exp_avg_scale", "exp_avg_sq_scale", "step"):
        for j, (a, b) in enumerate(zip(jit[key], aot[key])):
            assert torch.equal(bits(a), bits(b)), f"{variant.key()}: {key}[{j}] differs"
