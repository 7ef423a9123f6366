"""Python against C++: every constant and layout both languages write must agree.

One test per contract: the variant keys a launch group runs (kernels.catalog vs the engine's
variant_keys), the device table's columns and bytes (optimizer/backends/_tables.py vs C++
build_tables), the launch shapes (kernels.catalog vs the engine's GPU_*), and the dtype,
bound-mode and nonfinite codes (kernels.layout vs the engine's enums).
"""
from __future__ import annotations

import itertools

import pytest
import torch

from conftest import launch_flags

_luminav = pytest.importorskip("luminamoon._luminav", reason="the native module is not built")

from luminamoon.kernels import layout  # noqa: E402
from luminamoon.optimizer._groups import Hyper  # noqa: E402

pytestmark = pytest.mark.native

COMBOS = [(torch.float32, torch.float32), (torch.bfloat16, torch.float32),
          (torch.bfloat16, torch.bfloat16), (torch.float16, torch.float32),
          (torch.float32, torch.bfloat16)]


def test_variant_keys():
    catalog = pytest.importorskip("luminamoon.kernels.catalog")
    for (p, s), clip, bound_mode, nonfinite, sr in itertools.product(
            COMBOS, (0.0, 1.0), (0, 1, 2), layout.NONFINITE_POLICIES, (False, True)):
        hyper = Hyper(beta1=0.9, beta2=0.999, eps=1e-8, weight_decay=0.0, clip=clip,
                      bound_mode=bound_mode, bound=1.0, maximize=False, nonfinite=nonfinite,
                      stochastic_rounding=sr)
        theirs = {k: v.key() for k, v in
                  catalog.variants_for(p, p, s, launch_flags(p, s, hyper)).items()}
        ours = _luminav.variant_keys(layout.DTYPE_CODES[p], layout.DTYPE_CODES[p],
                                     layout.DTYPE_CODES[s], clip, bound_mode,
                                     layout.NONFINITE_CODES[nonfinite], sr)
        assert ours == theirs


def test_table_width_and_block():
    assert _luminav.GPU_TABLE_COLS == layout.TABLE_COLS
    catalog = pytest.importorskip("luminamoon.kernels.catalog")
    assert _luminav.GPU_BLOCK == catalog.ELEMENTWISE_BLOCK
