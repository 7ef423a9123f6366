"""Random streams and bf16 stochastic rounding (docs/tdclm.md, "Rounding" and "Random streams")."""
from __future__ import annotations

import math
import os
import random
import subprocess
import sys

import pytest
import torch

from conftest import assert_bitwise_equal, bits, requires_triton
from luminamoon import LuminaMoon, tdclm
from luminamoon.optimizer import rng
from luminamoon.optimizer._groups import LaunchGroup
from luminamoon.optimizer._validation import make_hyper
from luminamoon.optimizer.backends.reference import ReferenceBackend

M32 = 0xFFFFFFFF

# Random123's known-answer vectors for Philox4x32-10: (key lo, key hi), counter, output.
PHILOX_KAT = [
    ((0x00000000, 0x00000000), (0x00000000,) * 4,
     (0x6627E8D5, 0xE169C58D, 0xBC57AC4C, 0x9B00DBD8)),
    ((0xFFFFFFFF, 0xFFFFFFFF), (0xFFFFFFFF,) * 4,
     (0x408F276D, 0x41C83B0E, 0xA20BC7C6, 0x6D5451FD)),
    ((0xA4093822, 0x299F31D0), (0x243F6A88, 0x85A308D3, 0x13198A2E, 0x03707344),
     (0xD16CFE09, 0x94FDCCEB, 0x5001E420, 0x24126EA1)),
]


# --------------------------------------------------------------------------------------------
# Philox4x32-10 and splitmix64
# --------------------------------------------------------------------------------------------
@pytest.mark.parametrize("key,ctr,expected", PHILOX_KAT, ids=["zeros", "ones", "pi"])
@pytest.mark.parametrize("form", ["int", "tensor", "tensor-key"])
def test_philox_known_answers(key, ctr, expected, form):
    k64 = key[0] | (key[1] << 32)
    if form == "int":
        out = rng.philox4x32_10(k64, *ctr)
    elif form == "tensor":
        out = rng.philox4x32_10(k64, *(torch.tensor([c], dtype=torch.int64) for c in ctr))
    else:  # the key as (lo, hi) device words, as the reference computes it on the device
        words = tuple(torch.tensor(w, dtype=torch.int64) for w in key)
        out = rng.philox4x32_10(words, *(torch.tensor([c], dtype=torch.int64) for c in ctr))
    assert tuple(int(w) for w in out) == expected


def test_splitmix64_reference_sequence():
    """splitmix64 seeded with 0 (Vigna's reference generator): next() returns splitmix64 of
    0, gamma, 2*gamma, ... — its published first outputs."""
    gamma = rng.SPLITMIX_GAMMA
    outputs = [rng.splitmix64((i * gamma) & rng.MASK64) for i in range(3)]
    assert outputs == [0xE220A8397B1DCDAF, 0x6E789E6AA1B965F4, 0x06C45D188009454F]


def test_rounding_seed_is_the_nested_splitmix():
    for seed, t, k in [(0, 1, 0), (2**64 - 1, 1, 3), (123456789, 2**40, 2**20)]:
        inner = rng.splitmix64((seed + t) % 2**64)
        assert rng.rounding_seed(seed, t, k) == rng.splitmix64((inner + k) % 2**64)


def test_device_rounding_seed_equals_host():
    """seed_tk computed from a device step tensor (16-bit limb arithmetic) equals the host's."""
    r = random.Random(5)
    cases = [(2**64 - 1, 1, 0), (2**64 - 5, 7, 2**31), (0, 0, 0), (2**63, 2**62, 7)]
    cases += [(r.getrandbits(64), r.getrandbits(r.choice([5, 33, 62])), r.getrandbits(24))
              for _ in range(300)]
    for seed, t, k in cases:
        lo, hi = rng.rounding_seed_words(seed, torch.tensor(t, dtype=torch.int64), k)
        assert int(lo) | (int(hi) << 32) == rng.rounding_seed(seed, t, k), (seed, t, k)


def test_random_words_counter_layout():
    """Format 2: R16(i, s) is half i & 1 of word (i >> 1) & 3 of Philox(seed_tk, (lo32(j),
    hi32(j), s, 0)) with j = i >> 3."""
    index = torch.tensor([0, 1, 5, 7, 8, 2**32 - 1, 2**32, 2**32 + 5, 3 * 2**40 + 17,
                          2**35 + 3], dtype=torch.int64)
    seed, t, k = 0xDEADBEEFCAFEF00D, 3, 11
    key = rng.rounding_seed(seed, t, k)
    for stream in (0, 1, 2):
        words = rng.random_words(seed, t, k, index, stream)
        expected = []
        for i in index.tolist():
            j = i >> 3
            w = rng.philox4x32_10(key, j & M32, j >> 32, stream, 0)[(i >> 1) & 3]
            expected.append((w >> (16 * (i & 1))) & 0xFFFF)
        assert words.tolist() == expected
        tensor_t = rng.random_words(seed, torch.tensor(t), k, index, stream)
        assert torch.equal(words, tensor_t)
    assert not torch.equal(rng.random_words(seed, t, k, index, 0),
                           rng.random_words(seed, t, k, index, 1))


@pytest.mark.parametrize("first", [0, 3, 8, 2**32 - 5, 2**40 + 1])
@pytest.mark.parametrize("count", [1, 5, 8, 77])
def test_stream_words_are_random_words_of_the_run(first, count):
    """stream_words (one Philox per group of eight) gives random_words of every index."""
    seed, t, k = 77, 4, 2
    key = rng.rounding_seed(seed, t, k)
    for stream in (0, 1, 2):
        got = rng.stream_words(key, first, count, stream, "cpu")
        index = torch.arange(first, first + count, dtype=torch.int64)
        assert torch.equal(got, rng.random_words(seed, t, k, index, stream))
        on_device = rng.stream_words(rng.rounding_seed_words(seed, torch.tensor(t), k), first,
                                     count, stream, "cpu")
        assert torch.equal(on_device, got)


_TRITON_PHILOX_SCRIPT = r"""
import os, sys
os.environ["TRITON_INTERPRET"] = "1"  # before triton is imported: tl.philox is interpreted too
import torch, triton, triton.language as tl

@triton.jit
def philox_words_kernel(out_ptr, idx_ptr, seed_ptr, stream, n, BLOCK: tl.constexpr):
    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    mask = offs < n
    idx = tl.load(idx_ptr + offs, mask=mask, other=0)
    c0 = (idx & 0xFFFFFFFF).to(tl.uint32)
    c1 = ((idx >> 32) & 0xFFFFFFFF).to(tl.uint32)
    c2 = tl.zeros_like(c0) + stream
    c3 = tl.zeros_like(c0)
    seed = tl.load(seed_ptr).to(tl.uint64, bitcast=True)  # the int64 two's complement
    r0, r1, r2, r3 = tl.philox(seed, c0, c1, c2, c3)
    base = out_ptr + offs * 4
    tl.store(base + 0, r0.to(tl.int32, bitcast=True), mask=mask)
    tl.store(base + 1, r1.to(tl.int32, bitcast=True), mask=mask)
    tl.store(base + 2, r2.to(tl.int32, bitcast=True), mask=mask)
    tl.store(base + 3, r3.to(tl.int32, bitcast=True), mask=mask)

index, seeds, streams, out_path = torch.load(sys.argv[1])
results = {}
n = index.numel()
for seed in seeds:
    for stream in streams:
        out = torch.empty(n * 4, dtype=torch.int32)
        signed = seed - 2**64 if seed >= 2**63 else seed
        philox_words_kernel[(triton.cdiv(n, 128),)](
            out, index, torch.tensor([signed], dtype=torch.int64), stream, n, BLOCK=128)
        results[(seed, stream)] = out.view(n, 4).to(torch.int64) & 0xFFFFFFFF
torch.save(results, out_path)
"""


@requires_triton
@pytest.mark.triton
def test_philox_matches_triton_language(tmp_path):
    """The torch Philox equals tl.philox (run by Triton's interpreter) for the same 64-bit key
    and counters. A fresh interpreter: TRITON_INTERPRET must be set before triton loads."""
    index = torch.cat([torch.arange(0, 200, dtype=torch.int64),
                       torch.tensor([2**32 - 1, 2**32, 2**33 + 7, 2**45 + 3], dtype=torch.int64)])
    seeds = [0, 1, 0x0123456789ABCDEF, 2**63 + 12345, 2**64 - 1]
    streams = [0, 2]
    args = tmp_path / "args.pt"
    out = tmp_path / "out.pt"
    torch.save((index, seeds, streams, str(out)), args)
    script = tmp_path / "philox_triton.py"
    script.write_text(_TRITON_PHILOX_SCRIPT)
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    proc = subprocess.run([sys.executable, str(script), str(args)], env=env,
                          capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:]
    results = torch.load(out)
    for seed in seeds:
        for stream in streams:
            got = results[(seed, stream)]
            ours = rng.philox4x32_10(seed, index & M32, index >> 32, stream, 0)
            for w in range(4):
                assert torch.equal(got[:, w], ours[w]), f"seed {seed:#x} stream {stream} word {w}"


# --------------------------------------------------------------------------------------------
# rounding to bf16
# --------------------------------------------------------------------------------------------
def _neighbours(x: torch.Tensor):
    """(toward zero, away from zero) bf16 neighbours of float32 ``x``, as float64."""
    b = bits(x).to(torch.int64) & M32
    down = ((b >> 16) << 16)
    up = down + 0x10000
    as_f = lambda v: torch.where(v >= 2**31, v - 2**32, v).to(torch.int32).view(torch.float32)
    return as_f(down).double(), as_f(up).double(), (b & 0xFFFF)


def test_round_to_bf16_is_exactly_unbiased_over_all_low_words():
    """For each x, the 65536 possible low words round up exactly (low bits of x) times, so the
    mean over them equals x exactly: E[round(x)] = x."""
    gen = torch.Generator().manual_seed(0)
    xs = torch.cat([torch.randn(24, generator=gen) * 10.0 ** torch.randint(-30, 30, (24,), generator=gen),
                    torch.tensor([1.0, -1.0, 0.0, -0.0, 3e38, -3e38, 1e-40])])
    words = torch.arange(65536, dtype=torch.int64)
    for x in xs:
        rounded = rng.round_to_bf16(x.expand(65536).contiguous(), words).double()
        # The float64 sum of 65536 values with 8 significant bits each is exact.
        assert rounded.sum().item() / 65536 == x.double().item(), x.item()


def test_round_to_bf16_picks_a_neighbour_and_keeps_exact_values():
    gen = torch.Generator().manual_seed(1)
    x = torch.randn(4096, generator=gen)
    words = torch.randint(0, 2**32, (4096,), generator=gen, dtype=torch.int64)
    out = rng.round_to_bf16(x, words).double()
    down, up, low = _neighbours(x)
    assert bool(((out == down) | (out == up)).all())
    # Zero low word: truncation toward zero; all-ones low word: away unless exact.
    assert torch.equal(rng.round_to_bf16(x, torch.zeros_like(words)).double(), down)
    ones = torch.full_like(words, 0xFFFF)
    assert torch.equal(rng.round_to_bf16(x, ones).double(), torch.where(low == 0, down, up))
    exact = x.to(torch.bfloat16).float()
    assert_bitwise_equal(rng.round_to_bf16(exact, words), exact.to(torch.bfloat16))


def test_round_to_bf16_nonfinite_round_to_nearest():
    x = torch.tensor([float("inf"), float("-inf"), float("nan")])
    words = torch.full((3,), 0xFFFF, dtype=torch.int64)
    out = rng.round_to_bf16(x, words)
    assert out[0] == float("inf") and out[1] == float("-inf") and torch.isnan(out[2])
    assert_bitwise_equal(rng.round_to_bf16(x, None), x.to(torch.bfloat16))


# --------------------------------------------------------------------------------------------
# stochastic rounding through the optimizer
# --------------------------------------------------------------------------------------------
SR_MODE = dict(lr=1e-3, weight_decay=0.0, clip=0.0, nonfinite="propagate", backend="reference")


def _bf16_step(seed, n=50_000, value=1.0, grad=1.0, **kw):
    p = torch.nn.Parameter(torch.full((n,), value, dtype=torch.bfloat16))
    p.grad = torch.full((n,), grad, dtype=torch.bfloat16)
    opt = LuminaMoon([p], seed=seed, **{**SR_MODE, **kw})
    opt.step()
    return p.detach()


def test_stochastic_rounding_is_unbiased_through_a_step():
    """All elements share q (below one bf16 ulp from p, so nearest rounding would never move
    p). The mean of the stored values equals E = down + (up - down) * frac within 8 sigma of
    the binomial spread; the data and seed are fixed, so the test cannot flake."""
    n = 50_000
    q32 = torch.nn.Parameter(torch.ones(1))  # the same step in float32 gives q exactly
    q32.grad = torch.ones(1)
    LuminaMoon([q32], seed=0, **SR_MODE).step()
    q = q32.detach()
    assert q.item() != 1.0 and q.to(torch.bfloat16).item() == 1.0  # nearest would stagnate
    down, up, low = _neighbours(q)
    frac = low.item() / 65536
    expected = down.item() + (up.item() - down.item()) * frac
    sigma = abs(up.item() - down.item()) * math.sqrt(frac * (1 - frac) / n)
    stored = _bf16_step(seed=1234, n=n).double()
    assert bool(((stored == down) | (stored == up)).all())
    assert abs(stored.mean().item() - expected) <= 8 * sigma
    # ...and the nearest-rounding run does stagnate.
    assert bool((_bf16_step(seed=1234, n=n, stochastic_rounding=False) == 1.0).all())


def test_stochastic_rounding_reproducible_and_seeded():
    a = _bf16_step(seed=7, n=4096)
    b = _bf16_step(seed=7, n=4096)
    c = _bf16_step(seed=8, n=4096)
    assert_bitwise_equal(a, b, "same seed")
    assert not torch.equal(bits(a), bits(c))


def test_words_follow_the_streams():
    """Stored bf16 p, m and v equal rounding of the float32 values with streams 0, 1, 2 of
    (seed, t, k) over the global element index — checked against rng directly."""
    seed, n = 99, 777
    gen = torch.Generator().manual_seed(3)
    p32 = torch.randn(n, generator=gen)
    g32 = torch.randn(n, generator=gen)
    other = torch.nn.Parameter(torch.zeros(3, dtype=torch.bfloat16))  # k = 0
    p = torch.nn.Parameter(p32.to(torch.bfloat16))  # k = 1
    p.grad, other.grad = g32.to(torch.bfloat16), torch.zeros(3, dtype=torch.bfloat16)
    opt = LuminaMoon([other, p], seed=seed, state_dtype=torch.bfloat16, **SR_MODE)
    # The same step on float32 copies, without rounding, gives the float32 values to round.
    f = torch.nn.Parameter(p.detach().float())
    f.grad = p.grad.float()
    ref = LuminaMoon([f], seed=seed, **SR_MODE)
    p_before = p.detach().clone()
    opt.step()
    idx = torch.arange(n, dtype=torch.int64)
    m_new = (1 - torch.tensor(0.9)) * p.grad.float()  # beta1 * 0 + (1 - beta1) * g
    assert_bitwise_equal(opt.state[p]["exp_avg"],
                         rng.round_to_bf16(m_new, rng.random_words(seed, 1, 1, idx, 1)), "m")
    v_new = (1 - torch.tensor(0.999)) * (p.grad.float() * p.grad.float())
    assert_bitwise_equal(opt.state[p]["exp_avg_sq"],
                         rng.round_to_bf16(v_new, rng.random_words(seed, 1, 1, idx, 2)), "v")
    # p: recompute q in float32 from the stored (rounded) moments, as steps 3-8 do.
    m = opt.state[p]["exp_avg"].float()
    v = opt.state[p]["exp_avg_sq"].float()
    bc1 = torch.tensor(1 - 0.8999999761581421, dtype=torch.float32)
    bc2 = torch.tensor(1 - 0.9990000128746033, dtype=torch.float32)
    u = (m * (1.0 / bc1)) / (torch.sqrt(v * (1.0 / bc2)) + torch.tensor(1e-8))
    q = p_before.float() * (1 - torch.tensor(1e-3) * 0.0) - torch.tensor(1e-3) * u
    assert_bitwise_equal(p.detach(), rng.round_to_bf16(q, rng.random_words(seed, 1, 1, idx, 0)), "p")
    del ref


def _functional(params, grads, k_indices, seed, **kw):
    n = len(params)
    states = [torch.zeros_like(p, dtype=torch.float32) for p in params]
    sqs = [torch.zeros_like(p, dtype=torch.float32) for p in params]
    steps = [torch.zeros((), dtype=torch.int64) for _ in params]
    tdclm(params, grads, states, sqs, None, steps, param_indices=k_indices, lr=1e-2,
          betas=(0.9, 0.999), eps=1e-8, weight_decay=0.0, clip=kw.get("clip", 0.0),
          bound_mode="none", bound=1.0, maximize=False, nonfinite="skip",
          stochastic_rounding=True, seed=seed)
    return params


def test_bits_do_not_depend_on_the_tensors_launched_together():
    """Stepping [a, b] together equals stepping a alone with param_indices=[0] and b alone
    with param_indices=[1], bitwise; and it differs from b stepped as k=0."""
    gen = torch.Generator().manual_seed(11)
    a0 = torch.randn(300, generator=gen).to(torch.bfloat16)
    b0 = torch.randn(5, 7, generator=gen).to(torch.bfloat16)
    ga = torch.randn(300, generator=gen).to(torch.bfloat16)
    gb = torch.randn(5, 7, generator=gen).to(torch.bfloat16)
    for clip in (0.0, 2.0):
        a, b = torch.nn.Parameter(a0.clone()), torch.nn.Parameter(b0.clone())
        a.grad, b.grad = ga.clone(), gb.clone()
        LuminaMoon([a, b], seed=5, lr=1e-2, weight_decay=0.0, clip=clip, backend="reference").step()
        (a_alone,) = _functional([a0.clone()], [ga], [0], 5, clip=clip)
        (b_alone,) = _functional([b0.clone()], [gb], [1], 5, clip=clip)
        (b_as_k0,) = _functional([b0.clone()], [gb], [0], 5, clip=clip)
        assert_bitwise_equal(a.detach(), a_alone, "a")
        assert_bitwise_equal(b.detach(), b_alone, "b")
        assert not torch.equal(bits(b.detach()), bits(b_as_k0))


def _group(params, grads, offsets, global_numels, seed, clip, sr=True):
    hyper = make_hyper(dict(lr=1e-2, betas=(0.9, 0.999), eps=1e-8, weight_decay=0.1, clip=clip,
                            bound_mode="none", bound=1.0, maximize=False, nonfinite="propagate",
                            stochastic_rounding=sr, state_dtype=torch.bfloat16))
    return LaunchGroup(
        device=params[0].device, param_dtype=params[0].dtype, grad_dtype=grads[0].dtype,
        state_dtype=torch.bfloat16, hyper=hyper, lr=1e-2, seed=seed, params=params, grads=grads,
        exp_avgs=[torch.zeros_like(p) for p in params],
        exp_avg_sqs=[torch.zeros_like(p) for p in params], p_inits=None,
        steps=[torch.zeros((), dtype=torch.int64) for _ in params],
        param_indices=[4] * len(params), elem_offsets=offsets, global_numels=global_numels)


def test_bits_do_not_depend_on_sharding():
    """A tensor cut into two shards (elem_offsets, global_numels) draws the same bits as whole;
    with clip the shards' S summed over the shards gives the whole tensor's threshold."""
    gen = torch.Generator().manual_seed(2)
    whole = torch.randn(1001, generator=gen).to(torch.bfloat16)
    grad = torch.randn(1001, generator=gen).to(torch.bfloat16)
    backend = ReferenceBackend()
    for clip in (0.0, 1.5):
        one = _group([whole.clone()], [grad], [0], [1001], seed=17, clip=clip)
        cut = 600
        shards = [_group([whole[:cut].clone()], [grad[:cut]], [0], [1001], 17, clip),
                  _group([whole[cut:].clone()], [grad[cut:]], [cut], [1001], 17, clip)]
        flag = torch.zeros((), dtype=torch.int32)
        if clip:
            backend.pass1(one, flag)
            for s in shards:
                backend.pass1(s, flag)
            total = shards[0].stats + shards[1].stats  # the all-reduce over shard ranks
            for s in shards:
                s.stats = total.clone()
            # The whole tensor's S, summed in another order, equals to float32 rounding;
            # use it exactly so that the bits must agree.
            one.stats = total.clone()
        for g in [one] + shards:
            backend.pass2(g, flag)
        joined = torch.cat([shards[0].params[0], shards[1].params[0]])
        assert_bitwise_equal(joined, one.params[0], f"param clip={clip}")
        joined_m = torch.cat([shards[0].exp_avgs[0], shards[1].exp_avgs[0]])
        assert_bitwise_equal(joined_m, one.exp_avgs[0], "exp_avg")
