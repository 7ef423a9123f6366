"""kernels/catalog.py: which kernels exist, how each variant is compiled, and which variants a
launch group runs. The one interface of the ``triton`` backend, the AOT builder and (by its
mirror in C++, variant_keys) the C++ engine.
"""
from dataclasses import dataclass
from typing import Dict, List, Optional, Tuple

import torch

from . import tdclm
from .keys import variant_key
from .layout import BOUND_MODES, DTYPE_CODES, NONFINITE_POLICIES, S_DTYPE_Q8, LaunchFlags
from .quant import Q8

__all__ = [
    "COMPILE_OPTIONS",
    "NVIDIA_ONLY_OPTIONS",
    "variant_options",
    "KernelSpec",
    "KERNEL_SPECS",
    "JIT_ONLY_KERNEL_SPECS",
    "Variant",
    "LaunchFlags",
    "variants_for",
    "all_variants",
    "DEFAULT_DTYPE_COMBOS",
    "Q8_DTYPE_COMBOS",
]

# Compiler options every variant is built with, by the JIT launcher and the AOT builder alike.
# No floating-point contraction: with division and square root already IEEE-rounded (div_rn,
# sqrt_rn), each element's arithmetic is then the same sequence of correctly rounded float32
# operations as the C++ CPU engine (built with -ffp-contract=off) and the reference, so the
# backends agree to the bit except where tanh's implementations differ, and in the kernels whose
# gradients and moments are 16-bit, whose step 4 takes approximate forms (tdclm._direction). An
# FMA would change m' = beta1*m + (1-beta1)*g by up to an ulp of its operands, which under
# cancellation is many ulps of the result and moves bf16 moments by several storage ulps. The
# separate multiply and add cost about 4 instructions an element.
COMPILE_OPTIONS = {"enable_fp_fusion": False}
# Options Triton's NVIDIA backend takes and its AMD backend does not (HIPOptions has no register
# cap): left out of every compile for a HIP device, by the JIT launcher and the AOT builder alike.
NVIDIA_ONLY_OPTIONS = ("maxnreg",)


def variant_options(variant: "Variant", hip: bool = False) -> Dict[str, object]:
    """The options a launch (or an ahead-of-time compile) of ``variant`` passes to Triton:
    COMPILE_OPTIONS, num_warps, num_stages, and maxnreg where the variant sets one; for a HIP
    device (``hip``) without the NVIDIA-only ones."""
    options: Dict[str, object] = dict(COMPILE_OPTIONS, num_warps=variant.num_warps,
                                      num_stages=variant.num_stages)
    if variant.maxnreg is not None:
        options["maxnreg"] = variant.maxnreg
    if hip:
        options = {k: v for k, v in options.items() if k not in NVIDIA_ONLY_OPTIONS}
    return options


@dataclass(frozen=True)
class KernelSpec:
    name: str  # "pass1" | "reduce" | "pass2" | "single_pass" | "commit"
    fn: object  # the @triton.jit function
    args: tuple  # ((arg_name, triton_type_word), ...): runtime arguments in order
    constexprs: tuple  # constexpr parameter names in declaration order
    # compiler options beyond num_warps/num_stages, as ((name, value), ...): COMPILE_OPTIONS
    compile_options: tuple = tuple(sorted(COMPILE_OPTIONS.items()))


_PASS2_ARGS = (
    ("table", "*i64"), ("block_map", "*i32"), ("stats", "*fp32"), ("found_inf", "*i32"),
    ("lr", "*fp32"), ("seed", "i64"), ("sign", "fp32"), ("beta1", "fp32"), ("beta2", "fp32"),
    ("eps", "fp32"), ("weight_decay", "fp32"), ("clip", "fp32"), ("bound", "fp32"),
)

KERNEL_SPECS: Dict[str, KernelSpec] = {
    "pass1": KernelSpec(
        "pass1", tdclm._lumina_tdclm_pass1_kernel,
        (("table", "*i64"), ("block_map", "*i32"), ("partial_sum", "*fp32"),
         ("partial_bad", "*i32"), ("seed", "i64"), ("sign", "fp32"), ("beta1", "fp32"),
         ("beta2", "fp32"), ("eps", "fp32")),
        ("G_DTYPE", "S_DTYPE", "SR", "NEED_SUM", "BLOCK")),
    "reduce": KernelSpec(
        "reduce", tdclm._lumina_tdclm_reduce_kernel,
        (("table", "*i64"), ("partial_sum", "*fp32"), ("partial_bad", "*i32"),
         ("stats", "*fp32"), ("found_inf", "*i32"), ("ntensors", "i32")),
        ("BLOCK", "RBLOCK")),
    "pass2": KernelSpec(
        "pass2", tdclm._lumina_tdclm_pass2_kernel, _PASS2_ARGS,
        ("P_DTYPE", "G_DTYPE", "S_DTYPE", "SR", "BOUND_MODE", "USE_CLIP", "CHECK_FLAG", "BLOCK")),
    "single_pass": KernelSpec(
        "single_pass", tdclm._lumina_adamw_single_pass_kernel, _PASS2_ARGS,
        ("P_DTYPE", "G_DTYPE", "S_DTYPE", "SR", "BOUND_MODE", "BLOCK")),
    "commit": KernelSpec(
        "commit", tdclm._lumina_tdclm_commit_kernel,
        (("table", "*i64"), ("found_inf", "*i32"), ("ntensors", "i32")),
        ("CHECK_FLAG", "TBLOCK")),
}

# Kernels only the triton backend launches (just in time; never in an AOT bundle).
JIT_ONLY_KERNEL_SPECS: Dict[str, KernelSpec] = {
    "commit_last": KernelSpec(
        "commit_last", tdclm._lumina_tdclm_commit_last_kernel,
        (("table", "*i64"), ("found_inf", "*i32"), ("skipped", "*i64"), ("ntensors", "i32")),
        ("TBLOCK",)),
}

# Launch shapes, measured on an H200 (torch 2.11, Triton 3.6; benchmarks/tune_launch.py, one
# 256M-element tensor, benchmarks/results/2026-11-29-h200-tune.csv). Pass 1 and pass 2: BLOCK
# 1024 with 4 warps (8 elements a thread) beat 2048/8, 2048/4, 4096/8 and 1024/8 in every mix:
# fp32 AdamW mode 4.10 TB/s (2048/8: 3.96), bf16 params with fp32 moments 2.96 TB/s (2048/8:
# 2.49; that mix is bound by the Philox rounding words, not by memory). Pass 1 and pass 2 of a
# group must share BLOCK (one block_map), and reduce must know it.
ELEMENTWISE_BLOCK = 1024
ELEMENTWISE_WARPS = 4
# Reduce: one program per tensor sums cdiv(numel, BLOCK) partials in chunks of RBLOCK. The one
# program that owns the 262144 partials of a 256M tensor waits on its chunk loads one after the
# other: 8192 with 8 warps took 2-4 % off the clipped step against 1024/4, and 16384 with 16
# warps 4-6 % more (fp32 2671 vs 2838 us, bf16 5420 vs 5529 us; 32768/32: 2848, 5457;
# benchmarks/results/2026-11-29-h200-tune-2.csv).
REDUCE_RBLOCK = 16384
REDUCE_WARPS = 16
# Register cap of the single-pass kernel when every element tensor is 16-bit and nothing is
# rounded stochastically (bf16 params, grads and moments, round to nearest): uncapped it takes
# 68 registers a thread, which leaves room for 7 programs of 4 warps on an SM; at 64 (a few
# bytes of spill, outside the element loop) 8 fit, and the step ran 1053.7 instead of 1090.7 us
# on one 256M tensor (H200, torch 2.11, Triton 3.6; 56: 1087.8, 48: 1244.8). Every other mix
# measured slower under a cap (fp32: 1810.7 vs 1808.7 us at 64; bf16 params with fp32 moments
# and SR: 1869.6 vs 1748.8), so they keep the compiler's choice. A cap changes no arithmetic.
SINGLE_PASS_16BIT_MAXNREG = 64
# Register caps of the two passes when every element tensor they touch is 16-bit and bf16 stores
# round stochastically (bf16 params and moments, clip > 0). Uncapped, ptxas gives pass 1 72
# registers a thread (7 programs an SM) although it fits 48 with no spill (10 programs), and
# pass 2 66 (64 fits, 8 programs). One 256M tensor, H200, torch 2.11, Triton 3.6, one call
# (benchmarks/results/2026-12-01-h200-sr-caps.txt): the two-pass step 2141.0 us uncapped,
# 2009.3 at (48, 64), 2008.0 at (56, 64), 2052.2 at (48, none), 2059.8 at (64, 64).
SR_16BIT_PASS1_MAXNREG = 48
SR_16BIT_MAXNREG = 64
# Register cap of the q8 update kernels (S_DTYPE 3, pass 2 and the single pass): their masked
# branches (row lengths that 256 does not divide, a tensor's last program) take far more
# registers than the full branch every program of a 256-aligned tensor runs (sm_90, Triton 3.6:
# 120 registers the full branch alone, 222 the whole kernel), and registers are allotted by the
# kernel's heaviest branch; capped, the masked branches spill instead.
Q8_MAXNREG = 128
# Commit: one program; 1024 counters per chunk covers the 1000-tiny-tensor case in one pass.
COMMIT_TBLOCK = 1024
COMMIT_WARPS = 4
# No kernel here has a loop over global memory that software pipelining would help; 1 stage
# keeps the shared-memory use at 0 (and the same value in the AOT build).
NUM_STAGES = 1


def _spec_of(kernel: str) -> KernelSpec:
    spec = KERNEL_SPECS.get(kernel)
    return spec if spec is not None else JIT_ONLY_KERNEL_SPECS[kernel]


@dataclass(frozen=True)
class Variant:
    kernel: str  # key into KERNEL_SPECS
    constexprs: tuple  # ((name, int_value), ...) in KernelSpec.constexprs order
    num_warps: int
    num_stages: int
    # registers a thread may use (Triton's ``maxnreg``), or None for the compiler's choice; a
    # launch-shape choice like num_warps that changes no result, so it is not part of the key
    maxnreg: Optional[int] = None

    def key(self) -> str:
        """e.g. "pass2.p1g1s0.sr1.b2.c1.f1.B1024.w4" (docs/internals.md, "Variant keys").

        Order: kernel, the dtype codes present (p, g, s) joined, then sr, b, c, f, n, B, R, T in
        that order for the constexprs the kernel takes, then w (num_warps).
        """
        return variant_key(self.kernel, dict(self.constexprs), self.num_warps)

    @property
    def spec(self) -> KernelSpec:
        return _spec_of(self.kernel)

    def constexpr_dict(self) -> Dict[str, int]:
        return dict(self.constexprs)


def _make_variant(kernel: str, values: Dict[str, int], num_warps: int,
                  maxnreg: Optional[int] = None) -> Variant:
    spec = _spec_of(kernel)
    missing = [n for n in spec.constexprs if n not in values]
    if missing:
        raise ValueError(f"variant of {kernel!r} lacks constexprs {missing}")
    return Variant(kernel, tuple((n, int(values[n])) for n in spec.constexprs), num_warps,
                   NUM_STAGES, maxnreg)


def _dtype_code(dtype: torch.dtype, what: str) -> int:
    try:
        return DTYPE_CODES[dtype]
    except KeyError:
        raise ValueError(
            f"{what} dtype {dtype} is not supported by the Triton kernels; use one of "
            f"float32, bfloat16, float16") from None


def variants_for(param_dtype, grad_dtype, state_dtype, flags: LaunchFlags) -> Dict[str, Variant]:
    """The variants one launch group runs: {"pass1", "reduce", "pass2"} + "commit" when pass 1 is
    needed, else {"single_pass", "commit"}."""
    p = _dtype_code(param_dtype, "param")
    g = _dtype_code(grad_dtype, "grad")
    s = S_DTYPE_Q8 if state_dtype == Q8 else _dtype_code(state_dtype, "state")
    if s == 2:
        raise ValueError("state_dtype float16 is not supported; use float32 or bfloat16")
    sr, bound_mode = int(flags.sr), int(flags.bound_mode)
    use_clip, check = int(flags.use_clip), int(flags.check)
    out: Dict[str, Variant] = {}
    # every tensor a pass touches 16-bit, and SR (the caps were measured for float moments;
    # q8 variants keep the compiler's choice)
    sr_16bit = bool(sr) and g != 0 and s in (1, 2)
    if flags.needs_pass1:
        out["pass1"] = _make_variant(
            "pass1", dict(G_DTYPE=g, S_DTYPE=s, SR=sr, NEED_SUM=use_clip, BLOCK=ELEMENTWISE_BLOCK),
            ELEMENTWISE_WARPS, SR_16BIT_PASS1_MAXNREG if sr_16bit and use_clip else None)
        out["reduce"] = _make_variant(
            "reduce", dict(BLOCK=ELEMENTWISE_BLOCK, RBLOCK=REDUCE_RBLOCK), REDUCE_WARPS)
        out["pass2"] = _make_variant(
            "pass2", dict(P_DTYPE=p, G_DTYPE=g, S_DTYPE=s, SR=sr, BOUND_MODE=bound_mode,
                          USE_CLIP=use_clip, CHECK_FLAG=check, BLOCK=ELEMENTWISE_BLOCK),
            ELEMENTWISE_WARPS, Q8_MAXNREG if s == S_DTYPE_Q8 else
            SR_16BIT_MAXNREG if sr_16bit and p != 0 else None)
    else:
        all_16bit = p != 0 and g != 0 and s in (1, 2)
        out["single_pass"] = _make_variant(
            "single_pass", dict(P_DTYPE=p, G_DTYPE=g, S_DTYPE=s, SR=sr, BOUND_MODE=bound_mode,
                                BLOCK=ELEMENTWISE_BLOCK),
            ELEMENTWISE_WARPS, Q8_MAXNREG if s == S_DTYPE_Q8 else
            SINGLE_PASS_16BIT_MAXNREG if all_16bit and not sr else None)
    out["commit"] = _make_variant("commit", dict(CHECK_FLAG=check, TBLOCK=COMMIT_TBLOCK),
                                  COMMIT_WARPS)
    return out


# The commit that also counts a skipped step and clears the flag (TritonBackend.commit_last).
COMMIT_LAST_VARIANT = _make_variant("commit_last", dict(TBLOCK=COMMIT_TBLOCK), COMMIT_WARPS)


DEFAULT_DTYPE_COMBOS: List[Tuple[torch.dtype, torch.dtype, torch.dtype]] = [
    (torch.float32, torch.float32, torch.float32),
    (torch.float32, torch.float32, torch.bfloat16),  # fp32 weights, half-size moments
    (torch.bfloat16, torch.bfloat16, torch.float32),
    (torch.bfloat16, torch.bfloat16, torch.bfloat16),
    (torch.float16, torch.float16, torch.float32),
    (torch.bfloat16, torch.float32, torch.float32),
]


# q8 moments (state "q8") with every (param, grad) pair the float moments ship with.
Q8_DTYPE_COMBOS: List[Tuple[torch.dtype, torch.dtype, str]] = list(dict.fromkeys(
    (p, g, Q8) for p, g, _s in DEFAULT_DTYPE_COMBOS))


def all_variants(dtype_combos=DEFAULT_DTYPE_COMBOS + Q8_DTYPE_COMBOS) -> List[Variant]:
    """Every variant the given (param, grad, state) dtype combos may launch, deduplicated, in
    key order: all bound modes, clip on/off, every nonfinite policy, SR on/off (normalised)."""
    seen: Dict[str, Variant] = {}
    for param_dtype, grad_dtype, state_dtype in dtype_combos:
        for bound_mode in sorted(BOUND_MODES.values()):
            for clip in (0.0, 1.0):
                for nonfinite in NONFINITE_POLICIES:
                    for sr in (False, True):
                        flags = LaunchFlags.normalised(
                            param_dtype, state_dtype, stochastic_rounding=sr,
                            bound_mode=bound_mode, clip=clip, nonfinite=nonfinite)
                        for v in variants_for(param_dtype, grad_dtype, state_dtype,
                                              flags).values():
                            seen.setdefault(v.key(), v)
    return [seen[k] for k in sorted(seen)]
