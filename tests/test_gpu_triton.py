"""Triton backend on a CUDA GPU: what the backend matrix (test_backends.py) does not cover,
at realistic sizes: run-to-run bits, >2**31 elements, the current device, JIT vs AOT code,
the direct launch path, tensor lrs.

Marker ``gpu``: every test here is skipped without CUDA (and without Triton).
"""
from __future__ import annotations

import math

import pytest
import torch

from cases import (BF16, F16, F32, GPU_CASES, GPU_SHAPES, Case, assert_groups_close, f32,
                   assert_storage_close,
                   clone_group, compare_with_reference, copy_state, make_group, new_grads,
                   run_step, snapshot, assert_unchanged)
from conftest import bits, needs, require, requires_triton, skip_because
from luminamoon.optimizer._groups import LaunchGroup
from luminamoon.optimizer.backends.reference import ReferenceBackend

# ------------------------------------------------------------------------------------------
# GPU tests
# ------------------------------------------------------------------------------------------

_HAS_CUDA = torch.cuda.is_available()
pytestmark = [
    pytest.mark.gpu,
    requires_triton,
    needs("cuda"),
]

def _backend():
    from luminamoon.optimizer.backends.triton import TritonBackend

    return TritonBackend()


@pytest.mark.parametrize("case", [GPU_CASES[1], GPU_CASES[5]], ids=lambda c: c.id)
def test_bitwise_run_to_run(case):
    backend = _backend()
    a = make_group(case, "cuda")
    b = clone_group(a)
    for s in range(3):
        if s:
            a.grads = new_grads(a, 50 + s)
            b.grads = [g.clone() for g in a.grads]
        run_step(backend, a)
        run_step(backend, b)
    for name in ("params", "exp_avgs", "exp_avg_sqs", "steps"):
        for j, (x, y) in enumerate(zip(getattr(a, name), getattr(b, name))):
            assert torch.equal(bits(x), bits(y)), f"{name}[{j}] differs between two runs"
    if a.stats is not None:
        assert torch.equal(bits(a.stats), bits(b.stats))


def test_nonfinite_skip_leaves_everything_bitwise():
    case = Case(BF16, BF16, F32, clip=1.0, bound_mode=2, nonfinite="skip", shapes=GPU_SHAPES)
    group = make_group(case, "cuda")
    backend = _backend()
    run_step(backend, group)
    for value in (float("nan"), float("inf")):
        group.grads = new_grads(group, 7, nonfinite_at=(9, 12345), value=value)
        before = snapshot(group)
        found = run_step(backend, group)
        assert int(found) == 1
        assert_unchanged(group, before, f"skip on {value}")


def test_tensor_over_2_31_elements():
    """bf16 param + grad with fp32 moments, 2**31 + 4099 elements (~26 GB): a few slices
    checked against the reference computed on those slices."""
    n = 2 ** 31 + 4099
    free, _ = torch.cuda.mem_get_info()
    if free < 30 * 2 ** 30:
        skip_because("gpu memory", f"{free / 2 ** 30:.1f} GiB free")
    case = Case(BF16, BF16, F32, clip=1.0, nonfinite="skip", shapes=((n,),))
    dev = torch.device("cuda")
    gen = torch.Generator(device=dev).manual_seed(3)
    p = torch.randn(n, generator=gen, device=dev, dtype=torch.float32).to(BF16)
    g = torch.randn(n, generator=gen, device=dev, dtype=torch.float32).to(BF16)
    m = torch.randn(n, generator=gen, device=dev) * 0.1
    v = torch.rand(n, generator=gen, device=dev) * 0.01
    slices = [(0, 4096), (2 ** 31 - 2048, 2 ** 31 + 2048), (n - 3000, n)]
    saved = [(p[a:b].clone(), g[a:b].clone(), m[a:b].clone(), v[a:b].clone()) for a, b in slices]
    group = LaunchGroup(dev, BF16, BF16, F32, case.hyper(), 1e-2, 777, [p], [g], [m], [v], None,
                        [torch.tensor(5, dtype=torch.int64, device=dev)], [4], [0], [n])
    run_step(_backend(), group)
    # S over the whole tensor decides tau; the reference slices use the Triton S so that the
    # comparison isolates the elementwise update (S itself is checked in test_matches_reference)
    s_total = group.stats[0].clone()
    for (a, b), (p0, g0, m0, v0) in zip(slices, saved):
        ref = LaunchGroup(dev, BF16, BF16, F32, case.hyper(), 1e-2, 777, [p0], [g0], [m0], [v0],
                          None, [torch.tensor(5, dtype=torch.int64, device=dev)], [4], [a], [n])
        ref.stats = s_total.reshape(1)
        flag = torch.zeros((), dtype=torch.int32, device=dev)
        ReferenceBackend().pass2(ref, flag)
        assert_storage_close(p[a:b], ref.params[0], f"param slice {a}:{b}")
        assert_storage_close(m[a:b], ref.exp_avgs[0], f"exp_avg slice {a}:{b}")
        assert_storage_close(v[a:b], ref.exp_avg_sqs[0], f"exp_avg_sq slice {a}:{b}")


@pytest.mark.parametrize("clip", [0.0, 1.0])
def test_sixteen_bit_direction_keeps_subnormal_second_moments(clip):
    """The all-16-bit kernels take step 4's approximate square root (kernels/tdclm._direction),
    which flushes a subnormal argument to zero unless scaled first. With v'/bc2 subnormal and a
    tiny eps the root is what u divides by: flushed, u would be m'/eps (about 1e10 here) instead
    of about 1. Both passes (clip 1) and the single pass (clip 0) against the reference."""
    import dataclasses

    from cases import assert_stats_close

    dev = torch.device("cuda")
    case = Case(BF16, BF16, BF16, clip=clip, nonfinite="skip" if clip else "propagate")
    hyper = dataclasses.replace(case.hyper(), eps=f32(1e-30))
    gen = torch.Generator(device=dev).manual_seed(11)
    shapes = [(4099,), (2048,), (37, 29)]

    def rnd(shape, scale):
        return (torch.randn(shape, generator=gen, device=dev) * scale).to(BF16)

    def group(ps, gs, ms, vs):
        n = len(ps)
        return LaunchGroup(dev, BF16, BF16, BF16, hyper, 1e-2, 4242, ps, gs, ms, vs, None,
                           [torch.tensor(20000, dtype=torch.int64, device=dev) for _ in range(n)],
                           [5 * j for j in range(n)], [0] * n, [math.prod(s) for s in shapes])

    ps = [rnd(s, 1.0) for s in shapes]
    gs = [rnd(s, 1e-21) for s in shapes]
    ms = [rnd(s, 1e-20) for s in shapes]
    # second moments between 1e-40 and 1e-38: below float32's normal range (1.18e-38)
    vs = [(torch.rand(s, generator=gen, device=dev) * 1e-38 + 1e-40).to(BF16) for s in shapes]
    assert all(bool((v.float() < 1.1754943508222875e-38).any()) for v in vs)
    ours = group(ps, gs, ms, vs)
    ref = group(*[[t.clone() for t in ts] for ts in (ps, gs, ms, vs)])
    run_step(_backend(), ours)
    run_step(ReferenceBackend(), ref)
    assert_stats_close(ours, ref, "subnormal v")
    assert_groups_close(ours, ref, "subnormal v")
    # the update is of the order of lr (|u| about 1), not 1e8
    for p, p_ref in zip(ours.params, ref.params):
        assert float((p.float() - p_ref.float()).abs().max()) < 0.1


def test_current_device_differs_from_params():
    require("2 cuda")
    case = Case(BF16, BF16, F32, clip=1.0, nonfinite="skip", shapes=GPU_SHAPES[:5])
    backend = _backend()
    with torch.cuda.device(0):
        compare_with_reference(backend, case, "cuda:1")
    with torch.cuda.device(1):
        compare_with_reference(backend, case, "cuda:0")
        # two groups on two GPUs stepped back to back with cuda:1 current
        g0, g1 = make_group(case, "cuda:0"), make_group(case, "cuda:1")
        r0, r1 = clone_group(g0), clone_group(g1)
        for grp in (g0, g1):
            run_step(backend, grp)
        for grp in (r0, r1):
            run_step(ReferenceBackend(), grp)
        assert_groups_close(g0, r0, "cuda:0 group")
        assert_groups_close(g1, r1, "cuda:1 group")


def test_jit_and_ahead_of_time_compile_to_the_same_code():
    """The JIT's compiled kernel (as launched) and the AOT builder's triton.compile call (every
    pointer divisible by 16, no integer specialisation) give the same PTX."""
    import triton

    from luminamoon.aot import builder, compat
    from luminamoon.kernels import launch, rounding
    from luminamoon.optimizer.backends.triton import TritonBackend

    case = Case(BF16, BF16, F32, clip=1.0, bound_mode=2, nonfinite="skip", shapes=GPU_SHAPES[:4])
    group = make_group(case, "cuda")
    run_step(TritonBackend(), group)
    st = group.cache["triton"]
    major, minor = torch.cuda.get_device_capability()
    for name, launcher in st.launchers.items():
        ck = launcher.compiled_kernel
        assert ck is not None, f"{name}: the JIT kept no compiled kernel"
        v = launcher.variant
        plan = builder.plan_kernel(v.spec)
        src = compat.make_ast_source(plan.fn, plan.source_spec(v.constexpr_dict()),
                                     compat.detect_api())
        aot = triton.compile(src, target=compat.gpu_target(major * 10 + minor),
                             options=builder.compile_options(plan, v))
        assert aot.asm["ptx"] == ck.asm["ptx"], f"{v.key()}: JIT and AOT PTX differ"


def test_direct_launch_and_jit_launch_agree_bitwise(monkeypatch):
    from luminamoon.kernels import launch, rounding
    from luminamoon.optimizer.backends.triton import TritonBackend

    case = Case(BF16, BF16, BF16, clip=1.0, bound_mode=2, nonfinite="skip", shapes=GPU_SHAPES)
    results = []
    for direct in (True, False):
        monkeypatch.setattr(launch, "_DIRECT_LAUNCH", direct and launch._direct_launch_supported())
        monkeypatch.setattr(launch, "_LAUNCHERS", {})
        group = make_group(case, "cuda")
        backend = TritonBackend()
        for s in range(3):
            if s:
                group.grads = new_grads(group, 60 + s)
            run_step(backend, group)
        launchers = group.cache["triton"].launchers.values()
        if direct and launch._direct_launch_supported():
            assert all(launcher.direct for launcher in launchers)
        if not direct:
            assert not any(launcher.direct for launcher in launchers)
        results.append(group)
    for name in ("params", "exp_avgs", "exp_avg_sqs", "steps"):
        for j, (x, y) in enumerate(zip(getattr(results[0], name), getattr(results[1], name))):
            assert torch.equal(bits(x), bits(y)), f"{name}[{j}]: direct and JIT launches differ"


def test_optimizer_commit_last_equals_commit_and_torch_ops(monkeypatch):
    """The optimizer's step ends in the commit_last kernel (step counters, skipped_steps +=
    flag, flag = 0); the same steps with that kernel refused (two torch ops after the commit
    instead) give the same bits, the same counts, and a clear flag after every step."""
    from luminamoon import LuminaMoon
    from luminamoon.kernels import launch, rounding
    from luminamoon.optimizer.backends.triton import TritonBackend

    from luminamoon.optimizer.backends.base import Backend

    real = TritonBackend.commit_last
    runs = []
    for use_kernel in (True, False):
        used = []

        def commit_last(self, group, found_inf, skipped, _use=use_kernel):
            if _use:
                real(self, group, found_inf, skipped)
                # the kernel's arguments are bound when (and only when) it launched
                used.append(group.cache["triton"].commit_last_args is not None)
            else:
                Backend.commit_last(self, group, found_inf, skipped)
                used.append(False)

        monkeypatch.setattr(TritonBackend, "commit_last", commit_last)
        gen = torch.Generator(device="cuda").manual_seed(8)
        params = [torch.nn.Parameter(torch.randn(s, device="cuda", generator=gen))
                  for s in ((4099,), (33, 65), (1,))]
        opt = LuminaMoon(params, lr=1e-2, clip=1.0, nonfinite="skip", seed=3, backend="triton")
        for step in range(6):
            for p in params:
                p.grad = torch.randn(p.shape, device="cuda", generator=gen)
            if step in (2, 3):
                params[step - 1].grad.view(-1)[0] = float("nan")
            opt.step()
            assert [int(f) for f in opt._flags.values()] == [0], f"flag after step {step}"
        assert used == [use_kernel] * 6
        assert int(opt.skipped_steps) == 2
        assert [int(opt.state[p]["step"]) for p in params] == [4, 4, 4]
        runs.append([p.detach().clone() for p in params])
    for j, (a, b) in enumerate(zip(*runs)):
        assert torch.equal(bits(a), bits(b)), f"param {j}: commit_last and commit differ"


def test_tensor_lr_followed_through_new_tensors_and_new_storage():
    """The launches hand over addresses, not tensors: an lr given as a new tensor every step,
    or moved to new storage in place (set_), is still the lr the kernels read: the steps equal
    those of the same lrs given as floats, bitwise."""
    from luminamoon import LuminaMoon

    lrs = [1e-2, 3e-3, 7e-3, 5e-4]
    runs = []
    for mode in ("float", "new tensor", "set_"):
        gen = torch.Generator(device="cuda").manual_seed(2)
        params = [torch.nn.Parameter(torch.randn(s, device="cuda", generator=gen))
                  for s in ((2049,), (17, 3))]
        lr_t = torch.tensor(lrs[0], device="cuda")
        opt = LuminaMoon(params, lr=lrs[0] if mode == "float" else lr_t, clip=1.0, seed=4,
                         backend="triton")
        for step, lr in enumerate(lrs):
            for p in params:
                p.grad = torch.randn(p.shape, device="cuda", generator=gen)
            if mode == "float":
                opt.param_groups[0]["lr"] = lr
            elif mode == "new tensor":
                opt.param_groups[0]["lr"] = torch.tensor(lr, device="cuda")
            else:
                lr_t.set_(torch.tensor(lr, device="cuda").untyped_storage(), 0, ())
            opt.step()
        torch.cuda.synchronize()
        runs.append([p.detach().clone() for p in params])
    for j in range(2):
        assert torch.equal(bits(runs[0][j]), bits(runs[1][j])), f"param {j}: new tensors"
        assert torch.equal(bits(runs[0][j]), bits(runs[2][j])), f"param {j}: set_"


def test_compiled_bf16_round_to_nearest_is_torchs_rounding_bitwise():
    """The compiled round-to-nearest-even (the hardware conversion) gives torch's bfloat16 bits
    for every class of float32: zeros, subnormals, ties in both directions, the largest finite
    values (rounding up to inf) and inf; NaN with any payload stays NaN."""
    import triton
    import triton.language as tl

    from luminamoon.kernels import launch, rounding
    from luminamoon.optimizer.backends.triton import TritonBackend

    @triton.jit
    def _rne_kernel(x_ptr, y_ptr, n, BLOCK: tl.constexpr):
        offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
        x = tl.load(x_ptr + offs, mask=offs < n, other=0.0)
        tl.store(y_ptr + offs, rounding._to_bf16(x, 0, 0), mask=offs < n)

    gen = torch.Generator().manual_seed(5)
    random_bits = torch.randint(-2 ** 31, 2 ** 31, (1 << 22,), generator=gen, dtype=torch.int64)
    special = []
    for sign in (0, 0x80000000):
        for exp in (0x00000000, 0x00800000, 0x3F800000, 0x7F000000, 0x7F800000):
            for low in (0, 1, 0x7FFF, 0x8000, 0x8001, 0xFFFF, 0x10000, 0x18000, 0x17FFF,
                        0x7FFFFF, 0x7F8000, 0x400000):
                special.append(sign | exp | low)
    words = torch.cat([torch.tensor(special, dtype=torch.int64), random_bits])
    words = words & 0xFFFFFFFF
    x = torch.where(words >= 2 ** 31, words - 2 ** 32, words).to(torch.int32)
    x = x.view(torch.float32).cuda()
    y = torch.empty(x.numel(), dtype=torch.bfloat16, device="cuda")
    _rne_kernel[(triton.cdiv(x.numel(), 1024),)](x, y, x.numel(), BLOCK=1024)
    # torch's rounding; a NaN's payload is not part of the contract (torch stores 0x7FFF on
    # CUDA and other patterns on CPUs): NaN in, some NaN out
    expected = x.cpu().to(torch.bfloat16).cuda()
    nan = torch.isnan(x)
    assert int(nan.sum()) > 1000 and bool(torch.isnan(y[nan]).all()), "a NaN did not stay NaN"
    x, y, expected = x[~nan], y[~nan], expected[~nan]
    diff = (bits(y) != bits(expected)).nonzero()
    assert diff.numel() == 0, (
        f"{diff.numel()} values round differently, first input bits "
        f"{int(x.view(torch.int32)[diff[0]]) & 0xFFFFFFFF:#010x}: "
        f"{int(bits(y)[diff[0]]):#06x} vs torch {int(bits(expected)[diff[0]]):#06x}")


# ------------------------------------------------------------------------------------------
# the torch.optim contract on the GPU backends (tests/test_torch_contract.py runs it on CPU)
# ------------------------------------------------------------------------------------------
def _gpu_backends():
    from conftest import native_available

    return ["triton"] + (["aot"] if native_available() else [])


def _opt(params, backend, request, **kw):
    from luminamoon import LuminaMoon

    extra = dict(aot_bundle=request.getfixturevalue("aot_bundle")) if backend == "aot" else {}
    return LuminaMoon(params, backend=backend, **extra, **kw)


@pytest.mark.parametrize("backend", _gpu_backends())
def test_grad_scaler_step_has_no_host_sync_and_equals_unscale_then_step(backend, request):
    from luminamoon import LuminaMoon

    class UnscaleThenStep(LuminaMoon):
        _step_supports_amp_scaling = False

    results = []
    for cls in (LuminaMoon, UnscaleThenStep):
        torch.manual_seed(0)
        model = torch.nn.Linear(64, 32).cuda()
        if cls is LuminaMoon:
            opt = _opt(model.parameters(), backend, request, lr=1e-2, seed=3, clip=1.0)
        else:
            extra = dict(aot_bundle=request.getfixturevalue("aot_bundle")) if backend == "aot" else {}
            opt = cls(model.parameters(), backend=backend, lr=1e-2, seed=3, clip=1.0, **extra)
        scaler = torch.amp.GradScaler("cuda", init_scale=2.0 ** 12)
        gen = torch.Generator(device="cuda").manual_seed(1)
        for step in range(4):
            x = torch.randn(8, 64, device="cuda", generator=gen)
            opt.zero_grad()
            scaler.scale(model(x).pow(2).mean()).backward()
            if step == 2:
                model.weight.grad[0, 0] = float("inf")
            if cls is LuminaMoon and step >= 1:  # past the first step's plan and compile
                torch.cuda.set_sync_debug_mode("error")
                try:
                    scaler.step(opt)
                finally:
                    torch.cuda.set_sync_debug_mode("default")
            else:
                scaler.step(opt)
            scaler.update()
        results.append(([p.detach().clone() for p in model.parameters()], int(opt.skipped_steps)))
    (ours, skipped), (theirs, _) = results
    assert all(torch.equal(a, b) for a, b in zip(ours, theirs)) and skipped == 1


@pytest.mark.parametrize("backend", _gpu_backends())
def test_channels_last_and_strided_parameters_on_the_gpu(backend, request):
    torch.manual_seed(4)
    conv = torch.nn.Conv2d(3, 16, 3).cuda()
    plain = torch.nn.Conv2d(3, 16, 3).cuda()
    plain.load_state_dict(conv.state_dict())
    conv = conv.to(memory_format=torch.channels_last)
    opts = [_opt(m.parameters(), backend, request, lr=1e-2, seed=2, clip=0.0) for m in (conv, plain)]
    x = torch.randn(2, 3, 11, 11, device="cuda")
    for _ in range(3):
        for m, o in zip((conv, plain), opts):
            o.zero_grad()
            m(x.to(memory_format=torch.channels_last) if m is conv else x).sum().backward()
            o.step()
    assert torch.equal(conv.weight.detach().contiguous(), plain.weight.detach())


@pytest.mark.parametrize("backend", _gpu_backends())
def test_a_compiled_training_step_calling_step_matches_eager_on_the_gpu(backend, request):
    out = []
    for compiled in (False, True):
        torch.manual_seed(0)
        model = torch.nn.Sequential(torch.nn.Linear(16, 16), torch.nn.Tanh()).cuda()
        opt = _opt(model.parameters(), backend, request, lr=1e-2, seed=7)

        def step(x):
            opt.zero_grad()
            model(x).pow(2).mean().backward()
            opt.step()

        fn = torch.compile(step, backend="eager") if compiled else step
        for k in range(3):
            fn(torch.full((4, 16), 0.1 * (k + 1), device="cuda"))
        out.append([p.detach().clone() for p in model.parameters()])
    assert all(torch.equal(a, b) for a, b in zip(*out))


@pytest.mark.parametrize("clip", [0.0, 1.0])
@pytest.mark.parametrize("backend", _gpu_backends())
def test_a_transposed_parameter_on_the_gpu_steps_as_its_contiguous_copy(backend, request, clip):
    """A parameter that is a transposed view, its gradient strided too: the values of the
    contiguous parameter's run, bit for bit without the clip (elementwise); with it, S is summed
    in the memory order the kernels walk, so within float32 rounding."""
    torch.manual_seed(5)
    base = torch.randn(24, 40, device="cuda")
    strided = torch.nn.Parameter(base.clone().t())  # shape (40, 24), strides (1, 40)
    plain = torch.nn.Parameter(base.clone().t().contiguous())
    opts = [_opt([p], backend, request, lr=1e-2, seed=2, clip=clip) for p in (strided, plain)]
    gen = torch.Generator(device="cuda").manual_seed(6)
    for _ in range(3):
        g = torch.randn(24, 40, device="cuda", generator=gen)
        strided.grad = g.clone().t()
        plain.grad = g.clone().t().contiguous()
        for o in opts:
            o.step()
    assert strided.stride() == (1, 40)
    if clip == 0.0:
        assert torch.equal(strided.detach().contiguous(), plain.detach())
    else:
        torch.testing.assert_close(strided.detach().contiguous(), plain.detach())


@pytest.mark.parametrize("value", [float("nan"), float("inf"), -1e-3], ids=["nan", "inf", "negative"])
@pytest.mark.parametrize("backend", _gpu_backends())
def test_a_bad_lr_in_device_memory_skips_the_step_on_the_device(backend, request, value):
    """An lr tensor on the GPU that is not finite and >= 0 (a scheduler's tensor gone bad): the
    step is skipped on the device and counted, with no host synchronisation; the next good lr
    steps as usual."""
    torch.manual_seed(3)
    model = torch.nn.Linear(32, 16).cuda()
    lr = torch.tensor(1e-2, device="cuda")
    opt = _opt(model.parameters(), backend, request, lr=lr, seed=3, clip=1.0)
    x = torch.randn(8, 32, device="cuda")
    model(x).pow(2).mean().backward()
    opt.step()  # the plan, the kernels
    model(x).pow(2).mean().backward()
    before = [p.detach().clone() for p in model.parameters()]
    lr.fill_(value)
    torch.cuda.set_sync_debug_mode("error")
    try:
        opt.step()
    finally:
        torch.cuda.set_sync_debug_mode("default")
    assert all(torch.equal(a, p.detach()) for a, p in zip(before, model.parameters()))
    assert int(opt.skipped_steps) == 1
    assert all(int(s["step"]) == 1 for s in opt.state.values())
    lr.fill_(1e-2)
    opt.step()
    assert not all(torch.equal(a, p.detach()) for a, p in zip(before, model.parameters()))
    assert all(int(s["step"]) == 2 for s in opt.state.values())


@pytest.mark.parametrize("backend", _gpu_backends())
def test_propagate_with_clip_carries_nan_as_the_reference_on_the_gpu(backend, request):
    """nonfinite="propagate" with the clip: a NaN gradient element makes S NaN, so the whole
    tensor's update is NaN, as on the reference backend (tests/test_torch_contract.py runs the
    CPU backends)."""
    from luminamoon import LuminaMoon

    results = []
    for name in (backend, "reference"):
        torch.manual_seed(2)
        w = torch.nn.Parameter(torch.randn(64, 8, device="cuda"))
        b = torch.nn.Parameter(torch.randn(8, device="cuda"))
        kw = dict(lr=1e-2, seed=9, clip=1.0, nonfinite="propagate")
        opt = (_opt([w, b], name, request, **kw) if name != "reference"
               else LuminaMoon([w, b], backend="reference", **kw))
        w.grad = torch.randn(64, 8, device="cuda")
        b.grad = torch.randn(8, device="cuda")
        w.grad[3, 4] = float("nan")
        opt.step()
        results.append((torch.isnan(w.detach()), torch.isnan(b.detach()), int(opt.skipped_steps)))
    (wn, bn, skipped), (wn_ref, bn_ref, _) = results
    assert bool(wn.all()) and torch.equal(wn, wn_ref)
    assert not bool(bn.any()) and torch.equal(bn, bn_ref)
    assert skipped == 0


@pytest.mark.parametrize("backend", _gpu_backends())
def test_compiling_the_step_itself_on_the_gpu(backend, request):
    """fullgraph=True fails with a message naming LuminaMoon and changes nothing (first: once a
    frame broke, Dynamo skips it, and fullgraph can only say so); torch.compile(opt.step) then
    runs with a graph break around the kernels and steps as eager."""
    import inspect

    with_reason = "reason" in inspect.signature(torch.compiler.disable).parameters  # 2.6+
    out = []
    for how in ("eager", "compiled"):
        torch.manual_seed(0)
        model = torch.nn.Linear(16, 16).cuda()
        opt = _opt(model.parameters(), backend, request, lr=1e-2, seed=7)
        torch._dynamo.reset()
        step = opt.step
        if how == "compiled":
            model(torch.ones(2, 16, device="cuda")).sum().backward()
            with pytest.raises(Exception, match=r"LuminaMoon.step launches its own fused kernels"
                               if with_reason else r"disable"):
                torch.compile(lambda: opt.step(), backend="eager", fullgraph=True)()
            assert all(int(s["step"]) == 0 for s in opt.state.values())
            step = torch.compile(opt.step, backend="eager")
        for k in range(3):
            opt.zero_grad()
            model(torch.full((4, 16), 0.1 * (k + 1), device="cuda")).pow(2).mean().backward()
            step()
        out.append([p.detach().clone() for p in model.parameters()])
    assert all(torch.equal(a, b) for a, b in zip(*out))


@pytest.mark.parametrize("backend", _gpu_backends())
def test_new_gradient_tensors_every_step_step_as_the_same_ones(backend, request):
    """New gradient tensors at new addresses every step (the plan vouches for them, the backend
    only rewrites its gradient column) give the bits of the same values in the same tensors; a
    gradient at an address the kernels cannot read (not 16-byte aligned) is refused before
    anything changes, naming it."""
    torch.manual_seed(8)
    shapes = [(33, 17), (5,), (64, 64)]
    a = [torch.nn.Parameter(torch.randn(s, device="cuda")) for s in shapes]
    b = [torch.nn.Parameter(p.detach().clone()) for p in a]
    oa = _opt(a, backend, request, lr=1e-2, seed=5, clip=1.0)
    ob = _opt(b, backend, request, lr=1e-2, seed=5, clip=1.0)
    gen = torch.Generator(device="cuda").manual_seed(9)
    held = [torch.zeros(s, device="cuda") for s in shapes]
    for _ in range(4):
        grads = [torch.randn(s, device="cuda", generator=gen) for s in shapes]
        for p, g in zip(a, grads):
            p.grad = g.clone()  # new tensors, new addresses
        for p, h, g in zip(b, held, grads):
            h.copy_(g)
            p.grad = h  # the same tensors every step
        oa.step()
        ob.step()
    assert all(torch.equal(x.detach(), y.detach()) for x, y in zip(a, b))
    before = [p.detach().clone() for p in a]
    buf = torch.zeros(33 * 17 + 1, device="cuda")
    a[0].grad = buf[1:].view(33, 17)  # 4 bytes past an aligned address
    for p in a[1:]:
        p.grad = torch.ones_like(p)
    with pytest.raises(ValueError, match="grad"):
        oa.step()
    assert all(torch.equal(x, p.detach()) for x, p in zip(before, a))
