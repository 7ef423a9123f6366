"""Every rejected input, with its message; a refused step changes nothing."""
from __future__ import annotations

import re
import sys

import pytest
import torch

from conftest import needs
from luminamoon import LuminaMoon, tdclm
from luminamoon.optimizer.backends import BackendUnavailableError, get_backend

BAD_HYPERPARAMETERS = [
    # kwargs, exception, message (regex)
    (dict(lr=-1e-3), ValueError, r"lr must be >= 0, got -0\.001"),
    (dict(lr=float("nan")), ValueError, r"lr must be finite, got nan"),
    (dict(lr="0.1"), ValueError, r"lr must be a real number, got '0\.1'"),
    (dict(lr=torch.tensor([1e-3, 2e-3])), ValueError, r"lr as a tensor must have one floating-point element, got shape \(2,\)"),
    (dict(lr=torch.tensor(1)), ValueError, r"lr as a tensor must have one floating-point element.*torch\.int64"),
    (dict(betas=(1.0, 0.999)), ValueError, r"betas\[0\] must be in \[0, 1\), got 1\.0"),
    (dict(betas=(0.9, -0.1)), ValueError, r"betas\[1\] must be in \[0, 1\), got -0\.1"),
    (dict(betas=(0.9, 0.99999999999)), ValueError, r"betas\[1\] rounds to 1\.0 in float32"),
    (dict(betas=0.9), ValueError, r"betas must be a pair \(beta1, beta2\), got 0\.9"),
    (dict(eps=0.0), ValueError, r"eps must be > 0, got 0\.0"),
    (dict(eps=1e-50), ValueError, r"eps rounds to 0 in float32 \(got 1e-50\)"),
    (dict(weight_decay=-0.1), ValueError, r"weight_decay must be >= 0, got -0\.1"),
    (dict(clip=-1.0), ValueError, r"clip must be >= 0 \(0 turns soft clipping off\), got -1\.0"),
    (dict(clip=float("inf")), ValueError, r"clip must be finite, got inf"),
    (dict(bound_mode="relative"), ValueError, r"bound_mode must be one of \('none', 'abs', 'rel'\), got 'relative'"),
    (dict(bound_mode="rel", bound=0.0), ValueError, r"^bound must be > 0 when bound_mode='rel', got 0\.0$"),
    (dict(bound_mode="abs", bound=-2), ValueError, r"bound must be > 0 when bound_mode='abs', got -2\.0"),
    (dict(maximize="yes"), ValueError, r"maximize must be True or False, got 'yes'"),
    (dict(nonfinite="ignore"), ValueError, r"nonfinite must be one of \('skip', 'raise', 'propagate'\), got 'ignore'"),
    (dict(stochastic_rounding=1), ValueError, r"stochastic_rounding must be True or False, got 1"),
    (dict(state_dtype=torch.float16), ValueError, r"state_dtype must be torch\.float32, torch\.bfloat16 or 'q8' \(8-bit moments, docs/tdclm\.md\), got torch\.float16"),
    (dict(seed=-1), ValueError, r"seed must be None or an integer in \[0, 2\*\*64\), got -1"),
    (dict(seed=2**64), ValueError, r"seed must be None or an integer in \[0, 2\*\*64\), got 18446744073709551616"),
    (dict(seed=1.5), ValueError, r"seed must be None or an integer"),
    (dict(backend="cuda"), ValueError, r"backend must be one of \('auto', 'reference', 'triton', 'cpu', 'aot'\).*got 'cuda'"),
]
# backend="aot" without aot_bundle takes the default bundle: test_default_bundle.py


def _ids(cases):
    return [re.sub(r"[^a-z0-9=_.-]+", "", "-".join(f"{k}={v}" for k, v in c[0].items()).lower())[:40]
            for c in cases]


@pytest.mark.parametrize("kwargs,exc,message", BAD_HYPERPARAMETERS, ids=_ids(BAD_HYPERPARAMETERS))
def test_constructor_rejects(kwargs, exc, message):
    with pytest.raises(exc, match=message):
        LuminaMoon([torch.nn.Parameter(torch.ones(2))], **kwargs)


@pytest.mark.parametrize("kwargs,exc,message", BAD_HYPERPARAMETERS[:21], ids=_ids(BAD_HYPERPARAMETERS[:21]))
def test_add_param_group_rejects_naming_the_group(kwargs, exc, message):
    opt = LuminaMoon([torch.nn.Parameter(torch.ones(2))])
    name = message.split(" ")[0].lstrip("^")
    group_message = message.replace(name, name + r" \(param group 1\)", 1)
    with pytest.raises(exc, match=group_message):
        opt.add_param_group({"params": [torch.nn.Parameter(torch.ones(3))], **kwargs})
    assert len(opt.param_groups) == 1


def test_hyperparameter_edited_to_an_invalid_value_refuses_the_step():
    p = torch.nn.Parameter(torch.ones(3))
    opt = LuminaMoon([p], backend="reference")
    p.grad = torch.ones(3)
    opt.step()
    before = p.detach().clone()
    opt.param_groups[0]["eps"] = -1.0
    with pytest.raises(ValueError, match=r"eps \(param group 0\) must be > 0, got -1\.0"):
        opt.step()
    assert torch.equal(p.detach(), before) and int(opt.state[p]["step"]) == 1
    opt.param_groups[0]["eps"] = 1e-8
    opt.param_groups[0]["lr"] = -1.0
    with pytest.raises(ValueError, match=r"lr \(param group 0\) must be >= 0, got -1\.0"):
        opt.step()


@pytest.mark.parametrize("seed", [-1, 2**64, 1.5, True, "7"])
def test_a_groups_seed_outside_the_64_bit_range_is_refused(seed):
    opt = LuminaMoon([torch.nn.Parameter(torch.ones(2))], seed=5)
    with pytest.raises(ValueError, match=r"seed \(param group 1\) must be None or an integer "
                                         r"in \[0, 2\*\*64\), got "):
        opt.add_param_group({"params": [torch.nn.Parameter(torch.ones(2))], "seed": seed})
    assert len(opt.param_groups) == 1


def test_a_groups_seed_edited_to_an_invalid_value_refuses_the_step():
    p = torch.nn.Parameter(torch.ones(3))
    p.grad = torch.ones(3)
    opt = LuminaMoon([p], backend="reference")
    opt.param_groups[0]["seed"] = None
    with pytest.raises(ValueError, match=r"seed \(param group 0\) must be an integer in "
                                         r"\[0, 2\*\*64\), got None"):
        opt.step()
    assert torch.equal(p.detach(), torch.ones(3)) and len(opt.state) == 0


def test_non_floating_parameters_are_refused():
    with pytest.raises(ValueError, match=r"parameter 1 \(param group 0, index 1\) has dtype torch\.int64"):
        LuminaMoon([torch.nn.Parameter(torch.ones(2)), torch.zeros(2, dtype=torch.int64)])


def _torch_error(fn):
    """The exception torch.optim.AdamW raises for the same input: LuminaMoon raises the same."""
    try:
        fn(torch.optim.AdamW)
    except Exception as exc:  # noqa: BLE001
        return type(exc), str(exc)
    raise AssertionError("torch.optim.AdamW accepted it")


@pytest.mark.parametrize("make", [
    lambda cls: cls(torch.nn.Parameter(torch.ones(2))),  # a tensor instead of an iterable
    lambda cls: cls([]),  # nothing to optimize
    lambda cls: cls([torch.ones(2, requires_grad=True) * 2]),  # a non-leaf tensor
    lambda cls: cls([{"params": {torch.nn.Parameter(torch.ones(2))}}]),  # a set
    lambda cls: cls(["not a tensor"]),
], ids=["tensor", "empty", "non-leaf", "set", "not-a-tensor"])
def test_generic_errors_are_torchs_own(make):
    kind, message = _torch_error(make)
    with pytest.raises(kind) as info:
        make(LuminaMoon)
    assert str(info.value) == message


def _sparse_step(cls):
    emb = torch.nn.Embedding(4, 2, sparse=True)
    opt = cls(emb.parameters())
    emb(torch.tensor([1])).sum().backward()
    opt.step()


def _load_other_groups(cls):
    two = [{"params": [torch.nn.Parameter(torch.ones(2))]},
           {"params": [torch.nn.Parameter(torch.ones(2))]}]
    cls([torch.nn.Parameter(torch.ones(2))]).load_state_dict(cls(two).state_dict())


def _load_other_sizes(cls):
    saved = cls([torch.nn.Parameter(torch.ones(2)), torch.nn.Parameter(torch.ones(2))])
    cls([torch.nn.Parameter(torch.ones(2))]).load_state_dict(saved.state_dict())


def _named(*items):
    return [(f"w{i}", t) if named else t
            for i, (named, t) in enumerate((n, torch.nn.Parameter(torch.ones(2))) for n in items)]


def _ctor(**kwargs):
    return lambda cls: cls([torch.nn.Parameter(torch.ones(2))], **kwargs)


# Every input that torch.optim.AdamW (torch 2.13) refuses with a message of its own and that
# LuminaMoon refuses too: LuminaMoon's message holds torch's wording (then its value and fix),
# and its exception is of torch's type. Not here, because LuminaMoon takes the input: a tensor
# lr with foreach=True (LuminaMoon is capturable), fused with foreach, betas of mixed types;
# nor where torch's refusal is Python's own (lr="x": a failed comparison).
SHARED_WITH_TORCH = [
    ("lr-negative", _ctor(lr=-1)),
    ("lr-negative-tensor", _ctor(lr=torch.tensor(-0.5))),
    ("lr-nan", _ctor(lr=float("nan"))),
    ("lr-tensor-of-two", _ctor(lr=torch.tensor([1e-3, 1e-3]))),
    ("eps-negative", _ctor(eps=-1e-8)),
    ("eps-nan", _ctor(eps=float("nan"))),
    ("beta0-above-one", _ctor(betas=(1.5, 0.9))),
    ("beta0-negative", _ctor(betas=(-0.1, 0.9))),
    ("beta1-one", _ctor(betas=(0.9, 1.0))),
    ("beta1-nan", _ctor(betas=(0.9, float("nan")))),
    ("weight-decay-negative", _ctor(weight_decay=-1)),
    ("weight-decay-nan", _ctor(weight_decay=float("nan"))),
    ("fused-differentiable", _ctor(fused=True, differentiable=True)),
    ("sparse-gradient", _sparse_step),
    ("add-param-group-not-a-dict", lambda cls: cls(_named(False)).add_param_group([1])),
    ("names-on-some-params", lambda cls: cls(_named(True, False))),
    ("names-on-some-groups", lambda cls: cls([{"params": _named(True)}, {"params": _named(False)}])),
    ("load-other-group-count", _load_other_groups),
    ("load-other-group-size", _load_other_sizes),
]


@needs("torch 2.13 wording")
@pytest.mark.parametrize("make", [c[1] for c in SHARED_WITH_TORCH], ids=[c[0] for c in SHARED_WITH_TORCH])
def test_errors_shared_with_torch_carry_torchs_wording(make):
    kind, message = _torch_error(make)
    with pytest.raises(Exception) as info:
        make(LuminaMoon)
    assert isinstance(info.value, kind), f"{type(info.value).__name__}, torch raises {kind.__name__}"
    assert message in str(info.value)


def test_torchs_wording_comes_first_then_the_value_and_the_fix():
    with pytest.raises(ValueError) as info:
        LuminaMoon([torch.nn.Parameter(torch.ones(2))], lr=torch.tensor([1e-3, 1e-3]))
    assert str(info.value).startswith("Tensor lr must be 1-element; lr as a tensor must have "
                                      "one floating-point element, got shape (2,)")
    opt = LuminaMoon([torch.nn.Parameter(torch.ones(2))])
    with pytest.raises(ValueError, match=r"^Invalid beta parameter at index 1: 1\.0; betas\[1\] "
                                         r"\(param group 1\) must be in \[0, 1\), got 1\.0$"):
        opt.add_param_group({"params": [torch.nn.Parameter(torch.ones(2))], "betas": (0.9, 1.0)})


def test_a_parameter_in_two_groups_is_torchs_error():
    p = torch.nn.Parameter(torch.ones(2))
    kind, message = _torch_error(lambda cls: cls([{"params": [p]}, {"params": [p]}]))
    with pytest.raises(kind, match=message):
        LuminaMoon([{"params": [p]}, {"params": [p]}])


def test_the_same_tensor_twice_in_one_group_is_refused():
    p = torch.nn.Parameter(torch.ones(2))
    with pytest.raises(ValueError, match=r"param group 0 holds the same tensor more than once"):
        LuminaMoon([p, p])


def test_sparse_gradient_refused_before_any_change():
    emb = torch.nn.Embedding(10, 3, sparse=True)
    dense = torch.nn.Parameter(torch.ones(4))
    opt = LuminaMoon([dense, emb.weight], backend="reference")
    emb(torch.tensor([1, 2])).sum().backward()
    dense.grad = torch.ones(4)
    with pytest.raises(ValueError, match=r"parameter 1 \(param group 0, index 1\) has a sparse gradient.*SparseAdam"):
        opt.step()
    assert torch.equal(dense.detach(), torch.ones(4))
    assert len(opt.state) == 0  # no state created by a refused step


def test_explicit_backend_that_cannot_load(monkeypatch, clean_backend_cache):
    monkeypatch.setitem(sys.modules, "luminamoon.optimizer.backends.cpu", None)  # import fails
    with pytest.raises(BackendUnavailableError, match=r"backend 'cpu' is unavailable.*build the native module"):
        get_backend("cpu", "cpu")
    p = torch.nn.Parameter(torch.ones(2))
    p.grad = torch.ones(2)
    opt = LuminaMoon([p], backend="cpu")
    with pytest.raises(ImportError, match=r"backend 'cpu' is unavailable"):
        opt.step()
    assert torch.equal(p.detach(), torch.ones(2)) and len(opt.state) == 0
    # "auto" falls back to the reference backend.
    opt = LuminaMoon([p], backend="auto")
    opt.step()
    assert not torch.equal(p.detach(), torch.ones(2))
    assert opt._plan.backends[0].name == "reference"


def test_explicit_backend_that_cannot_step_a_group():
    from luminamoon.optimizer.backends.base import Backend
    from luminamoon.optimizer.backends.reference import ReferenceBackend

    class Fp32Only(ReferenceBackend):
        name = "fp32-only"

        def supports(self, group):
            return group.param_dtype == torch.float32

    a = torch.nn.Parameter(torch.ones(2))
    b = torch.nn.Parameter(torch.ones(2, dtype=torch.float16))
    a.grad, b.grad = torch.ones(2), torch.ones(2, dtype=torch.float16)
    opt = LuminaMoon([a, b], backend=Fp32Only())
    with pytest.raises(ValueError, match=r"backend 'fp32-only' cannot step 1 tensor\(s\) on cpu \(param torch\.float16.*parameter indices \[1\]"):
        opt.step()
    assert torch.equal(a.detach(), torch.ones(2)) and len(opt.state) == 0
    assert isinstance(Fp32Only(), Backend)


FUNCTIONAL_OK = dict(lr=1e-3, betas=(0.9, 0.999), eps=1e-8, weight_decay=0.0, clip=1.0,
                     bound_mode="none", bound=1.0, maximize=False, nonfinite="skip",
                     stochastic_rounding=True, seed=0)


def _lists(n=2, shape=(3,)):
    ps = [torch.ones(shape) for _ in range(n)]
    gs = [torch.ones(shape) for _ in range(n)]
    ms = [torch.zeros(shape) for _ in range(n)]
    vs = [torch.zeros(shape) for _ in range(n)]
    steps = [torch.zeros((), dtype=torch.int64) for _ in range(n)]
    return ps, gs, ms, vs, steps


FUNCTIONAL_BAD = [
    ("length", lambda L: (L[0], L[1][:1], L[2], L[3], None, L[4]), {}, r"grads has 1 entries but params has 2"),
    ("grad-shape", lambda L: (L[0], [torch.ones(3), torch.ones(4)], L[2], L[3], None, L[4]), {},
     r"params\[1\] has shape \(3,\) but its gradient has shape \(4,\)"),
    ("grad-int", lambda L: (L[0], [torch.ones(3), torch.ones(3, dtype=torch.int32)], L[2], L[3], None, L[4]), {},
     r"params\[1\] has a gradient of dtype torch\.int32"),
    ("moment-dtype", lambda L: (L[0], L[1], [torch.zeros(3), torch.zeros(3, dtype=torch.bfloat16)], L[3], None, L[4]), {},
     r"params\[1\]: state 'exp_avg' has dtype torch\.bfloat16, expected torch\.float32"),
    ("moment-fp16", lambda L: (L[0], L[1], [torch.zeros(3, dtype=torch.float16)] * 2, L[3], None, L[4]), {},
     r"state_dtype must be torch\.float32, torch\.bfloat16 or 'q8' \(8-bit moments, docs/tdclm\.md\), got torch\.float16"),
    ("step-dtype", lambda L: (L[0], L[1], L[2], L[3], None, [torch.zeros(()), L[4][1]]), {},
     r"steps\[0\] must be a 0-dim int64 tensor"),
    ("p-init-missing", lambda L: L[:4] + (None, L[4]), dict(bound_mode="abs"),
     r"p_inits must be given when bound_mode='abs'"),
    ("seed-none", lambda L: L[:4] + (None, L[4]), dict(seed=None), r"seed must be an integer in \[0, 2\*\*64\) for tdclm"),
    ("indices", lambda L: L[:4] + (None, L[4]), dict(param_indices=[0, 0]), r"param_indices must hold 2 distinct indices"),
    ("found-inf", lambda L: L[:4] + (None, L[4]), dict(found_inf=torch.zeros(())), r"found_inf must be a 0-dim int32 tensor"),
]


@pytest.mark.parametrize("make,extra,message", [c[1:] for c in FUNCTIONAL_BAD], ids=[c[0] for c in FUNCTIONAL_BAD])
def test_functional_rejects(make, extra, message):
    lists = _lists()
    args = make(lists)
    before = [p.clone() for p in lists[0]]
    with pytest.raises(ValueError, match=message):
        tdclm(*args, **{**FUNCTIONAL_OK, **extra})
    assert all(torch.equal(p, b) for p, b in zip(lists[0], before))
    assert all(int(s) == 0 for s in lists[4])


def test_functional_raise_names_the_list_position():
    ps, gs, ms, vs, steps = _lists(3)
    gs[2][1] = float("nan")
    with pytest.raises(FloatingPointError, match=r"params\[2\] \(param_indices 9\)"):
        tdclm(ps, gs, ms, vs, None, steps, **{**FUNCTIONAL_OK, "nonfinite": "raise"},
              param_indices=[4, 5, 9])
    assert all(int(s) == 0 for s in steps)


def test_functional_found_inf_and_skipped_outputs():
    ps, gs, ms, vs, steps = _lists(2)
    gs[0][0] = float("inf")
    found = torch.full((), 7, dtype=torch.int32)
    skipped = torch.zeros((), dtype=torch.int64)
    tdclm(ps, gs, ms, vs, None, steps, **FUNCTIONAL_OK, found_inf=found, skipped=skipped)
    assert int(found) == 1 and int(skipped) == 1 and all(int(s) == 0 for s in steps)
    gs[0][0] = 1.0
    tdclm(ps, gs, ms, vs, None, steps, **FUNCTIONAL_OK, found_inf=found, skipped=skipped)
    assert int(found) == 0 and int(skipped) == 1 and all(int(s) == 1 for s in steps)
