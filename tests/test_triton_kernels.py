"""The Triton kernels of the TDCLM step against the reference backend, on CPU tensors.

Marker ``triton``. The kernels run in Triton's interpreter (TRITON_INTERPRET=1), which must be
switched on before triton is first imported: Triton decides at decoration time whether a
@triton.jit function (its own tl.sum, tl.philox... included) is compiled or interpreted, for
the whole process. So:
- run on its own (``pytest tests/test_triton_kernels.py``), or in a session started with
  TRITON_INTERPRET=1, this module switches the interpreter on (before importing triton) and the
  tests run in this process;
- in a session that also holds tests needing compiled Triton (the AOT builder's, the PTX
  checks), switching the interpreter on here would break them, so the same tests run in a child
  pytest process with TRITON_INTERPRET=1 (``test_interpreted_suite_in_child_process``), which
  fails here if any fails there.
Sizes are small: the interpreter runs one program at a time in numpy.
"""
import os
import sys



def _only_this_file_requested() -> bool:
    """The pytest command line names this file (or its tests) and no other path."""
    paths = [a.split("::")[0] for a in sys.argv[1:] if not a.startswith("-")
             and (a.split("::")[0].endswith(".py") or os.path.isdir(a))]
    here = os.path.abspath(__file__)
    return bool(paths) and all(os.path.abspath(p) == here for p in paths)


if "triton" not in sys.modules and _only_this_file_requested():
    os.environ.setdefault("TRITON_INTERPRET", "1")

import subprocess  # noqa: E402

import pytest  # noqa: E402
import torch  # noqa: E402

from conftest import bits, has, launch_flags, needs, require, requires_triton  # noqa: E402
from cases import (BF16, F16, F32, Case, assert_groups_close,  # noqa: E402
                             assert_unchanged, clone_group, compare_with_reference, copy_state,
                             make_group, new_grads, run_step, snapshot)


IN_PROCESS = has("interpreted triton")
in_process = needs("interpreted triton")

if IN_PROCESS:
    import triton
    import triton.language as tl

    from luminamoon.kernels import catalog, launch, layout, rounding, tdclm
    from luminamoon.optimizer.backends.triton import TritonBackend
    from luminamoon.optimizer.backends._tables import signed64
    from luminamoon.optimizer import rng
    from luminamoon.optimizer.backends.reference import ReferenceBackend, _bias_correction

pytestmark = [pytest.mark.triton, requires_triton]


def test_interpreted_suite_in_child_process():
    require("no interpreted triton")
    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    env = dict(os.environ, TRITON_INTERPRET="1")
    env["PYTHONPATH"] = os.pathsep.join(
        [os.path.join(root, "python")] + ([env["PYTHONPATH"]] if env.get("PYTHONPATH") else []))
    proc = subprocess.run(
        [sys.executable, "-m", "pytest", "-q", "-x", "-p", "no:cacheprovider", "-m", "triton",
         os.path.abspath(__file__),  # and the triton rows of the backend matrix
         os.path.join(os.path.dirname(os.path.abspath(__file__)), "test_backends.py")],
        cwd=root, env=env, capture_output=True, text=True, timeout=1800)
    assert proc.returncode == 0, ("interpreted kernel tests failed in the child process:\n"
                                  + proc.stdout[-8000:] + proc.stderr[-4000:])


# ------------------------------------------------------------------------------------------
# Non-finite gradients
# ------------------------------------------------------------------------------------------
@in_process
@pytest.mark.parametrize("clip", [0.0, 1.0], ids=["clip0", "clip1"])
@pytest.mark.parametrize("value", [float("nan"), float("inf"), float("-inf")],
                         ids=["nan", "inf", "-inf"])
def test_skip_leaves_everything_bitwise_unchanged(clip, value):
    case = Case(BF16, BF16, BF16, clip=clip, bound_mode=2, nonfinite="skip",
                shapes=((131,), (7,), (3, 5, 7)))
    group = make_group(case, "cpu")
    backend = TritonBackend()
    run_step(backend, group)  # a normal step first: the cache exists and is reused
    group.grads = new_grads(group, 9, nonfinite_at=(2, 17), value=value)
    before = snapshot(group)
    found = run_step(backend, group)
    assert int(found) == 1
    assert_unchanged(group, before, f"skipped step ({value})")
    ref = clone_group(group)
    assert int(run_step(ReferenceBackend(), ref)) == 1
    # and the next finite step goes on from the unchanged state, as the reference does
    group.grads = new_grads(group, 10)
    ref.grads = [g.clone() for g in group.grads]
    copy_state(group, ref)
    assert int(run_step(backend, group)) == 0
    run_step(ReferenceBackend(), ref)
    assert_groups_close(group, ref, "step after a skipped one")


@in_process
@pytest.mark.parametrize("clip", [0.0, 1.0], ids=["clip0", "clip1"])
def test_a_small_seed_steps_as_the_reference(clip):
    """A seed below 2**31 (the interpreter hands such a kernel argument over as 32 bits): every
    kernel that reads it widens it before its bits are taken, so the step runs and equals the
    reference, with the check-only pass 1 (clip 0) and the summing one alike."""
    from luminamoon import LuminaMoon

    def make():
        return [torch.nn.Parameter(torch.randn(s, generator=torch.Generator().manual_seed(i))
                                   .to(torch.bfloat16)) for i, s in enumerate(((131,), (3, 5)))]

    ps_t, ps_r = make(), make()
    kw = dict(lr=1e-2, clip=clip, nonfinite="skip", seed=3, state_dtype=torch.bfloat16)
    opt_t = LuminaMoon(ps_t, backend="triton", **kw)
    opt_r = LuminaMoon(ps_r, backend="reference", **kw)
    gen = torch.Generator().manual_seed(5)
    for _ in range(2):
        for p, q in zip(ps_t, ps_r):
            g = torch.randn(p.shape, generator=gen).to(torch.bfloat16)
            p.grad, q.grad = g.clone(), g.clone()
        opt_t.step()
        opt_r.step()
    for p, q in zip(ps_t, ps_r):
        torch.testing.assert_close(p.detach(), q.detach())
        torch.testing.assert_close(opt_t.state[p]["exp_avg"], opt_r.state[q]["exp_avg"])


@in_process
def test_optimizer_counts_a_skip_and_clears_its_flag_in_the_last_commit(monkeypatch):
    """LuminaMoon on the triton backend ends each step with the commit_last kernel (step
    counters, skipped_steps += flag, flag = 0): a skipped step changes nothing and is counted
    once, the flag is clear after every step, and every step matches the reference backend's."""
    from luminamoon import LuminaMoon

    from luminamoon.optimizer.backends.base import Backend

    finished, fallbacks = [], []
    real, base = TritonBackend.commit_last, Backend.commit_last

    def spy(self, group, found_inf, skipped):
        finished.append(True)
        return real(self, group, found_inf, skipped)

    def spy_base(self, group, found_inf, skipped):  # the commit and two torch ops
        fallbacks.append(type(self).__name__)
        return base(self, group, found_inf, skipped)

    monkeypatch.setattr(TritonBackend, "commit_last", spy)
    monkeypatch.setattr(Backend, "commit_last", spy_base)
    shapes = ((131,), (7,), (3, 5, 7))

    def make():
        return [torch.nn.Parameter(torch.randn(s, generator=torch.Generator().manual_seed(i)))
                for i, s in enumerate(shapes)]

    ps_t, ps_r = make(), make()
    kw = dict(lr=1e-2, clip=1.0, nonfinite="skip", seed=11, weight_decay=0.1)
    opt_t = LuminaMoon(ps_t, backend="triton", **kw)
    opt_r = LuminaMoon(ps_r, backend="reference", **kw)
    gen = torch.Generator().manual_seed(5)
    for step in range(4):
        grads = [torch.randn(p.shape, generator=gen) for p in ps_t]
        if step == 1:
            grads[2].view(-1)[5] = float("nan")
        for p, q, g in zip(ps_t, ps_r, grads):
            p.grad, q.grad = g.clone(), g.clone()
        before = [p.detach().clone() for p in ps_t]
        opt_t.step()
        opt_r.step()
        assert [int(f) for f in opt_t._flags.values()] == [0], f"flag after step {step}"
        if step == 1:
            for p, b in zip(ps_t, before):
                assert torch.equal(bits(p.detach()), bits(b)), "skipped step changed a param"
        for p, q in zip(ps_t, ps_r):
            torch.testing.assert_close(p.detach(), q.detach())
    assert int(opt_t.skipped_steps) == int(opt_r.skipped_steps) == 1
    assert [int(opt_t.state[p]["step"]) for p in ps_t] == [3, 3, 3]
    assert finished == [True] * 4
    assert "TritonBackend" not in fallbacks  # its own one-kernel commit_last every step


@in_process
def test_direct_launches_hand_over_the_current_addresses(monkeypatch):
    """The direct launch path (a compiled kernel's own launcher; faked here, which records
    what it is handed) gets every tensor argument as its address, the lr's and the flag's
    re-read when they change: a new lr tensor, or the flag moved to other storage."""
    calls = []

    class FakeCompiled:
        function = packed_metadata = None

        def run(self, *a):
            calls.append(a)

    def direct_launcher(variant, device):  # as after a first, compiling launch
        launcher = launch._Launcher(variant, device)
        launcher.direct, launcher.compiled_kernel = True, FakeCompiled()
        launcher._get_stream = launcher._get_device = lambda *a: 0
        return launcher

    from luminamoon.optimizer.backends import triton as triton_backend

    monkeypatch.setattr(triton_backend, "launcher", direct_launcher)
    monkeypatch.setattr(launch, "_launch_hooks_set", lambda: False)
    case = Case(F32, F32, F32, clip=1.0, nonfinite="skip", shapes=((131,), (7,)))
    group = make_group(case, "cpu")
    backend = TritonBackend()
    flag = torch.zeros((), dtype=torch.int32)
    for step, lr in enumerate((torch.tensor(1e-2), torch.tensor(2e-2))):
        group.lr = lr
        if step == 1:
            flag.set_(torch.zeros((), dtype=torch.int32).untyped_storage(), 0, ())
        calls.clear()
        backend.pass1(group, flag)
        backend.pass2(group, flag)
        backend.commit(group, flag)
        st = group.cache["triton"]
        assert len(calls) == 4  # pass 1, reduce, pass 2, commit
        for c in calls:
            handed = c[9:]  # grid x3, stream, function, metadata, three hooks, then the args
            assert not any(isinstance(a, torch.Tensor) for a in handed)
        pass1, reduce, pass2, commit = (c[9:] for c in calls)
        assert pass1[0] == st.table.data_ptr() and reduce[4] == flag.data_ptr()
        assert pass2[3] == flag.data_ptr() and pass2[4] == lr.data_ptr()
        assert commit[:2] == (st.table.data_ptr(), flag.data_ptr())


@in_process
def test_propagate_carries_nan_like_the_reference():
    case = Case(F32, F32, F32, clip=1.0, nonfinite="propagate", shapes=((131,), (7,)))
    group = make_group(case, "cpu")
    group.grads = new_grads(group, 4, nonfinite_at=(0, 5))
    ref = clone_group(group)
    run_step(TritonBackend(), group)
    run_step(ReferenceBackend(), ref)
    assert bool(torch.isnan(group.params[0]).any())
    assert_groups_close(group, ref, "propagate")


# ------------------------------------------------------------------------------------------
# The random words, the bias corrections, tanh, rounding: kernel helpers on their own
# ------------------------------------------------------------------------------------------
if IN_PROCESS:

    # t, k and the offset come from an int64 tensor, as the kernels read them from the table;
    # the seed is a kernel argument, as in the kernels

    @triton.jit
    def _words_kernel(out, key_out, tko, seed, n, STREAM: tl.constexpr, BLOCK: tl.constexpr,
                      ALIGNED: tl.constexpr):
        offs = tl.arange(0, BLOCK // 8)[:, None] * 8 + tl.arange(0, 8)[None, :]  # the tile
        key = rounding._seed_tk(seed, tl.load(tko), tl.load(tko + 1))
        w = rounding._stream_words16(key, tl.load(tko + 2), STREAM, BLOCK, ALIGNED)
        tl.store(out + offs, w.to(tl.int64), mask=offs < n)
        tl.store(key_out, key.to(tl.int64, bitcast=True))

    @triton.jit
    def _bc_kernel(out, beta1, beta2, t_ptr):
        bc1, bc2 = tdclm._bias_corrections(tl.cast(beta1, tl.float32), tl.cast(beta2, tl.float32),
                                        tl.load(t_ptr))
        tl.store(out, bc1)
        tl.store(out + 1, bc2)

    @triton.jit
    def _tanh_kernel(x_ptr, y_ptr, n, BLOCK: tl.constexpr):
        offs = tl.arange(0, BLOCK)
        x = tl.load(x_ptr + offs, mask=offs < n, other=0.0)
        tl.store(y_ptr + offs, tdclm._triton_tanh_fast(x), mask=offs < n)

    @triton.jit
    def _bf16_kernel(x_ptr, w_ptr, y_ptr, n, SR: tl.constexpr, BLOCK: tl.constexpr):
        offs = tl.arange(0, BLOCK)
        x = tl.load(x_ptr + offs, mask=offs < n, other=0.0)
        w = tl.load(w_ptr + offs, mask=offs < n, other=0).to(tl.uint32)
        tl.store(y_ptr + offs, rounding._to_bf16(x, w, SR), mask=offs < n)


SEEDS = [0, 1, 2 ** 31 + 5, 2 ** 63 - 1, 2 ** 63, 2 ** 64 - 1, 0x9E3779B97F4A7C15]


@in_process
@pytest.mark.parametrize("seed", SEEDS, ids=[f"seed{s:#x}" for s in SEEDS])
@pytest.mark.parametrize("stream", [0, 1, 2])
def test_random_words_equal_reference_rng(seed, stream):
    n = 300
    # offsets that are and are not multiples of 8 (a shard starting inside a group)
    for t, k, offset in [(1, 0, 0), (7, 5, 2 ** 32 - 150), (123456, 2 ** 40 + 3, 2 ** 33 + 9),
                         (2, 1, 3), (9, 2, 2 ** 32 - 3)]:
        out = torch.empty(n, dtype=torch.int64)
        key = torch.empty(1, dtype=torch.int64)
        tko = torch.tensor([t, k, offset], dtype=torch.int64)
        index = torch.arange(n, dtype=torch.int64) + offset
        expected = rng.random_words(seed, t, k, index, stream)
        # the aligned path (one Philox a row) where the offset allows it; the general one always
        for aligned in ((0, 1) if offset % 8 == 0 else (0,)):
            _words_kernel[(1,)](out, key, tko, signed64(seed), n, STREAM=stream, BLOCK=512,
                                ALIGNED=aligned)
            assert int(key) & 0xFFFFFFFFFFFFFFFF == rng.rounding_seed(seed, t, k)
            assert torch.equal(out, expected), f"seed {seed:#x} t {t} k {k} offset {offset}"


@in_process
@pytest.mark.parametrize("beta", [(0.9, 0.999), (0.5, 0.95), (0.0, 0.0), (0.99, 0.9999)])
def test_bias_corrections_equal_reference(beta):
    b1, b2 = (float(torch.tensor(b, dtype=torch.float32)) for b in beta)
    out = torch.empty(2, dtype=torch.float32)
    for t in (1, 2, 3, 10, 1000, 123457, 2 ** 31 + 11):
        tt = torch.tensor(t, dtype=torch.int64)
        _bc_kernel[(1,)](out, b1, b2, tt)
        expected = torch.stack([_bias_correction(b1, tt), _bias_correction(b2, tt)])
        assert torch.equal(bits(out), bits(expected)), f"t={t}: {out.tolist()} vs {expected}"


@in_process
def test_tanh_formula_is_accurate_and_total():
    # finite range, tiny values, and the special values the soft clip can meet
    x = torch.cat([torch.linspace(-12.0, 12.0, 997), torch.tensor(
        [0.0, -0.0, 1e-30, -1e-30, 1e-7, 20.0, -20.0, 1e30, float("inf"), float("-inf"),
         float("nan")])])
    y = torch.empty_like(x)
    _tanh_kernel[(1,)](x, y, x.numel(), BLOCK=1024)
    expected = torch.tanh(x.double()).float()
    # The interpreter's formula: 1 - e and 1 + e each round once, so its error is absolute,
    # <= 2**-23 (relative where |x| < 1e-4, where it returns x); 4 float32 ulps elsewhere.
    torch.testing.assert_close(y, expected, rtol=4 * 2 ** -23, atol=2 ** -23, equal_nan=True)
    assert torch.equal(torch.sign(y[:-1]), torch.sign(expected[:-1]))


@in_process
@pytest.mark.parametrize("sr", [0, 1], ids=["rne", "sr"])
def test_bf16_rounding_equals_reference(sr):
    gen = torch.Generator().manual_seed(5)
    x = torch.cat([torch.randn(900, generator=gen) * 10.0 ** torch.randint(
        -30, 30, (900,), generator=gen), torch.tensor(
        [0.0, -0.0, 1.0, -1.0, 3.3895314e38, -3.3895314e38, 3.4028235e38, 1e-40, -1e-41,
         float("inf"), float("-inf"), float("nan"), 1.00390625, 1.01171875])])
    # ties to even: 1 + 2**-8 rounds to 1, 1 + 3*2**-8 up (both in the tensor above)
    words = torch.randint(0, 2 ** 16, x.shape, generator=gen, dtype=torch.int64)  # R16 values
    y = torch.empty(x.shape, dtype=torch.bfloat16)
    _bf16_kernel[(1,)](x, words, y, x.numel(), SR=sr, BLOCK=1024)
    expected = rng.round_to_bf16(x, words if sr else None)
    nan = torch.isnan(x)
    assert torch.equal(torch.isnan(y), nan)
    assert torch.equal(bits(y[~nan]), bits(expected[~nan]))


# ------------------------------------------------------------------------------------------
# The backend's cache, lr handling, refusals
# ------------------------------------------------------------------------------------------
@in_process
def test_cache_is_reused_and_follows_new_grad_tensors():
    case = Case(F32, F32, F32, clip=1.0, nonfinite="skip", shapes=((131,), (7,), (40,)))
    group = make_group(case, "cpu")
    ref = clone_group(group)
    backend = TritonBackend()
    run_step(backend, group)
    run_step(ReferenceBackend(), ref)
    st = group.cache["triton"]
    for s in range(2):
        # new gradient tensors (new addresses), the rest unchanged: the table is patched
        group.grads = new_grads(group, 20 + s)
        ref.grads = [g.clone() for g in group.grads]
        copy_state(group, ref)
        run_step(backend, group)
        run_step(ReferenceBackend(), ref)
        assert group.cache["triton"] is st
        assert st.table[:, layout.COL_GRAD].tolist() == [g.data_ptr() for g in group.grads]
        assert_groups_close(group, ref, f"new grads, step {s}")


@in_process
@pytest.mark.parametrize("sr", [True, False], ids=["sr", "rne"])
def test_step_constant_cache_follows_the_step_counters(sr):
    """The table's cache of each step's constants: filled by the update kernel for the next
    step, read when it holds the step being applied, ignored when it does not (a counter
    changed in place, a skipped step); every step matches the reference."""
    case = Case(BF16, BF16, BF16, clip=1.0, nonfinite="skip", sr=sr,
                shapes=((2500,), (7,), (1030,)))
    group = make_group(case, "cpu")
    backend = TritonBackend()
    cache = layout.COL_CACHE
    plan = [("step", None), ("step", None), ("counter", 1_000_000), ("step", None),
            ("skip", None), ("step", None), ("counter", 6), ("step", None)]
    for s, (what, value) in enumerate(plan):
        if what == "counter":
            for step in group.steps:
                step.fill_(value)
            continue
        group.grads = new_grads(group, 50 + s, nonfinite_at=(1, 3) if what == "skip" else None)
        ref = clone_group(group)
        copy_state(group, ref)
        t_before = [int(x) for x in group.steps]
        f_a = run_step(backend, group)
        f_e = run_step(ReferenceBackend(), ref)
        assert int(f_a) == int(f_e) == (1 if what == "skip" else 0)
        assert_groups_close(group, ref, f"step {s} ({what})")
        table = group.cache["triton"].table
        for j, t in enumerate(t_before):
            # after a step that applies t + 1, slot (t + 2) & 1 holds step t + 2
            slot = cache + ((t + 2) & 1) * 3
            assert int(table[j, slot]) == t + 2, f"tensor {j}: cache slot not written"


@in_process
def test_new_param_tensors_rebuild_the_tables():
    case = Case(F32, F32, F32, shapes=((131,), (7,)))
    group = make_group(case, "cpu")
    backend = TritonBackend()
    run_step(backend, group)
    st = group.cache["triton"]
    group.params = [p.clone() for p in group.params]
    group.grads = new_grads(group, 3)
    ref = clone_group(group)
    run_step(backend, group)
    run_step(ReferenceBackend(), ref)
    assert group.cache["triton"] is not st
    assert_groups_close(group, ref, "after new params")


@in_process
def test_float_lr_changes_are_applied():
    case = Case(F32, F32, F32, shapes=((131,),))
    group = make_group(case, "cpu")
    ref = clone_group(group)
    backend = TritonBackend()
    for s, lr in enumerate([1e-2, 1e-2, 3e-3, 0.0]):
        group.lr = ref.lr = lr
        if s:
            group.grads = new_grads(group, 30 + s)
            ref.grads = [g.clone() for g in group.grads]
            copy_state(group, ref)
        run_step(backend, group)
        run_step(ReferenceBackend(), ref)
        assert_groups_close(group, ref, f"lr {lr}")
        assert float(group.cache["triton"].lr_buf) == float(torch.tensor(lr))


def _refused(group, match):
    before = snapshot(group)
    grads_before = [g.clone() for g in group.grads]
    with pytest.raises(ValueError, match=match):
        run_step(TritonBackend(), group)
    assert_unchanged(group, before, "refused step")
    for a, b in zip(group.grads, grads_before):
        assert torch.equal(bits(a), bits(b))


@in_process
def test_refuses_misaligned_tensor_and_changes_nothing():
    case = Case(F32, F32, F32, shapes=((131,), (7,)))
    group = make_group(case, "cpu")
    base = torch.zeros(132)
    base[1:].copy_(group.params[0])
    group.params[0] = base[1:]  # 4 bytes past a 16-byte boundary
    _refused(group, r"param of tensor 0 .* not a multiple of 16 bytes")


@in_process
def test_refuses_misaligned_new_grad():
    case = Case(F32, F32, F32, shapes=((131,), (7,)))
    group = make_group(case, "cpu")
    run_step(TritonBackend(), group)  # a cached state exists, then a bad grad arrives
    backend = TritonBackend()
    buf = torch.zeros(9)
    group.grads[1] = buf[2:]
    before = snapshot(group)
    with pytest.raises(ValueError, match=r"grad of tensor 1 .* not a multiple of 16 bytes"):
        run_step(backend, group)
    assert_unchanged(group, before, "refused step")


@in_process
@pytest.mark.parametrize("what", ["noncontiguous", "dtype", "numel", "not a tensor"])
def test_refuses_a_bad_new_grad_by_name(what):
    """New gradient tensors are checked all at once; one that does not fit is named."""
    case = Case(F32, F32, F32, shapes=((131,), (6, 7), (5,)))
    group = make_group(case, "cpu")
    backend = TritonBackend()
    run_step(backend, group)
    grads = [g.clone() for g in group.grads]
    if what == "noncontiguous":
        grads[1] = torch.zeros(7, 6).t()
        match = r"grad of tensor 1 .* is not contiguous"
    elif what == "dtype":
        grads[2] = grads[2].double()
        match = r"grad of tensor 2 .* has dtype torch.float64"
    elif what == "numel":
        grads[0] = torch.zeros(130)
        match = r"grad of tensor 0 .* has 130 elements"
    else:
        grads[1] = [0.0] * 42
        match = r"grad of tensor 1 .* must be a tensor"
    group.grads = grads
    before = snapshot(group)
    with pytest.raises(ValueError, match=match):
        run_step(backend, group)
    assert_unchanged(group, before, f"refused step ({what})")


@in_process
@pytest.mark.parametrize("what", ["noncontiguous", "dtype", "numel", "p_init"])
def test_refuses_bad_groups(what):
    case = Case(F32, F32, F32, bound_mode=1, shapes=((6, 42), (7,)))
    group = make_group(case, "cpu")
    if what == "noncontiguous":
        group.exp_avgs[0] = group.exp_avgs[0].t()
        match = "not contiguous"
    elif what == "dtype":
        group.exp_avg_sqs[1] = group.exp_avg_sqs[1].double()
        match = "dtype torch.float64"
    elif what == "numel":
        group.grads[1] = torch.zeros(8)
        match = "has 8 elements"
    else:
        group.p_inits = None
        match = "needs one p_init per param"
    _refused(group, match)


# ------------------------------------------------------------------------------------------
# Variants: the interface of the AOT builder and the C++ engine
# ------------------------------------------------------------------------------------------
@in_process
def test_variants_for_follows_the_launch_plan():
    h = Case(BF16, BF16, F32, clip=1.0, bound_mode=2, nonfinite="skip").hyper()
    v = catalog.variants_for(BF16, BF16, F32, launch_flags(BF16, F32, h))
    assert sorted(v) == ["commit", "pass1", "pass2", "reduce"]
    assert v["pass2"].key() == (f"pass2.p1g1s0.sr1.b2.c1.f1.B{catalog.ELEMENTWISE_BLOCK}"
                                f".w{catalog.ELEMENTWISE_WARPS}")
    assert v["pass1"].key().startswith("pass1.g1s0.sr1.n1.B")
    assert v["reduce"].constexpr_dict()["BLOCK"] == v["pass1"].constexpr_dict()["BLOCK"]
    # AdamW-equivalent: one single-pass kernel and the commit
    h0 = Case(F32, F32, F32, nonfinite="propagate").hyper()
    v0 = catalog.variants_for(F32, F32, F32, launch_flags(F32, F32, h0))
    assert sorted(v0) == ["commit", "single_pass"]
    assert v0["single_pass"].key() == (f"single_pass.p0g0s0.sr0.b0.B{catalog.ELEMENTWISE_BLOCK}"
                                       f".w{catalog.ELEMENTWISE_WARPS}")
    # clip 0 + skip: pass 1 reads only grads (NEED_SUM 0), pass 2 checks the flag
    hs = Case(F16, F16, F32, nonfinite="skip").hyper()
    vs = catalog.variants_for(F16, F16, F32, launch_flags(F16, F32, hs))
    assert vs["pass1"].constexpr_dict()["NEED_SUM"] == 0
    assert vs["pass2"].constexpr_dict()["USE_CLIP"] == 0
    assert vs["pass2"].constexpr_dict()["CHECK_FLAG"] == 1
    assert vs["pass2"].constexpr_dict()["SR"] == 0  # no bf16 anywhere: SR normalised to 0
    for variant in list(v.values()) + list(v0.values()):
        assert tuple(n for n, _ in variant.constexprs) == catalog.KERNEL_SPECS[variant.kernel].constexprs


@in_process
def test_all_variants_are_unique_and_cover_every_group():
    variants = catalog.all_variants()
    keys = [v.key() for v in variants]
    assert len(keys) == len(set(keys))
    assert keys == sorted(keys)
    assert {v.kernel for v in variants} == set(catalog.KERNEL_SPECS)
    for p, g, s in catalog.DEFAULT_DTYPE_COMBOS:
        for clip in (0.0, 3.0):
            for bound_mode in (0, 1, 2):
                for nonfinite in ("skip", "raise", "propagate"):
                    for sr in (False, True):
                        h = Case(p, g, s, clip=clip, bound_mode=bound_mode, nonfinite=nonfinite,
                                 sr=sr).hyper()
                        for v in catalog.variants_for(p, g, s, launch_flags(p, s, h)).values():
                            assert v.key() in keys
    with pytest.raises(ValueError, match="float16 is not supported"):
        catalog.variants_for(F32, F32, F16, launch_flags(F32, F16, Case(F32, F32, F32).hyper()))


@in_process
def test_kernel_specs_match_the_kernel_signatures():
    import inspect

    for name, spec in {**catalog.KERNEL_SPECS, **catalog.JIT_ONLY_KERNEL_SPECS}.items():
        params = list(inspect.signature(spec.fn.fn).parameters)
        assert params == [a for a, _ in spec.args] + list(spec.constexprs), name
