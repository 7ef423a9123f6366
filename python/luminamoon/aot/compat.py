"""One ahead-of-time compile across Triton 3.0 - 3.9.

Triton's ``ASTSource`` (the object ``triton.compile`` takes) changed shape twice:

=================  ==========================================================================
generation         what ``ASTSource`` expects
=================  ==========================================================================
``index_keyed``    3.0, 3.1: ``signature={i: type}`` for the runtime arguments only,
                   ``constants={i: value}``, ``attrs=AttrsDescriptor(divisible_by_16=...,
                   equal_to_1=...)`` from ``triton.compiler``
``name_keyed``     3.2: ``signature={name: type}`` for the runtime arguments only,
                   ``constants={name: value}``, ``attrs=AttrsDescriptor.from_hints({i: 16})``
                   from ``triton.backends.compiler``
``constexprs``     3.3+: ``signature`` lists every argument (constexprs typed ``"constexpr"``),
                   ``constexprs={name: value}``, ``attrs={(i,): [["tt.divisibility", 16]]}``
=================  ==========================================================================

The generation is found by looking at the installed Triton (the parameters of
``ASTSource.__init__`` and where ``AttrsDescriptor`` lives), never by comparing version
strings. The one table that *is* keyed by version is the number of implicit trailing scratch
pointers, and it is only ever used to cross-check the count read from the compiled PTX.

Indices are always positions in the kernel's full parameter list (constexprs included), as
Triton's own JIT and ``tools/compile.py`` use them.

Nothing here imports Triton at module import time.
"""
from __future__ import annotations

import importlib
import inspect
import re
from dataclasses import dataclass, field
from typing import Any, Dict, Iterable, List, Mapping, Optional, Sequence, Tuple

API_INDEX_KEYED = "index_keyed"  # Triton 3.0, 3.1
API_NAME_KEYED = "name_keyed"  # Triton 3.2
API_CONSTEXPRS = "constexprs"  # Triton 3.3 and later
API_GENERATIONS = (API_INDEX_KEYED, API_NAME_KEYED, API_CONSTEXPRS)

SCALAR_TYPE_WORDS = ("i1", "i32", "i64", "u32", "u64", "fp16", "bf16", "fp32", "fp64")
INT_TYPE_WORDS = ("i1", "i32", "i64", "u32", "u64")
# Bytes one kernel parameter of this type takes (pointers are 8-byte CUdeviceptr values).
PARAM_BYTES = {"i1": 1, "i32": 4, "u32": 4, "fp32": 4, "fp16": 2, "bf16": 2,
               "i64": 8, "u64": 8, "fp64": 8}
POINTER_BYTES = 8

_PTX_ENTRY = re.compile(r"\.(?:visible|extern)\s+\.entry\s+([A-Za-z_$][\w$]*)\s*\(([^)]*)\)")
_PTX_PARAM = re.compile(r"\.param\s+\.(\w+)")
_VERSION = re.compile(r"^\s*(\d+)\.(\d+)")


class TritonCompatError(RuntimeError):
    """The installed Triton cannot be driven, or a compiled kernel disagrees with its ABI."""


def is_type_word(word: str) -> bool:
    """True for a Triton scalar type word (``i32``, ``fp32`` ...) or a pointer to one."""
    if not isinstance(word, str):
        return False
    base = word[1:] if word.startswith("*") else word
    return base in SCALAR_TYPE_WORDS


def param_bytes(word: str) -> int:
    """Size in bytes of one kernel parameter of Triton type ``word``."""
    if not is_type_word(word):
        raise ValueError(f"unknown Triton type word {word!r}; expected one of "
                         f"{', '.join(SCALAR_TYPE_WORDS)} or a pointer '*<word>'")
    return POINTER_BYTES if word.startswith("*") else PARAM_BYTES[word]


# --------------------------------------------------------------------------------------------
# Which ASTSource API the installed Triton has
# --------------------------------------------------------------------------------------------
def classify_api(ast_init_params: Iterable[str], backends_attrs: Any = None,
                 compiler_attrs: Any = None) -> str:
    """The API generation from what an installed Triton offers.

    ``ast_init_params``: parameter names of ``ASTSource.__init__``; ``backends_attrs``:
    ``triton.backends.compiler.AttrsDescriptor`` or None; ``compiler_attrs``:
    ``triton.compiler.AttrsDescriptor`` or None.
    """
    params = set(ast_init_params)
    if "constexprs" in params:
        return API_CONSTEXPRS
    if "constants" in params:
        if backends_attrs is not None and hasattr(backends_attrs, "from_hints"):
            return API_NAME_KEYED
        if compiler_attrs is not None:
            return API_INDEX_KEYED
    raise TritonCompatError(
        "unsupported Triton: ASTSource.__init__ takes "
        f"({', '.join(sorted(params))}) and no known AttrsDescriptor was found; "
        "LuminaMoon's ahead-of-time builder supports Triton 3.0 through 3.9")


def detect_api() -> str:
    """The ASTSource API generation of the installed Triton."""
    from triton.compiler import ASTSource

    params = inspect.signature(ASTSource.__init__).parameters
    backends_attrs = getattr(importlib.import_module("triton.backends.compiler"),
                             "AttrsDescriptor", None)
    compiler_attrs = getattr(importlib.import_module("triton.compiler"), "AttrsDescriptor", None)
    return classify_api(params.keys(), backends_attrs, compiler_attrs)


# --------------------------------------------------------------------------------------------
# The arguments of ASTSource, as pure data
# --------------------------------------------------------------------------------------------
@dataclass(frozen=True)
class SourceSpec:
    """What one compile asks for, independent of the Triton API generation.

    ``arg_names``: every parameter of the @triton.jit function in declaration order.
    ``types``: runtime argument name -> Triton type word. ``constexprs``: constexpr name ->
    value. ``divisible_by_16``: runtime argument names compiled as 16-divisible.
    """

    arg_names: Tuple[str, ...]
    types: Mapping[str, str]
    constexprs: Mapping[str, Any]
    divisible_by_16: Tuple[str, ...] = field(default_factory=tuple)

    def __post_init__(self) -> None:
        names = set(self.arg_names)
        if len(names) != len(self.arg_names):
            raise ValueError(f"duplicate parameter names in {self.arg_names}")
        covered = set(self.types) | set(self.constexprs)
        if set(self.types) & set(self.constexprs):
            raise ValueError("an argument is both runtime and constexpr: "
                             f"{sorted(set(self.types) & set(self.constexprs))}")
        if covered != names:
            missing = sorted(names - covered)
            extra = sorted(covered - names)
            raise ValueError(f"source spec does not cover the kernel's parameters: "
                             f"missing {missing}, unknown {extra}")
        for name in self.divisible_by_16:
            if name not in self.types:
                raise ValueError(f"divisibility hint on {name!r}, which is not a runtime argument")

    def index(self, name: str) -> int:
        return self.arg_names.index(name)

    @property
    def runtime_names(self) -> Tuple[str, ...]:
        return tuple(n for n in self.arg_names if n in self.types)


def ast_source_arguments(api: str, spec: SourceSpec) -> Dict[str, Any]:
    """``signature``, ``constants``/``constexprs`` and ``attrs`` for ``api``, as plain data.

    For the two older generations ``attrs`` is a description of the ``AttrsDescriptor`` to
    build (``{"divisible_by_16": [i, ...], "equal_to_1": []}`` for 3.0/3.1,
    ``{"hints": {i: 16}}`` for 3.2); :func:`make_ast_source` turns it into the real object.
    Nothing is ever marked equal to 1: such an argument would leave the runtime signature.
    """
    div = sorted(spec.index(n) for n in spec.divisible_by_16)
    if api == API_INDEX_KEYED:
        return {
            "signature": {spec.index(n): spec.types[n] for n in spec.runtime_names},
            "constants": {spec.index(n): v for n, v in _in_order(spec, spec.constexprs)},
            "attrs": {"divisible_by_16": div, "equal_to_1": []},
        }
    if api == API_NAME_KEYED:
        return {
            "signature": {n: spec.types[n] for n in spec.runtime_names},
            "constants": {n: v for n, v in _in_order(spec, spec.constexprs)},
            "attrs": {"hints": {i: 16 for i in div}},
        }
    if api == API_CONSTEXPRS:
        return {
            "signature": {n: (spec.types[n] if n in spec.types else "constexpr")
                          for n in spec.arg_names},
            "constexprs": {n: v for n, v in _in_order(spec, spec.constexprs)},
            "attrs": {(i,): [["tt.divisibility", 16]] for i in div},
        }
    raise ValueError(f"unknown Triton API generation {api!r}; expected one of {API_GENERATIONS}")


def _in_order(spec: SourceSpec, values: Mapping[str, Any]) -> List[Tuple[str, Any]]:
    return [(n, values[n]) for n in spec.arg_names if n in values]


def make_ast_source(fn: Any, spec: SourceSpec, api: Optional[str] = None) -> Any:
    """The installed Triton's ``ASTSource`` for ``fn`` compiled as ``spec`` asks."""
    from triton.compiler import ASTSource

    api = api or detect_api()
    kw = ast_source_arguments(api, spec)
    if api == API_INDEX_KEYED:
        attrs_cls = importlib.import_module("triton.compiler").AttrsDescriptor
        attrs = attrs_cls(divisible_by_16=list(kw["attrs"]["divisible_by_16"]),
                          equal_to_1=list(kw["attrs"]["equal_to_1"]))
        return ASTSource(fn=fn, signature=kw["signature"], constants=kw["constants"], attrs=attrs)
    if api == API_NAME_KEYED:
        attrs_cls = importlib.import_module("triton.backends.compiler").AttrsDescriptor
        attrs = attrs_cls.from_hints(kw["attrs"]["hints"])
        return ASTSource(fn=fn, signature=kw["signature"], constants=kw["constants"], attrs=attrs)
    return ASTSource(fn=fn, signature=kw["signature"], constexprs=kw["constexprs"],
                     attrs=kw["attrs"])


# --------------------------------------------------------------------------------------------
# The compile target: an NVIDIA compute capability or an AMD gfx arch
# --------------------------------------------------------------------------------------------
from .hsaco import HIP_ARCHS  # noqa: E402  (gfx90a, gfx942, gfx950: what a HIP entry may name)
TARGET_FORMS = ("an NVIDIA compute capability: 90, sm_90, sm90 or cuda:90; an AMD arch: "
                f"{', '.join(HIP_ARCHS)} or hip:<arch>")


@dataclass(frozen=True)
class Target:
    """One compile target: ``Target("cuda", 90)`` or ``Target("hip", "gfx942")``."""

    backend: str
    arch: Any  # int for cuda (major*10 + minor), str for hip

    def __post_init__(self) -> None:
        if self.backend == "cuda":
            ok = isinstance(self.arch, int) and not isinstance(self.arch, bool) \
                and 50 <= self.arch <= 999
        elif self.backend == "hip":
            ok = self.arch in HIP_ARCHS
        else:
            ok = False
        if not ok:
            raise ValueError(f"not a compile target: backend {self.backend!r}, arch "
                             f"{self.arch!r}; expected {TARGET_FORMS}")

    @property
    def warp_size(self) -> int:
        return 64 if self.backend == "hip" else 32

    @property
    def is_hip(self) -> bool:
        return self.backend == "hip"

    def __str__(self) -> str:
        return self.arch if self.is_hip else f"sm_{self.arch}"

    def gpu_target(self) -> Any:
        """Triton's ``GPUTarget(backend, arch, warp_size)``."""
        from triton.backends.compiler import GPUTarget

        return GPUTarget(self.backend, self.arch, self.warp_size)

    def manifest_target(self) -> Dict[str, Any]:
        return {"backend": self.backend, "arch": self.arch, "warp_size": self.warp_size}


def parse_target(value: Any) -> Target:
    """``90``, ``"90"``, ``"sm_90"``, ``"sm90"``, ``"cuda:90"`` -> ``Target("cuda", 90)``;
    ``"gfx942"``, ``"hip:gfx942"`` -> ``Target("hip", "gfx942")``; a Target as it is. Raises
    ValueError naming the value and the accepted forms."""
    if isinstance(value, Target):
        return value
    if isinstance(value, int) and not isinstance(value, bool):
        return Target("cuda", value)
    if not isinstance(value, str):
        raise ValueError(f"not a compile target: {value!r}; expected {TARGET_FORMS}")
    word = value.strip().lower()
    backend = None
    for prefix, b in (("cuda:", "cuda"), ("hip:", "hip"), ("sm_", "cuda"), ("sm", "cuda")):
        if word.startswith(prefix):
            backend, word = b, word[len(prefix):]
            break
    if backend != "cuda" and word.startswith("gfx"):
        try:
            return Target("hip", word)
        except ValueError:
            pass
    elif backend != "hip" and word.isdigit():
        try:
            return Target("cuda", int(word))
        except ValueError:
            pass
    raise ValueError(f"not a compile target: {value!r}; expected {TARGET_FORMS}")


def gpu_target(arch: Any, warp_size: Optional[int] = None) -> Any:
    """Triton's ``GPUTarget`` for ``arch`` (a :class:`Target` or what :func:`parse_target`
    takes): ``GPUTarget("cuda", 90, 32)``, ``GPUTarget("hip", "gfx942", 64)``."""
    target = parse_target(arch)
    if warp_size is not None and warp_size != target.warp_size:
        raise ValueError(f"{target} runs warps of {target.warp_size}, not {warp_size}")
    return target.gpu_target()


# --------------------------------------------------------------------------------------------
# Triton 3.0-3.4 on AMD: the external linker
# --------------------------------------------------------------------------------------------
LLD_ENV = "TRITON_HIP_LLD_PATH"
_LLVM_DIR = re.compile(r"/llvm-(\d+)/")


def hip_needs_external_lld(version: str) -> bool:
    """Triton 3.0-3.4 link AMD code objects with an external ld.lld; 3.5 and later inside."""
    m = _VERSION.match(str(version))
    return bool(m) and int(m.group(1)) == 3 and int(m.group(2)) <= 4


def find_hip_lld(version: str, environ: Optional[Mapping[str, str]] = None,
                 candidates: Optional[Sequence[str]] = None) -> Optional[str]:
    """The ld.lld Triton ``version`` needs to link an AMD code object, or None (3.5+: none).

    ``$TRITON_HIP_LLD_PATH`` if set (it must exist), else the newest Debian lld among
    ``candidates`` (default: /usr/lib/llvm-*/bin/ld.lld and /usr/bin/ld.lld); 3.3 and 3.4 need
    lld 19 or later (an older one fails with "unknown abi version"). Raises TritonCompatError
    naming TRITON_HIP_LLD_PATH and the Debian package."""
    if not hip_needs_external_lld(version):
        return None
    import glob
    import os

    environ = os.environ if environ is None else environ
    minor = int(_VERSION.match(str(version)).group(2))
    need = 19 if minor >= 3 else 14
    package = f"lld-{need}"
    hint = (f"set {LLD_ENV} to an ld.lld of LLVM {need} or later, or install Debian's {package} "
            f"(apt-get install {package})")
    given = environ.get(LLD_ENV)
    if given:
        if not os.access(given, os.X_OK):
            raise TritonCompatError(f"{LLD_ENV}={given!r} is not an executable file; {hint}")
        return given
    if candidates is None:
        candidates = glob.glob("/usr/lib/llvm-*/bin/ld.lld") + ["/usr/bin/ld.lld"]
    found = []
    for path in candidates:
        if os.access(path, os.X_OK):
            m = _LLVM_DIR.search(os.path.realpath(path)) or _LLVM_DIR.search(path)
            found.append((int(m.group(1)) if m else 0, path))
    if not found:
        raise TritonCompatError(f"Triton {version} links AMD code objects with an external "
                                f"ld.lld and none was found; {hint}")
    llvm, path = max(found)
    if llvm < need:
        raise TritonCompatError(f"Triton {version} needs ld.lld of LLVM {need} or later to link "
                                f"AMD code objects; the newest found is {path} (LLVM "
                                f"{llvm or 'unknown'}); {hint}")
    return path


def hsaco_trailing_scratch_ptrs(hsaco: bytes, name: str, num_runtime_args: int,
                                version: str) -> int:
    """Trailing scratch pointers of a compiled AMD kernel: its code object's explicit arguments
    (NT_AMDGPU_METADATA, hidden_* excluded) less the runtime arguments, cross-checked with what
    Triton ``version`` is known to append."""
    from .hsaco import HsacoError, explicit_args, parse_hsaco

    try:
        kernels = parse_hsaco(hsaco).kernel(name)
    except HsacoError as exc:
        raise TritonCompatError(f"the code object of {name} is unreadable: {exc}") from None
    if len(kernels) != 1:
        raise TritonCompatError(f"the code object's metadata note has {len(kernels)} kernels "
                                f"named {name!r}, expected one")
    n_params = len(explicit_args(kernels[0]))
    trailing = n_params - num_runtime_args
    if trailing < 0:
        raise TritonCompatError(f"kernel {name} has {n_params} explicit arguments, fewer than "
                                f"its {num_runtime_args} runtime arguments")
    expected = expected_trailing_scratch_ptrs(version)
    if expected is not None and trailing != expected:
        raise TritonCompatError(
            f"kernel {name}: the code object has {trailing} trailing scratch pointer(s) "
            f"({n_params} explicit arguments - {num_runtime_args} runtime arguments) but Triton "
            f"{version} is known to append {expected}; the bundle would launch with a wrong ABI")
    return trailing


def triton_version() -> str:
    import triton

    return str(triton.__version__)


# --------------------------------------------------------------------------------------------
# What the JIT would specialise
# --------------------------------------------------------------------------------------------
@dataclass(frozen=True)
class ParamInfo:
    """One parameter of a @triton.jit function, as its launcher sees it."""

    name: str
    is_constexpr: bool
    do_not_specialize: bool
    do_not_specialize_on_alignment: bool
    annotation: str  # Triton type word of the annotation ("i64"), "" when none


def jit_params(fn: Any) -> List[ParamInfo]:
    """The parameters of a ``JITFunction`` with their specialisation flags (3.0 - 3.9)."""
    params = getattr(fn, "params", None)
    if params is None:
        if type(fn).__name__ == "InterpretedFunction":
            raise TritonCompatError(
                f"{getattr(fn, '__name__', fn)!r} is interpreted: TRITON_INTERPRET=1 is set, "
                "and Triton's interpreter compiles nothing; unset TRITON_INTERPRET to build a "
                "bundle")
        raise TritonCompatError(f"{fn!r} is not a @triton.jit function (it has no .params)")
    dns = set(getattr(fn, "do_not_specialize", None) or ())
    dns_al = set(getattr(fn, "do_not_specialize_on_alignment", None) or ())
    out = []
    for i, p in enumerate(params):
        name = p.name
        flag = getattr(p, "do_not_specialize", None)
        if flag is None:
            flag = i in dns or name in dns
        flag_al = getattr(p, "do_not_specialize_on_alignment", None)
        if flag_al is None:
            flag_al = i in dns_al or name in dns_al
        ann = getattr(p, "annotation_type", "") or ""
        out.append(ParamInfo(name, bool(p.is_constexpr), bool(flag), bool(flag_al),
                             ann if isinstance(ann, str) else str(ann)))
    return out


def jit_would_mark_divisible(param: ParamInfo, type_word: str) -> bool:
    """Whether Triton's JIT marks this argument ``tt.divisibility 16`` for a 16-aligned pointer.

    The JIT specialises a pointer on 16-byte alignment unless the parameter is in
    ``do_not_specialize`` or ``do_not_specialize_on_alignment``; it never marks a float.
    Integer scalars are handled by :func:`specialisation_problems`.
    """
    return (type_word.startswith("*") and not param.do_not_specialize
            and not param.do_not_specialize_on_alignment)


def specialisation_problems(param: ParamInfo, type_word: str) -> List[str]:
    """Reasons the compiled ABI of this argument could differ from what the JIT launches.

    An integer scalar that the JIT specialises changes the kernel with its value (equal to 1 it
    becomes a constant and leaves the parameter list; divisible by 16 it is marked), and the
    engine cannot promise either, so such an argument must be in ``do_not_specialize``. An
    explicit annotation must name the same type as the declared signature.
    """
    problems = []
    if type_word in INT_TYPE_WORDS and not param.do_not_specialize:
        problems.append(
            f"integer argument {param.name!r} ({type_word}) is specialised by the JIT on its "
            "value (== 1 removes it from the parameter list, % 16 == 0 marks it), which the "
            f"runtime cannot guarantee; add {param.name!r} to do_not_specialize in @triton.jit")
    if param.annotation and param.annotation != type_word and param.annotation != "constexpr":
        problems.append(
            f"argument {param.name!r} is annotated {param.annotation!r} but declared "
            f"{type_word!r} in the kernel spec; make them agree")
    return problems


# --------------------------------------------------------------------------------------------
# Reading the compiled kernel
# --------------------------------------------------------------------------------------------
def expected_trailing_scratch_ptrs(version: str) -> Optional[int]:
    """Implicit pointer parameters Triton ``version`` appends after the user arguments.

    0 for 3.0 - 3.2, 1 (global scratch) for 3.3 - 3.4, 2 (global, then profile scratch) for
    3.5 and later 3.x; None for a version outside 3.x (then only the PTX count stands).
    """
    m = _VERSION.match(str(version))
    if not m:
        return None
    major, minor = int(m.group(1)), int(m.group(2))
    if major != 3:
        return None
    if minor <= 2:
        return 0
    if minor <= 4:
        return 1
    return 2


def ptx_entry_params(ptx: str, entry: Optional[str] = None) -> List[str]:
    """The ``.param`` types of the ``.entry`` named ``entry`` (or of the only one) in ``ptx``."""
    entries = _PTX_ENTRY.findall(ptx)
    if not entries:
        raise TritonCompatError("no .entry found in the compiled PTX")
    if entry is None:
        if len(entries) != 1:
            raise TritonCompatError(
                f"the PTX has {len(entries)} .entry functions "
                f"({', '.join(e for e, _ in entries)}); name the one to read")
        return _PTX_PARAM.findall(entries[0][1])
    for name, params in entries:
        if name == entry:
            return _PTX_PARAM.findall(params)
    raise TritonCompatError(f".entry {entry!r} not found in the PTX; it has "
                            f"{', '.join(e for e, _ in entries)}")


def trailing_scratch_ptrs(ptx: str, entry: str, num_runtime_args: int, version: str) -> int:
    """Trailing scratch pointers of a compiled kernel, read from its PTX and cross-checked."""
    n_params = len(ptx_entry_params(ptx, entry))
    trailing = n_params - num_runtime_args
    if trailing < 0:
        raise TritonCompatError(
            f".entry {entry} has {n_params} .param entries, fewer than its "
            f"{num_runtime_args} runtime arguments")
    expected = expected_trailing_scratch_ptrs(version)
    if expected is not None and trailing != expected:
        raise TritonCompatError(
            f".entry {entry}: the PTX has {trailing} trailing scratch pointer(s) "
            f"({n_params} .param - {num_runtime_args} runtime arguments) but Triton {version} "
            f"is known to append {expected}; the bundle would launch with a wrong ABI")
    return trailing


def kernel_metadata(compiled: Any) -> Dict[str, Any]:
    """Fields of a compiled kernel's metadata the bundle records (absent ones -> 0 / 1)."""
    md = compiled.metadata
    get = (md.get if isinstance(md, dict) else lambda k, d=None: getattr(md, k, d))
    return {
        "entry": str(get("name")),
        "shared_mem": int(get("shared", 0) or 0),
        "num_warps": int(get("num_warps")),
        "num_ctas": int(get("num_ctas", 1) or 1),
        "num_stages": int(get("num_stages")),
        "global_scratch_size": int(get("global_scratch_size", 0) or 0),
        "global_scratch_align": int(get("global_scratch_align", 1) or 1),
        "profile_scratch_size": int(get("profile_scratch_size", 0) or 0),
        "profile_scratch_align": int(get("profile_scratch_align", 1) or 1),
    }
