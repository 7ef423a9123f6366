"""Every variant of an AOT bundle runs, through ``LuminaMoon(backend="aot")``, and equals the
Triton JIT (``backend="triton"``) bitwise.

One bundle is built with exactly ``catalog.all_variants(DEFAULT_DTYPE_COMBOS)`` for this
GPU. Each update variant (``pass2`` / ``single_pass``) is mapped back to the optimizer
configuration that launches it (param/grad/state dtypes, stochastic rounding, bound mode,
clip on or off, nonfinite "skip" or "propagate"); the configuration then runs 3 steps on both
backends from identical inputs, and params, moments, step counters and skipped-step counts must
agree to the bit. A coverage test checks that these configurations launch, together, exactly the
variants the bundle holds (pass1, reduce and commit included), by the Python variant keys and by
the C++ engine's.

Markers ``gpu`` and ``native``: skipped without a CUDA device or the native module.
``LUMINAMOON_TEST_BUNDLE`` is used instead of a fresh build when its keys for this GPU are
exactly those variants.
"""
from __future__ import annotations

import os
from dataclasses import dataclass
from typing import Dict, List

import pytest
import torch

from conftest import (assert_bitwise_equal, bits, import_or_skip, launch_flags, require,
                      requires_triton, skip_because)

pytestmark = [pytest.mark.gpu, pytest.mark.native, requires_triton]

require("cuda", "compiled triton")
_luminav = import_or_skip("luminamoon._luminav", "native")

from luminamoon.optimizer import LuminaMoon  # noqa: E402
from luminamoon.kernels import catalog  # noqa: E402
from luminamoon.optimizer._groups import BOUND_MODES, DTYPE_CODES, Hyper  # noqa: E402
from luminamoon.optimizer._validation import make_hyper  # noqa: E402

COMBOS = list(catalog.DEFAULT_DTYPE_COMBOS)
SHAPES = ((1,), (3001,), (64, 65))
STEPS = 3
NAN_STEP = 1  # skip configurations: the second step's gradient holds a NaN
SEED = 0xC0FFEE_1234_5678

_DTYPE_OF_CODE = {code: dtype for dtype, code in DTYPE_CODES.items()}
_BOUND_OF_CODE = {code: name for name, code in BOUND_MODES.items()}
_DT_NAME = {torch.float32: "fp32", torch.bfloat16: "bf16", torch.float16: "fp16"}
_BOUND_SIZE = {"none": 1.0, "abs": 0.015, "rel": 0.02}


@dataclass(frozen=True)
class Config:
    """An optimizer configuration, made to launch one update variant (``source``)."""

    source: str  # key of the pass2 / single_pass variant it was made from
    param_dtype: torch.dtype
    grad_dtype: torch.dtype
    state_dtype: torch.dtype
    stochastic_rounding: bool
    bound_mode: str
    clip: float
    nonfinite: str

    @property
    def id(self) -> str:
        sr = self.source.split(".sr")[1][0]  # the normalised SR of the key
        return "-".join([f"p{_DT_NAME[self.param_dtype]}", f"g{_DT_NAME[self.grad_dtype]}",
                         f"s{_DT_NAME[self.state_dtype]}", f"sr{sr}", self.bound_mode,
                         "clip" if self.clip > 0 else "noclip", self.nonfinite])

    def options(self) -> dict:
        """LuminaMoon keyword arguments (besides backend and bundle)."""
        return dict(lr=3e-2, betas=(0.9, 0.999), eps=1e-8, weight_decay=0.1, clip=self.clip,
                    bound_mode=self.bound_mode, bound=_BOUND_SIZE[self.bound_mode],
                    # the sign -1 rides along on the "abs" configurations (a runtime scalar)
                    maximize=self.bound_mode == "abs", nonfinite=self.nonfinite,
                    stochastic_rounding=self.stochastic_rounding, state_dtype=self.state_dtype)

    def expected_variants(self) -> Dict[str, catalog.Variant]:
        """The variants a launch group of this configuration runs (as the optimizer plans it)."""
        opts = self.options()
        group = {k: opts[k] for k in ("lr", "betas", "eps", "weight_decay", "clip", "bound_mode",
                                      "bound", "maximize", "nonfinite", "stochastic_rounding")}
        return catalog.variants_for(self.param_dtype, self.grad_dtype, self.state_dtype,
                                    launch_flags(self.param_dtype, self.state_dtype,
                                                 make_hyper(group)))

    def engine_keys(self) -> Dict[str, str]:
        """The variant keys the C++ engine (the aot backend) launches for this configuration."""
        hyper = Hyper(beta1=0.9, beta2=0.999, eps=1e-8, weight_decay=0.0, clip=float(self.clip),
                      bound_mode=BOUND_MODES[self.bound_mode], bound=1.0, maximize=False,
                      nonfinite=self.nonfinite, stochastic_rounding=self.stochastic_rounding)
        return dict(_luminav.variant_keys(_luminav.GroupConfig(
            (DTYPE_CODES[self.param_dtype], DTYPE_CODES[self.grad_dtype],
             DTYPE_CODES[self.state_dtype]), hyper, 0)))


def config_for(v: catalog.Variant) -> Config:
    """The configuration that launches update variant ``v``, read from its constexprs."""
    assert v.kernel in ("pass2", "single_pass"), v.key()
    cx = v.constexpr_dict()
    p, g, s = (_DTYPE_OF_CODE[cx[n]] for n in ("P_DTYPE", "G_DTYPE", "S_DTYPE"))
    any_bf16 = torch.bfloat16 in (p, s)
    # SR is normalised to 0 without bf16 storage: ask for it there, the key must still say 0
    sr = bool(cx["SR"]) if any_bf16 else True
    use_clip = cx.get("USE_CLIP", 0)  # single_pass: no clip, no flag
    check = cx.get("CHECK_FLAG", 0)
    return Config(source=v.key(), param_dtype=p, grad_dtype=g, state_dtype=s,
                  stochastic_rounding=sr, bound_mode=_BOUND_OF_CODE[cx["BOUND_MODE"]],
                  clip=1.0 if use_clip else 0.0, nonfinite="skip" if check else "propagate")


ALL_VARIANTS = catalog.all_variants(COMBOS)
CONFIGS: List[Config] = [config_for(v) for v in ALL_VARIANTS
                         if v.kernel in ("pass2", "single_pass")]


# ------------------------------------------------------------------------------------------
# bundle
# ------------------------------------------------------------------------------------------
def _arch() -> int:
    major, minor = torch.cuda.get_device_capability()
    return major * 10 + minor


def _manifest_keys(bundle: str, arch: int) -> set:
    """Keys of the bundle's cubins that run on ``arch``."""
    from luminamoon.aot.manifest import read_manifest, runs_on

    return {e["key"] for e in read_manifest(bundle)["kernels"]
            if runs_on(e["target"]["arch"], arch)}


@pytest.fixture(scope="session")
def variants_bundle(tmp_path_factory) -> str:
    arch = _arch()
    wanted = {v.key() for v in ALL_VARIANTS}
    given = os.environ.get("LUMINAMOON_TEST_BUNDLE")
    if given:
        try:
            if _manifest_keys(given, arch) == wanted:
                return given
        except (ValueError, OSError):  # not a readable bundle: build one
            pass
    from luminamoon.aot.builder import build_bundle

    out = tmp_path_factory.mktemp("variants_bundle")
    build_bundle(out, archs=[arch], dtype_combos=COMBOS,
                 jobs=max(1, min(8, os.cpu_count() or 1)), progress=False)
    return str(out)


# ------------------------------------------------------------------------------------------
# runs
# ------------------------------------------------------------------------------------------
def _inputs(config: Config):
    """Initial params and the gradients of every step, identical for both backends."""
    gen = torch.Generator().manual_seed(2024)
    params = [torch.randn(s, generator=gen).to(config.param_dtype) for s in SHAPES]
    grads = []
    for step in range(STEPS):
        gs = [torch.randn(s, generator=gen).to(config.grad_dtype) for s in SHAPES]
        if config.nonfinite == "skip" and step == NAN_STEP:
            gs[1].view(-1)[1234] = float("nan")
        grads.append(gs)
    return params, grads


def _run(config: Config, backend: str, bundle=None) -> dict:
    init, grads = _inputs(config)
    params = [p.cuda().requires_grad_() for p in init]
    if config.grad_dtype != config.param_dtype:
        if not hasattr(params[0], "grad_dtype"):
            skip_because("grad dtype")
        for p in params:
            p.grad_dtype = None  # any gradient dtype: the grad_dtype of this configuration
    opt = LuminaMoon(params, seed=SEED, backend=backend, aot_bundle=bundle, **config.options())
    for step in range(STEPS):
        for p, g in zip(params, grads[step]):
            p.grad = g.cuda()
        opt.step()
    torch.cuda.synchronize()
    (group,) = opt._plan.groups  # one launch group: one device, one dtype combination
    out = {"params": [p.detach().cpu() for p in params], "init": init,
           "skipped_steps": int(opt.skipped_steps),
           "cache": group.cache}
    for key in ("exp_avg", "exp_avg_sq", "step"):
        out[key] = [opt.state[p][key].cpu() for p in params]
    return out


# ------------------------------------------------------------------------------------------
# tests
# ------------------------------------------------------------------------------------------
def test_configs_cover_every_bundled_variant(variants_bundle):
    arch = _arch()
    bundled = _manifest_keys(variants_bundle, arch)
    assert bundled == {v.key() for v in ALL_VARIANTS}, (
        f"the bundle differs from all_variants: missing "
        f"{sorted({v.key() for v in ALL_VARIANTS} - bundled)}, extra "
        f"{sorted(bundled - {v.key() for v in ALL_VARIANTS})}")
    launched = set()
    for config in CONFIGS:
        python_keys = {name: v.key() for name, v in config.expected_variants().items()}
        update = python_keys.get("pass2", python_keys.get("single_pass"))
        assert update == config.source, f"{config.id}: launches {update}, made from {config.source}"
        assert python_keys == config.engine_keys(), (
            f"{config.id}: the C++ engine launches {config.engine_keys()}, the JIT {python_keys}")
        launched |= set(python_keys.values())
    assert launched == bundled, (f"bundled but never launched: {sorted(bundled - launched)}; "
                                 f"launched but not bundled: {sorted(launched - bundled)}")


@pytest.mark.parametrize("config", CONFIGS, ids=lambda c: c.id)
def test_aot_variant_equals_triton_jit(config, variants_bundle):
    aot = _run(config, "aot", variants_bundle)
    jit = _run(config, "triton")

    # the triton backend ran exactly this configuration's variants
    expected = {name: v.key() for name, v in config.expected_variants().items()}
    ran = {name: v.key() for name, v in jit["cache"]["triton"].variants.items()}
    assert ran == expected, f"the triton backend launched {ran}, expected {expected}"
    assert "aot" in aot["cache"], "the aot backend did not step the group"

    # not vacuous: the largest tensor moved
    assert not torch.equal(bits(jit["params"][1]), bits(jit["init"][1])), "params never changed"
    skipped = 1 if config.nonfinite == "skip" else 0
    for run, name in ((aot, "aot"), (jit, "triton")):
        assert run["skipped_steps"] == skipped, f"{name}: skipped_steps {run['skipped_steps']}"
        assert [int(s) for s in run["step"]] == [STEPS - skipped] * len(SHAPES), (
            f"{name}: step counters {[int(s) for s in run['step']]}")
    for key in ("params", "exp_avg", "exp_avg_sq", "step"):
        for j, (a, b) in enumerate(zip(aot[key], jit[key])):
            assert_bitwise_equal(a, b, f"{config.id}: {key}[{j}] shape {tuple(SHAPES[j])}, "
                                       f"aot vs triton")
