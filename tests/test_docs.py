"""The documentation: `make docs` builds it warning-free (this test runs the same build), and
every code sample in docs/*.md and README.md runs (tests/test_docs_samples.py, through Sybil).

Skipped where the documentation's tools are missing (make docs installs docs/requirements.txt
into the venv; Doxygen comes from scripts/install-system-deps.sh docs); with
LUMINAMOON_REQUIRE_DOCS=1 (make test) a missing tool fails instead.
"""
from __future__ import annotations

import importlib.util
import os
import re
import shutil
import subprocess
import sys

import pytest

from conftest import require

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
DOCS = os.path.join(ROOT, "docs")
REQUIRE = os.environ.get("LUMINAMOON_REQUIRE_DOCS", "") not in ("", "0")


def _missing():
    mods = [m for m in ("sphinx", "myst_parser", "breathe", "furo", "matplotlib")
            if importlib.util.find_spec(m) is None]
    if shutil.which("doxygen") is None:
        mods.append("doxygen")
    return mods


@pytest.fixture(scope="module")
def built(tmp_path_factory):
    missing = _missing()
    if missing:
        if REQUIRE:
            pytest.fail(f"the documentation needs {missing}: make docs installs them")
        require("docs tools")
    out = tmp_path_factory.mktemp("html")
    proc = subprocess.run([sys.executable, "-m", "sphinx", "-b", "html", "-W", "--keep-going",
                           "-q", DOCS, str(out)], capture_output=True, text=True, timeout=900)
    assert proc.returncode == 0, f"sphinx -W failed:\n{proc.stdout}\n{proc.stderr}"
    return str(out)


def test_the_site_builds_without_a_warning_and_has_every_page(built):
    for page in ("index", "getting-started", "install", "user-guide", "tdclm", "distributed",
                 "aot", "bundle-format", "triton-abi", "c-api", "cpp-api", "python-api",
                 "compatibility", "performance", "internals", "changelog"):
        assert os.path.isfile(os.path.join(built, page + ".html")), page


def _text(built, page):
    with open(os.path.join(built, page + ".html"), encoding="utf-8") as f:
        return f.read()


def test_the_api_pages_come_from_docstrings_and_headers(built):
    py = _text(built, "python-api")
    assert "stochastic_rounding" in py and "skipped_steps" in py  # LuminaMoon's docstring
    c = _text(built, "c-api")
    assert "lv_optimizer_create" in c and "lv_last_error" in c
    cpp = _text(built, "cpp-api")
    assert "TorchOptimizer" in cpp and "with_lr" in cpp


def test_the_supported_range_is_the_matrix_list(built):
    sys.path.insert(0, os.path.join(ROOT, "scripts"))
    import test_matrix

    lo, hi = test_matrix.PAIRS[0], test_matrix.PAIRS[-1]
    torch_range = f"{'.'.join(lo.torch.split('.')[:2])}-{'.'.join(hi.torch.split('.')[:2])}"
    text = re.sub(r"<[^>]+>", "", _text(built, "compatibility"))
    assert f"torch {torch_range}" in text and f"Triton {lo.triton}-{hi.triton}" in text


def test_the_performance_page_is_made_from_the_results_files(built):
    import csv

    text = _text(built, "performance")
    path = os.path.join(ROOT, "benchmarks", "results", "2026-12-06-h100-sr-final.csv")
    with open(path, newline="") as f:
        row = next(r for r in csv.DictReader(f) if r["impl"] == "torchao-adamw-bf16sr")
    shown = (f"{float(row['us_per_step']):.1f}\u00a0us "
             f"({100 * float(row['ceiling_fraction']):.1f}\u00a0%)")
    assert shown in text
    assert os.path.isfile(os.path.join(built, "_images", "2026-12-06-h100-sr-final.png"))


def test_the_readme_is_short_and_links_into_the_docs():
    with open(os.path.join(ROOT, "README.md"), encoding="utf-8") as f:
        text = f.read()
    assert len(text.splitlines()) <= 150
    assert "make demo" in text and "make test" in text and "pip install" in text
    for link in re.findall(r"\]\(((?:docs|benchmarks/results)/[^)#]+)", text):
        assert os.path.exists(os.path.join(ROOT, link)), link
    assert "docs/getting-started.md" in text and "docs/user-guide.md" in text
