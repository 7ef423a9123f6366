"""_get_device_context and _get_generator on every branch: torch.cuda, torch.xpu,
torch.accelerator (new and old names), and their absence, simulated with fakes that record
the index they were asked for."""
from __future__ import annotations

import contextlib

import pytest
import torch

from luminamoon import LuminaMoon
from luminamoon.optimizer import _device


class Recorder:
    """A fake device module: records device()/set calls, reports a current index."""

    def __init__(self, current=0, generators=None):
        self.current = current
        self.calls = []
        self.default_generators = generators or []
        self.inits = 0

    def current_device(self):
        return self.current

    def device(self, index):
        self.calls.append(("device", index))
        return contextlib.nullcontext(index)

    def init(self):
        self.inits += 1


@pytest.fixture
def fake_cuda(monkeypatch):
    rec = Recorder(current=3, generators=[object() for _ in range(5)])
    monkeypatch.setattr(torch.cuda, "current_device", rec.current_device)
    # the fast path's own view of the current index, and its memory of initialisation
    monkeypatch.setattr(_device, "_CUDA_GET_DEVICE", rec.current_device)
    monkeypatch.setattr(_device, "_CUDA_INITIALIZED", False)
    monkeypatch.setattr(torch.cuda, "device", rec.device)
    monkeypatch.setattr(torch.cuda, "init", rec.init)
    monkeypatch.setattr(torch.cuda, "default_generators", tuple(rec.default_generators))
    return rec


@pytest.mark.parametrize("device", ["cpu", torch.device("cpu"), "meta", "mps"])
def test_indexless_devices_get_a_null_context(device):
    assert isinstance(_device._get_device_context(device), contextlib.nullcontext)


def test_cuda_explicit_index_is_used(fake_cuda):
    with _device._get_device_context("cuda:1") as idx:
        assert idx == 1
    assert fake_cuda.calls == [("device", 1)]


def test_cuda_already_current_switches_nothing(fake_cuda, monkeypatch):
    """With CUDA initialised and the device already current, no device switch is made."""
    monkeypatch.setattr(torch.cuda, "is_initialized", lambda: True)
    ctx = _device._get_device_context("cuda:3")
    assert isinstance(ctx, contextlib.nullcontext)
    assert fake_cuda.calls == []
    # another index still switches
    with _device._get_device_context("cuda:1") as idx:
        assert idx == 1
    assert fake_cuda.calls == [("device", 1)]


def test_cuda_without_index_means_the_current_device_not_zero(fake_cuda):
    with _device._get_device_context(torch.device("cuda")) as idx:
        assert idx == 3
    assert fake_cuda.calls == [("device", 3)]
    assert _device._device_index("cuda") == 3


def test_xpu_present(monkeypatch):
    xpu = Recorder(current=2)
    monkeypatch.setattr(torch, "xpu", xpu, raising=False)
    _device._get_device_context("xpu")
    _device._get_device_context("xpu:4")
    assert xpu.calls == [("device", 2), ("device", 4)]


class FakeAccelerator:
    def __init__(self, current, new_names=True, with_context=True):
        self.current = current
        self.log = []
        if new_names:
            self.current_device_index = lambda: self.current
            self.set_device_index = self._set
        else:  # torch 2.6-2.7 spelling
            self.current_device_idx = lambda: self.current
            self.set_device_idx = self._set
        if with_context:
            self.device_index = self._device_index

    def _set(self, index):
        self.log.append(("set", index))
        self.current = index

    def _device_index(self, index):
        self.log.append(("device_index", index))
        return contextlib.nullcontext(index)


@pytest.mark.parametrize("new_names", [True, False], ids=["current_device_index", "current_device_idx"])
def test_accelerator_without_xpu(monkeypatch, new_names):
    """A torch without torch.xpu: an out-of-tree device goes through torch.accelerator."""
    monkeypatch.delattr(torch, "xpu", raising=False)
    acc = FakeAccelerator(current=5, new_names=new_names)
    monkeypatch.setattr(torch, "accelerator", acc, raising=False)
    assert _device._device_index("privateuseone") == 5
    _device._get_device_context("privateuseone:2")
    assert acc.log == [("device_index", 2)]


@pytest.mark.parametrize("new_names", [True, False])
def test_accelerator_without_device_index_sets_and_restores(monkeypatch, new_names):
    monkeypatch.delattr(torch, "xpu", raising=False)
    acc = FakeAccelerator(current=1, new_names=new_names, with_context=False)
    monkeypatch.setattr(torch, "accelerator", acc, raising=False)
    with _device._get_device_context("privateuseone:6"):
        assert acc.current == 6
    assert acc.current == 1
    assert acc.log == [("set", 6), ("set", 1)]
    with _device._get_device_context("privateuseone:1"):  # already current: no switching
        pass
    assert acc.log == [("set", 6), ("set", 1)]


def test_no_accelerator_api_is_a_clear_error(monkeypatch):
    """torch 2.4/2.5: no torch.accelerator; an unknown device type cannot be resolved."""
    monkeypatch.delattr(torch, "xpu", raising=False)
    monkeypatch.delattr(torch, "accelerator", raising=False)
    with pytest.raises(RuntimeError, match=r"cannot tell which 'privateuseone' device is current.*'privateuseone:1'"):
        _device._get_device_context("privateuseone")
    with pytest.raises(RuntimeError, match=r"cannot make privateuseone:1 the current device"):
        _device._get_device_context("privateuseone:1")


def test_cuda_is_checked_before_xpu_and_accelerator(monkeypatch, fake_cuda):
    xpu = Recorder(current=7)
    acc = FakeAccelerator(current=8)
    monkeypatch.setattr(torch, "xpu", xpu, raising=False)
    monkeypatch.setattr(torch, "accelerator", acc, raising=False)
    _device._get_device_context("cuda")
    assert fake_cuda.calls == [("device", 3)] and xpu.calls == [] and acc.log == []


# --------------------------------------------------------------------------------------------
# generators
# --------------------------------------------------------------------------------------------
def test_cpu_generator_is_the_default_one(clean_device_cache):
    assert _device._get_generator("cpu") is torch.default_generator


def test_cuda_generator_of_the_current_index_and_cached(fake_cuda, clean_device_cache):
    gen = _device._get_generator("cuda")
    assert gen is fake_cuda.default_generators[3]
    assert _device._get_generator("cuda:3") is gen
    assert _device._get_generator("cuda:1") is fake_cuda.default_generators[1]
    assert fake_cuda.inits == 2  # once per (type, index), then cached


def test_xpu_generator(monkeypatch, clean_device_cache):
    xpu = Recorder(current=1, generators=["g0", "g1", "g2"])
    monkeypatch.setattr(torch, "xpu", xpu, raising=False)
    assert _device._get_generator("xpu") == "g1"
    assert _device._get_generator("xpu:2") == "g2"


def test_other_device_generator_seeded_from_cpu(monkeypatch, clean_device_cache):
    made = []

    class FakeGenerator:
        def __init__(self, device):
            self.device = device
            made.append(self)

        def manual_seed(self, seed):
            self.seed = seed
            return self

    monkeypatch.delattr(torch, "xpu", raising=False)
    monkeypatch.setattr(torch, "accelerator", FakeAccelerator(current=2), raising=False)
    monkeypatch.setattr(torch, "Generator", FakeGenerator)
    torch.default_generator.manual_seed(0)  # torch.manual_seed would look for torch.xpu
    gen = _device._get_generator("privateuseone")
    assert gen.device == torch.device("privateuseone", 2)
    torch.default_generator.manual_seed(0)
    _device._GENERATORS.clear()
    assert _device._get_generator("privateuseone:2").seed == gen.seed


def test_optimizer_draws_its_seed_from_the_first_parameters_device(monkeypatch):
    from luminamoon.optimizer import optimizer as optimizer_module

    asked = []
    real = optimizer_module._get_generator

    def spy(device):
        asked.append(torch.device(device))
        return real(device)

    monkeypatch.setattr(optimizer_module, "_get_generator", spy)
    torch.manual_seed(123)
    s1 = LuminaMoon([torch.nn.Parameter(torch.ones(2))]).seed
    torch.manual_seed(123)
    s2 = LuminaMoon([torch.nn.Parameter(torch.ones(2))]).seed
    torch.manual_seed(124)
    s3 = LuminaMoon([torch.nn.Parameter(torch.ones(2))]).seed
    assert asked == [torch.device("cpu")] * 3
    assert s1 == s2 != s3 and 0 <= s1 < 2**64
    assert LuminaMoon([torch.nn.Parameter(torch.ones(2))], seed=2**64 - 1).seed == 2**64 - 1
    assert len(asked) == 3  # a given seed draws nothing
