"""The source of the Triton kernels, and the code it compiles to.

1. No @triton.jit function anywhere in the package names a ``torch.`` symbol (the kernels must
   compile where only Triton is present, and ahead of time). Found through the AST of every
   module under python/luminamoon, without importing them.
2. Every integer scalar of every kernel is typed and kept out of the JIT's specialisation, so a
   JIT build and an ahead-of-time build of a variant are the same code.
3. The element loads and stores of the passes are vector accesses (16 bytes; 8 for 16-bit data
   in kernels that mix 16- and 32-bit tensors), with no layout conversion: compiled for sm_90
   without a GPU (the same triton.compile call the AOT builder makes), checked in the PTX.
"""
from __future__ import annotations

import ast
import os
import re
from collections import Counter
from typing import Dict, Iterator, List, Tuple

import pytest

from conftest import require, requires_triton, skip_because

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
PACKAGE = os.path.join(ROOT, "python", "luminamoon")
KERNELS_SRC = os.path.join(PACKAGE, "kernels", "tdclm.py")  # every @triton.jit kernel
ARITH_SRC = os.path.join(PACKAGE, "kernels", "arith.py")  # the kernels' element helpers
Q8_SRC = os.path.join(PACKAGE, "kernels", "tdclm_q8.py")  # the programs of q8 moments
CATALOG_SRC = os.path.join(PACKAGE, "kernels", "catalog.py")  # KERNEL_SPECS


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
    names = {fn.name for src in (KERNELS_SRC, ARITH_SRC, Q8_SRC)
             for fn in jit_functions(open(src).read(), src)}
    for kernel in ("_lumina_tdclm_pass1_kernel", "_lumina_tdclm_reduce_kernel",
                   "_lumina_tdclm_pass2_kernel", "_lumina_adamw_single_pass_kernel",
                   "_lumina_tdclm_commit_kernel", "_moment_update", "_triton_tanh_fast",
                   "_q8_update_block", "_q8_pass1_block"):
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
    return {fn.name: fn for fn in jit_functions(open(KERNELS_SRC).read(), KERNELS_SRC)}


def _spec_args_from_source() -> Dict[str, List[Tuple[str, str]]]:
    """kernel function name -> [(arg, type word)] from the KERNEL_SPECS and
    JIT_ONLY_KERNEL_SPECS literals, read by AST so the check needs neither triton nor an
    import."""
    tree = ast.parse(open(CATALOG_SRC).read())
    consts: Dict[str, ast.expr] = {}
    for node in tree.body:
        if isinstance(node, ast.Assign) and len(node.targets) == 1 and isinstance(
                node.targets[0], ast.Name):
            consts[node.targets[0].id] = node.value
        elif isinstance(node, ast.AnnAssign) and isinstance(node.target, ast.Name):
            consts[node.target.id] = node.value
    out = {}
    for call in consts["KERNEL_SPECS"].values + consts["JIT_ONLY_KERNEL_SPECS"].values:
        fn_node = call.args[1]  # tdclm.<kernel>
        fn_name = fn_node.attr if isinstance(fn_node, ast.Attribute) else fn_node.id
        args_node = call.args[2]
        if isinstance(args_node, ast.Name):
            args_node = consts[args_node.id]
        out[fn_name] = ast.literal_eval(args_node)
    return out


def test_integer_scalars_are_typed_and_not_specialised():
    defs = _kernel_defs()
    specs = _spec_args_from_source()
    assert len(specs) == 6  # five in every bundle, one the triton backend's own
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
    require("compiled triton")
    from luminamoon.aot import builder, compat
    from luminamoon.kernels import catalog
    return builder, compat, catalog


# Elements per thread of the passes: BLOCK / (32 * num_warps). Every tensor of a kernel whose
# element tensors are all 32-bit or all 16-bit is accessed in 16-byte vectors; where 32-bit and
# 16-bit tensors mix, the kernel keeps one layout of 4 elements per access: 16 bytes of 32-bit
# data, 8 bytes of 16-bit data (kernels/tdclm.py, _block_offsets).
_SIZE = {0: 4, 1: 2, 2: 2}


def _expected_vectors(v, per_thread: int) -> Tuple[Counter, Counter]:
    """Least numbers of (lanes, bits) vector accesses per thread: loads, stores."""
    cx = v.constexpr_dict()
    if v.kernel == "pass1":
        loaded = [cx["G_DTYPE"]] + ([cx["S_DTYPE"]] * 2 if cx["NEED_SUM"] else [])
        stored = []
    else:
        loaded = [cx["G_DTYPE"], cx["S_DTYPE"], cx["S_DTYPE"], cx["P_DTYPE"]]
        if cx["BOUND_MODE"]:
            loaded.append(cx["P_DTYPE"])
        stored = [cx["P_DTYPE"], cx["S_DTYPE"], cx["S_DTYPE"]]
    mixed = len({_SIZE[c] for c in loaded}) > 1

    def count(codes):
        out = Counter()
        for c in codes:
            run = 4 if mixed else 16 // _SIZE[c]  # elements per access
            lanes = run * _SIZE[c] // 4  # 32-bit words per access
            out[(str(lanes), "32")] += per_thread // run
        return out
    return count(loaded), count(stored)


VECTOR_KEYS = [
    "pass1.g0s0.sr0.n1", "pass1.g1s1.sr1.n1", "pass1.g2s0.sr0.n0", "pass1.g1s0.sr1.n1",
    "pass2.p0g0s0.sr0.b2.c1.f1", "pass2.p1g1s1.sr1.b1.c1.f0", "pass2.p1g1s0.sr1.b2.c1.f1",
    "single_pass.p0g0s0.sr0.b0", "single_pass.p1g1s0.sr1.b0", "single_pass.p2g2s0.sr0.b2",
    "single_pass.p1g0s0.sr1.b1",
]


@requires_triton
@pytest.mark.triton
@pytest.mark.parametrize("prefix", VECTOR_KEYS)
def test_element_accesses_are_wide_vectors(prefix):
    builder, compat, catalog = _compiler_or_skip()
    variant = next((v for v in catalog.all_variants() if v.key().startswith(prefix + ".")), None)
    assert variant is not None, f"no variant {prefix}.*"
    plan = builder.plan_kernel(variant.spec)
    src = compat.make_ast_source(plan.fn, plan.source_spec(variant.constexpr_dict()),
                                 compat.detect_api())
    import triton
    try:
        compiled = triton.compile(src, target=compat.gpu_target(90),
                                  options=builder.compile_options(plan, variant))
    except Exception as exc:  # no CUDA backend / ptxas in this Triton build
        skip_because("no sm_90 compiler", f"{type(exc).__name__}: {exc}")
    ptx = compiled.asm["ptx"]
    loads = Counter(re.findall(r"ld\.global(?:\.\w+)*\.v(\d)\.b(\d+)", ptx))
    stores = Counter(re.findall(r"st\.global(?:\.\w+)*\.v(\d)\.b(\d+)", ptx))
    cx = variant.constexpr_dict()
    per_thread = cx["BLOCK"] // (32 * variant.num_warps)
    want_loads, want_stores = _expected_vectors(variant, per_thread)
    for shape, n in want_loads.items():
        assert loads[shape] >= n, f"{variant.key()}: vector loads {dict(loads)}, want {dict(want_loads)}"
    for shape, n in want_stores.items():
        assert stores[shape] >= n, (f"{variant.key()}: vector stores {dict(stores)}, "
                                    f"want {dict(want_stores)}")
    if variant.kernel in ("pass2", "single_pass"):
        # elementwise: no layout conversion, so no shared memory between loads and arithmetic
        assert compiled.metadata.shared == 0, f"{variant.key()}: {compiled.metadata.shared} B shared"
