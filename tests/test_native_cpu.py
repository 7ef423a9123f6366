"""The C++ CPU engine (backend "cpu") against the reference backend, its random words against
luminamoon.optimizer.rng, determinism across thread counts, and checkpoint/resume."""
from __future__ import annotations

import dataclasses
import itertools

import pytest
import torch

from cases import CASES, compare_with_reference
from conftest import ODD_SHAPES, SHAPE_IDS, TOLERANCES, import_or_skip, require

_luminav = import_or_skip("luminamoon._luminav", "native")

from luminamoon.optimizer import LuminaMoon  # noqa: E402
from luminamoon.optimizer import rng  # noqa: E402
from luminamoon.optimizer._groups import DTYPE_CODES, Hyper, LaunchGroup  # noqa: E402
from luminamoon.optimizer.backends.cpu import CpuBackend  # noqa: E402

pytestmark = pytest.mark.native

def _make_params(shapes, dtype, seed):
    gen = torch.Generator().manual_seed(seed)
    return [torch.randn(s, generator=gen).to(dtype) for s in shapes]


def _run(backend, params, grads_per_step, case, state_dtype, seed=1234):
    params = [p.clone().requires_grad_() for p in params]
    opt = LuminaMoon(params, lr=3e-2, weight_decay=0.1, state_dtype=state_dtype, seed=seed,
                     backend=backend, **case)
    for grads in grads_per_step:
        for p, g in zip(params, grads):
            p.grad = g.clone()
        opt.step()
    return [p.detach() for p in params], opt


def _compare(ours, ref, dtype, min_equal):
    """Within the dtype's tolerance, and at least `min_equal` of the elements bitwise equal."""
    for a, b in zip(ours, ref):
        rtol, atol = TOLERANCES[dtype]
        torch.testing.assert_close(a.float(), b.float(), rtol=rtol, atol=atol, equal_nan=True)
        if a.numel() >= 64:
            same = (a.view(-1).float() == b.view(-1).float()).float().mean().item()
            assert same >= min_equal, f"only {same:.4f} of the elements are bitwise equal"


# With clip == 0 every operation of the step is a correctly rounded float32 one (the reference's
# sqrt included: reference.sqrt_rn, since torch's own CPU sqrt is an ulp off on some CPUs) in
# the spec's order, so the engine and the reference store the same bits (see also
# test_engine_cpu.cpp, AdamWModeIsBitwiseTheScalarSpec).
EQUAL_NO_CLIP = 1.0


@pytest.mark.parametrize("case", [c for c in CASES if c.clip == 0], ids=lambda c: c.id)
def test_cpu_engine_is_bitwise_the_reference_without_clip(case):
    """(The backend matrix, test_backends.py, checks every case within the spec's tolerance.)"""
    compare_with_reference(CpuBackend(), case, "cpu", bitwise=True)


@pytest.mark.parametrize("shape", ODD_SHAPES, ids=SHAPE_IDS)
def test_many_tensors_and_odd_shapes_in_one_group(shape):
    shapes = [shape] * 5 + [(2049,), (1,)] * 20
    params = _make_params(shapes, torch.bfloat16, 2)
    gen = torch.Generator().manual_seed(3)
    steps = [[torch.randn(s, generator=gen).to(torch.bfloat16) for s in shapes] for _ in range(2)]
    case = dict(clip=0.0, bound_mode="abs", bound=0.5, nonfinite="skip")
    ours, _ = _run("cpu", params, steps, case, torch.bfloat16)
    ref, _ = _run("reference", params, steps, case, torch.bfloat16)
    _compare(ours, ref, torch.bfloat16, EQUAL_NO_CLIP)


def test_nonfinite_gradient_skips_the_step_and_counts_it():
    params = _make_params([(100,), (7, 3)], torch.float32, 4)
    grads = [torch.ones(100), torch.ones(7, 3)]
    ps = [p.clone().requires_grad_() for p in params]
    opt = LuminaMoon(ps, lr=1e-2, backend="cpu", nonfinite="skip")
    for p, g in zip(ps, grads):
        p.grad = g.clone()
    opt.step()
    before = [p.detach().clone() for p in ps]
    ps[1].grad[2, 1] = float("nan")
    opt.step()
    assert all(torch.equal(a, b) for a, b in zip(before, ps))
    assert int(opt.skipped_steps) == 1
    assert int(opt.state[ps[0]]["step"]) == 1


def _mixed_groups_run(one_call: bool, monkeypatch):
    """Three param groups that take each path of a step (clip and skip, AdamW mode that
    propagates, bf16 with stochastic rounding and a raise check), five steps, a NaN gradient
    in the third; every tensor's bits and the counters after each step."""
    from luminamoon.optimizer.backends.base import Backend

    calls = []
    real_step, real_pass2 = CpuBackend.step_groups, CpuBackend.pass2
    with monkeypatch.context() as m:
        if one_call:
            m.setattr(CpuBackend, "step_groups",
                      lambda *a: calls.append("step") or real_step(*a))
        else:
            m.setattr(CpuBackend, "step_groups", Backend.step_groups)
        m.setattr(CpuBackend, "pass2", lambda *a: calls.append("pass2") or real_pass2(*a))
        gen = torch.Generator().manual_seed(11)
        shapes = [(33, 17), (1000,), (5,), (64, 3), (129,)]
        ps = [torch.randn(s, generator=gen).requires_grad_() for s in shapes]
        ps[3:] = [p.detach().to(torch.bfloat16).requires_grad_() for p in ps[3:]]
        opt = LuminaMoon([{"params": ps[:2], "clip": 1.0, "nonfinite": "skip"},
                          {"params": ps[2:3], "clip": 0.0, "nonfinite": "propagate",
                           "lr": torch.tensor(2e-2)},
                          {"params": ps[3:], "state_dtype": torch.bfloat16, "clip": 2.0,
                           "bound_mode": "rel", "bound": 0.1, "nonfinite": "skip"}],
                         lr=3e-2, seed=5, backend="cpu")
        seen = []
        for step in range(5):
            for p in ps:
                p.grad = torch.randn(p.shape, generator=gen).to(p.dtype)
            if step == 2:
                ps[4].grad[7] = float("nan")
            opt.step()
            seen.append([t.clone() for p in ps for t in (p.detach(), opt.state[p]["exp_avg"],
                                                            opt.state[p]["exp_avg_sq"],
                                                            opt.state[p]["step"])]
                        + [opt.skipped_steps.clone()])
    return seen, calls


def test_the_one_call_step_equals_the_step_pass_by_pass_bitwise(monkeypatch):
    ours, calls = _mixed_groups_run(True, monkeypatch)
    assert calls == ["step"] * 5  # one call a step for the three groups, no pass from Python
    theirs, calls = _mixed_groups_run(False, monkeypatch)
    assert calls == ["pass2"] * 15
    for a, b in zip(ours, theirs):
        assert all(torch.equal(x.view(-1).view(torch.uint8) if x.is_floating_point() else x,
                               y.view(-1).view(torch.uint8) if y.is_floating_point() else y)
                   for x, y in zip(a, b))
    assert int(ours[-1][-1]) == 1  # the NaN step was skipped and counted
    # the propagating group's counter went on through the skipped step, the others' did not
    assert [int(ours[-1][4 * k + 3]) for k in range(5)] == [4, 4, 5, 4, 4]


def test_random_words_equal_the_reference_rng():
    seed = 0xDEADBEEF12345678
    index = torch.cat([torch.arange(0, 3000), torch.arange(2**32 - 5, 2**32 + 5),
                       torch.tensor([2**40 + 17])]).to(torch.int64)
    for t, k, stream in itertools.product((1, 7), (0, 3), (0, 1, 2)):
        ref = rng.random_words(seed, t, k, index, stream)
        key = _luminav.stream_key(seed, t, k)
        assert key == rng.rounding_seed(seed, t, k)
        ours = torch.empty(index.numel(), dtype=torch.int32)
        # contiguous runs of indices, as the engine draws them
        for lo, hi in ((0, 3000), (3000, 3010), (3010, 3011)):
            _luminav.random_words(ours[lo:].data_ptr(), key, int(index[lo]), hi - lo, stream)
        assert torch.equal(ours.to(torch.int64) & 0xFFFFFFFF, ref), (t, k, stream)
        # runs that start inside a group of eight, as a shard's offset puts them
        for first in (3, 2**32 - 3, 2**40 + 5):
            run = torch.empty(21, dtype=torch.int32)
            _luminav.random_words(run.data_ptr(), key, first, 21, stream)
            want = rng.random_words(seed, t, k, torch.arange(first, first + 21), stream)
            assert torch.equal(run.to(torch.int64) & 0xFFFFFFFF, want), (first, stream)


def test_stochastic_rounding_uses_the_reference_streams_bitwise():
    # clip == 0: no reduction order involved; the same words round the same float32 values.
    params = _make_params([(5000,)], torch.bfloat16, 5)
    gen = torch.Generator().manual_seed(6)
    steps = [[torch.randn(5000, generator=gen).to(torch.bfloat16)] for _ in range(4)]
    case = dict(clip=0.0, nonfinite="propagate", stochastic_rounding=True)
    ours, _ = _run("cpu", params, steps, case, torch.bfloat16, seed=77)
    ref, _ = _run("reference", params, steps, case, torch.bfloat16, seed=77)
    other, _ = _run("cpu", params, steps, case, torch.bfloat16, seed=78)
    _compare(ours, ref, torch.bfloat16, EQUAL_NO_CLIP)
    assert not torch.equal(ours[0], other[0])  # the seed matters


def _group(params, grads, hyper, seed=9):
    n = len(params)
    return LaunchGroup(
        device=torch.device("cpu"), param_dtype=params[0].dtype, grad_dtype=grads[0].dtype,
        state_dtype=torch.bfloat16, hyper=hyper, lr=1e-2, seed=seed, params=params, grads=grads,
        exp_avgs=[torch.zeros_like(p, dtype=torch.bfloat16) for p in params],
        exp_avg_sqs=[torch.zeros_like(p, dtype=torch.bfloat16) for p in params],
        p_inits=[p.clone() for p in params], steps=[torch.zeros((), dtype=torch.int64) for _ in params],
        param_indices=list(range(n)), elem_offsets=[0] * n,
        global_numels=[p.numel() for p in params])


@pytest.mark.parametrize("threads", [1, 3])
def test_thread_count_does_not_change_any_bit(threads):
    hyper = Hyper(beta1=0.9, beta2=0.999, eps=1e-8, weight_decay=0.01, clip=1.0, bound_mode=2,
                  bound=0.3, maximize=False, nonfinite="skip", stochastic_rounding=True)
    shapes = [(100003,), (2047,), (1,), (0,), (4096,)]
    outs = []
    for nt in (threads, 4):
        params = _make_params(shapes, torch.bfloat16, 10)
        grads = _make_params(shapes, torch.float32, 11)
        group = _group(params, grads, hyper)
        backend = CpuBackend(num_threads=nt)
        flag = torch.zeros((), dtype=torch.int32)
        for _ in range(2):
            backend.pass1(group, flag)
            backend.pass2(group, flag)
            backend.commit(group, flag)
        outs.append((params, group.exp_avgs, group.stats))
    for a, b in zip(outs[0][0] + outs[0][1], outs[1][0] + outs[1][1]):
        assert torch.equal(a, b)
    assert torch.equal(outs[0][2], outs[1][2])


def test_checkpoint_resume_is_bitwise():
    shapes = [(300,), (17, 9)]
    params = _make_params(shapes, torch.bfloat16, 12)
    gen = torch.Generator().manual_seed(13)
    steps = [[torch.randn(s, generator=gen).to(torch.bfloat16) for s in shapes] for _ in range(6)]
    case = dict(clip=1.0, bound_mode="rel", bound=0.1, nonfinite="skip")
    full, _ = _run("cpu", params, steps, case, torch.bfloat16, seed=5)
    half, opt = _run("cpu", params, steps[:3], case, torch.bfloat16, seed=5)
    state = opt.state_dict()
    resumed = [p.clone().requires_grad_() for p in half]
    opt2 = LuminaMoon(resumed, lr=3e-2, weight_decay=0.1, state_dtype=torch.bfloat16, seed=99,
                      backend="cpu", **case)
    opt2.load_state_dict(state)
    for grads in steps[3:]:
        for p, g in zip(resumed, grads):
            p.grad = g.clone()
        opt2.step()
    for a, b in zip(full, resumed):
        assert torch.equal(a, b.detach())


def test_bad_input_is_refused_with_the_value():
    with pytest.raises(ValueError, match="num_threads must be >= 0"):
        CpuBackend(num_threads=-1)
    hyper = Hyper(beta1=0.9, beta2=0.9, eps=1e-8, weight_decay=0.0, clip=0.0, bound_mode=0,
                  bound=1.0, maximize=False, nonfinite="skip", stochastic_rounding=False)
    with pytest.raises(ValueError, match="beta1 must be in \\[0, 1\\), got 1.5"):
        _luminav.GroupConfig((0, 0, 0), dataclasses.replace(hyper, beta1=1.5), 0)
    with pytest.raises(ValueError, match="param_dtype must be a dtype code"):
        _luminav.GroupConfig((5, 0, 0), hyper, 0)
    with pytest.raises(ValueError, match='nonfinite must be "skip", "raise" or "propagate", '
                                         'got "sometimes"'):
        _luminav.GroupConfig((0, 0, 0), dataclasses.replace(hyper, nonfinite="sometimes"), 0)
    with pytest.raises(ValueError, match="lr must be finite in float32"):
        _luminav.CpuGroup(_luminav.GroupConfig((0, 0, 0), hyper, 0), []).pass2(1e39, 0, 0)


# ---------------------------------------------------------------------------- vector widths
_ISA_WORKER = r"""
import hashlib, sys, torch
from luminamoon.optimizer import LuminaMoon
import luminamoon._luminav as lv
print("isa", lv.cpu_isa())
gen = torch.Generator().manual_seed(7)
shapes = [(257, 33), (4099,), (8, 8, 9), (1,), (70001,)]
configs = [
    dict(dtype=torch.float32, state_dtype=torch.float32, clip=4.0, bound_mode="none"),
    dict(dtype=torch.float32, state_dtype=torch.float32, clip=0.0, bound_mode="none"),
    dict(dtype=torch.bfloat16, state_dtype=torch.bfloat16, clip=2.0, bound_mode="rel"),
    dict(dtype=torch.bfloat16, state_dtype=torch.float32, clip=1.0, bound_mode="abs"),
    dict(dtype=torch.float16, state_dtype=torch.float32, clip=4.0, bound_mode="none"),
    dict(dtype=torch.float32, state_dtype="q8", clip=4.0, bound_mode="none"),
    dict(dtype=torch.bfloat16, state_dtype="q8", clip=0.0, bound_mode="rel"),
]
for i, c in enumerate(configs):
    params = [(torch.randn(s, generator=gen) * 0.3).to(c["dtype"]).requires_grad_() for s in shapes]
    opt = LuminaMoon(params, lr=1e-2, weight_decay=0.1, clip=c["clip"], bound_mode=c["bound_mode"],
                     bound=0.05, state_dtype=c["state_dtype"], seed=11, backend="cpu")
    for step in range(3):
        for p in params:
            g = torch.randn(p.shape, generator=gen) * (10.0 ** (step - 1))
            g.view(-1)[:: 97] *= 1e3  # outliers: the clip's tanh saturates for some
            p.grad = g.to(c["dtype"])
        opt.step()
    h = hashlib.sha256()
    for p in params:
        st = opt.state[p]
        for t in [p.detach()] + [st[k] for k in sorted(st) if k not in ("step", "p_init")]:
            h.update(t.contiguous().view(torch.uint8).numpy().tobytes())  # q8: codes and scales
    print("config", i, h.hexdigest())
"""


def _isa_run(isa):
    import os
    import subprocess
    import sys

    env = dict(os.environ)
    env.pop("LUMINAV_CPU_ISA", None)
    if isa is not None:
        env["LUMINAV_CPU_ISA"] = isa
    return subprocess.run([sys.executable, "-c", _ISA_WORKER], env=env, capture_output=True,
                          text=True, timeout=300)


def test_every_vector_width_stores_the_same_bits():
    """The engine's loops run at the widest vector width the CPU has (AVX-512F, AVX2 or the
    baseline); a result that depended on it would differ between machines. Every width this
    machine has steps fp32, bf16 (stochastic rounding, bf16, fp32 and q8 moments, bounds) and fp16
    parameters through the clip's tanh three times; all store the same bits."""
    require("default cpu isa")
    widest = _luminav.cpu_isa()
    order = ["baseline", "avx2", "avx512"]
    widths = order[: order.index(widest) + 1]
    outputs = {}
    for isa in widths:
        proc = _isa_run(isa)
        assert proc.returncode == 0, proc.stderr[-3000:]
        lines = proc.stdout.splitlines()
        assert lines[0] == f"isa {isa}"
        outputs[isa] = [ln for ln in lines if ln.startswith("config")]
        assert len(outputs[isa]) == 7
    for isa in widths[1:]:
        assert outputs[isa] == outputs["baseline"], f"{isa} differs from the baseline"


def test_an_unknown_or_missing_vector_width_is_refused_with_the_value():
    proc = _isa_run("avx1024")
    assert proc.returncode != 0
    assert "LUMINAV_CPU_ISA='avx1024' is not a vector width" in proc.stderr
    assert "baseline, avx2 or avx512" in proc.stderr
    if _luminav.cpu_isa() != "avx512":
        proc = _isa_run("avx512")
        assert proc.returncode != 0
        assert "LUMINAV_CPU_ISA=avx512: this CPU's widest is" in proc.stderr
