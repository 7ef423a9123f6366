"""Compile every kernel variant for every GPU arch and write a bundle. Needs no GPU.

Each variant is compiled with ``triton.compile(ASTSource(...), target=GPUTarget("cuda", arch,
32), options={"num_warps", "num_stages", "num_ctas": 1})`` for an NVIDIA arch, with
``GPUTarget("hip", "gfx942", 64)`` for an AMD one (a :class:`.compat.Target` either way); the
``ASTSource`` is built for whichever Triton API generation is installed (:mod:`.compat`).

Specialisation (what the compiled kernel assumes about its arguments)
---------------------------------------------------------------------
The cubin must be the kernel Triton's JIT would compile for the same arguments, so the engine
launching it from C++ computes exactly what the ``triton`` backend computes. The JIT
specialises a pointer on 16-byte alignment and an integer scalar on its value (equal to 1 it
becomes a constant and leaves the parameter list; divisible by 16 it is marked). The engine
guarantees 16-byte aligned pointers (torch and ``cuMemAlloc`` allocations are; a view that
starts inside a storage must not reach a bundle kernel) and nothing about integer values.
Hence:

* every pointer argument is compiled ``tt.divisibility 16``, exactly as the JIT does for an
  aligned pointer, except one the kernel declares ``do_not_specialize`` or
  ``do_not_specialize_on_alignment`` (the JIT leaves those unmarked, and so does the builder);
* no scalar is marked, and an integer scalar that the JIT *would* specialise (one missing from
  ``do_not_specialize``) is refused: its runtime ABI would depend on a value the engine does not
  control. Nothing is ever compiled as equal to 1.
* float scalars are never specialised by the JIT and are passed as declared.

Files are written atomically (temporary file + rename) and ``manifest.json`` last, after any old
manifest in the folder has been removed, so a reader never sees a manifest naming a cubin that
is not yet whole.
"""
from __future__ import annotations

import dataclasses
import importlib
import os
import pickle
import queue
import subprocess
import sys
import threading
import time
from dataclasses import dataclass
from typing import Any, Dict, Iterable, List, Mapping, Optional, Sequence, Tuple

from . import compat
from .manifest import (FORMAT, FORMAT_VERSION, KERNEL_NAMES, MANIFEST_NAME, BundleError,
                       atomic_write, check_cubin, code_object_file, derive_key, write_manifest)

DEFAULT_ARCHS = (80, 90)


class BuildError(RuntimeError):
    """The bundle cannot be built as asked; the message names the value and the fix."""


@dataclass(frozen=True)
class CompilePlan:
    """How one kernel is compiled: its parameters, runtime signature and hints."""

    kernel: str
    fn: Any
    arg_names: Tuple[str, ...]  # every parameter, declaration order
    runtime_args: Tuple[Tuple[str, str], ...]  # (name, type word), ABI order
    constexpr_names: Tuple[str, ...]
    divisible_by_16: Tuple[str, ...]
    # compiler options the JIT launcher uses too (e.g. enable_fp_fusion), from the KernelSpec
    compile_options: Tuple[Tuple[str, Any], ...] = ()

    def source_spec(self, constexprs: Mapping[str, Any]) -> compat.SourceSpec:
        return compat.SourceSpec(arg_names=self.arg_names, types=dict(self.runtime_args),
                                 constexprs=dict(constexprs),
                                 divisible_by_16=self.divisible_by_16)


def plan_kernel(spec: Any) -> CompilePlan:
    """Checks a ``KernelSpec`` against its @triton.jit function and decides the hints.

    Raises :class:`BuildError` listing every disagreement: a parameter the spec does not
    declare (or declares wrongly as runtime/constexpr), runtime arguments out of declaration
    order, an unknown type word, or an argument whose ABI the JIT would specialise.
    """
    name = spec.name
    fn = spec.fn
    try:
        params = compat.jit_params(fn)
    except compat.TritonCompatError as exc:
        raise BuildError(f"kernel {name!r}: {exc}") from None
    by_name = {p.name: p for p in params}
    problems: List[str] = []
    runtime = tuple((str(a), str(t)) for a, t in spec.args)
    cnames = tuple(str(c) for c in spec.constexprs)
    for a, t in runtime:
        if not compat.is_type_word(t):
            problems.append(f"argument {a!r} has unknown type word {t!r} (use i32, i64, u32, "
                            "u64, fp16, bf16, fp32, fp64, i1 or a pointer '*<word>')")
        p = by_name.get(a)
        if p is None:
            problems.append(f"argument {a!r} is not a parameter of {_fn_name(fn)}")
        elif p.is_constexpr:
            problems.append(f"argument {a!r} is a tl.constexpr parameter but listed as a runtime "
                            "argument; move it to constexprs")
        elif compat.is_type_word(t):
            problems.extend(compat.specialisation_problems(p, t))
    for c in cnames:
        p = by_name.get(c)
        if p is None:
            problems.append(f"constexpr {c!r} is not a parameter of {_fn_name(fn)}")
        elif not p.is_constexpr:
            problems.append(f"constexpr {c!r} is a runtime parameter of {_fn_name(fn)}; declare "
                            "it tl.constexpr or list it in args")
    declared = {a for a, _ in runtime} | set(cnames)
    for p in params:
        if p.name not in declared:
            problems.append(f"parameter {p.name!r} of {_fn_name(fn)} is missing from the spec")
    fn_runtime_order = [p.name for p in params if not p.is_constexpr]
    if not problems and [a for a, _ in runtime] != fn_runtime_order:
        problems.append(f"runtime arguments {[a for a, _ in runtime]} are not in the kernel's "
                        f"declaration order {fn_runtime_order}")
    if problems:
        raise BuildError(f"kernel {name!r} ({_fn_name(fn)}) cannot be compiled ahead of time:\n  "
                         + "\n  ".join(problems))
    div = tuple(a for a, t in runtime if compat.jit_would_mark_divisible(by_name[a], t))
    return CompilePlan(kernel=name, fn=fn, arg_names=tuple(p.name for p in params),
                       runtime_args=runtime, constexpr_names=cnames, divisible_by_16=div,
                       compile_options=tuple(getattr(spec, "compile_options", ())))


def _fn_name(fn: Any) -> str:
    return getattr(fn, "__name__", None) or getattr(getattr(fn, "fn", None), "__name__", repr(fn))


def _variant_constexprs(plan: CompilePlan, variant: Any) -> Dict[str, int]:
    values = {str(k): v for k, v in variant.constexprs}
    missing = [c for c in plan.constexpr_names if c not in values]
    extra = [c for c in values if c not in plan.constexpr_names]
    if missing or extra:
        raise BuildError(f"variant {variant.key()}: constexprs {sorted(values)} do not match "
                         f"kernel {plan.kernel!r}'s {list(plan.constexpr_names)} "
                         f"(missing {missing}, unknown {extra})")
    for c, v in values.items():
        if not isinstance(v, int):
            raise BuildError(f"variant {variant.key()}: constexpr {c} must be an int, got {v!r}")
    return {c: int(values[c]) for c in plan.constexpr_names}


def compile_options(plan: CompilePlan, variant: Any, hip: bool = False) -> Dict[str, Any]:
    """The options ``triton.compile`` gets for ``variant``: what the JIT launcher passes too
    (``kernels.catalog.variant_options``: no NVIDIA-only option, such as maxnreg, for HIP)."""
    from ..kernels.catalog import NVIDIA_ONLY_OPTIONS

    options = {"num_warps": int(variant.num_warps), "num_stages": int(variant.num_stages),
               "num_ctas": 1, **dict(plan.compile_options)}
    maxnreg = getattr(variant, "maxnreg", None)
    if maxnreg is not None:
        options["maxnreg"] = int(maxnreg)
    if hip:
        options = {k: v for k, v in options.items() if k not in NVIDIA_ONLY_OPTIONS}
    return options


def compile_variant(plan: CompilePlan, variant: Any, arch: Any,
                    api: Optional[str] = None) -> Tuple[Dict[str, Any], bytes]:
    """Compiles one variant for one arch (a :class:`.compat.Target`, or 90, "gfx942", ...):
    ``(manifest entry, cubin or hsaco bytes)``."""
    import triton

    target = compat.parse_target(arch)
    key = variant.key()
    constexprs = _variant_constexprs(plan, variant)
    api = api or compat.detect_api()
    src = compat.make_ast_source(plan.fn, plan.source_spec(constexprs), api)
    options = compile_options(plan, variant, hip=target.is_hip)
    version = compat.triton_version()
    try:
        if target.is_hip:
            lld = compat.find_hip_lld(version)
            if lld is not None:
                os.environ[compat.LLD_ENV] = lld
        compiled = triton.compile(src, target=target.gpu_target(), options=options)
    except compat.TritonCompatError as exc:
        raise BuildError(f"compiling {key} for {target}: {exc}") from None
    except Exception as exc:  # the compiler's own error, with the variant that caused it
        raise BuildError(f"compiling {key} for {target} failed: {type(exc).__name__}: "
                         f"{exc}") from exc
    md = compat.kernel_metadata(compiled)
    try:
        if target.is_hip:
            image = bytes(compiled.asm["hsaco"])
            trailing = compat.hsaco_trailing_scratch_ptrs(image, md["entry"],
                                                          len(plan.runtime_args), version)
        else:
            image = bytes(compiled.asm["cubin"])
            trailing = compat.trailing_scratch_ptrs(compiled.asm["ptx"], md["entry"],
                                                    len(plan.runtime_args), version)
    except compat.TritonCompatError as exc:
        raise BuildError(f"{key} for {target}: {exc}") from None
    entry = {
        "key": key,
        "kernel": plan.kernel,
        "name": _fn_name(plan.fn),
        "entry": md["entry"],
        ("hsaco" if target.is_hip else "cubin"): code_object_name(key, target),
        "sha256": _sha256(image),
        "target": target.manifest_target(),
        "triton_version": version,
        "num_warps": md["num_warps"],
        "num_ctas": md["num_ctas"],
        "num_stages": md["num_stages"],
        "shared_mem": md["shared_mem"],
        "arg_names": [a for a, _ in plan.runtime_args],
        "signature": [t for _, t in plan.runtime_args],
        "constexprs": constexprs,
        "num_params": len(plan.runtime_args) + trailing,
        "num_trailing_scratch_ptrs": trailing,
        "global_scratch_size": md["global_scratch_size"],
        "global_scratch_align": md["global_scratch_align"],
        "profile_scratch_size": md["profile_scratch_size"],
        "profile_scratch_align": md["profile_scratch_align"],
    }
    if entry["num_warps"] != int(variant.num_warps):
        raise BuildError(f"{key} for {target}: asked for num_warps={variant.num_warps} but "
                         f"Triton compiled {entry['num_warps']}")
    # The loaders' own checks (docs/bundle-format.md, rules C2-C6, H2-H9): a toolchain whose
    # output they would refuse is reported here, when the bundle is built, not at its first load.
    try:
        check_cubin(".", entry, 0, data=image)
    except BundleError as exc:
        what = "code object" if target.is_hip else "cubin"
        raise BuildError(f"{key} for {target}: the compiled {what} breaks the bundle rule book "
                         f"[{exc.code}]: {exc.expected} expected, {exc.found} found; this "
                         f"Triton ({version}) writes {what}s the loaders do not accept") from None
    return entry, image


def cubin_file_name(key: str, arch: int) -> str:
    return f"{key}.sm{int(arch)}.cubin"


def code_object_name(key: str, target: compat.Target) -> str:
    """``<key>.sm<arch>.cubin`` or ``<key>.<gfx arch>.hsaco``."""
    return f"{key}.{target.arch}.hsaco" if target.is_hip else cubin_file_name(key, target.arch)


def _sha256(data: bytes) -> str:
    import hashlib

    return hashlib.sha256(data).hexdigest()


def _created_by() -> str:
    try:
        from importlib.metadata import version

        return f"luminamoon {version('luminamoon')}"
    except Exception:  # not installed: a source checkout on PYTHONPATH
        pkg = sys.modules.get(__name__.split(".")[0])
        return f"luminamoon {getattr(pkg, '__version__', 'unknown')}"


def _table_cols() -> int:
    from ..kernels.layout import TABLE_COLS

    return int(TABLE_COLS)


def _check_archs(archs: Iterable[Any]) -> Tuple[compat.Target, ...]:
    out: List[compat.Target] = []
    for a in archs:
        try:
            t = compat.parse_target(a)
        except ValueError as exc:
            raise BuildError(f"arch {a!r}: {exc}") from None
        if t not in out:
            out.append(t)
    if not out:
        raise BuildError('no arch given; pass e.g. archs=(80, 90) or ("gfx942",)')
    return tuple(out)


def _default_kernels() -> Any:
    try:
        from ..kernels import catalog
    except ImportError as exc:
        raise BuildError(f"the Triton kernels cannot be imported ({exc}); install Triton "
                         "(pip install 'triton>=3.0')") from exc
    return catalog


def _fn_ref(fn: Any) -> Optional[Tuple[str, str]]:
    """(module, attribute) under which a fresh worker process finds the @triton.jit ``fn``
    again, or None when it cannot (a kernel defined inside a function, or in ``__main__``)."""
    py = getattr(fn, "fn", fn)
    module, name = getattr(py, "__module__", None), getattr(py, "__name__", None)
    if not module or not name or module == "__main__":
        return None
    try:
        found = getattr(importlib.import_module(module), name, None)
    except Exception:  # noqa: BLE001 - an unimportable module just means no worker can
        return None
    return (module, name) if found is fn else None


def _run_workers(items: List[Any], jobs: int, finish) -> None:
    """Compiles ``items`` in ``jobs`` fresh worker processes (aot/_worker.py), calling
    ``finish(index, entry, cubin)`` here as each result arrives; raises BuildError for the first
    item a worker could not compile, or a worker that died."""
    env = dict(os.environ)
    # the worker imports what this process imports, from the same places
    env["PYTHONPATH"] = os.pathsep.join(p for p in sys.path if p)
    chunks = [items[i::jobs] for i in range(jobs)]
    procs = [subprocess.Popen([sys.executable, "-m", "luminamoon.aot._worker"], env=env,
                              stdin=subprocess.PIPE, stdout=subprocess.PIPE)
             for chunk in chunks if chunk]
    results: "queue.Queue[Any]" = queue.Queue()

    def read(proc):
        try:
            while True:
                results.put(pickle.load(proc.stdout))
        except EOFError:
            pass
        finally:
            results.put(proc)

    threads = []
    try:
        for proc, chunk in zip(procs, (c for c in chunks if c)):
            proc.stdin.write(pickle.dumps(chunk))
            proc.stdin.close()
            threads.append(threading.Thread(target=read, args=(proc,), daemon=True))
            threads[-1].start()
        running = len(procs)
        while running:
            got = results.get()
            if isinstance(got, subprocess.Popen):
                running -= 1
                if got.wait() != 0:
                    raise BuildError(f"a build worker exited with status {got.returncode} (its "
                                     "error is above); run with jobs=1 to see it in-process")
                continue
            index, entry, cubin = got
            if entry is None:
                raise BuildError(cubin)
            finish(index, entry, cubin)
    finally:
        for proc in procs:
            if proc.poll() is None:
                proc.kill()
            proc.wait()


def _compile_in_worker(item: Tuple[int, Tuple[str, str], CompilePlan, Any, int, str]
                       ) -> Tuple[int, Dict[str, Any], bytes]:
    index, (module, name), plan, variant, arch, api = item
    fn = getattr(importlib.import_module(module), name)
    entry, cubin = compile_variant(dataclasses.replace(plan, fn=fn), variant, arch, api)
    return index, entry, cubin


def build_bundle(out_dir: "os.PathLike[str] | str", archs: Sequence[Any] = DEFAULT_ARCHS,
                 dtype_combos: Optional[Sequence[Tuple[Any, Any, Any]]] = None,
                 variants: Optional[Sequence[Any]] = None, jobs: int = 1,
                 progress: bool = True, *, specs: Optional[Mapping[str, Any]] = None
                 ) -> Dict[str, Any]:
    """Compiles every variant for every arch into a bundle at ``out_dir``; returns the manifest.

    ``variants`` defaults to ``kernels.catalog.all_variants(dtype_combos)`` (every default dtype
    combination when ``dtype_combos`` is None); ``specs`` (kernel name -> ``KernelSpec``)
    defaults to ``kernels.catalog.KERNEL_SPECS``. ``jobs`` > 1 compiles in that many worker
    processes, each a fresh interpreter (:func:`_run_workers`); kernels a worker cannot
    import by name are compiled here, one after the other.
    """
    archs = _check_archs(archs)
    if isinstance(jobs, bool) or not isinstance(jobs, int) or jobs < 1:
        raise BuildError(f"jobs must be an integer >= 1, got {jobs!r}")
    if specs is None or variants is None:
        kernels = _default_kernels()
        if specs is None:
            specs = kernels.KERNEL_SPECS
        if variants is None:
            variants = (kernels.all_variants(list(dtype_combos)) if dtype_combos is not None
                        else kernels.all_variants())
    variants = list(variants)
    if not variants:
        raise BuildError("no kernel variants to build")

    plans: Dict[str, CompilePlan] = {}
    keys: Dict[str, Any] = {}
    for v in variants:
        if v.kernel not in specs:
            raise BuildError(f"variant {v.key()} names kernel {v.kernel!r}, which has no spec "
                             f"(known: {', '.join(sorted(specs))})")
        if v.kernel not in KERNEL_NAMES:
            raise BuildError(f"variant {v.key()}: kernel {v.kernel!r} is not one the runtime "
                             f"launches ({', '.join(KERNEL_NAMES)})")
        if v.kernel not in plans:
            plans[v.kernel] = plan_kernel(specs[v.kernel])
        constexprs = _variant_constexprs(plans[v.kernel], v)
        k = v.key()
        derived = derive_key(v.kernel, constexprs, int(v.num_warps))
        if k != derived:
            raise BuildError(f"variant key {k!r} is not the one its kernel, constexprs and "
                             f"num_warps give ({derived!r}, docs/internals.md \"Variant keys\"): "
                             "loaders derive the key and would refuse the bundle")
        if k in keys:
            raise BuildError(f"two variants share the key {k!r}: {keys[k]!r} and {v!r}")
        keys[k] = v

    api = compat.detect_api()
    work = [(plans[v.kernel], v, a) for v in variants for a in archs]
    out_dir = os.fspath(out_dir)
    os.makedirs(out_dir, exist_ok=True)
    old_manifest = os.path.join(out_dir, MANIFEST_NAME)
    if os.path.exists(old_manifest):
        os.unlink(old_manifest)

    entries: List[Optional[Dict[str, Any]]] = [None] * len(work)
    bar = _progress(len(work), progress)
    t0 = time.monotonic()

    def finish(index: int, entry: Dict[str, Any], cubin: bytes) -> None:
        atomic_write(os.path.join(out_dir, code_object_file(entry)), cubin)
        entries[index] = entry
        bar.update(entry)

    refs = {k: _fn_ref(p.fn) for k, p in plans.items()}
    parallel = jobs > 1 and len(work) > 1 and all(r is not None for r in refs.values())
    try:
        if parallel:
            items = [(i, refs[plan.kernel], dataclasses.replace(plan, fn=None), v, a, api)
                     for i, (plan, v, a) in enumerate(work)]
            _run_workers(items, min(jobs, len(work)), finish)
        else:
            for index, (plan, v, a) in enumerate(work):
                entry, cubin = compile_variant(plan, v, a, api)
                finish(index, entry, cubin)
    finally:
        bar.close()

    manifest = {
        "format": FORMAT,
        "format_version": FORMAT_VERSION,
        "table_cols": _table_cols(),
        "created_by": _created_by(),
        "triton_version": compat.triton_version(),
        "kernels": entries,
    }
    write_manifest(out_dir, manifest)
    if progress:
        print(f"wrote {len(entries)} kernel(s) for {', '.join(map(str, archs))} and "
              f"{MANIFEST_NAME} to {out_dir} in {time.monotonic() - t0:.1f} s", file=sys.stderr)
    return manifest


class _progress:
    """A tqdm bar on stderr where tqdm is installed, a line per kernel otherwise."""

    def __init__(self, total: int, enabled: bool) -> None:
        self.total, self.enabled, self.done, self.bar = total, enabled, 0, None
        if enabled:
            try:
                from tqdm.auto import tqdm

                self.bar = tqdm(total=total, unit="kernel", desc="aot build", file=sys.stderr)
            except ImportError:
                self.bar = None

    def update(self, entry: Mapping[str, Any]) -> None:
        self.done += 1
        if not self.enabled:
            return
        label = f"{entry['key']} {compat.parse_target(entry['target']['arch'])}"
        if self.bar is not None:
            self.bar.set_postfix_str(label, refresh=False)
            self.bar.update(1)
        else:
            print(f"[{self.done}/{self.total}] {label}", file=sys.stderr)

    def close(self) -> None:
        if self.bar is not None:
            self.bar.close()
