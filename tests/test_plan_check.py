"""The step's plan check: a p.data swapped between steps for another tensor or view (another
shape, dtype, strides, offset or storage), or a gradient of another layout than the plan's, is
seen before any launch, with the fast check (torch's TensorGuards) and with its Python fallback;
an unchanged step keeps its plan."""
from __future__ import annotations

import pytest
import torch

from conftest import CPU_BACKENDS, needs, skip_because
from luminamoon import LuminaMoon
from luminamoon.optimizer import _plan as opt_module

BACKENDS = CPU_BACKENDS


_TORCH_PTRS_EQUAL = opt_module._PTRS_EQUAL  # torch's C++ pointer comparison (CUDA builds)


def _ptrs_equal_in_python(tensors, ptrs, indices):
    """The contract of torch._C._tensors_data_ptrs_at_indices_equal, for torch builds without
    it (CPU-only builds): the plan's use of the comparison is tested on every machine, torch's
    own where it exists."""
    return all(tensors[i].data_ptr() == ptrs[i] for i in indices)


@pytest.fixture(params=["guards", "python", "guards+ptrs"])
def check(request, monkeypatch):
    """Runs a test with the TensorGuards check, with the Python tuples, and with TensorGuards
    plus the addresses compared in one call (torch's C++ comparison where this torch has it,
    else the same contract in Python)."""
    if request.param == "python":
        monkeypatch.setattr(opt_module, "_TensorGuards", None)
        monkeypatch.setattr(opt_module, "_PTRS_EQUAL", None)
        return request.param
    if not opt_module._guards_work():
        skip_because("tensor guards")
    if request.param == "guards":
        monkeypatch.setattr(opt_module, "_PTRS_EQUAL", None)
    else:
        monkeypatch.setattr(opt_module, "_PTRS_EQUAL", _TORCH_PTRS_EQUAL or _ptrs_equal_in_python)
    return request.param


def _stepped(p, backend, **kw):
    opt = LuminaMoon([p], backend=backend, seed=2, **kw)
    p.grad = torch.ones_like(p)
    opt.step()
    return opt


def test_the_guard_probe_passes_on_this_torch():
    assert opt_module._guards_work() == (opt_module._TensorGuards is not None)


@pytest.mark.parametrize("backend", BACKENDS)
def test_an_unchanged_step_keeps_its_plan(backend, check):
    conv = torch.nn.Conv2d(3, 4, 3).to(memory_format=torch.channels_last)  # a flat layout
    strided = torch.nn.Parameter(torch.randn(6, 5).t())  # staged
    params = [conv.weight, conv.bias, strided, torch.nn.Parameter(torch.randn(7))]
    opt = LuminaMoon(params, backend=backend, seed=2)
    for p in params:
        p.grad = torch.ones_like(p)
    opt.step()
    plan = opt._plan
    layouts = plan.owner_layouts
    assert all((g.guards is not None) == (check != "python") for g in layouts)
    for _ in range(2):
        opt.step()
        assert opt._plan is plan


@pytest.mark.parametrize("backend", BACKENDS)
def test_a_reshaped_view_of_the_same_memory_is_seen(backend, check):
    p = torch.nn.Parameter(torch.randn(4, 6))
    opt = _stepped(p, backend)
    p.data = p.data.view(6, 4)  # same address, element count and contiguity
    p.grad = torch.ones(6, 4)
    with pytest.raises(ValueError, match=r"state 'exp_avg' has shape \(4, 6\) but the parameter "
                                         r"has shape \(6, 4\)"):
        opt.step()
    assert int(opt.state[p]["step"]) == 1


@pytest.mark.parametrize("backend", BACKENDS)
def test_a_view_as_another_dtype_of_the_same_size_is_seen(backend, check):
    p = torch.nn.Parameter(torch.randn(4, 6).to(torch.bfloat16))
    opt = _stepped(p, backend, stochastic_rounding=False)
    plan = opt._plan
    p.data = p.data.view(torch.float16)  # same address, shape and strides; the grad is kept
    assert p.grad.dtype == torch.bfloat16
    opt.step()
    assert opt._plan is not plan
    assert [g.param_dtype for g in opt._plan.groups] == [torch.float16]


@pytest.mark.parametrize("backend", BACKENDS)
def test_a_transposed_view_of_the_same_memory_is_seen(backend, check):
    p = torch.nn.Parameter(torch.randn(5, 5))
    opt = _stepped(p, backend)
    plan = opt._plan
    p.data = p.data.t()  # same address, shape and element count; other strides
    p.grad = torch.ones(5, 5)
    opt.step()
    assert opt._plan is not plan and opt._plan.groups[0].modes is not None


@pytest.mark.parametrize("backend", BACKENDS)
def test_another_offset_of_the_same_storage_is_seen(backend, check):
    base = torch.zeros(5, 6)
    p = torch.nn.Parameter(base[0:4])
    opt = _stepped(p, backend, weight_decay=0.0)
    first = base.clone()
    p.data = base[1:5]  # same shape and strides, one row further on
    opt.step()
    assert torch.equal(base[0], first[0])  # the old first row is left alone
    assert not torch.equal(base[4], first[4])  # the new last row is stepped


@pytest.mark.parametrize("backend", BACKENDS)
def test_another_storage_of_the_same_layout_is_seen(backend, check):
    p = torch.nn.Parameter(torch.zeros(4, 6))
    opt = _stepped(p, backend, weight_decay=0.0)
    old = p.data
    before = old.clone()
    p.data = torch.zeros(4, 6)
    opt.step()
    assert torch.equal(old, before)  # the replaced tensor is not written
    assert not torch.equal(p.detach(), torch.zeros(4, 6))


@pytest.mark.parametrize("backend", BACKENDS)
def test_a_gradient_of_another_layout_rebuilds_the_plan(backend, check):
    # the plan was made for a contiguous gradient; the next one is a transposed copy (as
    # torch's .grad setter allows: same shape, dtype and device)
    torch.manual_seed(0)
    p = torch.nn.Parameter(torch.randn(6, 5))
    twin = torch.nn.Parameter(p.detach().clone())
    opts = [_stepped(x, backend, lr=1e-2) for x in (p, twin)]
    plan = opts[0]._plan
    g = torch.randn(6, 5)
    strided = torch.empty(5, 6).t()
    strided.copy_(g)
    assert not strided.is_contiguous()
    p.grad, twin.grad = strided, g.clone()
    for opt in opts:
        opt.step()
    assert opts[0]._plan is not plan and opts[0]._plan.groups[0].modes is not None
    assert torch.equal(p, twin)
    assert torch.equal(opts[0].state[p]["exp_avg"], opts[1].state[twin]["exp_avg"])
    # and back to a contiguous gradient: the plan follows again
    plan = opts[0]._plan
    p.grad = g.clone()
    opts[0].step()
    assert opts[0]._plan is not plan


@pytest.mark.parametrize("backend", BACKENDS)
def test_a_gradient_whose_dtype_changed_under_it_is_seen(backend, check):
    # grad.data swapped for another dtype (the .grad setter would refuse it; .data does not)
    p = torch.nn.Parameter(torch.randn(4, 6))
    opt = _stepped(p, backend)
    plan = opt._plan
    p.grad.data = torch.ones(4, 6, dtype=torch.float64)
    try:
        opt.step()
    except (TypeError, ValueError) as exc:  # a backend that reads only its own dtype
        assert "float64" in str(exc)
        assert int(opt.state[p]["step"]) == 1
    else:  # the plan was rebuilt for the float64 gradient, not read as float32
        assert opt._plan is not plan
        assert int(opt.state[p]["step"]) == 2


@needs("native")
def test_vouched_gradients_are_not_checked_again_by_the_backend(check, monkeypatch):
    """New gradient tensors every step (zero_grad(set_to_none=True), then backward): the plan
    has checked their layout (test_a_gradient_of_another_layout_rebuilds_the_plan: one it cannot
    read rebuilds it), so the cpu backend only takes their addresses; the results are the
    reference's."""
    from luminamoon.optimizer.backends import _tables

    calls = []
    real = _tables._IS_CONTIGUOUS
    monkeypatch.setattr(_tables, "_IS_CONTIGUOUS", lambda t: calls.append(1) or real(t))
    params = [torch.nn.Parameter(torch.randn(n)) for n in (5, 300, 17)]
    twins = [torch.nn.Parameter(p.detach().clone()) for p in params]
    opt = LuminaMoon(params, backend="cpu", seed=4)
    ref = LuminaMoon(twins, backend="reference", seed=4)
    for step in range(3):
        for p, q in zip(params, twins):
            g = torch.randn_like(p)
            p.grad, q.grad = g.clone(), g.clone()  # new tensors at new addresses
        opt.step()
        ref.step()
    assert calls == []
    for p, q in zip(params, twins):
        torch.testing.assert_close(p, q)


@pytest.mark.parametrize("backend", BACKENDS)
def test_gradients_that_did_not_move_keep_the_last_steps_addresses(backend, check):
    """The same gradient tensors step after step (zero_grad(set_to_none=False)): with the
    one-call comparison the step takes the addresses it read before; a gradient that moved
    (a new tensor) or whose memory was swapped under the same tensor object is read again,
    and every step's result is the reference's."""
    torch.manual_seed(3)
    params = [torch.nn.Parameter(torch.randn(n)) for n in (5, 300, 17)]
    twins = [torch.nn.Parameter(p.detach().clone()) for p in params]
    opt = LuminaMoon(params, backend=backend, seed=4, lr=1e-2)
    ref = LuminaMoon(twins, backend="reference", seed=4, lr=1e-2)
    for p, q in zip(params, twins):
        p.grad = torch.randn_like(p)
        q.grad = p.grad.clone()
    taken = []
    for step in range(6):
        if step == 2:  # one gradient moves to a new tensor
            g = torch.randn_like(params[1])
            params[1].grad, twins[1].grad = g, g.clone()
        if step == 4:  # one gradient's memory swapped under the same tensor object
            g = torch.randn_like(params[2])
            params[2].grad.data, twins[2].grad = g, g.clone()
        opt.step()
        ref.step()
        taken.append(opt._plan.last_grad_ptrs[0])
        for p, q in zip(params, twins):
            assert torch.allclose(p, q, rtol=1e-6, atol=1e-7)
    if check == "guards+ptrs":
        assert taken[1] is not None and taken[2] is not taken[1] and taken[4] is not taken[3]
        assert taken[3] is taken[2] and taken[5] is taken[4]  # unchanged steps: no new record
        assert taken[5].ptrs == tuple(p.grad.data_ptr() for p in params)
    else:  # without the one-call comparison nothing is recorded: every address is read
        assert all(t is None for t in taken)


@pytest.mark.gpu
@needs("cuda", "triton")
def test_the_triton_backends_plan_check_on_cuda_sees_moves_and_swaps():
    """On CUDA (the triton backend, torch's C++ pointer comparison where this torch has it):
    gradients kept, a gradient moved to a new tensor, a gradient's memory swapped under the
    same object and a parameter's p.data swapped for another tensor of its layout; each step
    equals the reference backend's on CPU copies."""
    torch.manual_seed(5)
    params = [torch.nn.Parameter(torch.randn(n, device="cuda")) for n in (5, 3000, 17)]
    twins = [torch.nn.Parameter(p.detach().cpu()) for p in params]
    opt = LuminaMoon(params, backend="triton", seed=4, lr=1e-2, clip=1.0)
    ref = LuminaMoon(twins, backend="reference", seed=4, lr=1e-2, clip=1.0)
    for p, q in zip(params, twins):
        p.grad = torch.randn_like(p)
        q.grad = p.grad.cpu()
    for step in range(6):
        if step == 2:
            g = torch.randn_like(params[1])
            params[1].grad, twins[1].grad = g, g.cpu()
        if step == 3:
            g = torch.randn_like(params[2])
            params[2].grad.data, twins[2].grad = g, g.cpu()
        if step == 4:  # p.data swapped for another tensor of the same layout
            fresh = params[0].detach().clone()
            params[0].data = fresh
        opt.step()
        ref.step()
        for p, q in zip(params, twins):
            assert torch.allclose(p.cpu(), q, rtol=1e-5, atol=1e-6), f"step {step}"
    assert opt._plan.owner_ptrs[0].ptrs[0] == params[0].data_ptr()
