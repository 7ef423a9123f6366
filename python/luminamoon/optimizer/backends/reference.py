"""optimizer/backends/reference.py: the reference backend: TDCLM in plain PyTorch ops, one tensor at a time, on any device.

It is the oracle the other backends are tested against, and the fallback wherever nothing
faster runs. It follows docs/internals.md line by line; the numbered comments below carry the
same wording as the kernels'. Nothing here synchronises with the host: the step count, the
bias corrections, the rounding keys, the clip threshold and the skip decision stay on the
device. q8 moments (state_dtype "q8") are decoded and re-encoded with kernels/quant.py, whole
tensors at a time (no loop over blocks or elements).
"""
from __future__ import annotations

from typing import Optional, Tuple

import torch

from ...kernels import quant
from .. import rng
from .._dtensor import global_indices
from .._groups import LaunchGroup
from .base import Backend

# float32 constant of the "rel" bound: r = bound * sqrt(p0 * p0 + 1e-4).
REL_BOUND_FLOOR = 1e-4

# Veltkamp's splitting constant for float32 (2**12 + 1): a * SPLIT splits a 24-bit significand
# into two 12-bit halves whose products are exact.
_SPLIT = 4097.0


def _two_square_error(s: torch.Tensor) -> torch.Tensor:
    """The exact error s*s - fl(s*s) for float32 ``s`` of moderate magnitude (Dekker)."""
    c = s * _SPLIT
    hi = c - (c - s)
    lo = s - hi
    p = s * s
    return ((hi * hi - p) + hi * lo + lo * hi) + lo * lo


def sqrt_rn(x: torch.Tensor) -> torch.Tensor:
    """float32 sqrt, correctly rounded (round to nearest even), on every device.

    The spec's sqrt is the IEEE one (the kernels' sqrt_rn, the C++ engine's std::sqrt). torch's
    CPU sqrt is not always that: through MKL's vector library it is within one ulp, and on some
    CPUs (seen on AMD EPYC, every ATEN_CPU_CAPABILITY) about one float32 result in six is one
    ulp off. Here torch's value is only the first guess; the guess is then corrected with exact
    float32 arithmetic only (no float64: MPS has none):

    - x = y * 4**k with y in [1, 4) (exact: integer ops on the bits), so nothing below
      overflows or underflows;
    - s = sqrt(y) (the guess, at most an ulp off), e = y - s*s exactly (Dekker's product; e is
      a multiple of ulp(s)**2 / 4, a float32 whenever s is the right root or a neighbour of it;
      where the guess is further off, e is rounded but far beyond either threshold);
    - the correctly rounded root is above s when y exceeds the upper midpoint squared, which
      on that grid is e > s * ulp_up(s), and below s when e <= -s * ulp_down(s); twice, for a
      guess two ulps off;
    - sqrt(x) = root * 2**k (exact). Zero, +inf, NaN and negative x keep torch's value.

    On CUDA torch's sqrt is already IEEE (nvcc's default -prec-sqrt=true) and is returned as is.
    """
    if x.device.type == "cuda":
        return torch.sqrt(x)
    bits = x.view(torch.int32)
    finite_pos = (bits > 0) & (bits < 0x7F800000)
    # subnormal x: scale by 2**64 first (exact), undone below as 2**-32 on the root
    tiny = bits < 0x00800000
    xs = torch.where(tiny, x * 18446744073709551616.0, x)
    b = xs.view(torch.int32)
    exp = (b >> 23) - 127  # unbiased exponent of the (now normal) finite positive values
    half = torch.div(exp, 2, rounding_mode="floor")  # exp = 2 * half + (0 or 1)
    # y = mantissa * 2**(exp - 2 * half): exponent field 127 (y in [1, 2)) or 128 ([2, 4))
    y_bits = (b & 0x007FFFFF) | ((exp - 2 * half + 127) << 23)
    y = torch.where(finite_pos, y_bits.view(torch.float32), torch.ones_like(x))
    s = torch.sqrt(y)
    for _ in range(2):
        e = (y - s * s) - _two_square_error(s)
        s_bits = s.view(torch.int32)  # s is in [1, 2): its neighbours are the bits +- 1
        up = (s_bits + 1).view(torch.float32)
        down = (s_bits - 1).view(torch.float32)
        s = torch.where(e > s * (up - s), up, torch.where(e <= -(s * (s - down)), down, s))
    # 2**half (minus 32 for the scaled subnormals) as float32 bits; half is in [-75, 64)
    k = torch.where(tiny, half - 32, half)
    scale = ((k + 127) << 23).view(torch.float32)
    return torch.where(finite_pos, s * scale, torch.sqrt(x))


def _bias_correction(beta: float, t: torch.Tensor) -> torch.Tensor:
    """float32(1 - float64(beta) ** t) for the step tensor ``t``, on its device.

    Devices without float64 (MPS) take the power on the CPU.
    """
    if t.device.type == "mps":
        t = t.cpu()
    power = torch.pow(torch.tensor(beta, dtype=torch.float64, device=t.device), t.to(torch.float64))
    return (1.0 - power).to(torch.float32)


def _lr_tensor(lr, device: torch.device) -> torch.Tensor:
    """The learning rate as a float32 0-dim tensor on ``device`` (a tensor lr: no host sync)."""
    if isinstance(lr, torch.Tensor):
        return lr.detach().to(device=device, dtype=torch.float32)
    return torch.tensor(float(lr), dtype=torch.float32, device=device)


def _sr_dtype_active(group: LaunchGroup, dtype: torch.dtype) -> bool:
    return group.hyper.stochastic_rounding and dtype == torch.bfloat16


class _TensorStep:
    """One tensor j of a launch group: the shared pass-1/pass-2 arithmetic."""

    def __init__(self, group: LaunchGroup, j: int, codebooks: Optional[str] = None):
        self.group = group
        self.codebooks = codebooks  # q8: the codebooks' name (None: the chosen ones)
        self.j = j
        h = group.hyper
        self.param = group.params[j]
        self.grad = group.grads[j]
        self.exp_avg = group.exp_avgs[j]
        self.exp_avg_sq = group.exp_avg_sqs[j]
        self.numel = self.param.numel()
        self.t = group.steps[j] + 1  # the step being applied
        self.k = group.param_indices[j]
        self.offset = group.elem_offsets[j]
        self.sign = -1.0 if h.maximize else 1.0
        # Hyperparameters are float32 already (Hyper holds them rounded); 1 - beta in float32.
        ones = torch.ones((), dtype=torch.float32)
        self.one_minus_beta1 = float(ones - h.beta1)
        self.one_minus_beta2 = float(ones - h.beta2)
        self._key = None
        # q8 blocks cut by shard boundaries: where each local element's block sits among the
        # local scales (_q8_state.BlockMap), computed once a tensor step
        self.block_map = group.q8_maps[j] if group.q8_maps is not None else None
        self._block_index = None

    # -- random words -------------------------------------------------------------------
    def words(self, stream: int) -> torch.Tensor:
        """R16 of this tensor's elements for ``stream`` (format 2: one Philox per eight)."""
        maps = self.group.index_maps
        if maps is not None:  # a shard that is not one run of global indices (Shard(1))
            index = global_indices(maps[self.j], self.param.device)
            return rng.random_words(self.group.seed, self.t, self.k, index, stream)
        if self._key is None:
            self._key = rng.rounding_seed_words(self.group.seed, self.t, self.k)
        return rng.stream_words(self._key, self.offset, self.numel, stream, self.param.device)

    def store_round(self, x: torch.Tensor, dtype: torch.dtype, stream: int) -> torch.Tensor:
        words = self.words(stream) if _sr_dtype_active(self.group, dtype) else None
        return rng.round_to_storage(x, dtype, words)

    # -- steps 1-4 ----------------------------------------------------------------------
    def q8_tables(self) -> Tuple[torch.Tensor, torch.Tensor]:
        """The signed (m) and unsigned (v) codebooks on the tensor's device."""
        return (quant.codebook(True, self.codebooks, self.param.device),
                quant.codebook(False, self.codebooks, self.param.device))

    def block_index(self) -> torch.Tensor:
        """Each local element's index into the flat local scales (cut blocks only)."""
        if self._block_index is None:
            self._block_index = self.block_map.block_index(self.numel, self.param.device)
        return self._block_index

    def element_scales(self, scales: torch.Tensor) -> torch.Tensor:
        """The scale of every local element, flat, from the local scales (whole rows where no
        block is cut; else through the tensor's BlockMap)."""
        if self.block_map is None:
            rows, k = self.group.q8_rows[self.j]
            return quant.expand_scales(scales, rows, k)
        return scales.reshape(-1)[self.block_index()]

    def stored_moments(self) -> Tuple[torch.Tensor, torch.Tensor]:
        """m and v as float32, flat: q8 codes dequantized (scale * codebook[code])."""
        if self.group.state_dtype != quant.Q8:
            return (self.exp_avg.reshape(-1).to(torch.float32),
                    self.exp_avg_sq.reshape(-1).to(torch.float32))
        table_m, table_v = self.q8_tables()
        scale_m = self.element_scales(self.group.exp_avg_scales[self.j])
        scale_v = self.element_scales(self.group.exp_avg_sq_scales[self.j])
        return (quant.dequantize(self.exp_avg, scale_m, table_m),
                quant.dequantize(self.exp_avg_sq, scale_v, table_v))

    def partial_maxima(self, m_new: torch.Tensor, v_new: torch.Tensor):
        """Pass 1 of a tensor whose blocks shard boundaries cut: the largest |m'| and v' of the
        local elements of each block (0 where it holds none; +inf for a non-finite value), the
        local scales' shape, flat; the step MAX-reduces them over the ranks."""
        n_scales = self.group.exp_avg_scales[self.j].numel()
        index = self.block_index()
        return (self.block_map.partial_max(m_new, index, n_scales),
                self.block_map.partial_max(v_new, index, n_scales))

    def requantize(self, x: torch.Tensor, signed: bool):
        """(codes, scales) of flat float32 ``x`` (m' when ``signed``, else v'): each block's
        scale is its largest |x| (NaN for a non-finite block; over every rank's piece of a block
        that shard boundaries cut: pass 1's maxima, MAX-reduced), each code rounded
        stochastically with R16 of stream 3 (m) or 4 (v)."""
        table = self.q8_tables()[0 if signed else 1]
        if self.block_map is None:
            rows, k = self.group.q8_rows[self.j]
            scales = quant.block_scales(x, rows, k)
        else:
            reduced = self.group.q8_partials[2 * self.j + (0 if signed else 1)]
            scales = self.block_map.finish_scales(reduced)
        stream = rng.STREAM_Q8_EXP_AVG if signed else rng.STREAM_Q8_EXP_AVG_SQ
        codes = quant.quantize(x, self.element_scales(scales), table,
                               self.words(stream), quant.zero_code(signed, self.codebooks))
        return codes, scales

    def moments_and_direction(self) -> Tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """(m stored, v stored, u): steps 1-4, shared by pass 1 and pass 2. For q8 moments
        m' and v' come back unrounded (float32): pass 2 requantizes them."""
        h = self.group.hyper
        state_dtype = self.group.state_dtype
        rbc1 = 1.0 / _bias_correction(h.beta1, self.t)  # float32, once per tensor
        rbc2 = 1.0 / _bias_correction(h.beta2, self.t)
        grad = self.grad.reshape(-1).to(torch.float32)
        m, v = self.stored_moments()
        # 1. gradient, sign applied
        g = grad * self.sign
        # 2. moments
        m_new = m * h.beta1 + g * self.one_minus_beta1
        v_new = v * h.beta2 + (g * g) * self.one_minus_beta2
        # 3. round moments to their storage dtype (streams 1 and 2); q8: not rounded
        if state_dtype == quant.Q8:
            return m_new, v_new, (m_new * rbc1) / (sqrt_rn(v_new * rbc2) + h.eps)
        m_store = self.store_round(m_new, state_dtype, rng.STREAM_EXP_AVG)
        v_store = self.store_round(v_new, state_dtype, rng.STREAM_EXP_AVG_SQ)
        m_new = m_store.to(torch.float32)
        v_new = v_store.to(torch.float32)
        # 4. Adam direction
        u = (m_new * rbc1) / (sqrt_rn(v_new * rbc2) + h.eps)
        return m_store, v_store, u


class ReferenceBackend(Backend):
    """TDCLM with torch ops on any device and any floating-point parameter dtype."""

    name = "reference"
    index_maps = True
    q8_cut_blocks = True

    def __init__(self, codebooks: Optional[str] = None):
        # q8 codebooks other than the chosen ones (kernels/quant.py, CANDIDATES): only for
        # measuring a candidate (benchmarks/bench_q8_codebooks.py)
        if codebooks is not None and codebooks not in quant.CANDIDATES:
            raise ValueError(f"codebooks must be one of {sorted(quant.CANDIDATES)} or None, "
                             f"got {codebooks!r}")
        self.codebooks = codebooks

    def supports(self, group: LaunchGroup) -> bool:
        return (group.param_dtype.is_floating_point and group.grad_dtype.is_floating_point
                and group.state_dtype in (torch.float32, torch.bfloat16, quant.Q8))

    # -- pass 1 -------------------------------------------------------------------------
    def pass1(self, group: LaunchGroup, found_inf: torch.Tensor) -> None:
        need_sum = group.hyper.clip > 0
        cut = group.q8_maps is not None  # q8 blocks cut by shard boundaries: their maxima
        stats = torch.zeros(len(group), dtype=torch.float32, device=group.device)
        partials = []
        bad_flags = []
        for j in range(len(group)):
            grad = group.grads[j]
            if grad.numel() == 0:
                if cut:  # (this rank holds no piece of any block: it adds zeros to the MAX)
                    n_scales = group.exp_avg_scales[j].numel()
                    partials += [torch.zeros(n_scales, dtype=torch.float32,
                                             device=group.device) for _ in range(2)]
                continue
            bad_flags.append(~torch.isfinite(grad).all())
            if need_sum or cut:
                ts = _TensorStep(group, j, self.codebooks)
                m_new, v_new, u = ts.moments_and_direction()
                if need_sum:
                    stats[j] = torch.sum(u * u, dtype=torch.float32)
                if cut:
                    partials += ts.partial_maxima(m_new, v_new)
        group.stats = stats
        if cut:
            group.q8_partials = partials
        if bad_flags:
            bad = torch.stack(bad_flags).any().to(torch.int32)
            torch.maximum(found_inf, bad, out=found_inf)

    # -- pass 2 -------------------------------------------------------------------------
    def pass2(self, group: LaunchGroup, found_inf: torch.Tensor) -> None:
        h = group.hyper
        check = h.nonfinite == "skip"
        use_clip = h.clip > 0
        if use_clip and group.stats is None:
            raise RuntimeError("pass2 with clip > 0 needs the statistics of pass1; run pass1 first")
        if group.q8_maps is not None and group.q8_partials is None:
            raise RuntimeError("pass2 of q8 blocks cut by shard boundaries needs pass1's block "
                               "maxima, MAX-reduced over the ranks; run pass1 first")
        lr = _lr_tensor(group.lr, group.device)
        decay = 1.0 - lr * h.weight_decay  # float32
        skip = (found_inf != 0) if check else None
        for j in range(len(group)):
            param = group.params[j]
            if param.numel() == 0:
                continue
            ts = _TensorStep(group, j, self.codebooks)
            m_store, v_store, u = ts.moments_and_direction()
            # 5. soft clip (pass 2 only)
            if use_clip:
                tau = h.clip * sqrt_rn(group.stats[j] / float(group.global_numels[j]))
                safe_tau = torch.where(tau == 0, torch.ones_like(tau), tau)
                u = torch.where(tau == 0, torch.zeros_like(u), tau * torch.tanh(u * (1.0 / safe_tau)))
            # 6. decoupled decay and step
            p = param.reshape(-1).to(torch.float32)
            q = p * decay - lr * u
            # 7. bound (modes 1, 2)
            if h.bound_mode:
                p0 = group.p_inits[j].reshape(-1).to(torch.float32)
                if h.bound_mode == 1:
                    r = torch.full_like(p0, h.bound)
                else:
                    r = h.bound * sqrt_rn(p0 * p0 + REL_BOUND_FLOOR)
                q = torch.minimum(torch.maximum(q, p0 - r), p0 + r)
            # 8. store p (stream 0), m, v, each rounded to its storage dtype (q8: new block
            #    scales, codes rounded with streams 3 and 4)
            p_store = ts.store_round(q, group.param_dtype, rng.STREAM_PARAM)
            _store(param, p_store, skip)
            if group.state_dtype == quant.Q8:
                m_codes, m_scales = ts.requantize(m_store, signed=True)
                v_codes, v_scales = ts.requantize(v_store, signed=False)
                _store(group.exp_avg_scales[j], m_scales, skip)
                _store(group.exp_avg_sq_scales[j], v_scales, skip)
                m_store, v_store = m_codes, v_codes
            _store(group.exp_avgs[j], m_store, skip)
            _store(group.exp_avg_sqs[j], v_store, skip)

    # -- commit -------------------------------------------------------------------------
    def commit(self, group: LaunchGroup, found_inf: torch.Tensor) -> None:
        if group.hyper.nonfinite == "skip":
            applied = (1 - found_inf).to(torch.int64)
        else:
            applied = 1
        for step in group.steps:
            step.add_(applied)


def _store(dst: torch.Tensor, value: torch.Tensor, skip: Optional[torch.Tensor]) -> None:
    """dst <- value (flat, already in dst's dtype); left bitwise as it was when ``skip``."""
    value = value.view(dst.shape) if dst.is_contiguous() else value.reshape(dst.shape)
    if skip is not None:
        value = torch.where(skip, dst, value)
    dst.copy_(value)
