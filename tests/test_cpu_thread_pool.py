"""The cpu backend runs its passes on the OpenMP team torch itself uses (the one its CPU kernels
run on) when torch has loaded an OpenMP runtime, with an explicit thread count too, else on
threads of its own (engine/thread_pool.h); LUMINAV_CPU_POOL=threads keeps its own. Either pool
gives the same bits."""
from __future__ import annotations

import os
import re
import subprocess
import sys
import textwrap

import torch

from conftest import needs

pytestmark = needs("native")

# A few steps of bf16 params and moments with stochastic rounding and the clip (both passes,
# the direction cache, every rounding stream), then a digest of every tensor's bits.
_RUN = textwrap.dedent("""
    import hashlib, os, sys, torch
    from luminamoon import LuminaMoon
    from luminamoon.optimizer.backends.cpu import CpuBackend
    threads = int(os.environ.get("LUMINAMOON_TEST_THREADS", "0"))  # 0: the backend's default
    torch.manual_seed(0)
    params = [torch.nn.Parameter(torch.randn(s).to(torch.bfloat16))
              for s in [(300, 77), (4099,), (5,), (64, 64)]]
    opt = LuminaMoon(params, lr=1e-2, backend=CpuBackend(num_threads=threads) if threads else "cpu",
                     seed=3, state_dtype=torch.bfloat16,
                     clip=1.0, nonfinite="skip")
    for step in range(4):
        for p in params:
            p.grad = torch.randn(p.shape).to(torch.bfloat16)
        opt.step()
    native = next(v.native for v in opt._plan.groups[0].cache.values() if hasattr(v, "native"))
    h = hashlib.sha256()
    for p in params:
        for t in (p.detach(), opt.state[p]["exp_avg"], opt.state[p]["exp_avg_sq"]):
            h.update(t.view(torch.int16).numpy().tobytes())
    print(native.thread_pool, native.num_threads, h.hexdigest(), sep="|")
""")


def _run(**env) -> list:
    """[pool kind, threads, digest] of _RUN in a fresh interpreter, LUMINAV_CPU_POOL unset
    unless given."""
    base = {k: v for k, v in os.environ.items() if k != "LUMINAV_CPU_POOL"}
    out = subprocess.run([sys.executable, "-c", _RUN], capture_output=True, text=True,
                         env={**base, **env}, timeout=120)
    assert out.returncode == 0, out.stderr[-2000:]
    return out.stdout.strip().splitlines()[-1].split("|")


def _torch_has_openmp() -> bool:
    return "OpenMP" in torch.__config__.parallel_info() and sys.platform.startswith("linux")


@needs("openmp")
def test_the_passes_run_on_torchs_openmp_team_and_give_the_bits_of_its_own_threads():
    kind, threads, digest = _run()
    assert kind.startswith("openmp (") and "omp" in kind, kind
    assert int(threads) == torch.get_num_threads()
    own = _run(LUMINAV_CPU_POOL="threads")
    assert own[0] == "threads"
    assert own[2] == digest  # the same bits on either pool
    one = _run(OMP_NUM_THREADS="1")  # torch.set_num_threads(1) in effect: a team of one
    assert one[0] == kind and one[1] == "1" and one[2] == digest


@needs("openmp")
def test_an_explicit_thread_count_runs_on_a_team_of_that_many_with_the_same_bits():
    # (the pool's own threads competed for the cores with torch's spinning team: on 2 cores a
    # step on two of them took longer than on one)
    kind, _, digest = _run()
    for n in ("1", "2", "3"):
        got = _run(LUMINAMOON_TEST_THREADS=n)
        assert got == [kind, n, digest]
    own = _run(LUMINAMOON_TEST_THREADS="2", LUMINAV_CPU_POOL="threads")
    assert own == ["threads", "2", digest]


def test_doctor_names_the_cpu_engines_width_and_pool():
    out = subprocess.run([sys.executable, "-m", "luminamoon", "doctor"], capture_output=True,
                         text=True, timeout=120)
    m = re.search(r"^cpu engine +(avx512|avx2|baseline), (openmp \(lib[A-Za-z0-9._-]+\)|threads), "
                  r"(\d+) threads?$", out.stdout, re.M)
    assert m, out.stdout + out.stderr
    from luminamoon import _luminav

    assert m.group(1) == _luminav.cpu_isa()
    assert (m.group(2), int(m.group(3))) == tuple(_luminav.cpu_thread_pool())
    if _torch_has_openmp() and not os.environ.get("LUMINAV_CPU_POOL"):
        assert m.group(2).startswith("openmp (")


def test_an_unknown_pool_name_is_refused_naming_it_and_changes_nothing():
    code = textwrap.dedent("""
        import torch
        from luminamoon import LuminaMoon
        p = torch.nn.Parameter(torch.randn(10))
        before = p.detach().clone()
        p.grad = torch.randn(10)
        opt = LuminaMoon([p], backend="cpu")
        try:
            opt.step()
        except ValueError as exc:
            print("refused:", exc)
        print("unchanged:", torch.equal(p.detach(), before))
    """)
    base = {k: v for k, v in os.environ.items() if k != "LUMINAV_CPU_POOL"}
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         env={**base, "LUMINAV_CPU_POOL": "omp"}, timeout=120)
    assert out.returncode == 0, out.stderr[-2000:]
    assert "refused: LUMINAV_CPU_POOL='omp' is not a pool: use threads" in out.stdout, out.stdout
    assert "unchanged: True" in out.stdout
