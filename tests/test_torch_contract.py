"""LuminaMoon as a drop-in torch.optim optimizer: what generic code does with any optimizer
(named parameters, copies, empty groups, implementation keywords, state dicts and their hooks,
torch.compile), on the backends that run on CPU (reference and cpu). Each test names the
contract it checks; each failed before LuminaMoon met it."""
from __future__ import annotations

import collections
import copy
import ctypes
import functools
import io
import operator
import os
import pickle
import signal
import warnings

import pytest
import torch

from conftest import CPU_BACKENDS, needs
from luminamoon import LuminaMoon
from luminamoon.optimizer.backends.base import Backend

BACKENDS = CPU_BACKENDS



def _model(hidden=7):
    """hidden=1024: the first weight (5120 elements) keeps q8 moments under state_dtype="q8",
    the second (3072) float32 ones."""
    torch.manual_seed(0)
    return torch.nn.Sequential(torch.nn.Linear(5, hidden), torch.nn.Tanh(),
                               torch.nn.Linear(hidden, 3))


STATES = [pytest.param(torch.float32, 7, id="fp32"), pytest.param("q8", 1024, id="q8")]


def _train(model, opt, steps=3, seed=1):
    gen = torch.Generator().manual_seed(seed)
    for _ in range(steps):
        x = torch.randn(4, 5, generator=gen)
        opt.zero_grad()
        model(x).pow(2).mean().backward()
        opt.step()


def _same_params(a, b):
    return all(torch.equal(x.detach(), y.detach()) for x, y in zip(a.parameters(), b.parameters()))


# ------------------------------------------------------------------------------------------
# named parameters
# ------------------------------------------------------------------------------------------
@pytest.mark.parametrize("backend", BACKENDS)
def test_named_parameters_step_as_the_plain_ones(backend):
    named, plain = _model(), _model()
    opt_n = LuminaMoon(named.named_parameters(), lr=1e-2, seed=5, backend=backend)
    opt_p = LuminaMoon(plain.parameters(), lr=1e-2, seed=5, backend=backend)
    _train(named, opt_n)
    _train(plain, opt_p)
    assert _same_params(named, plain)


@needs("named params")
def test_named_param_groups_carry_their_names_and_load_across_named_and_unnamed():
    model = _model()
    decay = [(n, p) for n, p in model.named_parameters() if n.endswith("weight")]
    no_decay = [(n, p) for n, p in model.named_parameters() if n.endswith("bias")]
    opt = LuminaMoon([{"params": decay}, {"params": no_decay, "weight_decay": 0.0}], seed=2)
    _train(model, opt, steps=1)
    sd = opt.state_dict()
    assert sd["param_groups"][0]["param_names"] == [n for n, _ in decay]
    # into an unnamed optimizer, and back, as torch.optim does
    plain = LuminaMoon([{"params": [p for _, p in decay]},
                        {"params": [p for _, p in no_decay], "weight_decay": 0.0}], seed=2)
    plain.load_state_dict(sd)
    assert plain.param_groups[0]["param_names"] == [n for n, _ in decay]
    named_again = LuminaMoon([{"params": decay}, {"params": no_decay, "weight_decay": 0.0}],
                             seed=2)
    named_again.load_state_dict(plain.state_dict())
    assert named_again.param_groups[1]["param_names"] == [n for n, _ in no_decay]


# ------------------------------------------------------------------------------------------
# copies
# ------------------------------------------------------------------------------------------
def _copy_deep(model_opt):
    return copy.deepcopy(model_opt)


def _copy_pickle(model_opt):
    return pickle.loads(pickle.dumps(model_opt))


def _copy_torch_save(model_opt):
    buf = io.BytesIO()
    torch.save(model_opt, buf)
    buf.seek(0)
    return torch.load(buf, weights_only=False)


@pytest.mark.parametrize("how", [_copy_deep, _copy_pickle, _copy_torch_save],
                         ids=["deepcopy", "pickle", "torch.save"])
@pytest.mark.parametrize("backend", BACKENDS)
def test_a_copied_optimizer_steps_exactly_as_the_original(backend, how):
    model = _model()
    opt = LuminaMoon(model.parameters(), lr=1e-2, clip=1.0, bound_mode="rel", bound=0.5,
                     seed=9, backend=backend)
    _train(model, opt, steps=2)
    model2, opt2 = how((model, opt))
    assert opt2.seed == opt.seed and int(opt2.skipped_steps) == int(opt.skipped_steps)
    _train(model, opt, steps=2, seed=3)
    _train(model2, opt2, steps=2, seed=3)
    assert _same_params(model, model2)
    for p, q in zip(model.parameters(), model2.parameters()):
        assert torch.equal(opt.state[p]["exp_avg"], opt2.state[q]["exp_avg"])
        assert int(opt.state[p]["step"]) == int(opt2.state[q]["step"]) == 4


# ------------------------------------------------------------------------------------------
# groups, keywords
# ------------------------------------------------------------------------------------------
@pytest.mark.parametrize("backend", BACKENDS)
def test_empty_param_groups_are_accepted(backend):
    model = _model()
    opt = LuminaMoon([{"params": []}, {"params": list(model.parameters())}], backend=backend)
    _train(model, opt, steps=2)
    assert all(int(opt.state[p]["step"]) == 2 for p in model.parameters())
    only_empty = LuminaMoon([{"params": []}])
    only_empty.step()  # nothing to do
    assert only_empty.skipped_steps.device.type == "cpu"


@pytest.mark.parametrize("kwargs", [dict(foreach=False), dict(foreach=True), dict(fused=True),
                                    dict(capturable=True), dict(capturable=False),
                                    dict(differentiable=False)],
                         ids=lambda k: ",".join(f"{a}={b}" for a, b in k.items()))
def test_torch_implementation_keywords_are_accepted(kwargs):
    model = _model()
    opt = LuminaMoon(model.parameters(), seed=1, **kwargs)
    ref_model = _model()
    ref = LuminaMoon(ref_model.parameters(), seed=1)
    _train(model, opt)
    _train(ref_model, ref)
    assert _same_params(model, ref_model)
    assert opt.defaults["fused"] is True and opt.defaults["capturable"] is True
    assert opt.defaults["differentiable"] is False


@pytest.mark.parametrize("kwargs, match", [
    (dict(differentiable=True), r"differentiable=True is not supported"),
    (dict(fused=False), r"fused=False is not supported"),
    (dict(foreach="yes"), r"foreach must be None, True or False"),
])
def test_unsupported_implementation_keywords_are_named(kwargs, match):
    with pytest.raises(ValueError, match=match):
        LuminaMoon(_model().parameters(), **kwargs)


# ------------------------------------------------------------------------------------------
# hyperparameters as the float32 the kernels use; edits between steps
# ------------------------------------------------------------------------------------------
@pytest.mark.parametrize("kwargs, match", [
    (dict(lr=1e39), r"lr must be finite in float32 \(\|x\| < 3.4e38\), got 1e\+39"),
    (dict(betas=(1 - 1e-12, 0.999)), r"betas\[0\] rounds to 1.0 in float32"),
    (dict(eps=1e-50), r"eps rounds to 0 in float32"),
    (dict(weight_decay=1e40), r"weight_decay must be finite in float32"),
])
def test_hyperparameters_are_checked_as_float32(kwargs, match):
    with pytest.raises(ValueError, match=match):
        LuminaMoon(_model().parameters(), **kwargs)


@pytest.mark.parametrize("edit, match", [
    (lambda g: g.__setitem__("lr", 1e39), r"lr \(param group 0\) must be finite in float32"),
    (lambda g: g.__setitem__("lr", -1.0), r"lr \(param group 0\) must be >= 0"),
    (lambda g: g.__setitem__("betas", 0.9), r"betas \(param group 0\) must be a pair"),
    (lambda g: g.pop("clip"), r"param group \(param group 0\) has no 'clip'"),
    (lambda g: g.__setitem__("eps", 1e-50), r"eps \(param group 0\) rounds to 0 in float32"),
    (lambda g: g.__setitem__("lr", torch.tensor(float("nan"))),
     r"lr \(param group 0\) must be finite, got nan"),
    (lambda g: g.__setitem__("lr", torch.tensor([float("inf")])),
     r"lr \(param group 0\) must be finite, got inf"),
    (lambda g: g.__setitem__("lr", torch.tensor(-1e-3)), r"lr \(param group 0\) must be >= 0"),
])
@pytest.mark.parametrize("backend", BACKENDS)
def test_edits_between_steps_get_the_constructors_messages_and_change_nothing(
        backend, edit, match):
    model = _model()
    opt = LuminaMoon(model.parameters(), backend=backend, seed=4)
    _train(model, opt, steps=1)
    before = [p.detach().clone() for p in model.parameters()]
    steps = [int(opt.state[p]["step"]) for p in model.parameters()]
    edit(opt.param_groups[0])
    for p in model.parameters():
        p.grad = torch.ones_like(p)
    with pytest.raises(ValueError, match=match):
        opt.step()
    assert all(torch.equal(a, b.detach()) for a, b in zip(before, model.parameters()))
    assert [int(opt.state[p]["step"]) for p in model.parameters()] == steps


# ------------------------------------------------------------------------------------------
# non-finite values that reach the kernels
# ------------------------------------------------------------------------------------------
def test_propagate_with_clip_carries_nan_on_every_cpu_backend():
    """nonfinite="propagate" does what AdamW does: a NaN gradient makes the tensor NaN, clip
    or not (tau is NaN then), on every backend alike."""
    out = {}
    for backend in BACKENDS:
        p = torch.nn.Parameter(torch.linspace(-1, 1, 50))
        opt = LuminaMoon([p], clip=1.0, nonfinite="propagate", backend=backend, seed=1)
        p.grad = torch.ones(50)
        p.grad[7] = float("nan")
        opt.step()
        out[backend] = p.detach().clone()
        assert bool(torch.isnan(out[backend]).all()), backend
    for backend in BACKENDS[1:]:
        assert torch.equal(torch.isnan(out[backend]), torch.isnan(out["reference"]))


# ------------------------------------------------------------------------------------------
# layouts: non-contiguous and channels_last parameters and gradients
# ------------------------------------------------------------------------------------------
def _conv_pair(memory_format, dtype):
    torch.manual_seed(3)
    conv = torch.nn.Conv2d(3, 8, 3).to(dtype=dtype)
    other = copy.deepcopy(conv)
    conv = conv.to(memory_format=memory_format)
    return conv, other


@pytest.mark.parametrize("dtype, sr", [(torch.float32, False), (torch.bfloat16, True),
                                       (torch.bfloat16, False)], ids=["fp32", "bf16-sr", "bf16-rne"])
@pytest.mark.parametrize("backend", BACKENDS + ["auto"])
def test_channels_last_parameters_step_as_contiguous_ones(backend, dtype, sr):
    cl, plain = _conv_pair(torch.channels_last, dtype)
    assert cl.weight.is_contiguous(memory_format=torch.channels_last) and not cl.weight.is_contiguous()
    kw = dict(lr=1e-2, seed=6, backend=backend, stochastic_rounding=sr, clip=0.0)
    opt_cl, opt_plain = LuminaMoon(cl.parameters(), **kw), LuminaMoon(plain.parameters(), **kw)
    gen = torch.Generator().manual_seed(0)
    for _ in range(3):
        x = torch.randn(2, 3, 9, 9, generator=gen).to(dtype)
        for model, opt in ((cl, opt_cl), (plain, opt_plain)):
            opt.zero_grad()
            model(x.to(memory_format=torch.channels_last) if model is cl else x).float().sum().backward()
            opt.step()
    assert cl.weight.is_contiguous(memory_format=torch.channels_last)  # layout kept
    # the same values: elementwise updates, the rounding keyed on logical indices
    assert torch.equal(cl.weight.detach().contiguous(), plain.weight.detach())
    assert torch.equal(cl.bias.detach(), plain.bias.detach())


@pytest.mark.parametrize("backend", BACKENDS + ["auto"])
def test_a_transposed_view_parameter_steps_as_its_contiguous_copy(backend):
    base = torch.randn(6, 9)
    p_view = torch.nn.Parameter(base.t())  # strides (1, 9): not contiguous
    p_plain = torch.nn.Parameter(base.t().contiguous())
    kw = dict(lr=1e-2, seed=8, backend=backend, clip=1.0, bound_mode="abs", bound=0.1)
    opts = [LuminaMoon([p_view], **kw), LuminaMoon([p_plain], **kw)]
    for k in range(3):
        g = torch.cos(torch.arange(54.0) + k).reshape(9, 6)
        p_view.grad = g.t().contiguous().t()  # a gradient in yet another layout
        p_plain.grad = g.clone()
        for opt in opts:
            opt.step()
    assert not p_view.is_contiguous()
    assert torch.equal(p_view.detach(), p_plain.detach())


@pytest.mark.parametrize("backend", BACKENDS)
def test_replacing_p_data_between_steps_is_detected_before_any_launch(backend):
    p = torch.nn.Parameter(torch.randn(4, 6))
    opt = LuminaMoon([p], backend=backend, seed=2)
    p.grad = torch.ones(4, 6)
    opt.step()
    p.data = p.data[:2]  # the same storage, another shape
    p.grad = torch.ones(2, 6)
    with pytest.raises(ValueError, match=r"state 'exp_avg' has shape \(4, 6\) but the parameter "
                                         r"has shape \(2, 6\)"):
        opt.step()
    assert int(opt.state[p]["step"]) == 1


# ------------------------------------------------------------------------------------------
# state dicts
# ------------------------------------------------------------------------------------------
def test_a_torch_adamw_state_dict_gets_a_clear_message_and_changes_nothing():
    model = _model()
    adamw = torch.optim.AdamW(model.parameters())
    _train(model, adamw, steps=1)
    opt = LuminaMoon(model.parameters(), seed=3)
    _train(model, opt, steps=1)
    before = copy.deepcopy(opt.state_dict())
    with pytest.raises(ValueError, match=r"saved by another optimizer \(torch.optim.AdamW\?\)"):
        opt.load_state_dict(adamw.state_dict())
    after = opt.state_dict()
    assert after["param_groups"] == before["param_groups"]
    for k in before["state"]:
        assert torch.equal(after["state"][k]["exp_avg"], before["state"][k]["exp_avg"])


@pytest.mark.parametrize("break_it, match", [
    (lambda sd: sd["param_groups"].append(dict(sd["param_groups"][0])),
     r"different number of parameter groups"),
    (lambda sd: sd["param_groups"][0]["params"].pop(), r"doesn't match the size"),
    (lambda sd: sd["param_groups"][0].__setitem__("betas", (1.5, 0.9)),
     r"betas\[0\] \(param group 0 of the loaded state dict\) must be in \[0, 1\)"),
    (lambda sd: sd["state"][0].__setitem__("step", torch.tensor(-1)), r"whole number >= 0, got -1"),
    (lambda sd: sd["state"][0].__setitem__("step", 2.5), r"whole number >= 0, got 2.5"),
    (lambda sd: sd["state"][1].__setitem__("exp_avg", torch.zeros(3)), r"has shape \(3,\)"),
    (lambda sd: sd["param_groups"][0].__setitem__("rounding_stream", 7), r"rounding_stream"),
    (lambda sd: sd["param_groups"][0].__setitem__("seed", -5),
     r"seed \(param group 0 of the loaded state dict\) must be None or an integer"),
    (lambda sd: sd["param_groups"][0].__setitem__("lr", "0.1"),
     r"lr \(param group 0 of the loaded state dict\) must be a real number, got '0.1'"),
    (lambda sd: sd["param_groups"][0].__setitem__("maximize", "yes"),
     r"maximize \(param group 0 of the loaded state dict\) must be True or False"),
    (lambda sd: sd["state"][1].__setitem__("exp_avg_sq", sd["state"][1]["exp_avg_sq"].int()),
     r"'exp_avg_sq' for .* has dtype torch.int32; it must be a floating point tensor"),
], ids=["groups", "sizes", "hyper", "negative-step", "fractional-step", "shape", "stream", "seed",
        "lr-type", "flag-type", "state-dtype"])
def test_load_state_dict_checks_everything_first_and_changes_nothing(break_it, match):
    model = _model()
    opt = LuminaMoon(model.parameters(), seed=3)
    _train(model, opt, steps=2)
    sd = copy.deepcopy(opt.state_dict())
    break_it(sd)
    before = copy.deepcopy(opt.state_dict())
    with pytest.raises(ValueError, match=match):
        opt.load_state_dict(sd)
    after = opt.state_dict()
    assert after["param_groups"] == before["param_groups"]
    for k, v in before["state"].items():
        for key, t in v.items():
            assert torch.equal(after["state"][k][key], t)


@pytest.mark.parametrize("backend", BACKENDS)
def test_a_state_dict_taken_before_the_first_step_loads_and_steps(backend):
    """What accelerate does to every optimizer it wraps: the state stays torch's
    defaultdict(dict), so parameters without saved state get theirs on the first step."""
    model = _model()
    opt = LuminaMoon(model.parameters(), seed=3, backend=backend)
    opt.load_state_dict(opt.state_dict())
    assert isinstance(opt.state, collections.defaultdict)
    _train(model, opt, steps=1)
    assert all(int(opt.state[p]["step"]) == 1 for p in model.parameters())


def test_a_plain_number_step_is_accepted_and_converted():
    model = _model()
    opt = LuminaMoon(model.parameters(), seed=3)
    _train(model, opt, steps=2)
    sd = opt.state_dict()
    for s in sd["state"].values():
        s["step"] = 2.0  # as torch.optim accepts
    opt.load_state_dict(sd)
    step = opt.state[next(model.parameters())]["step"]
    assert step.dtype == torch.int64 and int(step) == 2


def test_load_hooks_pre_changes_count_and_post_sees_the_final_state():
    model = _model()
    opt = LuminaMoon(model.parameters(), seed=3, lr=1e-3)
    _train(model, opt, steps=1)
    sd = opt.state_dict()
    seen = {}

    def pre(optimizer, state_dict):
        state_dict["param_groups"][0]["lr"] = 0.5
        return state_dict

    def post(optimizer):
        seen["lr"] = optimizer.param_groups[0]["lr"]
        seen["step"] = int(next(iter(optimizer.state.values()))["step"])

    opt.register_load_state_dict_pre_hook(pre)
    opt.register_load_state_dict_post_hook(post)
    opt.load_state_dict(sd)
    assert opt.param_groups[0]["lr"] == 0.5 and seen == {"lr": 0.5, "step": 1}


def test_a_state_dict_without_the_rounding_format_loads_with_a_warning():
    model = _model()
    opt = LuminaMoon(model.parameters(), seed=3)
    _train(model, opt, steps=1)
    sd = opt.state_dict()
    for g in sd["param_groups"]:
        del g["rounding_stream"]
    with pytest.warns(UserWarning, match=r"rounding bits\s+change from the next step"):
        opt.load_state_dict(sd)
    assert opt.param_groups[0]["rounding_stream"] == 2


def test_skipped_steps_survive_distributed_checkpoint_state_dicts():
    from torch.distributed.checkpoint.state_dict import (get_optimizer_state_dict,
                                                         set_optimizer_state_dict)

    model = _model()
    opt = LuminaMoon(model.parameters(), seed=3)
    _train(model, opt, steps=1)
    for p in model.parameters():
        p.grad = torch.full_like(p, float("nan"))
    opt.step()
    assert int(opt.skipped_steps) == 1
    sd = get_optimizer_state_dict(model, opt)
    model2 = _model()
    opt2 = LuminaMoon(model2.parameters(), seed=11)
    _train(model2, opt2, steps=1)
    set_optimizer_state_dict(model2, opt2, sd)
    assert int(opt2.skipped_steps) == 1 and opt2.seed == 3


# ------------------------------------------------------------------------------------------
# torch.compile
# ------------------------------------------------------------------------------------------
@pytest.mark.parametrize("state_dtype,hidden", STATES)
@pytest.mark.parametrize("backend", BACKENDS)
def test_a_compiled_training_step_that_calls_step_matches_eager(backend, state_dtype, hidden):
    results = []
    for compiled in (False, True):
        model = _model(hidden)
        opt = LuminaMoon(model.parameters(), lr=1e-2, seed=7, backend=backend,
                         state_dtype=state_dtype)

        def train_step(x):
            opt.zero_grad()
            loss = model(x).pow(2).mean()
            loss.backward()
            opt.step()
            return loss

        fn = torch.compile(train_step, backend="eager") if compiled else train_step
        gen = torch.Generator().manual_seed(0)
        for _ in range(3):
            fn(torch.randn(4, 5, generator=gen))
        results.append([p.detach().clone() for p in model.parameters()]
                       + [v for s in opt.state.values() for v in s.values()])
    assert all(torch.equal(a, b) for a, b in zip(*results))
    if state_dtype == "q8":
        assert opt.state[model[0].weight]["exp_avg"].dtype == torch.uint8


def test_compiling_the_step_itself_works_and_fullgraph_says_why_not():
    model = _model()
    opt = LuminaMoon(model.parameters(), seed=7)
    model(torch.ones(2, 5)).sum().backward()
    # (first: once a frame broke, dynamo skips it, and fullgraph can only say so)
    import inspect

    with_reason = "reason" in inspect.signature(torch.compiler.disable).parameters  # 2.6+
    with pytest.raises(Exception, match=r"LuminaMoon.step launches its own fused kernels"
                       if with_reason else r"disable"):
        torch.compile(lambda: opt.step(), backend="eager", fullgraph=True)()
    assert all(int(s["step"]) == 0 for s in opt.state.values())
    torch.compile(opt.step, backend="eager")()
    assert all(int(s["step"]) == 1 for s in opt.state.values())


# ------------------------------------------------------------------------------------------
# a step is whole for every tensor
# ------------------------------------------------------------------------------------------
@pytest.mark.parametrize("backend", BACKENDS)
def test_a_keyboard_interrupt_during_the_launches_waits_for_the_step_to_be_whole(
        backend, monkeypatch):
    from luminamoon.optimizer.backends import get_backend

    be = get_backend(backend, "cpu")
    real = type(be).pass2
    calls = []

    def interrupted(self, group, found_inf):
        calls.append(1)
        if len(calls) == 1:
            signal.raise_signal(signal.SIGINT)  # arrives between this pass 2 and its commit
        return real(self, group, found_inf)

    monkeypatch.setattr(type(be), "pass2", interrupted)
    # the step pass by pass, where the signal can arrive between two calls (the cpu backend's
    # usual step is one C++ call: the test below)
    monkeypatch.setattr(type(be), "step_groups", Backend.step_groups)
    # Python's own SIGINT handler, whatever this process inherited: a shell that starts a
    # command in the background has it ignore SIGINT, and raise_signal would then do nothing
    previous = signal.signal(signal.SIGINT, signal.default_int_handler)
    try:
        _interrupted_step_is_whole(backend, calls)
    finally:
        signal.signal(signal.SIGINT, previous)


@needs("native", "posix signals")
def test_a_keyboard_interrupt_during_the_cpu_backends_one_call_step_waits_for_its_end(
        monkeypatch):
    from luminamoon import _luminav
    from luminamoon.optimizer.backends import cpu

    real = _luminav.cpu_step
    libc = ctypes.CDLL(None)
    calls = []

    def signalled_step(*args):
        calls.append(1)
        if len(calls) > 1:
            return real(*args)
        # the signal is pending when the C++ step begins: libc's kill, then the step, two C
        # calls with no Python code between them, where the interrupt could be raised (os.kill
        # and signal.raise_signal raise it before they return)
        any(map(operator.call, [functools.partial(libc.kill, os.getpid(), signal.SIGINT),
                                functools.partial(real, *args)]))

    monkeypatch.setattr(cpu._luminav, "cpu_step", signalled_step)
    previous = signal.signal(signal.SIGINT, signal.default_int_handler)
    try:
        model = _model()
        opt = LuminaMoon([{"params": list(model[0].parameters())},
                          {"params": list(model[2].parameters()), "lr": 2e-3}], backend="cpu")
        model(torch.ones(2, 5)).sum().backward()
        before = [p.detach().clone() for p in model.parameters()]
        with pytest.raises(KeyboardInterrupt):
            opt.step()
        assert len(calls) == 1  # one call for both groups
        # every tensor took the whole step, moments and counter together
        assert [int(opt.state[p]["step"]) for p in model.parameters()] == [1, 1, 1, 1]
        assert all(not torch.equal(p.detach(), b) for p, b in zip(model.parameters(), before))
        assert all(bool(opt.state[p]["exp_avg"].ne(0).any()) for p in model.parameters())
        opt.step()
        assert [int(opt.state[p]["step"]) for p in model.parameters()] == [2, 2, 2, 2]
    finally:
        signal.signal(signal.SIGINT, previous)


def _interrupted_step_is_whole(backend, calls):
    model = _model()
    opt = LuminaMoon([{"params": list(model[0].parameters())},
                      {"params": list(model[2].parameters()), "lr": 2e-3}], backend=backend)
    model(torch.ones(2, 5)).sum().backward()
    with pytest.raises(KeyboardInterrupt):
        opt.step()
    # every tensor took the whole step (moments and counter together), none twice
    assert [int(opt.state[p]["step"]) for p in model.parameters()] == [1, 1, 1, 1]
    assert len(calls) == 2
    opt.step()
    assert [int(opt.state[p]["step"]) for p in model.parameters()] == [2, 2, 2, 2]


# ------------------------------------------------------------------------------------------
# torch.amp.GradScaler
# ------------------------------------------------------------------------------------------
class _UnscaleThenStep(LuminaMoon):
    """The path torch takes with an optimizer that does not take the scaler's tensors:
    scaler.unscale_, a host check of found_inf, then a plain step."""

    _step_supports_amp_scaling = False


def _scaled_training(cls, backend, poisoned, steps=4, state_dtype=torch.float32, hidden=7):
    model = _model(hidden)
    opt = cls(model.parameters(), lr=1e-2, seed=5, backend=backend, clip=1.0,
              state_dtype=state_dtype)
    scaler = torch.amp.GradScaler("cpu", init_scale=2.0 ** 10, growth_interval=2)
    gen = torch.Generator().manual_seed(0)
    for step in range(steps):
        x = torch.randn(4, 5, generator=gen)
        opt.zero_grad()
        scaler.scale(model(x).pow(2).mean()).backward()
        if step in poisoned:  # an overflow in the scaled gradients, as a too large scale gives
            next(model.parameters()).grad.view(-1)[3] = float("inf")
        scaler.step(opt)
        scaler.update()
    return model, opt, scaler


@pytest.mark.parametrize("state_dtype,hidden", STATES)
@pytest.mark.parametrize("poisoned", [(), (1,)], ids=["finite", "overflow"])
@pytest.mark.parametrize("backend", BACKENDS)
def test_grad_scaler_takes_the_scale_into_the_step_and_equals_unscale_then_step(
        backend, poisoned, state_dtype, hidden):
    ours, opt, scaler = _scaled_training(LuminaMoon, backend, poisoned, state_dtype=state_dtype,
                                         hidden=hidden)
    theirs, opt2, scaler2 = _scaled_training(_UnscaleThenStep, backend, poisoned,
                                             state_dtype=state_dtype, hidden=hidden)
    assert _same_params(ours, theirs)
    for s1, s2 in zip(opt.state.values(), opt2.state.values()):
        assert all(torch.equal(s1[key], s2[key]) for key in s1)
    assert scaler.get_scale() == scaler2.get_scale()
    steps = [int(s["step"]) for s in opt.state.values()]
    assert steps == [int(s["step"]) for s in opt2.state.values()] == [4 - len(poisoned)] * 4
    assert int(opt.skipped_steps) == len(poisoned)  # skipped on the device, counted


def test_the_eager_step_skips_the_disabling_wrapper_only_where_the_callback_query_is_safe():
    """The eager step asks torch for the eval-frame callback only where that call returns a new
    reference (torch 2.13 on): before, each call took a reference from the callback, which
    freed dynamo's callback inside a compiled region (a segmentation fault on torch 2.6 and
    2.7). Where the query is used, a thousand calls leave None's reference count as it was."""
    import sys

    from luminamoon.optimizer import optimizer as opt_module

    version = tuple(int(x) for x in torch.__version__.split(".")[:2])
    if version < (2, 13):
        assert opt_module._EAGER_CHECK is False
        return
    assert opt_module._EAGER_CHECK is (opt_module._IS_COMPILING is not None
                                      and opt_module._FRAME_CALLBACK is not None)
    if opt_module._EAGER_CHECK and sys.version_info < (3, 12):
        before = sys.getrefcount(None)
        for _ in range(1000):
            assert opt_module._FRAME_CALLBACK() is None
        assert sys.getrefcount(None) == before
