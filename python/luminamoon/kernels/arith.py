"""kernels/arith.py: the element arithmetic the TDCLM kernels share (docs/internals.md, "One
step"): the moments and the Adam direction (steps 1-4), the soft clip, decay and bound (steps
5-7), the tanh chosen at import, and the skip decision as a mask; @triton.jit helpers of
kernels/tdclm.py (float moments) and kernels/tdclm_q8.py (q8 moments).

Every choice that shapes the generated code and is made at import (the tanh, the skip mask
under the interpreter) is made here, once, so JIT and AOT builds agree.
"""
import triton
import triton.language as tl

from .rounding import INTERPRET as _INTERPRET
from .rounding import _storage_to_f32, _to_storage

# ----------------------------------------------------------------------------------------------
# tanh: chosen once, here, at import; the AOT builder compiles these same functions, so JIT and
# AOT builds agree. The interpreter (TRITON_INTERPRET=1) runs no libdevice call, so it gets a
# formula through tl.exp.
# ----------------------------------------------------------------------------------------------
def _find_libdevice_tanh():
    """libdevice's tanh: triton.language.extra.libdevice (3.2+) or extra.cuda.libdevice (3.0, 3.1)."""
    for modname in ("triton.language.extra.libdevice", "triton.language.extra.cuda.libdevice"):
        try:
            mod = __import__(modname, fromlist=["tanh"])
        except ImportError:
            continue
        fn = getattr(mod, "tanh", None)
        if fn is not None:
            return fn
    return None


if _INTERPRET:
    TANH_IMPL = "exp-formula"
    _tanh_builtin = None
elif hasattr(tl.math, "tanh"):
    TANH_IMPL = "tl.math.tanh"
    _tanh_builtin = tl.math.tanh
else:
    _tanh_builtin = _find_libdevice_tanh()
    TANH_IMPL = "libdevice.tanh" if _tanh_builtin is not None else "exp-formula"

if _tanh_builtin is None:

    @triton.jit
    def _triton_tanh_fast(x):
        # sign(x) * (1 - e) / (1 + e) with e = exp(-2|x|) <= 1: no overflow for any x,
        # +-1 at +-inf, NaN stays NaN; absolute error <= 2**-23.
        # below 1e-4, tanh(x) = x to within x**2 / 3 < 2**-24 relative (and keeps the sign)
        e = tl.exp(-2.0 * tl.abs(x))
        t = tl.div_rn(1.0 - e, 1.0 + e)
        t = tl.where(x < 0, -t, t)
        return tl.where(tl.abs(x) < 1e-4, x, t)

else:

    @triton.jit
    def _triton_tanh_fast(x):
        return _tanh_builtin(x)


# The skip decision as an element mask. Compiled, one scalar load of found_inf that broadcasts;
# the interpreter of newer Triton releases refuses a scalar int1 broadcast into a load mask, so
# there every lane loads the flag's one address (the same value).
if _INTERPRET:

    @triton.jit
    def _step_applies(found_inf, offs):
        return tl.load(found_inf + offs * 0) == 0

else:

    @triton.jit
    def _step_applies(found_inf, offs):
        return tl.load(found_inf) == 0



# ----------------------------------------------------------------------------------------------
# Shared @triton.jit helpers
# ----------------------------------------------------------------------------------------------


@triton.jit
def _adam_scalars(sign, beta1, beta2, eps):
    """The scalars both passes take, as float32 (the interpreter hands Python floats over;
    compiled, these casts are no-ops)."""
    return (tl.cast(sign, tl.float32), tl.cast(beta1, tl.float32), tl.cast(beta2, tl.float32),
            tl.cast(eps, tl.float32))


@triton.jit
def _moment_update(g_raw, m, v, sign, beta1, beta2, eps, rbc1, rbc2, key, g0,
                   S_DTYPE: tl.constexpr, SR: tl.constexpr, BLOCK: tl.constexpr,
                   ALIGNED: tl.constexpr, WIDE: tl.constexpr, FAST_U: tl.constexpr):
    """Steps 1-4 of docs/internals.md; pass 1 and pass 2 both call this, so their u agree.

    Returns (m', v') rounded to the state dtype (in that dtype) and u (float32). FAST_U:
    _direction's.
    """
    # 1. gradient, sign applied: folded into the scalar (1 - beta1) * sign, the same bits as
    # (1 - beta1) * (g * sign) since a sign flip is exact; (g * sign)**2 is g * g
    g = g_raw
    # 2. moments
    m_new = beta1 * m + ((1.0 - beta1) * sign) * g
    v_new = beta2 * v + (1.0 - beta2) * (g * g)
    # 3. round moments to their storage dtype (streams 1 and 2)
    m_st = _to_storage(m_new, S_DTYPE, SR, key, g0, 1, BLOCK, ALIGNED, WIDE)
    v_st = _to_storage(v_new, S_DTYPE, SR, key, g0, 2, BLOCK, ALIGNED, WIDE)
    m_r = _storage_to_f32(m_st, S_DTYPE)
    v_r = _storage_to_f32(v_st, S_DTYPE)
    # 4. Adam direction
    u = _direction(m_r, v_r, rbc1, rbc2, eps, FAST_U)
    return m_st, v_st, u


# The float32 boundary of the normal range, and the scales _direction's square root takes a value
# below it through (the hardware's approximate root flushes such inputs to zero).
_FLT_MIN: tl.constexpr = tl.constexpr(1.1754943508222875e-38)
_TWO_POW_48: tl.constexpr = tl.constexpr(281474976710656.0)
_TWO_POW_M24: tl.constexpr = tl.constexpr(5.9604644775390625e-08)


@triton.jit
def _direction(m_r, v_r, rbc1, rbc2, eps, FAST_U: tl.constexpr):
    """Step 4, u = (m'/bc1) / (sqrt(v'/bc2) + eps), from the rounded moments.

    IEEE-rounded square root and division, or with FAST_U the hardware's approximations
    (sqrt.approx and div.full: within 2 ulps each, u within about 3 ulps of the IEEE value, which
    docs/tdclm.md allows: "within float32 rounding"; a 16-bit stored value moves only where q sits
    that close to a rounding edge). The approximate root is taken of a value below the normal
    range scaled by 2**48 (then the root by 2**-24), so that a subnormal v'/bc2 is not flushed to
    zero (which, with a tiny eps, would change u); the division is the full-range form, exact in
    its scaling for every positive denominator. The interpreter computes both exactly.

    FAST_U is set where gradients and moments are both 16-bit, by both passes alike (from the same
    two dtypes, so pass 2's u has pass 1's bits). Those kernels read and write 6 (pass 1) or 14
    (AdamW mode with bf16 params) bytes an element and are bound by the instructions they issue,
    not by memory (benchmarks/results/2026-12-06-sass-direction.csv); elsewhere memory bounds the
    kernels, and step 4 stays IEEE-rounded: the C++ engine's and the reference's bits."""
    if FAST_U:
        x = v_r * rbc2
        tiny = x < _FLT_MIN
        root = tl.sqrt(tl.where(tiny, x * _TWO_POW_48, x))
        root = tl.where(tiny, root * _TWO_POW_M24, root)
        return (m_r * rbc1) / (root + eps)
    else:
        return tl.div_rn(m_r * rbc1, tl.sqrt_rn(v_r * rbc2) + eps)


@triton.jit
def _clip_decay_bound(u, p, p0, lr, decay, tau, bound, BOUND_MODE: tl.constexpr,
                      USE_CLIP: tl.constexpr):
    """Steps 5-7 of docs/internals.md (pass 2): q from u, p and p0."""
    # 5. soft clip (pass 2 only)
    if USE_CLIP:
        # tau == 0 (every u zero) gives 0; a NaN tau (non-finite grads, nonfinite="propagate")
        # gives NaN, as the unclipped update would
        tau_zero = tau == 0.0
        tau_safe = tl.where(tau_zero, 1.0, tau)
        rtau = tl.div_rn(1.0 + tau_safe * 0.0, tau_safe)
        u = tl.where(tau_zero, 0.0, tau_safe * _triton_tanh_fast(u * rtau))
    # 6. decoupled decay and step
    q = p * decay - lr * u
    # 7. bound (modes 1, 2)
    if BOUND_MODE != 0:
        if BOUND_MODE == 1:
            r = bound + p0 * 0.0
        else:
            r = bound * tl.sqrt_rn(p0 * p0 + 1e-4)
        q = tl.minimum(tl.maximum(q, p0 - r, propagate_nan=tl.PropagateNan.ALL), p0 + r,
                       propagate_nan=tl.PropagateNan.ALL)
    return q
