"""Every code sample of the documentation (docs/*.md, README.md) runs, through Sybil.

Python blocks run in order, one namespace per page; bash blocks run with ``bash -e`` from the
repository root, with this interpreter's bin folder first on PATH. A sample that cannot run here
is marked in the page with ``<!-- skip: next "reason" -->`` (or ``if(not CUDA, reason=...)``
for GPU samples, skipped where no CUDA device is); C, C++ and CMake fragments are not run here
(examples/cpp and tests/test_cmake_install.py build whole programs). Skipped where Sybil is
missing (make docs installs docs/requirements.txt).
"""
from __future__ import annotations

import glob
import os
import pathlib
import re
import shutil
import subprocess
import sys
import unittest

import pytest

from conftest import require

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
PAGES = sorted(glob.glob(os.path.join(ROOT, "docs", "*.md"))) + [os.path.join(ROOT, "README.md")]
REQUIRE = os.environ.get("LUMINAMOON_REQUIRE_DOCS", "") not in ("", "0")


def _run_bash(example):
    # a sample that installs or builds must be marked skip with the test that covers it: it
    # would change this environment
    assert not re.search(r"\b(pip install|make \w|cmake --install)", example.parsed), (
        f"{example.path}:{example.line}: a sample that installs or builds runs only under a "
        "<!-- skip: next \"reason\" --> marker naming the test that covers it")
    env = dict(os.environ)
    env["PATH"] = os.path.dirname(sys.executable) + os.pathsep + env.get("PATH", "")
    proc = subprocess.run(["bash", "-e", "-c", example.parsed], cwd=ROOT, env=env,
                          capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, (f"{example.path}:{example.line}: exit {proc.returncode}\n"
                                  f"{proc.stdout}\n{proc.stderr}")


def _sybil():
    try:
        from sybil import Sybil
        from sybil.parsers.markdown import CodeBlockParser, PythonCodeBlockParser, SkipParser
    except ImportError:
        if REQUIRE:
            pytest.fail("the documentation's samples need sybil: make docs installs it")
        require("sybil")

    def setup(namespace):
        import torch

        namespace["CUDA"] = torch.cuda.is_available()
        from luminamoon.aot.default import packaged_bundle_dir

        # the installed package with its bundle and the luminav command (make install's)
        namespace["INSTALLED"] = (packaged_bundle_dir() is not None and shutil.which(
            "luminav", path=os.path.dirname(sys.executable)) is not None)

    return Sybil(parsers=[PythonCodeBlockParser(), CodeBlockParser("bash", _run_bash),
                          SkipParser()]), setup


@pytest.mark.parametrize("page", PAGES, ids=[os.path.relpath(p, ROOT) for p in PAGES])
def test_the_samples_of_a_page_run(page):
    sybil, setup = _sybil()
    document = sybil.parse(pathlib.Path(page))
    setup(document.namespace)
    ran, skipped = 0, []
    for example in document:
        try:
            example.evaluate()
        except unittest.SkipTest as e:
            skipped.append(f"line {example.line}: {e}")
            continue
        ran += 1
    if ran == 0 and skipped:
        pytest.skip("; ".join(skipped))
