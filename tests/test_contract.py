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
                     int(group.global_numels[j]), 0, 0, 0))
    table, block_map, nblocks = _luminav.build_tables(rows)
    assert nblocks == ours.nblocks
    assert torch.equal(torch.tensor(table, dtype=torch.int64).reshape(len(rows), -1), ours.table)
    if nblocks:
        assert torch.equal(torch.tensor(block_map, dtype=torch.int32), ours.block_map)


# --------------------------------------------------------------------------------------------
# q8 moments (docs/tdclm.md "Quantized moments (q8)")
# --------------------------------------------------------------------------------------------
def test_q8_codebooks():
    """engine/cpu_quant.cpp and kernels/quant.py: the same 256 float32 values, bit for bit."""
    from luminamoon.kernels import quant

    for signed in (True, False):
        ours = torch.tensor(_luminav.q8_codebook(signed), dtype=torch.float32)
        assert torch.equal(ours.view(torch.int32), quant.codebook(signed).view(torch.int32))
    assert _luminav.Q8_ZERO_CODES == (quant.zero_code(True), quant.zero_code(False))
    assert _luminav.Q8_BLOCK == quant.BLOCK == layout.Q8_BLOCK
    assert _luminav.S_DTYPE_Q8 == layout.S_DTYPE_Q8


def _q8_group(**hyper):
    """A q8 launch group of rows that 256 divides, rows of a short last block and a 1-D tensor,
    built by the optimizer (the cpu engine steps it once)."""
    from luminamoon import LuminaMoon

    gen = torch.Generator().manual_seed(0)
    params = [torch.nn.Parameter(torch.randn(s, generator=gen))
              for s in ((64, 256), (17, 257), (5000,), (2, 3, 32, 32))]
    for p in params:
        p.grad = torch.randn(p.shape, generator=gen)
    opt = LuminaMoon(params, state_dtype="q8", seed=3, backend="cpu", **hyper)
    opt.step()
    (group,) = [g for g in opt._plan.groups if g.state_dtype == "q8"]
    group.grads = [p.grad for p in params]  # (a step lets go of its gradient list)
    return group


def test_q8_table_bytes():
    """A q8 group's table and block map, written by Python and by C++ from the same rows: the
    scale addresses and ROW_LEN in columns 18-20, programs of whole q8 blocks."""
    from luminamoon.optimizer.backends._tables import host_rows

    group = _q8_group(bound_mode="abs", bound=1.0)
    ours = build_table(group, _luminav.GPU_BLOCK)
    rows = host_rows(group)
    table, block_map, nblocks = _luminav.build_tables(rows)
    theirs = torch.tensor(table, dtype=torch.int64).reshape(len(rows), -1)
    assert torch.equal(theirs, ours.table)
    assert torch.equal(torch.tensor(block_map, dtype=torch.int32), ours.block_map)
    assert nblocks == ours.nblocks
    per = _luminav.GPU_BLOCK // layout.Q8_BLOCK
    # programs a tensor owns: ceil(R * ceil(K / 256) / (BLOCK / 256))
    assert nblocks == sum(-(-r * -(-k // 256) // per) for r, k in group.q8_rows)
    for j, (r, k) in enumerate(group.q8_rows):
        assert int(theirs[j, layout.COL_ROW_LEN]) == k
        assert int(theirs[j, layout.COL_EXP_AVG_SCALE]) == group.exp_avg_scales[j].data_ptr()
        assert int(theirs[j, layout.COL_EXP_AVG_SQ_SCALE]) == group.exp_avg_sq_scales[j].data_ptr()
    assert nblocks > sum(-(-p.numel() // _luminav.GPU_BLOCK) for p in group.params)  # (17, 257)
    # a q8 row in a group of float moments, or a float row without its q8 fields, is refused
    bad = [rows[0][:10] + (0, 0, 0)] + rows[1:]
    with pytest.raises(ValueError, match="row 0: q8 row_len must be > 0"):
        _luminav.build_tables(bad)


def test_q8_variant_keys():
    """q8 configs (state dtype S_DTYPE_Q8 = 3): the update kernels' keys carry s3; where the
    kernel catalog has q8 variants, the keys are the catalog's."""
    catalog = import_or_skip("luminamoon.kernels.catalog", "triton")
    for p, clip, bound_mode, nonfinite, sr in itertools.product(
            (torch.float32, torch.bfloat16), (0.0, 1.0), (0, 2), layout.NONFINITE_POLICIES,
            (False, True)):
        hyper = Hyper(beta1=0.9, beta2=0.999, eps=1e-8, weight_decay=0.0, clip=clip,
                      bound_mode=bound_mode, bound=1.0, maximize=False, nonfinite=nonfinite,
                      stochastic_rounding=sr)
        config = _luminav.GroupConfig(
            (layout.DTYPE_CODES[p], layout.DTYPE_CODES[p], layout.S_DTYPE_Q8), hyper, 0)
        ours = _luminav.variant_keys(config)
        for kernel in ("pass1", "pass2", "single_pass"):
            if kernel in ours:
                assert f"s{layout.S_DTYPE_Q8}" in ours[kernel].split(".")[1], ours[kernel]
        try:
            theirs = catalog.variants_for(p, p, "q8", launch_flags(p, "q8", hyper))
        except (ValueError, KeyError):
            continue  # this catalog has no q8 variants (yet)
        assert ours == {k: v.key() for k, v in theirs.items()}
