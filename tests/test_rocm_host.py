"""A ROCm build of torch, as the host code sees it (no AMD GPU here: torch's version and device
properties are stand-ins): backend "auto" takes the Triton kernels on its HIP devices, the
compile options leave out what only NVIDIA has, and `luminamoon doctor` reports torch's HIP
version, the devices' gfx archs and whether the bundle has code objects for them."""
from __future__ import annotations

from types import SimpleNamespace

import torch

from conftest import import_or_skip

from luminamoon import cli
from luminamoon.optimizer import backends


def test_auto_takes_the_triton_kernels_on_a_hip_device(monkeypatch):
    monkeypatch.setattr(torch.version, "hip", "6.4.43482", raising=False)
    assert backends.is_rocm()
    assert backends._auto_name(torch.device("cuda", 0)) == "triton"
    monkeypatch.setattr(torch.version, "hip", None, raising=False)
    assert not backends.is_rocm()


def test_variant_options_leave_out_nvidia_only_options():
    catalog = import_or_skip("luminamoon.kernels.catalog", "triton")
    v = catalog.all_variants([(torch.float32,) * 3])[0]
    capped = catalog.Variant(v.kernel, v.constexprs, v.num_warps, v.num_stages, maxnreg=96)
    assert catalog.variant_options(capped)["maxnreg"] == 96
    hip = catalog.variant_options(capped, hip=True)
    assert set(catalog.NVIDIA_ONLY_OPTIONS).isdisjoint(hip)
    assert hip == {**catalog.COMPILE_OPTIONS, "num_warps": v.num_warps,
                   "num_stages": v.num_stages}


class _FakeCuda:
    def __init__(self, archs):
        self.archs = archs

    def is_available(self):
        return True

    def device_count(self):
        return len(self.archs)

    def get_device_properties(self, i):
        return SimpleNamespace(name="AMD Instinct MI300X", gcnArchName=self.archs[i],
                               total_memory=192 << 30, major=9, minor=4)


def test_doctor_rows_name_hip_and_the_gfx_arch():
    fake = SimpleNamespace(__version__="2.13.0+rocm6.4",
                           version=SimpleNamespace(hip="6.4.43482", cuda=None),
                           cuda=_FakeCuda(["gfx942:sramecc+:xnack-", "gfx90a"]))
    rows, devices = [], []
    cli._gpu_rows(fake, rows, devices)
    text = dict(rows)
    assert text["torch"] == "2.13.0+rocm6.4 (ROCm build, HIP 6.4.43482)"
    assert text["cuda devices (HIP)"] == "2"
    assert text["  cuda:0"] == "AMD Instinct MI300X, gfx942 (gfx942:sramecc+:xnack-), 192 GiB"
    assert devices == [(0, "AMD Instinct MI300X", "gfx942"), (1, "AMD Instinct MI300X", "gfx90a")]


def test_doctor_verdict_on_rocm():
    devices = [(0, "MI300X", "gfx942")]
    no_hip = SimpleNamespace(has_cuda_driver=lambda: False)
    with_hip = SimpleNamespace(has_cuda_driver=lambda: False, has_hip_runtime=lambda: True)
    bundle = {"path": "/b", "keys": {90: {"k"}, "gfx942": {"k"}}, "problem": None}
    verdict = cli._verdict(devices, with_hip, bundle)
    assert verdict.startswith("verdict: OK") and "cuda:0 (MI300X, gfx942)" in verdict
    assert "no AMD GPU has run these kernels yet" in verdict
    verdict = cli._verdict(devices, no_hip, bundle)
    assert verdict.startswith("verdict: FAIL") and "backend='triton'" in verdict
    other = {"path": "/b", "keys": {90: {"k"}, "gfx90a": {"k"}}, "problem": None}
    verdict = cli._verdict(devices, with_hip, other)
    assert verdict.startswith("verdict: FAIL") and "sm_90, gfx90a" in verdict
    assert "--arch gfx942" in verdict
