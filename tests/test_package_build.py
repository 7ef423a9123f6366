"""The installed package is complete: `make test` (and CI) require the compiled native module,
so its tests can never be skipped silently for want of a build."""
from __future__ import annotations

import importlib
import os
import subprocess
import sys

from conftest import needs

@needs("required native")
def test_native_module_is_built_and_importable():
    native = importlib.import_module("luminamoon._luminav")
    assert isinstance(native.has_cuda_driver(), bool)
    # the engine inside answers: variant keys for the default float32 combination
    assert hasattr(native, "CpuGroup")


def test_import_has_no_side_effects():
    """Importing luminamoon defines things only: no Triton, no native module, no CUDA init."""
    code = ("import sys, luminamoon, torch; "
            "print('triton' in sys.modules, 'luminamoon._luminav' in sys.modules, "
            "torch.cuda.is_initialized())")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         env={**os.environ, "PYTHONPATH": os.pathsep.join(sys.path)})
    assert out.returncode == 0, out.stderr
    assert out.stdout.split() == ["False", "False", "False"]


@needs("required native")
def test_pip_install_puts_luminav_on_the_path():
    """`pip install .` installs the luminav CLI beside this interpreter (the scripts folder)."""
    import shutil

    import luminamoon

    exe = shutil.which("luminav", path=os.path.dirname(sys.executable))
    assert exe is not None, f"no luminav in {os.path.dirname(sys.executable)}"
    out = subprocess.run([exe, "--version"], capture_output=True, text=True, timeout=60)
    assert out.returncode == 0 and out.stdout.startswith(f"luminav {luminamoon.__version__}")


def _child(code: str) -> str:
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300,
                         env={**os.environ, "PYTHONPATH": os.pathsep.join(sys.path)})
    assert out.returncode == 0, out.stderr
    return out.stdout


def test_import_luminamoon_adds_at_most_0_2_s_to_import_torch():
    """Measured in fresh processes (the fastest of three: other work on the machine only adds)."""
    code = ("import time; t0 = time.perf_counter(); import torch; t1 = time.perf_counter(); "
            "import luminamoon; t2 = time.perf_counter(); print(t1 - t0, t2 - t1)")
    runs = [tuple(map(float, _child(code).split())) for _ in range(3)]
    added = min(r[1] for r in runs)
    assert added <= 0.2, f"import luminamoon took {added:.3f} s on top of import torch ({runs})"


def test_the_aot_path_loads_no_triton_module_of_luminamoon():
    """backend="aot" (optimizer, backend, default bundle lookup) never imports the kernels'
    Triton source, the triton backend or the bundle builder: Triton is not needed at run time."""
    out = _child(
        "import sys, os, tempfile, json, torch\n"
        "from luminamoon import LuminaMoon\n"
        "d = tempfile.mkdtemp(); open(os.path.join(d, 'manifest.json'), 'w').write('{}')\n"
        "LuminaMoon([torch.nn.Parameter(torch.ones(2))], backend='aot', aot_bundle=d)\n"
        "try:\n"
        "    from luminamoon.optimizer.backends import get_backend\n"
        "    get_backend('aot', 'cuda', aot_bundle=d)\n"
        "except ImportError:\n"
        "    pass  # no native module in this build: the imports before it are still checked\n"
        "print(sorted(m for m in sys.modules if m.startswith('luminamoon.')))\n")
    loaded = eval(out.strip())  # noqa: S307 - our own child's repr of a list of names
    for name in ("luminamoon.kernels.tdclm", "luminamoon.kernels.catalog",
                 "luminamoon.optimizer.backends.triton", "luminamoon.aot.builder",
                 "luminamoon.aot.compat"):
        assert name not in loaded, f"{name} was imported on the aot path: {loaded}"
