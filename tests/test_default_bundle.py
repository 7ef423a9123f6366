"""The default bundle: where backend="aot" finds it without an aot_bundle argument (the bundle the
wheel ships, or $LUMINAMOON_AOT_BUNDLE), the errors when there is none, `luminamoon aot
default`, and `luminamoon doctor`'s report and verdict (a damaged bundle fails it).

With LUMINAMOON_REQUIRE_NATIVE=1 (make test) the installed package must ship the bundle.
"""
from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys

import pytest
import torch

from conftest import needs, skip_because
from luminamoon import LuminaMoon
from luminamoon.aot import default as dflt

REQUIRE_NATIVE = os.environ.get("LUMINAMOON_REQUIRE_NATIVE", "") not in ("", "0")
needs_native = needs("native")


def _cli(*args, env=None):
    return subprocess.run([sys.executable, "-m", "luminamoon", *args], capture_output=True,
                          text=True, timeout=300,
                          env={**os.environ, "PYTHONPATH": os.pathsep.join(sys.path), **(env or {})})


@pytest.fixture
def no_env_bundle(monkeypatch):
    monkeypatch.delenv(dflt.ENV_VAR, raising=False)


@pytest.fixture
def packaged(no_env_bundle):
    path = dflt.packaged_bundle_dir()
    if path is None:
        if REQUIRE_NATIVE:
            pytest.fail("the installed luminamoon ships no default bundle (luminamoon/bundle/); "
                        "`pip install .` builds one")
        skip_because("no packaged bundle")
    return path


def _tiny_bundle(source: str, dest) -> str:
    """A copy of ``source`` that keeps only its first kernel (manifest and cubin)."""
    manifest = json.load(open(os.path.join(source, "manifest.json"), encoding="utf-8"))
    manifest["kernels"] = manifest["kernels"][:1]
    os.makedirs(dest)
    shutil.copy(os.path.join(source, manifest["kernels"][0]["cubin"]), dest)
    with open(os.path.join(dest, "manifest.json"), "w", encoding="utf-8") as f:
        json.dump(manifest, f)
    return str(dest)


def test_cubin_loads_on():
    assert dflt.cubin_loads_on(80, 80) and dflt.cubin_loads_on(80, 86) and dflt.cubin_loads_on(80, 89)
    assert not dflt.cubin_loads_on(86, 80) and not dflt.cubin_loads_on(80, 90)
    # sm_90 and newer are Triton's arch-specific sm_XYa targets: that arch only
    assert dflt.cubin_loads_on(90, 90) and not dflt.cubin_loads_on(100, 103)
    assert dflt.cubin_loads_on(103, 103) and not dflt.cubin_loads_on(120, 121)


def test_the_packaged_bundle_holds_every_arch(packaged):
    manifest = json.load(open(os.path.join(packaged, "manifest.json"), encoding="utf-8"))
    archs = sorted({e["target"]["arch"] for e in manifest["kernels"]})
    assert archs == sorted(dflt.ARCHS)
    assert os.path.dirname(packaged) == os.path.dirname(os.path.abspath(
        __import__("luminamoon").__file__))


@needs_native
def test_backend_aot_takes_the_packaged_bundle(packaged, clean_backend_cache):
    from luminamoon.optimizer.backends import get_backend

    LuminaMoon([torch.nn.Parameter(torch.ones(2))], backend="aot")  # no aot_bundle: accepted
    assert get_backend("aot", "cuda").bundle_dir == packaged
    out = _cli("aot", "default")
    assert out.returncode == 0 and out.stdout.strip() == packaged


@needs_native
def test_the_environment_variable_and_the_argument_come_first(packaged, tmp_path, monkeypatch,
                                                               clean_backend_cache):
    from luminamoon.optimizer.backends import get_backend

    other = _tiny_bundle(packaged, tmp_path / "other")
    explicit = _tiny_bundle(packaged, tmp_path / "explicit")
    monkeypatch.setenv(dflt.ENV_VAR, other)
    assert get_backend("aot", "cuda").bundle_dir == other
    assert get_backend("aot", "cuda", aot_bundle=explicit).bundle_dir == explicit


def test_no_default_bundle_says_how_to_get_one(monkeypatch, no_env_bundle, clean_backend_cache):
    monkeypatch.setattr(dflt, "packaged_bundle_dir", lambda: None)
    with pytest.raises(ValueError, match=r"backend='aot' needs aot_bundle=<bundle directory> here: "
                                         r"this installation of luminamoon ships no default bundle"
                                         r".*luminamoon aot build --arch"):
        LuminaMoon([torch.nn.Parameter(torch.ones(2))], backend="aot")


def test_a_wrong_environment_variable_is_named(tmp_path, monkeypatch, clean_backend_cache):
    monkeypatch.setenv(dflt.ENV_VAR, str(tmp_path / "nowhere"))
    with pytest.raises(ValueError, match=r"LUMINAMOON_AOT_BUNDLE='.*nowhere' has no manifest\.json"):
        LuminaMoon([torch.nn.Parameter(torch.ones(2))], backend="aot")
    out = _cli("aot", "default")
    assert out.returncode == 1 and "nowhere" in out.stderr


def test_doctor_reports_the_bundle_and_a_verdict(packaged):
    out = _cli("doctor")
    assert out.returncode == 0, out.stdout + out.stderr
    lines = out.stdout.strip().splitlines()
    assert any(line.startswith("default bundle") and packaged in line for line in lines)
    manifest = json.load(open(os.path.join(packaged, "manifest.json"), encoding="utf-8"))
    keys = {e["key"] for e in manifest["kernels"]}
    archs = ", ".join(f"sm_{a}" for a in sorted(dflt.ARCHS))
    assert re.search(rf"^  archs +{archs}$", out.stdout, re.M), out.stdout
    assert re.search(rf"^  variants +{len(keys)} per arch, {len(manifest['kernels'])} cubins",
                     out.stdout, re.M), out.stdout
    assert re.search(rf"^  verified +all {len(manifest['kernels'])} cubins: SHA-256 as recorded",
                     out.stdout, re.M), out.stdout
    verdict = lines[-1]
    if torch.cuda.is_available():
        assert verdict.startswith("verdict: OK: backend='aot' runs on cuda:0"), verdict
    else:
        assert verdict.startswith("verdict: OK (CPU)"), verdict


@needs_native
def test_doctor_fails_a_damaged_bundle(packaged, tmp_path):
    bundle = _tiny_bundle(packaged, tmp_path / "damaged")
    cubin = [f for f in os.listdir(bundle) if f.endswith(".cubin")][0]
    data = bytearray(open(os.path.join(bundle, cubin), "rb").read())
    data[len(data) // 2] ^= 0xFF
    open(os.path.join(bundle, cubin), "wb").write(bytes(data))
    out = _cli("doctor", env={dflt.ENV_VAR: bundle})
    assert out.returncode == 1
    assert "REFUSED" in out.stdout and "sha256" in out.stdout
    assert out.stdout.strip().splitlines()[-1].startswith("verdict: FAIL: the default bundle cannot be used")
