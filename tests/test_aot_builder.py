"""The ahead-of-time builder: Triton API layer, specialisation policy, bundles, CLI. No GPU.

Two kernel sources are exercised: a small private kernel (always) and LuminaMoon's own
kernels from ``luminamoon.kernels.catalog`` (one dtype combination, sm_80 and sm_90) where that module
provides ``KERNEL_SPECS`` / ``all_variants``.
"""
from __future__ import annotations

import inspect

import collections
import hashlib
import importlib
import json
import os
import re
from dataclasses import dataclass
from typing import Any

import pytest

from conftest import import_or_skip, needs, requires_compiled_triton, skip_because

triton = import_or_skip("triton")
import triton.language as tl  # noqa: E402

from luminamoon.aot import builder, cli, compat, manifest as mf  # noqa: E402
from luminamoon.aot.cubin import ELF_MAGIC, has_symbol, parse_cubin  # noqa: E402

pytestmark = [pytest.mark.triton, *requires_compiled_triton]
ARCHS = (80, 90)


# ---------------------------------------------------------------------------------------------
# A private kernel with the shape of LuminaMoon's: pointers, an i32 count, an i64 seed, a float
# ---------------------------------------------------------------------------------------------
@triton.jit(do_not_specialize=["n", "seed"])
def _aot_toy_kernel(x_ptr, y_ptr, n, seed: tl.int64, scale, BLOCK: tl.constexpr,
                    SR: tl.constexpr):
    pid = tl.program_id(0)
    offs = pid.to(tl.int64) * BLOCK + tl.arange(0, BLOCK)
    mask = offs < n
    x = tl.load(x_ptr + offs, mask=mask)
    if SR == 1:
        x = x * scale + (seed & 0xFF).to(tl.float32)
    tl.store(y_ptr + offs, x, mask=mask)


# An integer scalar the JIT would specialise (no do_not_specialize): the builder must refuse it.
@triton.jit
def _aot_specialised_int_kernel(x_ptr, n, BLOCK: tl.constexpr):
    offs = tl.arange(0, BLOCK)
    tl.store(x_ptr + offs, tl.zeros([BLOCK], tl.float32), mask=offs < n)


# A pointer the kernel opts out of alignment specialisation: the JIT leaves it unmarked.
# (do_not_specialize_on_alignment exists from Triton 3.1 on; older releases have no such opt-out.)
_HAS_ALIGNMENT_OPT_OUT = "do_not_specialize_on_alignment" in inspect.signature(triton.jit).parameters


def _aot_unaligned_kernel_body(x_ptr, y_ptr, n, BLOCK: tl.constexpr):
    offs = tl.arange(0, BLOCK)
    tl.store(y_ptr + offs, tl.load(x_ptr + offs, mask=offs < n), mask=offs < n)


if _HAS_ALIGNMENT_OPT_OUT:
    _aot_unaligned_kernel = triton.jit(do_not_specialize=["n"],
                                       do_not_specialize_on_alignment=["y_ptr"])(
        _aot_unaligned_kernel_body)
else:
    _aot_unaligned_kernel = None


@dataclass(frozen=True)
class ToySpec:
    name: str
    fn: Any
    args: tuple
    constexprs: tuple


@dataclass(frozen=True)
class ToyVariant:
    kernel: str
    constexprs: tuple
    num_warps: int
    num_stages: int

    def key(self) -> str:
        # the rule book derives a key from these (docs/bundle-format.md); the toy's constexpr
        # names are ones the key encodes (its SR switches the scale mode)
        return mf.derive_key(self.kernel, dict(self.constexprs), self.num_warps)


TOY_ARGS = (("x_ptr", "*fp32"), ("y_ptr", "*fp32"), ("n", "i32"), ("seed", "i64"),
            ("scale", "fp32"))
TOY_SPECS = {"pass1": ToySpec("pass1", _aot_toy_kernel, TOY_ARGS, ("BLOCK", "SR"))}
TOY_VARIANTS = [ToyVariant("pass1", (("BLOCK", 256), ("SR", m)), 4, 3) for m in (0, 1)]


def build_toy_bundle(out_dir, archs=ARCHS, jobs=1):
    """A small bundle of the private kernel (used by test_aot_manifest.py as well)."""
    return builder.build_bundle(out_dir, archs=archs, variants=TOY_VARIANTS, specs=TOY_SPECS,
                                jobs=jobs, progress=False)


GB = importlib.import_module("luminamoon.kernels.catalog")  # (imports wherever triton does)


# ---------------------------------------------------------------------------------------------
# Bundles built once per session: the toy kernel, and the real kernels for one dtype combo
# ---------------------------------------------------------------------------------------------
@pytest.fixture(scope="module")
def toy_bundle(tmp_path_factory):
    out = tmp_path_factory.mktemp("toy_bundle")
    return out, build_toy_bundle(out)


def _one_combo_variants():
    import torch

    combo = (torch.float32, torch.float32, torch.float32)
    return GB.all_variants([combo])


@pytest.fixture(scope="module")
def real_bundle(tmp_path_factory):
    out = tmp_path_factory.mktemp("real_bundle")
    man = builder.build_bundle(out, archs=ARCHS, variants=_one_combo_variants(),
                               jobs=max(1, min(2, os.cpu_count() or 1)), progress=False)
    return out, man


BUNDLES = [pytest.param("toy_bundle", id="toy"),
           pytest.param("real_bundle", id="luminamoon")]


def _specs_for(name):
    return TOY_SPECS if name == "toy_bundle" else GB.KERNEL_SPECS


def _variants_for(name):
    return TOY_VARIANTS if name == "toy_bundle" else _one_combo_variants()


# ---------------------------------------------------------------------------------------------
# The bundle
# ---------------------------------------------------------------------------------------------
FIELD_TYPES = {
    "key": str, "kernel": str, "name": str, "entry": str, "cubin": str, "sha256": str,
    "target": dict, "triton_version": str, "num_warps": int, "num_ctas": int, "num_stages": int,
    "shared_mem": int, "arg_names": list, "signature": list, "constexprs": dict,
    "num_params": int, "num_trailing_scratch_ptrs": int, "global_scratch_size": int,
    "global_scratch_align": int, "profile_scratch_size": int, "profile_scratch_align": int,
}


@pytest.mark.parametrize("bundle", BUNDLES)
def test_bundle_manifest_fields_present_and_typed(bundle, request):
    out, man = request.getfixturevalue(bundle)
    on_disk = json.loads((out / "manifest.json").read_text())
    assert on_disk == man
    assert on_disk["format"] == "luminamoon-aot-bundle"
    assert on_disk["format_version"] == 3
    from luminamoon.kernels.layout import TABLE_COLS
    assert on_disk["table_cols"] == TABLE_COLS
    assert on_disk["triton_version"] == triton.__version__
    assert isinstance(on_disk["created_by"], str) and on_disk["created_by"].startswith("luminamoon")
    variants = _variants_for(bundle)
    assert len(on_disk["kernels"]) == len(variants) * len(ARCHS)
    assert {(e["key"], e["target"]["arch"]) for e in on_disk["kernels"]} == \
        {(v.key(), a) for v in variants for a in ARCHS}
    for e in on_disk["kernels"]:
        assert set(e) == set(FIELD_TYPES), sorted(set(e) ^ set(FIELD_TYPES))
        for field, typ in FIELD_TYPES.items():
            assert isinstance(e[field], typ) and not isinstance(e[field], bool), (field, e[field])
        assert e["target"] == {"backend": "cuda", "arch": e["target"]["arch"], "warp_size": 32}
        assert re.fullmatch(r"[0-9a-f]{64}", e["sha256"])
        assert all(compat.is_type_word(w) for w in e["signature"])
        assert len(e["arg_names"]) == len(e["signature"])
        assert all(isinstance(v, int) for v in e["constexprs"].values())
        assert e["num_ctas"] == 1
    mf.validate_manifest(on_disk)


@pytest.mark.parametrize("bundle", BUNDLES)
def test_cubins_hashed_elf_and_carry_their_entry(bundle, request):
    out, man = request.getfixturevalue(bundle)
    for e in man["kernels"]:
        data = (out / e["cubin"]).read_bytes()
        assert data[:4] == ELF_MAGIC
        assert hashlib.sha256(data).hexdigest() == e["sha256"]
        assert has_symbol(data, e["entry"])
        info = parse_cubin(data)
        assert info.arch == e["target"]["arch"]
        # The cubin's own parameter list (what cuFuncGetParamInfo reports) is the manifest's.
        assert len(info.params[e["entry"]]) == e["num_params"]


@pytest.mark.parametrize("bundle", BUNDLES)
def test_trailing_scratch_read_from_ptx_and_agrees_with_version_table(bundle, request):
    out, man = request.getfixturevalue(bundle)
    specs = _specs_for(bundle)
    api = compat.detect_api()
    by_key = {v.key(): v for v in _variants_for(bundle)}
    expected = compat.expected_trailing_scratch_ptrs(triton.__version__)
    for e in man["kernels"]:
        plan = builder.plan_kernel(specs[e["kernel"]])
        src = compat.make_ast_source(plan.fn, plan.source_spec(e["constexprs"]), api)
        v = by_key[e["key"]]
        compiled = triton.compile(src, target=compat.gpu_target(e["target"]["arch"]),
                                  options=builder.compile_options(plan, v))
        params = compat.ptx_entry_params(compiled.asm["ptx"], e["entry"])
        assert len(params) - len(e["signature"]) == e["num_trailing_scratch_ptrs"]
        assert len(params) == e["num_params"]
        if expected is not None:
            assert e["num_trailing_scratch_ptrs"] == expected
        assert bytes(compiled.asm["cubin"]) == (out / e["cubin"]).read_bytes()


def _jit_compile(fn, args, constexprs, num_warps, num_stages, arch, extra_options=()):
    """Compile ``fn`` as its JIT launcher would for ``args`` (the launcher's own binder)."""
    jit = importlib.import_module("triton.runtime.jit")
    make_binder = getattr(jit, "create_function_from_signature", None)
    if make_binder is None or not hasattr(fn, "_pack_args"):
        skip_because("triton binder")
    from triton.compiler import ASTSource, make_backend

    target = compat.gpu_target(arch)
    backend = make_backend(target)
    binder = make_binder(fn.signature, fn.params, backend)
    kwargs = dict(constexprs, num_warps=num_warps, num_stages=num_stages, **dict(extra_options))
    knobs = getattr(triton, "knobs", None)
    if knobs is not None:  # what JITFunction.run adds before binding, where this Triton has it
        kwargs["debug"] = fn.debug or knobs.runtime.debug
        run_source = inspect.getsource(jit.JITFunction.run)
        if "instrumentation_mode" in run_source:  # 3.8+; absent from 3.5's knobs and run()
            kwargs["instrumentation_mode"] = knobs.compilation.instrumentation_mode
    bound, specialization, options = binder(*args, **kwargs)
    options, signature, jit_constexprs, attrs = fn._pack_args(backend, kwargs, bound,
                                                               specialization, options)
    return signature, triton.compile(ASTSource(fn, signature, jit_constexprs, attrs),
                                     target=target, options=options.__dict__)


_TORCH_OF = {"fp32": "float32", "fp16": "float16", "bf16": "bfloat16", "fp64": "float64",
             "i32": "int32", "i64": "int64", "i1": "bool", "u32": "int32", "u64": "int64"}


def _launch_args(runtime_args):
    """Arguments a launch could pass: 16-byte aligned tensors, and integer scalars equal to 1
    (the value the JIT would turn into a constant if it specialised them)."""
    import torch

    out = []
    for _, word in runtime_args:
        if word.startswith("*"):
            t = torch.zeros(64, dtype=getattr(torch, _TORCH_OF[word[1:]]))
            assert t.data_ptr() % 16 == 0
            out.append(t)
        elif word in compat.INT_TYPE_WORDS:
            out.append(1)
        else:
            out.append(1.0)
    return out


@pytest.mark.parametrize("bundle", BUNDLES)
def test_builder_cubin_is_the_jit_kernel(bundle, request):
    """The AOT cubin equals, byte for byte, what the JIT compiles for aligned pointers and
    integer scalars equal to 1; at least the PTX parameter counts agree."""
    out, man = request.getfixturevalue(bundle)
    specs = _specs_for(bundle)
    by_key = {v.key(): v for v in _variants_for(bundle)}
    seen = set()
    for e in man["kernels"]:
        if e["kernel"] in seen:  # one variant per kernel keeps this quick
            continue
        seen.add(e["kernel"])
        plan = builder.plan_kernel(specs[e["kernel"]])
        v = by_key[e["key"]]
        sig, compiled = _jit_compile(plan.fn, _launch_args(plan.runtime_args), e["constexprs"],
                                     v.num_warps, v.num_stages, e["target"]["arch"],
                                     plan.compile_options)
        jit_runtime = [n for n, t in sig.items() if t != "constexpr"]
        assert jit_runtime == e["arg_names"]
        assert [sig[n] for n in jit_runtime] == e["signature"]
        jit_params = compat.ptx_entry_params(compiled.asm["ptx"], compiled.metadata.name)
        assert len(jit_params) == e["num_params"]
        assert bytes(compiled.asm["cubin"]) == (out / e["cubin"]).read_bytes(), e["key"]


def test_full_default_variant_list_enumerates_and_plans():
    variants = GB.all_variants()
    assert len(variants) > 0
    keys = [v.key() for v in variants]
    assert len(set(keys)) == len(keys), [k for k, c in collections.Counter(keys).items() if c > 1]
    assert {v.kernel for v in variants} <= set(mf.KERNEL_NAMES)
    assert set(GB.KERNEL_SPECS) <= set(mf.KERNEL_NAMES)
    plans = {name: builder.plan_kernel(spec) for name, spec in GB.KERNEL_SPECS.items()}
    for v in variants:
        values = builder._variant_constexprs(plans[v.kernel], v)
        assert set(values) == set(plans[v.kernel].constexpr_names)
        assert builder.cubin_file_name(v.key(), 90).endswith(".sm90.cubin")
    for plan in plans.values():  # every pointer is marked, no scalar is
        pointers = tuple(a for a, t in plan.runtime_args if t.startswith("*"))
        assert plan.divisible_by_16 == pointers


# ---------------------------------------------------------------------------------------------
# The specialisation policy
# ---------------------------------------------------------------------------------------------
def test_plan_marks_every_aligned_pointer_and_no_scalar():
    plan = builder.plan_kernel(TOY_SPECS["pass1"])
    assert plan.divisible_by_16 == ("x_ptr", "y_ptr")
    assert plan.runtime_args == TOY_ARGS
    assert plan.arg_names == ("x_ptr", "y_ptr", "n", "seed", "scale", "BLOCK", "SR")


@needs("triton alignment opt-out")
def test_plan_leaves_a_pointer_unmarked_where_the_jit_does():
    spec = ToySpec("pass2", _aot_unaligned_kernel,
                   (("x_ptr", "*fp32"), ("y_ptr", "*fp32"), ("n", "i32")), ("BLOCK",))
    assert builder.plan_kernel(spec).divisible_by_16 == ("x_ptr",)


def test_plan_refuses_an_integer_the_jit_specialises():
    spec = ToySpec("commit", _aot_specialised_int_kernel, (("x_ptr", "*fp32"), ("n", "i32")),
                   ("BLOCK",))
    with pytest.raises(builder.BuildError, match=r"'n'.*do_not_specialize"):
        builder.plan_kernel(spec)


@pytest.mark.parametrize("args, constexprs, pattern", [
    pytest.param(TOY_ARGS[:-1], ("BLOCK", "SR"), r"'scale'.*missing from the spec",
                 id="missing-arg"),
    pytest.param((TOY_ARGS[1], TOY_ARGS[0]) + TOY_ARGS[2:], ("BLOCK", "SR"),
                 r"not in the kernel's declaration order", id="out-of-order"),
    pytest.param(TOY_ARGS[:3] + (("seed", "i32"),) + TOY_ARGS[4:], ("BLOCK", "SR"),
                 r"'seed' is annotated 'i64' but declared 'i32'", id="annotation-disagrees"),
    pytest.param(TOY_ARGS + (("BLOCK", "i32"),), ("SR",),
                 r"'BLOCK' is a tl.constexpr parameter", id="constexpr-as-runtime"),
    pytest.param(TOY_ARGS[:4] + (("scale", "f32"),), ("BLOCK", "SR"),
                 r"unknown type word 'f32'", id="bad-type-word"),
    pytest.param(TOY_ARGS, ("BLOCK", "SR", "EXTRA"), r"'EXTRA' is not a parameter",
                 id="unknown-constexpr"),
])
def test_plan_refuses_a_spec_that_disagrees_with_its_kernel(args, constexprs, pattern):
    with pytest.raises(builder.BuildError, match=pattern):
        builder.plan_kernel(ToySpec("pass1", _aot_toy_kernel, args, constexprs))


# ---------------------------------------------------------------------------------------------
# build_bundle: refusals, atomicity, parallel build
# ---------------------------------------------------------------------------------------------
@pytest.mark.parametrize("kwargs, pattern", [
    pytest.param({"archs": ("gfx1100",)}, r"arch 'gfx1100': not a compile target: 'gfx1100'; "
                 r"expected an NVIDIA compute capability.*gfx90a, gfx942, gfx950", id="arch-str"),
    pytest.param({"archs": (9,)}, r"arch 9: not a compile target", id="arch-small"),
    pytest.param({"archs": ()}, r"no arch given", id="no-arch"),
    pytest.param({"jobs": 0}, r"jobs must be an integer >= 1, got 0", id="jobs"),
    pytest.param({"variants": []}, r"no kernel variants", id="no-variants"),
    pytest.param({"variants": TOY_VARIANTS + TOY_VARIANTS[:1]}, r"share the key",
                 id="duplicate-key"),
    pytest.param({"variants": [ToyVariant("pass1", (("BLOCK", 256),), 4, 3)]},
                 r"missing \['SR'\]", id="missing-constexpr"),
    pytest.param({"variants": [ToyVariant("reduce", (("BLOCK", 256),), 4, 3)]},
                 r"no spec", id="unknown-kernel"),
])
def test_build_refuses_bad_requests_and_writes_nothing(tmp_path, kwargs, pattern):
    args = dict(archs=ARCHS, variants=TOY_VARIANTS, specs=TOY_SPECS, progress=False)
    args.update(kwargs)
    with pytest.raises(builder.BuildError, match=pattern):
        builder.build_bundle(tmp_path / "b", **args)
    assert not (tmp_path / "b").exists()


def test_compile_failure_names_variant_and_arch_and_leaves_no_manifest(tmp_path, toy_bundle):
    src, _ = toy_bundle
    out = tmp_path / "b"
    out.mkdir()
    (out / "manifest.json").write_bytes((src / "manifest.json").read_bytes())
    bad = ToyVariant("pass1", (("BLOCK", 100), ("SR", 0)), 4, 3)  # arange needs a power of 2
    with pytest.raises(builder.BuildError, match=r"pass1\.sr0\.B100\.w4 for sm_80 failed"):
        builder.build_bundle(out, archs=(80,), variants=[bad], specs=TOY_SPECS, progress=False)
    # the old manifest is gone before anything is replaced: no reader sees a mixed bundle
    assert not (out / "manifest.json").exists()
    assert not [p for p in os.listdir(out) if p.endswith(".tmp")]


def test_build_writes_no_temporary_files_and_parallel_build_is_identical(tmp_path, toy_bundle):
    _, serial = toy_bundle
    par = build_toy_bundle(tmp_path, jobs=2)
    assert sorted(os.listdir(tmp_path)) == sorted(["manifest.json"] +
                                                  [e["cubin"] for e in par["kernels"]])
    strip = lambda m: sorted((e["key"], e["target"]["arch"], e["sha256"]) for e in m["kernels"])
    assert strip(par) == strip(serial)


def test_build_replaces_an_existing_bundle(tmp_path):
    first = build_toy_bundle(tmp_path, archs=(80,))
    second = build_toy_bundle(tmp_path, archs=(90,))
    on_disk = json.loads((tmp_path / "manifest.json").read_text())
    assert on_disk == second
    assert {e["target"]["arch"] for e in on_disk["kernels"]} == {90}
    assert first != second


# ---------------------------------------------------------------------------------------------
# The Triton API layer
# ---------------------------------------------------------------------------------------------
def test_detected_api_is_the_installed_one():
    import inspect

    from triton.compiler import ASTSource

    api = compat.detect_api()
    params = inspect.signature(ASTSource.__init__).parameters
    m = re.match(r"(\d+)\.(\d+)", triton.__version__)
    version = (int(m.group(1)), int(m.group(2)))
    if version >= (3, 3):
        assert api == compat.API_CONSTEXPRS and "constexprs" in params
    elif version == (3, 2):
        assert api == compat.API_NAME_KEYED
    else:
        assert api == compat.API_INDEX_KEYED


class _FromHints:
    @classmethod
    def from_hints(cls, hints):  # pragma: no cover - only looked up
        return cls()


class _Plain:
    pass


@pytest.mark.parametrize("params, backends_attrs, compiler_attrs, expected", [
    (("self", "fn", "signature", "constexprs", "attrs"), None, None, compat.API_CONSTEXPRS),
    (("self", "fn", "signature", "constants", "attrs"), _FromHints, None, compat.API_NAME_KEYED),
    (("self", "fn", "signature", "constants", "attrs"), None, _Plain, compat.API_INDEX_KEYED),
    (("self", "fn", "signature", "constants", "attrs"), _Plain, _Plain, compat.API_INDEX_KEYED),
], ids=["3.3+", "3.2", "3.0-3.1", "3.0-3.1-no-from_hints"])
def test_classify_api(params, backends_attrs, compiler_attrs, expected):
    assert compat.classify_api(params, backends_attrs, compiler_attrs) == expected


def test_classify_api_refuses_an_unknown_triton():
    with pytest.raises(compat.TritonCompatError, match=r"Triton 3.0 through 3.9"):
        compat.classify_api(("self", "fn", "signature"), None, None)


SPEC = compat.SourceSpec(
    arg_names=("table", "BLOCK", "seed", "out", "SR"),
    types={"table": "*i64", "seed": "i64", "out": "*fp32"},
    constexprs={"SR": 1, "BLOCK": 1024},
    divisible_by_16=("out", "table"))


def test_source_arguments_index_keyed():  # Triton 3.0, 3.1
    kw = compat.ast_source_arguments(compat.API_INDEX_KEYED, SPEC)
    assert kw == {"signature": {0: "*i64", 2: "i64", 3: "*fp32"},
                  "constants": {1: 1024, 4: 1},
                  "attrs": {"divisible_by_16": [0, 3], "equal_to_1": []}}


def test_source_arguments_name_keyed():  # Triton 3.2
    kw = compat.ast_source_arguments(compat.API_NAME_KEYED, SPEC)
    assert kw == {"signature": {"table": "*i64", "seed": "i64", "out": "*fp32"},
                  "constants": {"BLOCK": 1024, "SR": 1},
                  "attrs": {"hints": {0: 16, 3: 16}}}


def test_source_arguments_constexprs():  # Triton 3.3+
    kw = compat.ast_source_arguments(compat.API_CONSTEXPRS, SPEC)
    assert kw == {"signature": {"table": "*i64", "BLOCK": "constexpr", "seed": "i64",
                                "out": "*fp32", "SR": "constexpr"},
                  "constexprs": {"BLOCK": 1024, "SR": 1},
                  "attrs": {(0,): [["tt.divisibility", 16]], (3,): [["tt.divisibility", 16]]}}
    assert list(kw["signature"]) == list(SPEC.arg_names)


def test_source_spec_refuses_incoherent_specs():
    with pytest.raises(ValueError, match=r"missing \['b'\]"):
        compat.SourceSpec(("a", "b"), {"a": "i32"}, {})
    with pytest.raises(ValueError, match=r"both runtime and constexpr"):
        compat.SourceSpec(("a",), {"a": "i32"}, {"a": 1})
    with pytest.raises(ValueError, match=r"not a runtime argument"):
        compat.SourceSpec(("a", "B"), {"a": "*i32"}, {"B": 1}, divisible_by_16=("B",))
    with pytest.raises(ValueError, match=r"unknown Triton API generation"):
        compat.ast_source_arguments("3.1", SPEC)


@pytest.mark.parametrize("version, expected", [
    ("3.0.0", 0), ("3.1.0", 0), ("3.2.0", 0), ("3.3.1", 1), ("3.4.0", 1), ("3.5.0", 2),
    ("3.6.0", 2), ("3.8.0", 2), ("3.9.0+git1234", 2), ("2.3.1", None), ("nightly", None),
])
def test_trailing_scratch_version_table(version, expected):
    assert compat.expected_trailing_scratch_ptrs(version) == expected


PTX = """
.version 8.4
.target sm_90a
.visible .entry k(
\t.param .u64 .ptr .global .align 1 k_param_0,
\t.param .u32 k_param_1,
\t.param .u64 .ptr .global .align 1 k_param_2,
\t.param .u64 .ptr .global .align 1 k_param_3
)
.reqntid 128
{ ret; }
"""


def test_trailing_scratch_count_from_ptx():
    assert compat.ptx_entry_params(PTX, "k") == ["u64", "u32", "u64", "u64"]
    assert compat.trailing_scratch_ptrs(PTX, "k", 2, "3.6.0") == 2
    assert compat.trailing_scratch_ptrs(PTX, "k", 3, "3.4.0") == 1


def test_trailing_scratch_disagreement_names_both_numbers():
    with pytest.raises(compat.TritonCompatError, match=r"has 2 trailing.*known to append 0"):
        compat.trailing_scratch_ptrs(PTX, "k", 2, "3.2.0")
    with pytest.raises(compat.TritonCompatError, match=r"fewer than its 5 runtime"):
        compat.trailing_scratch_ptrs(PTX, "k", 5, "3.6.0")
    with pytest.raises(compat.TritonCompatError, match=r"'other' not found"):
        compat.ptx_entry_params(PTX, "other")


def test_metadata_fields_absent_on_old_triton_read_as_zero_and_one():
    Old = collections.namedtuple("KernelMetadata", "name shared num_warps num_ctas num_stages")
    md = compat.kernel_metadata(type("C", (), {"metadata": Old("k", 128, 4, 1, 3)})())
    assert md == {"entry": "k", "shared_mem": 128, "num_warps": 4, "num_ctas": 1,
                  "num_stages": 3, "global_scratch_size": 0, "global_scratch_align": 1,
                  "profile_scratch_size": 0, "profile_scratch_align": 1}


# ---------------------------------------------------------------------------------------------
# Command line
# ---------------------------------------------------------------------------------------------
def test_cli_inspect_prints_an_aligned_table(toy_bundle, capsys):
    out, man = toy_bundle
    assert cli.main(["inspect", str(out)]) == 0
    lines = capsys.readouterr().out.splitlines()
    from luminamoon.kernels.layout import TABLE_COLS
    assert f"v3 ({TABLE_COLS}-column tables)" in lines[0]
    header = lines[1]
    assert header.split() == ["key", "kernel", "arch", "warps", "shared", "trailing", "scratch",
                              "file", "bytes"]
    rows = lines[2:]
    assert len(rows) == len(man["kernels"])
    # right-aligned numeric columns end at the same offset as their header
    end = header.index("bytes") + len("bytes")
    for row, e in zip(rows, man["kernels"]):
        assert row.startswith(e["key"])
        assert row[:end].endswith(str((out / e["cubin"]).stat().st_size))
        assert row.split()[-2] == "cubin"
        assert f"sm_{e['target']['arch']}" in row


def test_cli_verify_ok_and_failure(toy_bundle, tmp_path, capsys):
    out, man = toy_bundle
    assert cli.main(["verify", str(out)]) == 0
    assert "OK" in capsys.readouterr().out
    bad = tmp_path / "bad"
    bad.mkdir()
    for p in out.iterdir():
        (bad / p.name).write_bytes(p.read_bytes())
    victim = bad / man["kernels"][0]["cubin"]
    victim.write_bytes(victim.read_bytes()[:-40])
    assert cli.main(["verify", str(bad)]) == 1
    err = capsys.readouterr().err
    assert "[truncated]" in err and man["kernels"][0]["cubin"] in err


def test_cli_usage_and_argument_errors(capsys, tmp_path):
    assert cli.main([]) == 2
    assert cli.main(["--help"]) == 0
    assert cli.main(["frobnicate"]) == 2
    assert "unknown command 'frobnicate'" in capsys.readouterr().err
    assert cli.main(["build"]) == 2  # --out is required
    assert cli.main(["build", "--out", str(tmp_path), "--arch", "ampere"]) == 1
    err = capsys.readouterr().err
    assert "--arch takes comma-separated archs" in err and "'ampere'" in err
    assert cli.main(["build", "--out", str(tmp_path), "--dtypes", "fp32:fp8:fp32"]) == 1
    assert "unknown dtype 'fp8'" in capsys.readouterr().err
    assert cli.main(["inspect", str(tmp_path / "nothing")]) == 1
    assert "no such file" in capsys.readouterr().err


def test_cli_parsers():
    import torch

    assert cli.parse_archs("80,90") == (compat.Target("cuda", 80), compat.Target("cuda", 90))
    assert cli.parse_archs("sm_80, sm90") == cli.parse_archs("cuda:80,90")
    assert cli.parse_archs("gfx942") == (compat.Target("hip", "gfx942"),)
    assert cli.parse_dtype_combos(["fp32:fp32:fp32,bf16:bf16:fp32", "fp16:fp16:fp16"]) == [
        (torch.float32,) * 3, (torch.bfloat16, torch.bfloat16, torch.float32),
        (torch.float16,) * 3]
    with pytest.raises(ValueError, match=r"param:grad:state"):
        cli.parse_dtype_combos(["fp32:fp32"])


def test_cli_build_real_kernels_one_combo(tmp_path, capsys):
    out = tmp_path / "bundle"
    rc = cli.main(["build", "--arch", "90", "--out", str(out), "--dtypes", "fp32:fp32:fp32",
                   "--jobs", "2", "--quiet"])
    assert rc == 0, capsys.readouterr().err
    man = json.loads((out / "manifest.json").read_text())
    assert len(man["kernels"]) == len(_one_combo_variants())
    assert cli.main(["verify", str(out)]) == 0


def test_parallel_build_workers_are_fresh_processes_that_find_the_kernels(tmp_path):
    """A process that has compiled a kernel holds LLVM's threads: a forked worker of it hangs or
    dies on Triton 3.0/3.1. Workers are fresh interpreters (``python -m
    luminamoon.aot._worker``) that import each kernel by name, from a script without a main
    guard too."""
    assert builder._fn_ref(_aot_toy_kernel) == (_aot_toy_kernel.fn.__module__, "_aot_toy_kernel")

    @triton.jit
    def local_kernel(x_ptr):  # defined in a function: no worker can import it
        tl.store(x_ptr, 0.0)

    assert builder._fn_ref(local_kernel) is None
    # a script that compiles in-process first, then builds with two workers, unguarded
    import subprocess
    import sys

    script = tmp_path / "unguarded.py"
    script.write_text(
        "import torch\n"
        "from luminamoon.aot import builder\n"
        "from luminamoon.kernels import catalog\n"
        "vs = catalog.all_variants([(torch.float32, torch.float32, torch.float32)])[:3]\n"
        f"builder.build_bundle({str(tmp_path / 'a')!r}, archs=(90,), variants=vs, jobs=1,"
        " progress=False)\n"
        f"m = builder.build_bundle({str(tmp_path / 'b')!r}, archs=(90,), variants=vs, jobs=2,"
        " progress=False)\n"
        "print(len(m['kernels']))\n")
    out = subprocess.run([sys.executable, str(script)], capture_output=True, text=True,
                         timeout=600)
    assert out.returncode == 0, out.stderr[-3000:]
    assert out.stdout.strip().splitlines()[-1] == "3"
    a = json.loads((tmp_path / "a" / "manifest.json").read_text())
    b = json.loads((tmp_path / "b" / "manifest.json").read_text())
    assert [e["sha256"] for e in a["kernels"]] == [e["sha256"] for e in b["kernels"]]
