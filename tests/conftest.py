"""Shared test data: shapes, dtypes, tolerances, and helpers.

Every skip of the suite is decided here, with its reason.
"""
from __future__ import annotations

import os
import sys

import pytest
import torch

import importlib.util

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

SKIP_NO_TRITON_REASON = "triton is not installed"


def triton_available() -> bool:
    """Whether Triton is installed, without importing it: a module that runs kernels under
    TRITON_INTERPRET=1 must set the variable before triton is first imported."""
    import importlib.util

    return importlib.util.find_spec("triton") is not None


requires_triton = pytest.mark.skipif(not triton_available(), reason=SKIP_NO_TRITON_REASON)


def triton_interpreted() -> bool:
    """Whether this session's Triton interprets kernels (TRITON_INTERPRET=1, read by Triton when
    a kernel is decorated): then nothing can be compiled ahead of time."""
    return os.environ.get("TRITON_INTERPRET", "0") not in ("", "0")


# Tests that compile kernels (the AOT builder, its bundles, the PTX checks).
requires_compiled_triton = [
    requires_triton,
    pytest.mark.skipif(triton_interpreted(), reason="TRITON_INTERPRET=1: Triton's interpreter "
                       "compiles nothing, so no bundle can be built in this session"),
]


def native_available() -> bool:
    """Whether the compiled module luminamoon._luminav imports (the cpu and aot backends)."""
    try:
        import luminamoon._luminav  # noqa: F401
    except ImportError:
        return False
    return True


# The optimizer backends that step CPU tensors in this process (Triton's CPU rows run in the
# interpreter's child process, test_triton_kernels.py).
CPU_BACKENDS = ["reference"] + (["cpu"] if native_available() else [])


def should_skip(backend: str, device: str) -> "str | None":
    """The one place a row of the backend matrix (test_backends.py) is excluded: the reason,
    or None when the row runs here. Each rule in order:"""
    # 1. a device this machine lacks
    if device == "cuda" and not torch.cuda.is_available():
        return "needs a CUDA GPU"
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
    """Skips unless FSDP2's fully_shard can run on this machine: it exists from torch 2.4, but
    on CPU its first forward fails before torch 2.7 (2.4 and 2.5 create CUDA streams in
    FSDPCommContext.init; 2.6's all-gather calls record_event on a CPU stream, which has none),
    so on a machine without a GPU it needs torch >= 2.7."""
    try:
        from torch.distributed.fsdp import fully_shard  # noqa: F401
    except ImportError:
        pytest.importorskip("torch.distributed._composable.fsdp")
    version = tuple(int(x) for x in torch.__version__.split("+")[0].split(".")[:2])
    if version < (2, 7) and not torch.cuda.is_available():
        pytest.skip(f"FSDP2 of torch {torch.__version__} cannot take a step on CPU (CUDA "
                    f"streams in 2.4/2.5, a CPU stream without record_event in 2.6); without a "
                    f"GPU it runs from torch 2.7")


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
