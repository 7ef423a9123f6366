"""Sphinx configuration of LuminaMoon's documentation (`make docs`: warnings are errors).

Markdown pages are read by MyST-Parser; the Python API comes from docstrings (autodoc, napoleon);
the C and C++ API from the public headers through Doxygen's XML and Breathe (Doxygen runs here,
before the build); the performance tables and charts are made at build time from the CSV files
in benchmarks/results/ (docs/_ext/perf.py); the supported torch/Triton range is read from
scripts/test_matrix.py, the list the compatibility matrix runs.
"""
from __future__ import annotations

import os
import re
import subprocess
import sys

DOCS = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(DOCS)
sys.path.insert(0, os.path.join(ROOT, "python"))
sys.path.insert(0, os.path.join(DOCS, "_ext"))
sys.path.insert(0, os.path.join(ROOT, "scripts"))

import test_matrix  # noqa: E402  (scripts/test_matrix.py: the pairs the matrix installs)

with open(os.path.join(ROOT, "VERSION"), encoding="utf-8") as f:
    release = version = f.read().strip()

project = "LuminaMoon"
author = "the LuminaMoon authors"
copyright = "the LuminaMoon authors"

extensions = [
    "myst_parser",
    "sphinx.ext.autodoc",
    "sphinx.ext.napoleon",
    "breathe",
    "perf",
]

source_suffix = {".md": "markdown", ".rst": "restructuredtext"}
root_doc = "index"
# compatibility-table.md is written by scripts/test_matrix.py and included by compatibility.md
exclude_patterns = ["_build", "_doxygen", "_generated", "compatibility-table.md"]

html_theme = "furo"
html_title = f"LuminaMoon {release}"
html_static_path = ["_static"]

myst_enable_extensions = ["substitution", "colon_fence"]
myst_heading_anchors = 3


def _range(values):
    return f"{values[0]}-{values[-1]}" if len(values) > 1 else values[0]


_torch = [".".join(p.torch.split(".")[:2]) for p in test_matrix.PAIRS]
_triton = [p.triton for p in test_matrix.PAIRS]
myst_substitutions = {
    "version": release,
    "torch_range": _range(_torch),
    "triton_range": _range(_triton),
}

autodoc_member_order = "bysource"
autodoc_typehints = "description"
autodoc_mock_imports = ["triton"]
napoleon_google_docstring = True
napoleon_numpy_docstring = False

# Breathe over the Doxygen XML of the public headers (docs/Doxyfile writes docs/_doxygen/xml).
breathe_projects = {"luminav": os.path.join(DOCS, "_doxygen", "xml")}
breathe_default_project = "luminav"
# luminav.h is C; error.h and cuda_driver.h are C++ headers despite their suffix.
breathe_domain_by_extension = {"h": "cpp", "hpp": "cpp"}
breathe_domain_by_file_pattern = {"*/luminav/luminav.h": "c"}
breathe_default_members = ("members",)


def _run_doxygen(app):
    out = os.path.join(DOCS, "_doxygen")
    os.makedirs(out, exist_ok=True)
    try:
        proc = subprocess.run(["doxygen", os.path.join(DOCS, "Doxyfile")], cwd=DOCS,
                              capture_output=True, text=True)
    except FileNotFoundError:
        raise RuntimeError("the C/C++ API pages need Doxygen: apt-get install doxygen "
                           "(scripts/install-system-deps.sh docs installs it)") from None
    if proc.returncode != 0:
        raise RuntimeError(f"doxygen failed (exit {proc.returncode}):\n{proc.stderr}")
    warnings = [line for line in proc.stderr.splitlines() if re.search(r"warning:", line)]
    if warnings:
        raise RuntimeError("doxygen warned:\n" + "\n".join(warnings))


def setup(app):
    app.connect("builder-inited", _run_doxygen)
