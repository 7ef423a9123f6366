"""The source of the Triton kernels, and the code it compiles to.

1. No @triton.jit function anywhere in the package names a ``torch.`` symbol (the kernels must
   compile where only Triton is present, and ahead of time). Found through the AST of every
   module under python/luminamoon, without importing them.
2. Every integer scalar of every kernel is typed and kept out of the JIT's specialisation, so a
   JIT build and an ahead-of-time build of a variant are the same code.
3. The element loads and stores of the passes are 16-byte vector accesses: compiled for sm_90
   without a GPU (the same triton.compile call the AOT builder makes), checked in the PTX.
"""
from __future__ import annotations

import ast
import os
import re
from collections import Counter
from typing import Dict, Iterator, List, Tuple

import pytest

from conftest import requires_triton, triton_available

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
PACKAGE = os.path.join(ROOT, "python", "luminamoon")
GPU_BACKEND = os.path.join(PACKAGE, "optimizer", "gpu_backend.py")


# ------------------------------------------------------------------------------------------
# 1. no torch inside @triton.jit
# ------------------------------------------------------------------------------------------
def _is_triton_jit(dec: ast.expr) -> bool:
    """@triton.jit, @triton.jit(...), @jit, @jit(...), @tl.jit-like attribute chains ending in
    ``jit``."""
    target = dec.func if isinstance(dec, ast.Call) else dec
    if isinstance(target, ast.Attribute):
        return target.attr == "jit"
    return isinstance(target, ast.Name) and target.id == "jit"


def jit_functions(source: str, filename: str = "<source>") -> Iterator[ast.FunctionDef]:
    for node in ast.walk(ast.parse(source, filename)):
        if isinstance(node, ast.FunctionDef) and any(map(_is_triton_jit, node.decorator_list)):
            yield node


def torch_uses(fn: ast.FunctionDef, torch_names=("torch",)) -> List[Tuple[int, str]]:
    """(line, text) of every use of a name bound to torch inside ``fn``'s body and signature."""
    found = []
    body = list(fn.body) + list(fn.args.args) + list(fn.args.kwonlyargs)
    for part in body:
        for node in ast.walk(part):
            if isinstance(node, ast.Name) and node.id in torch_names:
                found.append((node.lineno, node.id))
            elif isinstance(node, ast.Attribute):
                root = node
                while isinstance(root, ast.Attribute):
                    root = root.value
                if isinstance(root, ast.Name) and root.id in torch_names:
                    found.append((node.lineno, ast.unparse(node)))
    return found


def _torch_aliases(tree: ast.Module) -> Tuple[str, ...]:
    """Names a module binds to torch or to something from it (import torch as T, from torch
    import float32 ...)."""
    names = {"torch"}
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            for a in node.names:
                if a.name == "torch" or a.name.startswith("torch."):
                    names.add((a.asname or a.name).split(".")[0])
        elif isinstance(node, ast.ImportFrom) and node.module and (
                node.module == "torch" or node.module.startswith("torch.")):
            for a in node.names:
                names.add(a.asname or a.name)
    return tuple(sorted(names))


def package_modules() -> List[str]:
    out = []
    for dirpath, _dirs, files in os.walk(PACKAGE):
        out.extend(os.path.join(dirpath, f) for f in files if f.endswith(".py"))
    return sorted(out)


def test_the_walk_sees_the_kernels():
    names = {fn.name for fn in jit_functions(open(GPU_BACKEND).read(), GPU_BACKEND)}
    for kernel in ("_lumina_tdclm_pass1_kernel", "_lumina_tdclm_reduce_kernel",
                   "_lumina_tdclm_pass2_kernel", "_lumina_adamw_single_pass_kernel",
                   "_lumina_tdclm_commit_kernel", "_moment_update", "_triton_tanh_fast"):
        assert kernel in names


def test_the_check_catches_torch_inside_a_kernel():
    src = (
        "import torch as T\nfrom torch import float32\nimport triton\n"
        "@triton.jit(do_not_specialize=['n'])\n"
        "def k(x, n):\n    y = T.zeros(3)\n    return x.to(float32)\n"
        "@triton.jit\ndef ok(x):\n    return x + 1\n")
    tree = ast.parse(src)
    aliases = _torch_aliases(tree)
    fns = {fn.name: fn for fn in jit_functions(src)}
    assert sorted(t for _, t in torch_uses(fns["k"], aliases)) == ["T", "T.zeros", "float32"]
    assert torch_uses(fns["ok"], aliases) == []


@pytest.mark.parametrize("path", package_modules(),
                         ids=lambda p: os.path.relpath(p, PACKAGE))
def test_no_torch_symbol_inside_triton_jit(path):
    source = open(path, encoding="utf-8").read()
    tree = ast.parse(source, path)
    aliases = _torch_aliases(tree)
    bad = []
    for fn in jit_functions(source, path):
        for line, text in torch_uses(fn, aliases):
            bad.append(f"{os.path.relpath(path, ROOT)}:{line} {fn.name}: {text}")
    assert not bad, "torch symbols inside @triton.jit functions:\n" + "\n".join(bad)


# ------------------------------------------------------------------------------------------
# 2. integer scalars: typed, never specialised
# ------------------------------------------------------------------------------------------
def _kernel_defs() -> Dict[str, ast.FunctionDef]:
    return {fn.name: fn for fn in jit_functions(open(GPU_BACKEND).read(), GPU_BACKEND)}


def _spec_args_from_source() -> Dict[str, List[Tuple[str, str]]]:
    """kernel function name -> [(arg, type word)] from the KERNEL_SPECS literal, read by AST so
    the check needs neither triton nor an import."""
    tree = ast.parse(open(GPU_BACKEND).read())
    consts: Dict[str, ast.expr] = {}
    for node in tree.body:
        if isinstance(node, ast.Assign) and len(node.targets) == 1 and isinstance(
                node.targets[0], ast.Name):
            consts[node.targets[0].id] = node.value
        elif isinstance(node, ast.AnnAssign) and isinstance(node.target, ast.Name):
            consts[node.target.id] = node.value
    specs = consts["KERNEL_SPECS"]
    out = {}
    for call in specs.values:
        fn_name = call.args[1].id
        args_node = call.args[2]
        if isinstance(args_node, ast.Name):
            args_node = consts[args_node.id]
        out[fn_name] = ast.literal_eval(args_node)
    return out


def test_integer_scalars_are_typed_and_not_specialised():
    defs = _kernel_defs()
    specs = _spec_args_from_source()
    assert len(specs) == 5
    for fn_name, args in specs.items():
        fn = defs[fn_name]
        dec = next(d for d in fn.decorator_list if _is_triton_jit(d))
        listed = set()
        if isinstance(dec, ast.Call):
            for kw in dec.keywords:
                if kw.arg == "do_not_specialize":
                    listed = set(ast.literal_eval(kw.value))
        annotations = {a.arg: ast.unparse(a.annotation) if a.annotation else ""
                       for a in fn.args.args}
        ints = {a: t for a, t in args if t in ("i32", "i64")}
        assert ints, f"{fn_name} has no integer scalar?"
        for a, t in ints.items():
            assert a in listed, f"{fn_name}: integer argument {a} not in do_not_specialize"
            want = {"i32": "tl.int32", "i64": "tl.int64"}[t]
            assert annotations[a] == want, f"{fn_name}: {a} annotated {annotations[a]!r}"
        for a, t in args:
            if t == "fp32":
                assert annotations[a] == "tl.float32", f"{fn_name}: {a} annotated {annotations[a]!r}"


# ------------------------------------------------------------------------------------------
# 3. vector accesses in the compiled code
# ------------------------------------------------------------------------------------------
def _compiler_or_skip():
    if not triton_available():
        pytest.skip("triton is not installed")
    import triton.language.random as random_mod
    try:
        from triton.runtime.interpreter import InterpretedFunction
    except ImportError:  # pragma: no cover
        InterpretedFunction = ()
    if isinstance(random_mod.philox, InterpretedFunction):
        pytest.skip("TRITON_INTERPRET=1 is active in this process: nothing can be compiled")
    from luminamoon.aot import builder, compat
    from luminamoon.optimizer import gpu_backend as gb
    return builder, compat, gb


# Elements per thread of the passes: BLOCK / (32 * num_warps). Loads per tensor at full vector
# width: elements * bytes / 16.
_SIZE = {0: 4, 1: 2, 2: 2}


def _expected_vectors(v, per_thread: int) -> Tuple[int, int]:
    cx = v.constexpr_dict()
    vec = lambda code: per_thread * _SIZE[code] // 16  # noqa: E731
    if v.kernel == "pass1":
        loads = vec(cx["G_DTYPE"]) + (2 * vec(cx["S_DTYPE"]) if cx["NEED_SUM"] else 0)
        return loads, 0
    loads = vec(cx["G_DTYPE"]) + 2 * vec(cx["S_DTYPE"]) + vec(cx["P_DTYPE"])
    if cx["BOUND_MODE"]:
        loads += vec(cx["P_DTYPE"])
    stores = vec(cx["P_DTYPE"]) + 2 * vec(cx["S_DTYPE"])
    return loads, stores


VECTOR_KEYS = [
    "pass1.g0s0.sr0.n1", "pass1.g1s1.sr1.n1", "pass1.g2s0.sr0.n0",
    "pass2.p0g0s0.sr0.b2.c1.f1", "pass2.p1g1s1.sr1.b1.c1.f0",
    "single_pass.p0g0s0.sr0.b0", "single_pass.p1g1s0.sr1.b0", "single_pass.p2g2s0.sr0.b2",
]


@requires_triton
@pytest.mark.triton
@pytest.mark.parametrize("prefix", VECTOR_KEYS)
def test_element_accesses_are_16_byte_vectors(prefix):
    builder, compat, gb = _compiler_or_skip()
    variant = next((v for v in gb.all_variants() if v.key().startswith(prefix + ".")), None)
    assert variant is not None, f"no variant {prefix}.*"
    plan = builder.plan_kernel(variant.spec)
    src = compat.make_ast_source(plan.fn, plan.source_spec(variant.constexpr_dict()),
                                 compat.detect_api())
    import triton
    try:
        compiled = triton.compile(src, target=compat.gpu_target(90), options={
            "num_warps": variant.num_warps, "num_stages": variant.num_stages, "num_ctas": 1})
    except Exception as exc:  # no CUDA backend / ptxas in this Triton build
        pytest.skip(f"cannot compile for sm_90 here: {type(exc).__name__}: {exc}")
    ptx = compiled.asm["ptx"]
    loads = Counter(re.findall(r"ld\.global(?:\.\w+)*\.v(\d)", ptx))
    stores = Counter(re.findall(r"st\.global(?:\.\w+)*\.v(\d)", ptx))
    cx = variant.constexpr_dict()
    per_thread = cx["BLOCK"] // (32 * variant.num_warps)
    want_loads, want_stores = _expected_vectors(variant, per_thread)
    # 16-byte vectors: v4 of 32-bit words (fp32 elements, or 2 x 16-bit elements per word)
    assert loads["4"] >= want_loads, f"{variant.key()}: {dict(loads)} vector loads"
    assert stores["4"] >= want_stores, f"{variant.key()}: {dict(stores)} vector stores"


# ------------------------------------------------------------------------------------------
# 4. the launch path: the JIT's calling convention and launch hooks, read from this Triton
# ------------------------------------------------------------------------------------------
@requires_triton
@pytest.mark.triton
def test_direct_launch_follows_the_installed_triton():
    _builder, _compat, gb = _compiler_or_skip()
    import inspect

    import triton
    from triton.runtime.jit import JITFunction

    src = inspect.getsource(JITFunction.run)
    # the direct path is taken exactly when the JIT itself hands every bound argument over
    assert gb._direct_launch_supported() == ("*bound_args.values())" in src
                                             and "kernel.run(grid_0" in src)
    knobs = getattr(triton, "knobs", None)
    chain = getattr(getattr(knobs, "runtime", None), "launch_enter_hook", None)
    if chain is None or not hasattr(chain, "add"):
        pytest.skip("this Triton has no hook chain in knobs.runtime")
    assert not gb._launch_hooks_set()

    def hook(*_args):
        return None

    chain.add(hook)
    try:
        assert gb._launch_hooks_set()  # a profiler's hook sends launches through the JIT
    finally:
        chain.remove(hook)
    assert not gb._launch_hooks_set()
