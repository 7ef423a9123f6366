"""Every backend against the reference: the cases of tests/cases.py crossed with backend and
device, one runner. Ids read "<hyperparameters>/<param-grad-state dtypes>/<backend>/<device>",
e.g. "clip1-rel-skip-sr/pbf16-gbf16-sfp32/aot/cuda"; marks follow the axes (``-m triton``,
``-m native``, ``-m gpu``). Which rows run here is decided in conftest.should_skip, nowhere
else.
"""
from __future__ import annotations

import pytest

from cases import CASES, GPU_CASES, compare_with_reference
from conftest import should_skip

# backend -> the marks of its rows
BACKENDS = {"triton": [pytest.mark.triton], "cpu": [pytest.mark.native],
            "aot": [pytest.mark.native, pytest.mark.gpu]}
DEVICES = {"cpu": [], "cuda": [pytest.mark.gpu]}


def _rows():
    rows = []
    for cases, devices in ((CASES, ("cpu", "cuda")), (GPU_CASES, ("cuda",))):
        for case in cases:
            for backend, bmarks in BACKENDS.items():
                for device in devices:
                    rows.append(pytest.param(
                        case, backend, device, marks=bmarks + DEVICES[device],
                        id=f"{case.hyper_id}/{case.dtype_id}{case.shape_id}/{backend}/{device}"))
    return rows


def _backend(name: str, request):
    if name == "triton":
        from luminamoon.optimizer.backends.triton import TritonBackend

        return TritonBackend()
    if name == "cpu":
        from luminamoon.optimizer.backends.cpu import CpuBackend

        return CpuBackend()
    from luminamoon.optimizer.backends.aot import AotBackend

    return AotBackend(request.getfixturevalue("aot_bundle"))


@pytest.mark.parametrize("case, backend, device", _rows())
def test_backend_matches_reference(case, backend, device, request):
    reason = should_skip(backend, device)
    if reason:
        pytest.skip(reason)
    compare_with_reference(_backend(backend, request), case, device)
