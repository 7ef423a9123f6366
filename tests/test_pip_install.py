"""`pip install git+...` (and so `pip install .`) as a new user runs it: pip's default build
isolation, a fresh virtual environment, the sources as a fresh clone has them.

The checkout's files (tracked, and untracked ones git does not ignore: what a commit of this tree
holds) are copied into a new git repository, which a fresh venv installs with
``pip install -v git+file://...``: pip clones it and builds it in an isolated environment holding
only the build requirements of pyproject.toml (scikit-build-core, nanobind, nlohmann-json from
PyPI; no Triton, no torch). Then: the `luminav` command runs from the venv's bin/, the compiled
module loads and answers, the wheel has no default bundle, and the build said so in its one line
naming `luminamoon aot build`. (Importing the package and a CPU step need torch: tests/test_wheel.py
does them in a fresh venv.)

Marker ``slow``: the C++ build takes 69 s of CPU (3.5 minutes of wall time on two busy cores);
pip's cache keeps the build requirements' downloads.
"""
from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys

import pytest

from conftest import require

from native_build import ROOT, run

# the build's fixture may take longer than pyproject's per-test limit on a busy machine (8 min
# measured while a bundle compiled beside it)
pytestmark = [pytest.mark.slow, pytest.mark.timeout(1800)]

VERSION = open(os.path.join(ROOT, "VERSION"), encoding="utf-8").read().strip()


def _tree_files():
    out = subprocess.run(["git", "ls-files", "-co", "--exclude-standard", "-z"], cwd=ROOT,
                         capture_output=True, text=True, check=True)
    return [f for f in out.stdout.split("\0") if f and os.path.isfile(os.path.join(ROOT, f))]


@pytest.fixture(scope="module")
def installed(tmp_path_factory):
    if shutil.which("git") is None:
        require("git")
    src = tmp_path_factory.mktemp("clone")
    for f in _tree_files():
        os.makedirs(os.path.join(src, os.path.dirname(f)), exist_ok=True)
        shutil.copy2(os.path.join(ROOT, f), os.path.join(src, f))
    git = ["git", "-c", "user.name=test", "-c", "user.email=test@localhost", "-C", str(src)]
    run([*git, "init", "-q"])
    run([*git, "add", "-A"])
    run([*git, "commit", "-q", "-m", "snapshot"])

    venv = tmp_path_factory.mktemp("venv")
    run([sys.executable, "-m", "venv", str(venv)])
    py = os.path.join(venv, "bin", "python")
    env = {k: v for k, v in os.environ.items()
           if k not in ("PYTHONPATH", "PYTHONHOME", "PIP_NO_BUILD_ISOLATION",
                        "LUMINAMOON_BUNDLE_CACHE")}
    # --no-deps: torch is the run time's, not the build's (the build environment pip makes is
    # what is tested); isolation is pip's default and stays on.
    out = run([py, "-m", "pip", "install", "-v", "--no-deps", f"git+file://{src}"], env=env,
              timeout=1800)
    return dict(venv=str(venv), py=py, env=env, log=out.stdout)


def test_the_build_was_isolated_and_took_its_headers_from_pypi(installed):
    log = installed["log"]
    assert re.search(r"Installing build dependencies", log), log[-2000:]
    assert "nlohmann-json" in log  # a build requirement from PyPI
    assert "Successfully installed luminamoon" in log


def test_without_triton_the_wheel_says_in_one_line_how_to_get_a_bundle(installed):
    lines = [l for l in installed["log"].splitlines() if "Default AOT bundle: none" in l]
    assert len(lines) == 1, installed["log"][-3000:]
    assert "luminamoon aot build" in lines[0] and "cmake/default_bundle.cmake" in lines[0]
    site = subprocess.run([installed["py"], "-c", "import sysconfig; print(sysconfig.get_paths()['platlib'])"],
                          capture_output=True, text=True, check=True).stdout.strip()
    assert os.path.isdir(os.path.join(site, "luminamoon"))
    assert not os.path.exists(os.path.join(site, "luminamoon", "bundle", "manifest.json"))


def test_the_cli_and_the_module_run(installed):
    luminav = os.path.join(installed["venv"], "bin", "luminav")
    out = subprocess.run([luminav, "--version"], capture_output=True, text=True, timeout=60)
    assert out.returncode == 0 and out.stdout.startswith(f"luminav {VERSION}"), out
    # the compiled module, loaded by itself (the package's __init__ imports torch)
    code = ("import glob, importlib.util, os, sysconfig\n"
            "site = sysconfig.get_paths()['platlib']\n"
            "path, = glob.glob(os.path.join(site, 'luminamoon', '_luminav*.so'))\n"
            "spec = importlib.util.spec_from_file_location('luminamoon._luminav', path)\n"
            "m = importlib.util.module_from_spec(spec); spec.loader.exec_module(m)\n"
            "print(type(m.has_cuda_driver()).__name__, hasattr(m, 'CpuGroup'))\n")
    out = subprocess.run([installed["py"], "-c", code], capture_output=True, text=True,
                         env=installed["env"], timeout=60)
    assert out.returncode == 0, out.stderr
    assert out.stdout.split() == ["bool", "True"]
