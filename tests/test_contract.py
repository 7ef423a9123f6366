"""Python against C++: every constant and layout both languages write must agree.

One test per contract: the variant keys a launch group runs (kernels.catalog vs the engine's
variant_keys), the device table's columns and bytes (optimizer/backends/_tables.py vs C++
build_tables), the launch shapes (kernels.catalog vs the engine's GPU_* constants), the
alignment, and the dtype, bound-mode and nonfinite codes (kernels.layout vs the engine's enums).
"""
from __future__ import annotations

import itertools

import pytest
import torch

from cases import CASES, make_group
from conftest import import_or_skip, launch_flags

_luminav = import_or_skip("luminamoon._luminav", "native")

from luminamoon.kernels import layout  # noqa: E402
from luminamoon.optimizer._groups import Hyper  # noqa: E402
from luminamoon.optimizer.backends._tables import build_table  # noqa: E402

pytestmark = pytest.mark.native

COMBOS = [(torch.float32, torch.float32), (torch.bfloat16, torch.float32),
          (torch.bfloat16, torch.bfloat16), (torch.float16, torch.float32),
          (torch.float32, torch.bfloat16)]


def _config(p, s, hyper):
    return _luminav.GroupConfig(
        (layout.DTYPE_CODES[p], layout.DTYPE_CODES[p], layout.DTYPE_CODES[s]), hyper, 0)


def test_variant_keys():
    catalog = import_or_skip("luminamoon.kernels.catalog", "triton")
    for (p, s), clip, bound_mode, nonfinite, sr in itertools.product(
            COMBOS, (0.0, 1.0), (0, 1, 2), layout.NONFINITE_POLICIES, (False, True)):
        hyper = Hyper(beta1=0.9, beta2=0.999, eps=1e-8, weight_decay=0.0, clip=clip,
                      bound_mode=bound_mode, bound=1.0, maximize=False, nonfinite=nonfinite,
                      stochastic_rounding=sr)
        theirs = {k: v.key() for k, v in
                  catalog.variants_for(p, p, s, launch_flags(p, s, hyper)).items()}
        ours = _luminav.variant_keys(_config(p, s, hyper))
        assert ours == theirs


def test_table_columns_and_alignment():
    assert _luminav.TABLE_COLS == _luminav.GPU_TABLE_COLS == layout.TABLE_COLS
    for name in ("COL_PARAM", "COL_GRAD", "COL_EXP_AVG", "COL_EXP_AVG_SQ", "COL_P_INIT",
                 "COL_STEP", "COL_NUMEL", "COL_BLOCK_START", "COL_ELEM_OFFSET",
                 "COL_PARAM_INDEX", "COL_GLOBAL_NUMEL", "COL_CACHE", "COL_EXP_AVG_SCALE",
                 "COL_EXP_AVG_SQ_SCALE", "COL_ROW_LEN"):
        assert getattr(_luminav, name) == getattr(layout, name), name
    assert _luminav.ALIGN_BYTES == layout.ALIGN_BYTES


def test_launch_shapes():
    catalog = import_or_skip("luminamoon.kernels.catalog", "triton")
    assert _luminav.GPU_BLOCK == catalog.ELEMENTWISE_BLOCK
    assert _luminav.GPU_BLOCK_WARPS == catalog.ELEMENTWISE_WARPS
    assert _luminav.REDUCE_RBLOCK == catalog.REDUCE_RBLOCK
    assert _luminav.REDUCE_WARPS == catalog.REDUCE_WARPS
    assert _luminav.COMMIT_TBLOCK == catalog.COMMIT_TBLOCK
    assert _luminav.COMMIT_WARPS == catalog.COMMIT_WARPS


def test_dtype_bound_and_nonfinite_codes():
    names = {torch.float32: "float32", torch.bfloat16: "bfloat16", torch.float16: "float16"}
    assert _luminav.DTYPE_CODES == {names[d]: c for d, c in layout.DTYPE_CODES.items()}
    assert _luminav.BOUND_MODES == layout.BOUND_MODES
    assert _luminav.NONFINITE_CODES == layout.NONFINITE_CODES


@pytest.mark.parametrize("case", [c for c in CASES if c.offsets or len(c.shapes) > 20 or
                                  c.bound_mode][:4], ids=lambda c: c.id)
def test_table_bytes(case):
    """The same group's table and block map, written by Python and by C++."""
    group = make_group(case, "cpu")
    ours = build_table(group, _luminav.GPU_BLOCK)
    rows = []
    for j in range(len(group)):
        rows.append((group.params[j].data_ptr(), group.grads[j].data_ptr(),
                     group.exp_avgs[j].data_ptr(), group.exp_avg_sqs[j].data_ptr(),
                     group.p_inits[j].data_ptr() if group.hyper.bound_mode else 0,
                     group.steps[j].data_ptr(), group.params[j].numel(),
                     int(group.elem_offsets[j]), int(group.param_indices[j]),
                     int(group.global_numels[j])))
    table, block_map, nblocks = _luminav.build_tables(rows)
    assert nblocks == ours.nblocks
    assert torch.equal(torch.tensor(table, dtype=torch.int64).reshape(len(rows), -1), ours.table)
    if nblocks:
        assert torch.equal(torch.tensor(block_map, dtype=torch.int32), ours.block_map)
