"""The wheel, as a user gets it: built by `make wheel`'s script (scripts/build_wheel.py: `python -m
build --wheel`, then `auditwheel repair` into a manylinux wheel, its tag and its size below
PyPI's 100 MB checked), installed ALONE into a fresh virtual environment (with torch and numpy;
no Triton, no source tree on the path, no compiler on PATH, run from an empty folder), and
smoke-tested there: import, the `luminav` command on PATH, `luminamoon doctor`, one CPU step, and
the default bundle found by backend="aot" without an aot_bundle argument and passing `luminav
verify`.

The wheel's own contents are checked too: the module, the CLI as a script, the default bundle
for every arch of luminamoon.aot.default.ARCHS, and nothing of the C/C++ install (headers,
libluminav, CMake files).

Marker ``slow``: the wheel build (its default bundle comes from the cache that `pip install .`
fills) and a fresh environment take a few minutes.
"""
from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
import textwrap
import zipfile

import pytest

from conftest import require
from native_build import ROOT, run

pytestmark = pytest.mark.slow

VERSION = open(os.path.join(ROOT, "VERSION"), encoding="utf-8").read().strip()


def _archs():
    """ARCHS of python/luminamoon/aot/default.py, read from the file (the one list)."""
    text = open(os.path.join(ROOT, "python", "luminamoon", "aot", "default.py"),
                encoding="utf-8").read()
    return [int(a) for a in re.search(r"^ARCHS = \(([0-9, ]+)\)", text, re.M).group(1).split(",")]


@pytest.fixture(scope="module")
def wheel(tmp_path_factory) -> str:
    require("build", "auditwheel")
    out = tmp_path_factory.mktemp("dist")
    raw = tmp_path_factory.mktemp("raw")
    # --no-isolation inside: the bundle is compiled (or taken from build/bundle-cache) with this
    # environment's Triton and torch
    log = run([sys.executable, os.path.join(ROOT, "scripts", "build_wheel.py"), "--out", str(out),
               "--raw", str(raw)], timeout=3600).stdout
    print(log.splitlines()[-1])  # the wheel's size, cubins and grafted libraries
    wheels = [f for f in os.listdir(out) if f.endswith(".whl")]
    assert len(wheels) == 1, wheels
    return os.path.join(out, wheels[0])


def test_the_wheel_is_manylinux_below_pypis_limit_and_carries_its_libraries(wheel):
    name = os.path.basename(wheel)
    assert re.search(r"-manylinux_\d+_\d+_x86_64\.whl$|-manylinux_\d+_\d+_aarch64\.whl$", name), name
    assert os.path.getsize(wheel) < 100 * 1000 * 1000
    with zipfile.ZipFile(wheel) as z:
        names = z.namelist()
    # OpenSSL's libcrypto is not in any manylinux policy: auditwheel copied it in
    assert any(re.fullmatch(r"luminamoon\.libs/libcrypto-[0-9a-f]+\.so\.\d+", n) for n in names), \
        [n for n in names if ".libs/" in n]


@pytest.fixture(scope="module")
def venv(wheel, tmp_path_factory):
    """A fresh venv with torch (this environment's version) and numpy, then the wheel alone."""
    import torch

    root = tmp_path_factory.mktemp("venv")
    run([sys.executable, "-m", "venv", str(root)])
    py = os.path.join(root, "bin", "python")
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "PYTHONHOME")}
    run([py, "-m", "pip", "install", "-q", f"torch=={torch.__version__}", "numpy"], env=env,
        timeout=1800)
    run([py, "-m", "pip", "install", "-q", "--no-deps", wheel], env=env)
    # no compiler on PATH: the venv's bin/ and a folder with only the shell's basic tools
    tools = tmp_path_factory.mktemp("tools")
    for tool in ("sh", "bash", "env", "uname", "cat"):
        found = shutil.which(tool)
        if found:
            os.symlink(found, os.path.join(tools, tool))
    env["PATH"] = os.path.join(root, "bin") + os.pathsep + str(tools)
    for compiler in ("cc", "gcc", "c++", "g++", "clang", "clang++", "ld"):
        assert shutil.which(compiler, path=env["PATH"]) is None, compiler
    env.pop("TRITON_INTERPRET", None)
    env.pop("LUMINAMOON_AOT_BUNDLE", None)
    cwd = tmp_path_factory.mktemp("elsewhere")  # no checkout below or above
    return dict(root=str(root), py=py, env=env, cwd=str(cwd))


def _in(venv, *cmd, check=True):
    out = subprocess.run(list(cmd), env=venv["env"], cwd=venv["cwd"], capture_output=True,
                         text=True, timeout=600)
    if check:
        assert out.returncode == 0, f"{cmd}: exit {out.returncode}\n{out.stdout}\n{out.stderr}"
    return out


def test_the_wheel_holds_the_module_the_cli_and_the_bundle(wheel):
    with zipfile.ZipFile(wheel) as z:
        names = z.namelist()
        manifest = json.loads(z.read("luminamoon/bundle/manifest.json"))
    assert any(re.fullmatch(r"luminamoon/_luminav\..*\.so", n) for n in names), names[:20]
    assert f"luminamoon-{VERSION}.data/scripts/luminav" in names
    cubins = [n for n in names if n.startswith("luminamoon/bundle/") and n.endswith(".cubin")]
    assert len(cubins) == len(manifest["kernels"]) > 0
    archs = sorted({e["target"]["arch"] for e in manifest["kernels"]})
    assert archs == sorted(_archs())
    per_arch = {a: {e["key"] for e in manifest["kernels"] if e["target"]["arch"] == a} for a in archs}
    assert all(keys == per_arch[archs[0]] for keys in per_arch.values())  # every arch complete
    # the C/C++ package of `cmake --install` stays out of the wheel
    assert not [n for n in names if n.endswith((".h", ".hpp", ".cmake", ".pc", ".a"))
                or "libluminav" in n]


def test_import_cli_doctor_and_a_cpu_step_in_a_fresh_venv(venv):
    out = _in(venv, venv["py"], "-c", textwrap.dedent("""\
        import importlib.util, sys, torch, luminamoon
        from luminamoon import LuminaMoon
        print("file", luminamoon.__file__)
        print("version", luminamoon.__version__)
        print("triton", importlib.util.find_spec("triton") is not None)
        p = torch.nn.Parameter(torch.ones(5)); p.grad = torch.full((5,), 0.5)
        opt = LuminaMoon([p], lr=0.1, backend="cpu", seed=3)
        opt.step()
        print("step", int(opt.state[p]["step"]), float(p[0]))
        """))
    lines = dict(line.split(" ", 1) for line in out.stdout.splitlines())
    assert lines["file"].startswith(venv["root"]), lines["file"]  # the wheel's, not the checkout's
    assert lines["version"] == VERSION
    assert lines["triton"] == "False"  # nothing of this needs Triton
    step, p0 = lines["step"].split()
    assert step == "1" and float(p0) < 1.0

    luminav = _in(venv, "luminav", "--version").stdout
    assert luminav.startswith(f"luminav {VERSION}")
    which = _in(venv, venv["py"], "-c", "import shutil; print(shutil.which('luminav'))").stdout
    assert which.strip() == os.path.join(venv["root"], "bin", "luminav")

    doctor = _in(venv, "luminamoon", "doctor").stdout
    assert re.search(r"default bundle +\S+/luminamoon/bundle \(shipped with the package\)", doctor)
    assert re.search(r"archs +" + re.escape(", ".join(f"sm_{a}" for a in sorted(_archs()))), doctor)
    assert "verified" in doctor and "REFUSED" not in doctor
    assert doctor.strip().splitlines()[-1].startswith("verdict: OK (CPU)"), doctor


def test_backend_aot_finds_the_default_bundle_and_it_verifies(venv):
    out = _in(venv, venv["py"], "-c", textwrap.dedent("""\
        import sys, torch
        from luminamoon import LuminaMoon
        from luminamoon.optimizer.backends import get_backend
        opt = LuminaMoon([torch.nn.Parameter(torch.ones(3))], backend="aot")  # no aot_bundle
        print("bundle", get_backend("aot", "cuda").bundle_dir)
        print("triton", "triton" in sys.modules)
        """))
    lines = dict(line.split(" ", 1) for line in out.stdout.splitlines())
    bundle = lines["bundle"]
    assert bundle.startswith(venv["root"]) and bundle.endswith(os.path.join("luminamoon", "bundle"))
    assert lines["triton"] == "False"
    assert _in(venv, "luminamoon", "aot", "default").stdout.strip() == bundle
    verify = _in(venv, "luminav", "verify", bundle).stdout
    assert re.search(r"ok  schema, (keys, )?sha256 of \d+ cubins", verify), verify
