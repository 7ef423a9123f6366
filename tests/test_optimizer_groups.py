"""Param groups, launch-group planning and its cache, dtype mixes, backend choice, the
package surface."""
from __future__ import annotations

import gc
import os
import subprocess
import sys
import weakref

import pytest
import torch

from conftest import CPU_BACKENDS, assert_bitwise_equal, dtype_id, require
from luminamoon import LuminaMoon, tdclm
from luminamoon.optimizer.backends import get_backend

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
HYPER = dict(lr=1e-2, betas=(0.9, 0.99), eps=1e-8, weight_decay=0.05, clip=1.0,
             bound_mode="rel", bound=0.5, maximize=False, nonfinite="skip",
             stochastic_rounding=True)


def _functional_alone(p0, grads, k, seed, state_dtype=torch.float32, **hyper):
    """Step one tensor with the functional form as parameter k, over the given grads."""
    p = p0.clone()
    m = torch.zeros_like(p, dtype=state_dtype)
    v = torch.zeros_like(p, dtype=state_dtype)
    p_init = [p0.clone()] if hyper["bound_mode"] != "none" else None
    step = torch.zeros((), dtype=torch.int64)
    for g in grads:
        tdclm([p], [g], [m], [v], p_init, [step], param_indices=[k], seed=seed, **hyper)
    return p


def test_mixed_dtypes_are_grouped_and_each_matches_alone():
    dtypes = [torch.float32, torch.bfloat16, torch.float16, torch.float64, torch.bfloat16]
    gen = torch.Generator().manual_seed(0)
    inits = [torch.randn(37, 3, generator=gen).to(dt) for dt in dtypes]
    grads = [[torch.randn(37, 3, generator=gen).to(dt) for _ in range(3)] for dt in dtypes]
    params = [torch.nn.Parameter(t.clone()) for t in inits]
    opt = LuminaMoon(params, seed=21, backend="reference", **HYPER)
    for s in range(3):
        for p, g in zip(params, grads):
            p.grad = g[s]
        opt.step()
    # One launch group per (device, param dtype, grad dtype): fp32, bf16 (two tensors), fp16, fp64.
    assert sorted(len(g) for g in opt._plan.groups) == [1, 1, 1, 2]
    for k, (p, t, g) in enumerate(zip(params, inits, grads)):
        alone = _functional_alone(t, g, k, 21, **HYPER)
        assert_bitwise_equal(p.detach(), alone, f"param {k} {dtype_id(t.dtype)}")


def test_param_index_counts_parameters_without_gradients():
    gen = torch.Generator().manual_seed(1)
    inits = [torch.randn(50, generator=gen).to(torch.bfloat16) for _ in range(3)]
    params = [torch.nn.Parameter(t.clone()) for t in inits]
    g = torch.randn(50, generator=gen).to(torch.bfloat16)
    opt = LuminaMoon(params, seed=4, backend="reference", **HYPER)
    params[0].grad, params[2].grad = g.clone(), g.clone()
    opt.step()
    assert params[1] not in opt.state  # no grad: no state
    assert torch.equal(params[1].detach(), inits[1])
    assert_bitwise_equal(params[2].detach(), _functional_alone(inits[2], [g], 2, 4, **HYPER))


def test_groups_with_their_own_hyperparameters_match_functional_calls():
    gen = torch.Generator().manual_seed(2)
    inits = [torch.randn(64, generator=gen) for _ in range(3)]
    grads = [[torch.randn(64, generator=gen) for _ in range(4)] for _ in range(3)]
    params = [torch.nn.Parameter(t.clone()) for t in inits]
    overrides = [dict(), dict(lr=3e-2, clip=0.0, bound_mode="none"),
                 dict(betas=(0.5, 0.9), maximize=True, bound_mode="abs", bound=0.01,
                      state_dtype=torch.bfloat16)]
    opt = LuminaMoon([{"params": [p], **o} for p, o in zip(params, overrides)], seed=8,
                     backend="reference", **HYPER)
    for g in opt.param_groups:
        assert set(HYPER) <= set(g) and "state_dtype" in g and g["seed"] == 8
    for s in range(4):
        for p, g in zip(params, grads):
            p.grad = g[s]
        opt.step()
    for k, (p, t, g, o) in enumerate(zip(params, inits, grads, overrides)):
        hyper = {**HYPER, **{key: v for key, v in o.items() if key != "state_dtype"}}
        alone = _functional_alone(t, g, k, 8, state_dtype=o.get("state_dtype", torch.float32),
                                  **hyper)
        assert_bitwise_equal(p.detach(), alone, f"group {k}")


def test_plan_is_cached_and_rebuilt_on_change():
    a = torch.nn.Parameter(torch.ones(4))
    b = torch.nn.Parameter(torch.ones(4))
    opt = LuminaMoon([a, b], backend="reference")
    a.grad = torch.ones(4)
    opt.step()
    plan = opt._plan
    assert [len(g) for g in plan.groups] == [1]
    assert plan.groups[0].grads == []  # gradients are not kept alive between steps
    a.grad = torch.ones(4)
    opt.param_groups[0]["lr"] = 5e-3  # lr: not part of the plan
    opt.step()
    assert opt._plan is plan and plan.groups[0].lr == 5e-3
    b.grad = torch.ones(4)  # another parameter with a gradient: rebuild
    a.grad = torch.ones(4)
    opt.step()
    assert opt._plan is not plan and [len(g) for g in opt._plan.groups] == [2]
    plan = opt._plan
    opt.param_groups[0]["clip"] = 0.0  # a hyperparameter: rebuild
    a.grad, b.grad = torch.ones(4), torch.ones(4)
    opt.step()
    assert opt._plan is not plan and opt._plan.groups[0].hyper.clip == 0.0
    plan = opt._plan
    a.data = torch.zeros(4)  # the storage moved: rebuild
    a.grad, b.grad = torch.ones(4), torch.ones(4)
    opt.step()
    assert opt._plan is not plan
    assert int(opt.state[a]["step"]) == 5 and int(opt.state[b]["step"]) == 3


@pytest.mark.parametrize("path", ["one call", "pass by pass"])
@pytest.mark.parametrize("backend", CPU_BACKENDS)
def test_a_step_keeps_no_gradient_alive(backend, path):
    """Once a step has returned, the optimizer holds none of its gradients: dropping them
    (zero_grad(set_to_none=True), a new backward) frees them then, not at the next step. The
    pass-by-pass path (a GradScaler's step) and the one-call path alike."""
    params = [torch.nn.Parameter(torch.randn(64, 8)), torch.nn.Parameter(torch.randn(8))]
    opt = LuminaMoon(params, backend=backend, lr=1e-2, clip=1.0)
    scaler = torch.amp.GradScaler("cpu") if path == "pass by pass" else None
    for _ in range(2):
        loss = sum((p * torch.randn_like(p)).sum() for p in params)
        (loss if scaler is None else scaler.scale(loss)).backward()
        alive = [weakref.ref(p.grad) for p in params]
        if scaler is None:
            opt.step()
        else:
            scaler.step(opt)
            scaler.update()
        opt.zero_grad(set_to_none=True)
        gc.collect()
        assert [r() is None for r in alive] == [True, True], "a gradient outlived its step"
    assert int(opt.state[params[0]]["step"]) == 2


def test_plan_notices_every_change_the_step_depends_on():
    """A gradient dropped, a parameter swapped inside a group's list, a gradient of another
    dtype, a sparse gradient: each is seen on the next step (rebuild, or a clear error), and
    the step then updates exactly the parameters that have gradients."""
    a = torch.nn.Parameter(torch.ones(8))
    b = torch.nn.Parameter(torch.ones(8))
    opt = LuminaMoon([a, b], backend="reference", clip=0.0, nonfinite="propagate")
    a.grad, b.grad = torch.ones(8), torch.ones(8)
    opt.step()
    plan = opt._plan
    a.grad, b.grad = torch.ones(8), None  # b's gradient gone
    b_before = b.detach().clone()
    opt.step()
    assert opt._plan is not plan
    assert torch.equal(b.detach(), b_before) and int(opt.state[b]["step"]) == 1
    assert int(opt.state[a]["step"]) == 2
    plan = opt._plan
    c = torch.nn.Parameter(torch.ones(8))
    opt.param_groups[0]["params"][1] = c  # the same list, another parameter in it
    a.grad, c.grad = torch.ones(8), torch.ones(8)
    opt.step()
    assert opt._plan is not plan and int(opt.state[c]["step"]) == 1
    plan = opt._plan
    a.grad, c.grad = torch.ones(8), torch.ones(8)
    opt.step()
    assert opt._plan is plan  # nothing changed: the plan is reused
    if hasattr(a, "grad_dtype"):  # torch >= 2.9: a gradient dtype apart from the parameter's
        a.grad = None
        a.grad_dtype = torch.bfloat16
        a.grad, c.grad = torch.ones(8, dtype=torch.bfloat16), torch.ones(8)
        opt.step()
        assert opt._plan is not plan
        assert {g.grad_dtype for g in opt._plan.groups} == {torch.bfloat16, torch.float32}
        a.grad = None
        a.grad_dtype = None
    a.grad = torch.ones(8).to_sparse()
    c.grad = torch.ones(8)
    c_before = c.detach().clone()
    with pytest.raises(ValueError, match="sparse"):
        opt.step()
    assert torch.equal(c.detach(), c_before)  # refused: nothing changed


def test_zero_grad_and_closure():
    p = torch.nn.Parameter(torch.ones(3))
    opt = LuminaMoon([p], backend="reference")

    def closure():
        opt.zero_grad()
        loss = (p * p).sum()
        loss.backward()
        return loss

    losses = [float(opt.step(closure).detach()) for _ in range(3)]
    assert losses[0] == 3.0 and losses[-1] < losses[0]
    opt.zero_grad()
    assert p.grad is None
    before = p.detach().clone()
    opt.step()  # nothing has a gradient: nothing changes
    assert torch.equal(p.detach(), before)


def test_float64_parameters_on_the_reference_backend():
    p = torch.nn.Parameter(torch.ones(5, dtype=torch.float64))
    p.grad = torch.ones(5, dtype=torch.float64)
    opt = LuminaMoon([p], backend="reference", clip=0.0)
    opt.step()
    assert p.dtype == torch.float64 and bool((p.detach() < 1).all())
    assert opt.state[p]["exp_avg"].dtype == torch.float32


def test_non_contiguous_parameter():
    base = torch.randn(6, 8, generator=torch.Generator().manual_seed(3))
    p = torch.nn.Parameter(base.t())  # a transposed view: strides (1, 8)
    q = torch.nn.Parameter(base.t().contiguous())
    g = torch.randn(8, 6, generator=torch.Generator().manual_seed(4))
    for x in (p, q):
        x.grad = g.clone()
        LuminaMoon([x], seed=1, backend="reference", **HYPER).step()
    assert torch.equal(p.detach(), q.detach())


@pytest.mark.parametrize("device,expected", [("mps", "reference"), ("meta", "reference")])
def test_auto_backend_on_other_devices(device, expected):
    assert get_backend("auto", device).name == expected


def test_auto_backend_on_cpu_prefers_native():
    name = get_backend("auto", "cpu").name
    try:
        import luminamoon._luminav  # noqa: F401
        native = True
    except ImportError:
        native = False
    assert name == ("cpu" if native else "reference")
    assert get_backend("reference", "cpu") is get_backend("reference", "cpu")


def test_public_surface():
    import luminamoon
    import luminamoon.optimizer as opt_pkg

    assert luminamoon.__all__ == ["LuminaMoon", "tdclm", "q8_state", "step_in_backward", "InBackward",
                                  "offload", "CpuOffload", "__version__"]
    assert luminamoon.__version__ == "0.1.0"
    assert set(opt_pkg.__all__) == {"LuminaMoon", "tdclm", "q8_state"}
    assert issubclass(LuminaMoon, torch.optim.Optimizer)


def test_import_does_nothing_but_define():
    code = (
        "import sys, torch\n"
        "import luminamoon\n"
        "loaded = [m for m in ('triton', 'luminamoon._luminav',"
        " 'luminamoon.optimizer.backends.cpu', 'luminamoon.optimizer.backends.aot',"
        " 'luminamoon.optimizer.backends._native', 'luminamoon.optimizer.backends.triton',"
        " 'luminamoon.kernels.tdclm', 'luminamoon.kernels.catalog') if m in sys.modules]\n"
        "print(loaded, torch.cuda.is_initialized())\n"
    )
    env = dict(os.environ, PYTHONPATH=os.path.join(ROOT, "python"))
    out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True,
                         timeout=120)
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == "[] False"


# ------------------------------------------------------------------------------------------
# torch.optim's step hooks and profiler range
# ------------------------------------------------------------------------------------------
def _hooked_params():
    p = torch.nn.Parameter(torch.ones(4))
    p.grad = torch.full((4,), 0.5)
    return p


def test_step_hooks_run_once_each_in_order():
    from torch.optim.optimizer import (register_optimizer_step_post_hook,
                                       register_optimizer_step_pre_hook)

    p = _hooked_params()
    opt = LuminaMoon([p], backend="reference", clip=0.0)
    calls = []

    def pre(o, args, kwargs):
        assert o is opt and int(o.state[p].get("step", 0)) == len(calls) // 4  # runs before
        calls.append("pre")

    def post(o, args, kwargs):
        calls.append("post")

    handles = [opt.register_step_pre_hook(pre), opt.register_step_post_hook(post),
               register_optimizer_step_pre_hook(lambda o, a, k: calls.append("global-pre")),
               register_optimizer_step_post_hook(lambda o, a, k: calls.append("global-post"))]
    try:
        opt.step()
        opt.step()
    finally:
        for h in handles:
            h.remove()
    assert calls == ["global-pre", "pre", "post", "global-post"] * 2
    assert int(opt.state[p]["step"]) == 2
    calls.clear()
    opt.step()  # hooks removed: none runs, the step still does
    assert calls == [] and int(opt.state[p]["step"]) == 3


def test_a_pre_hook_may_replace_the_closure():
    p = _hooked_params()
    opt = LuminaMoon([p], backend="reference", clip=0.0)
    opt.register_step_pre_hook(lambda o, args, kwargs: ((o,), {"closure": lambda: 7.0}))
    assert opt.step() == 7.0


def test_subclass_step_runs_hooks_once():
    class Sub(LuminaMoon):
        def step(self, closure=None):
            self.seen = getattr(self, "seen", 0) + 1
            return super().step(closure)

    p = _hooked_params()
    opt = Sub([p], backend="reference", clip=0.0)
    calls = []
    opt.register_step_pre_hook(lambda o, a, k: calls.append("pre"))
    opt.register_step_post_hook(lambda o, a, k: calls.append("post"))
    opt.step()
    assert calls == ["pre", "post"] and opt.seen == 1 and int(opt.state[p]["step"]) == 1


def test_profiler_sees_the_step_range():
    p = _hooked_params()
    opt = LuminaMoon([p], backend="reference", clip=0.0)
    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU]) as prof:
        opt.step()
    names = {e.key for e in prof.key_averages()}
    assert "Optimizer.step#LuminaMoon.step" in names, sorted(names)[:20]
    assert int(opt.state[p]["step"]) == 1


def test_lr_scheduler_sees_the_step():
    import warnings

    p = _hooked_params()
    opt = LuminaMoon([p], backend="reference", clip=0.0, lr=1.0)
    sched = torch.optim.lr_scheduler.StepLR(opt, step_size=1, gamma=0.5)
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # "lr_scheduler.step() before optimizer.step()" fails
        opt.step()
        sched.step()
    assert opt.param_groups[0]["lr"] == 0.5


# ------------------------------------------------------------------------------------------
# the skip flag between steps
# ------------------------------------------------------------------------------------------
def test_a_step_failing_part_way_does_not_skip_the_next():
    from luminamoon.optimizer.backends.reference import ReferenceBackend

    class FailsOnce(ReferenceBackend):
        failed = False

        def pass2(self, group, found_inf):
            if not FailsOnce.failed:
                FailsOnce.failed = True
                raise RuntimeError("pass 2 failed")
            return super().pass2(group, found_inf)

    p = torch.nn.Parameter(torch.ones(4))
    opt = LuminaMoon([p], backend=FailsOnce(), clip=1.0, nonfinite="skip")
    p.grad = torch.tensor([1.0, float("nan"), 1.0, 1.0])
    with pytest.raises(RuntimeError, match="pass 2 failed"):
        opt.step()  # pass 1 raised the skip flag, then the step failed
    assert torch.equal(p.detach(), torch.ones(4))
    assert int(opt.skipped_steps) == 0 and int(opt.state[p]["step"]) == 0
    p.grad = torch.full((4,), 0.5)
    opt.step()  # finite: applied, not skipped by the failed step's flag
    assert int(opt.state[p]["step"]) == 1 and int(opt.skipped_steps) == 0
    assert bool((p.detach() < 1).all())
    p.grad = torch.tensor([float("inf"), 1.0, 1.0, 1.0])
    before = p.detach().clone()
    opt.step()
    assert torch.equal(p.detach(), before) and int(opt.skipped_steps) == 1
    assert all(int(f) == 0 for f in opt._flags.values())  # clear for the next step
    p.grad = torch.full((4,), 0.5)
    opt.step()
    assert int(opt.state[p]["step"]) == 2 and int(opt.skipped_steps) == 1


def test_an_lr_tensor_of_two_elements_set_between_steps_is_refused_before_any_change():
    p = torch.nn.Parameter(torch.ones(4))
    p.grad = torch.full((4,), 0.5)
    opt = LuminaMoon([p], backend="reference", lr=torch.tensor(1e-2))
    opt.step()
    before = p.detach().clone()
    opt.param_groups[0]["lr"] = torch.tensor([1e-2, 1e-2])
    with pytest.raises(ValueError, match=r"^Tensor lr must be 1-element; lr \(param group 0\) as "
                                         r"a tensor must have one floating-point element, got "
                                         r"shape \(2,\)"):
        opt.step()
    assert torch.equal(p.detach(), before) and int(opt.state[p]["step"]) == 1
    opt.param_groups[0]["lr"] = torch.tensor(1e-2)
    opt.step()
    assert int(opt.state[p]["step"]) == 2


@pytest.mark.parametrize("backend", ["reference", "cpu"])
def test_an_lr_tensor_of_one_element_in_any_shape_steps_as_the_float(backend):
    """torch.optim takes any one-element tensor as lr (torch.tensor([1e-3]) included)."""
    if backend == "cpu":
        require("native")
    results = []
    for lr in (1e-2, torch.tensor(1e-2), torch.tensor([1e-2]), torch.tensor([[1e-2]])):
        p = torch.nn.Parameter(torch.linspace(-1, 1, 37))
        opt = LuminaMoon([p], backend=backend, lr=lr, seed=3)
        for k in range(3):
            p.grad = torch.sin(torch.arange(37.0) + k)
            opt.step()
        results.append(p.detach().clone())
    for r in results[1:]:
        assert torch.equal(r, results[0])


# -------------------------------------------------------------------------------------------
# per-group seeds: like every constructor argument, the seed may be given per param group
# -------------------------------------------------------------------------------------------
SEED_A, SEED_B = 0x1234_5678_9ABC_DEF0, 77


def _bf16_model(gen):
    """Two bf16 tensors per group: stochastic rounding draws words from the group's seed."""
    return [torch.randn(61, 5, generator=gen).to(torch.bfloat16) for _ in range(4)]


def _run(opt, params, grads):
    for step_grads in grads:
        for p, g in zip(params, step_grads):
            if p is not None:
                p.grad = g.clone()
        opt.step()


@pytest.mark.parametrize("backend", CPU_BACKENDS)
def test_groups_with_their_own_seeds_step_as_single_group_optimizers(backend):
    gen = torch.Generator().manual_seed(33)
    inits = _bf16_model(gen)
    grads = [[torch.randn(61, 5, generator=gen).to(torch.bfloat16) for _ in inits]
             for _ in range(3)]
    params = [torch.nn.Parameter(t.clone()) for t in inits]
    opt = LuminaMoon([{"params": params[:2], "seed": SEED_A},
                      {"params": params[2:], "seed": SEED_B}], seed=5, backend=backend, **HYPER)
    assert [g["seed"] for g in opt.param_groups] == [SEED_A, SEED_B] and opt.seed == 5
    _run(opt, params, grads)
    assert len(opt._plan.groups) == 2  # one launch group per seed
    # each group as one single-group optimizer with its seed; the other group's tensors stay
    # in it without gradients, so every tensor keeps its index k in the rounding streams
    for seed, mine in ((SEED_A, (0, 1)), (SEED_B, (2, 3))):
        alone = [torch.nn.Parameter(t.clone()) for t in inits]
        single = LuminaMoon(alone, seed=seed, backend=backend, **HYPER)
        _run(single, [p if k in mine else None for k, p in enumerate(alone)], grads)
        for k in mine:
            assert_bitwise_equal(params[k].detach(), alone[k].detach(), f"param {k}")
    # the control: group B under group A's seed rounds otherwise
    alone = [torch.nn.Parameter(t.clone()) for t in inits]
    single = LuminaMoon(alone, seed=SEED_A, backend=backend, **HYPER)
    _run(single, [None, None] + alone[2:], grads)
    assert not torch.equal(params[2].detach(), alone[2].detach())


@pytest.mark.parametrize("backend", CPU_BACKENDS)
def test_each_groups_seed_survives_the_state_dict(backend):
    gen = torch.Generator().manual_seed(34)
    inits = _bf16_model(gen)
    grads = [[torch.randn(61, 5, generator=gen).to(torch.bfloat16) for _ in inits]
             for _ in range(4)]

    def make(seed, group_seeds):
        params = [torch.nn.Parameter(t.clone()) for t in inits]
        groups = [{"params": params[:2]}, {"params": params[2:]}]
        for g, s in zip(groups, group_seeds):
            if s is not None:
                g["seed"] = s
        return params, LuminaMoon(groups, seed=seed, backend=backend, **HYPER)

    params, opt = make(SEED_A, (None, SEED_B))  # group 0 takes the optimizer's seed
    _run(opt, params, grads[:2])
    saved = opt.state_dict()
    assert [g["seed"] for g in saved["param_groups"]] == [SEED_A, SEED_B]
    resumed_params, resumed = make(9, (None, None))
    with torch.no_grad():
        for p, q in zip(resumed_params, params):
            p.copy_(q)
    resumed.load_state_dict(saved)
    assert [g["seed"] for g in resumed.param_groups] == [SEED_A, SEED_B]
    assert resumed.seed == SEED_A  # the first group's: what a group added later takes
    _run(opt, params, grads[2:])
    _run(resumed, resumed_params, grads[2:])
    for k, (p, q) in enumerate(zip(params, resumed_params)):
        assert_bitwise_equal(q.detach(), p.detach(), f"param {k}")


def test_a_group_without_a_seed_takes_the_optimizers_and_a_changed_seed_replans():
    a, b = torch.nn.Parameter(torch.ones(3)), torch.nn.Parameter(torch.ones(3))
    opt = LuminaMoon([{"params": [a], "seed": None}], seed=12, backend="reference")
    opt.add_param_group({"params": [b]})
    assert [g["seed"] for g in opt.param_groups] == [12, 12]
    opt.add_param_group({"params": [torch.nn.Parameter(torch.ones(3))], "seed": 2**64 - 1})
    assert opt.param_groups[2]["seed"] == 2**64 - 1
    a.grad = torch.ones(3)
    opt.step()
    plan = opt._plan
    opt.param_groups[0]["seed"] = 13
    a.grad = torch.ones(3)
    opt.step()
    assert opt._plan is not plan and opt._plan.groups[0].seed == 13
