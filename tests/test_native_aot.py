"""The "aot" backend (bundle kernels launched by the C++ runtime) against the "triton" backend
(the same kernels, JIT): bitwise equal. And the C++ engine's CUDA path through the example.

Marker ``gpu``: skipped without a CUDA device, Triton, or the native module.
"""
from __future__ import annotations

import os
import subprocess

import pytest
import torch

pytestmark = [pytest.mark.gpu, pytest.mark.native]

from conftest import import_or_skip, require, skip_because  # noqa: E402

require("cuda", "triton")
_luminav = import_or_skip("luminamoon._luminav", "native")

from luminamoon.optimizer import LuminaMoon  # noqa: E402

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
COMBOS = [(torch.float32, torch.float32, torch.float32), (torch.float32, torch.float32, torch.bfloat16),
          (torch.bfloat16, torch.bfloat16, torch.float32),
          (torch.bfloat16, torch.bfloat16, torch.bfloat16)]


@pytest.fixture(scope="session")
def bundle(tmp_path_factory):
    from luminamoon.aot.builder import build_bundle

    major, minor = torch.cuda.get_device_capability()
    out = tmp_path_factory.mktemp("bundle")
    build_bundle(out, archs=[major * 10 + minor], dtype_combos=COMBOS, jobs=4, progress=False)
    return str(out)


CASES = [
    dict(clip=0.0, nonfinite="propagate"),
    dict(clip=4.0, nonfinite="skip"),
    dict(clip=0.5, bound_mode="abs", bound=0.01, maximize=True),
    dict(clip=1.0, bound_mode="rel", bound=0.02, nonfinite="raise"),
]


def _run(backend, shapes, dtype, state_dtype, case, bundle=None, steps=3, nan_at=None):
    gen = torch.Generator().manual_seed(0)
    params = [torch.randn(s, generator=gen).to(dtype).cuda().requires_grad_() for s in shapes]
    opt = LuminaMoon(params, lr=3e-2, state_dtype=state_dtype, seed=11, backend=backend,
                     aot_bundle=bundle, **case)
    for step in range(steps):
        for p in params:
            p.grad = torch.randn(p.shape, generator=gen).to(dtype).cuda()
        if nan_at == step:
            params[0].grad.view(-1)[0] = float("nan")
        opt.step()
    torch.cuda.synchronize()
    return [p.detach().cpu() for p in params], opt


@pytest.mark.parametrize("case", CASES, ids=["adamw", "clip", "clip-abs-max", "clip-rel-raise"])
@pytest.mark.parametrize("combo", COMBOS, ids=["fp32", "fp32-bf16", "bf16-fp32", "bf16-bf16"])
def test_aot_equals_triton_bitwise(bundle, combo, case):
    dtype, _, state_dtype = combo
    shapes = [(6, 42), (123,), (431,), (1,), (0,), (5000,), (2048,)]
    ours, opt = _run("aot", shapes, dtype, state_dtype, case, bundle)
    theirs, ref = _run("triton", shapes, dtype, state_dtype, case)
    for a, b in zip(ours, theirs):
        assert torch.equal(a, b)
    for p, q in zip(opt.param_groups[0]["params"], ref.param_groups[0]["params"]):
        assert torch.equal(opt.state[p]["exp_avg_sq"], ref.state[q]["exp_avg_sq"])
        assert int(opt.state[p]["step"]) == int(ref.state[q]["step"])


def test_skipped_step_changes_nothing(bundle):
    ours, opt = _run("aot", [(3000,)], torch.float32, torch.float32, dict(clip=1.0), bundle,
                     steps=3, nan_at=1)
    assert int(opt.skipped_steps) == 1
    assert int(opt.state[opt.param_groups[0]["params"][0]]["step"]) == 2


def test_missing_variant_names_the_fix(bundle):
    p = torch.randn(10, dtype=torch.float16, device="cuda", requires_grad=True)
    opt = LuminaMoon([p], backend="aot", aot_bundle=bundle)
    p.grad = torch.ones_like(p)
    with pytest.raises(LookupError, match=r"is not in bundle .*rebuild with `luminamoon aot build --arch \d+ --dtypes fp16:fp16:fp32`"):
        opt.step()


def test_cpp_engine_on_cuda_resumes_bitwise(bundle):
    import glob

    found = sorted(glob.glob(os.path.join(ROOT, "build", "*", "optimizer", "examples",
                                          "luminav_train_logreg")))
    exe = os.environ.get("LUMINAV_TRAIN_EXAMPLE") or (found[0] if found else None)
    if not exe or not os.path.exists(exe):
        skip_because("no cpp example")
    out = subprocess.run([exe, "--device", "cuda", "--bundle", bundle, "--epochs", "6",
                          "--checkpoint-epoch", "3", "--checkpoint", os.path.join(bundle, "ckpt")],
                         capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stdout + out.stderr
    assert "EQUALS" in out.stdout
