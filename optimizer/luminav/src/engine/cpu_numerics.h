// src/engine/cpu_numerics.h: the CPU engine's per-element primitives, inline for its tile loops:
// the Philox streams (rounding stream format 2), storage conversions and the soft clip's tanh
// (docs/tdclm.md, docs/internals.md). Each is branch-free or nearly so, so the loops that call
// them vectorise; cpu_kernels.cpp compiles those loops at each vector width.
#pragma once

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>

#if defined(__GNUC__) || defined(__clang__)
#define LV_TILE_INLINE inline __attribute__((always_inline))
#else
#define LV_TILE_INLINE inline
#endif

// The instruction sets of the engine's AVX-512 forms (x86-64-v4's: F, BW, VL, DQ, CD), written
// once: X(name) for each, SEP between them. LV_AVX512_TARGET is the list as one target string
// (adjacent literals); cpu_kernels.cpp checks each name before it picks the forms.
#define LV_AVX512_FEATURES(X, SEP) \
  X("avx512f") SEP X("avx512bw") SEP X("avx512vl") SEP X("avx512dq") SEP X("avx512cd")
#define LV_AVX512_NAME(name) name
#define LV_AVX512_TARGET LV_AVX512_FEATURES(LV_AVX512_NAME, ",")

namespace luminav {
namespace cpu {
namespace numerics {

LV_TILE_INLINE std::uint32_t f2u(float x) noexcept {
  std::uint32_t u;
  std::memcpy(&u, &x, 4);
  return u;
}
LV_TILE_INLINE float u2f(std::uint32_t u) noexcept {
  float x;
  std::memcpy(&x, &u, 4);
  return x;
}

constexpr std::uint32_t kPhiloxKeyA = 0x9E3779B9u;    // key bump, word 0
constexpr std::uint32_t kPhiloxKeyB = 0xBB67AE85u;    // key bump, word 1
constexpr std::uint32_t kPhiloxRoundA = 0xD2511F53u;  // multiplier of counter word 0
constexpr std::uint32_t kPhiloxRoundB = 0xCD9E8D57u;  // multiplier of counter word 2

// The ten Philox4x32 rounds on counter (c0, c1, c2, c3) with key (k0, k1), in place.
LV_TILE_INLINE void philox_rounds(std::uint32_t& c0, std::uint32_t& c1, std::uint32_t& c2, std::uint32_t& c3,
                          std::uint32_t k0, std::uint32_t k1) noexcept {
  for (int r = 0; r < 10; ++r) {
    const std::uint64_t pa = static_cast<std::uint64_t>(kPhiloxRoundA) * c0;
    const std::uint64_t pb = static_cast<std::uint64_t>(kPhiloxRoundB) * c2;
    const std::uint32_t n0 = static_cast<std::uint32_t>(pb >> 32) ^ c1 ^ k0;
    const std::uint32_t n2 = static_cast<std::uint32_t>(pa >> 32) ^ c3 ^ k1;
    c1 = static_cast<std::uint32_t>(pb);
    c3 = static_cast<std::uint32_t>(pa);
    c0 = n0;
    c2 = n2;
    k0 += kPhiloxKeyA;
    k1 += kPhiloxKeyB;
  }
}
// Out: std::uint32_t (random_words) or std::uint16_t (the engine's tiles: cpu_philox.h).
template <class Out>
LV_TILE_INLINE void random_words_impl(std::uint64_t key, std::int64_t first, std::int64_t count,
                                      std::uint32_t stream, Out* out) noexcept {
  // Rounding stream format 2 (docs/tdclm.md): index i takes half h = i & 1 of word
  // w = (i >> 1) & 3 of Philox(counter = (lo32(j), hi32(j), stream, 0)), j = i >> 3. One Philox
  // call per group of eight: a partial group at either end, then whole groups in a loop the
  // compiler vectorises (the rounds inline, groups in the lanes).
  if (count <= 0) return;
  const std::uint32_t key0 = static_cast<std::uint32_t>(key);
  const std::uint32_t key1 = static_cast<std::uint32_t>(key >> 32);
  const std::int64_t end = first + count;
  auto group = [&](std::uint64_t j, std::uint32_t w[4]) {
    std::uint32_t c0 = static_cast<std::uint32_t>(j), c1 = static_cast<std::uint32_t>(j >> 32);
    std::uint32_t c2 = stream, c3 = 0;
    philox_rounds(c0, c1, c2, c3, key0, key1);
    w[0] = c0;
    w[1] = c1;
    w[2] = c2;
    w[3] = c3;
  };
  auto half = [](const std::uint32_t w[4], std::int64_t i) -> std::uint32_t {
    const int p = static_cast<int>(i & 7);
    return (w[p >> 1] >> (16 * (p & 1))) & 0xFFFFu;
  };
  std::int64_t i = first;
  // a group the run starts inside
  if (i & 7) {
    std::uint32_t w[4];
    group(static_cast<std::uint64_t>(i) >> 3, w);
    const std::int64_t stop = std::min<std::int64_t>(end, (i | 7) + 1);
    for (; i < stop; ++i) out[i - first] = static_cast<Out>(half(w, i));
  }
  // whole groups
  const std::int64_t groups = (end - i) >> 3;
  Out* dst = out + (i - first);
  const std::uint64_t j0 = static_cast<std::uint64_t>(i) >> 3;
  for (std::int64_t g = 0; g < groups; ++g) {
    const std::uint64_t j = j0 + static_cast<std::uint64_t>(g);
    std::uint32_t c0 = static_cast<std::uint32_t>(j), c1 = static_cast<std::uint32_t>(j >> 32);
    std::uint32_t c2 = stream, c3 = 0;
    philox_rounds(c0, c1, c2, c3, key0, key1);
    Out* o = dst + 8 * g;
    o[0] = static_cast<Out>(c0 & 0xFFFFu);
    o[1] = static_cast<Out>(c0 >> 16);
    o[2] = static_cast<Out>(c1 & 0xFFFFu);
    o[3] = static_cast<Out>(c1 >> 16);
    o[4] = static_cast<Out>(c2 & 0xFFFFu);
    o[5] = static_cast<Out>(c2 >> 16);
    o[6] = static_cast<Out>(c3 & 0xFFFFu);
    o[7] = static_cast<Out>(c3 >> 16);
  }
  i += groups * 8;
  // a partial group at the end
  if (i < end) {
    std::uint32_t w[4];
    group(static_cast<std::uint64_t>(i) >> 3, w);
    for (; i < end; ++i) out[i - first] = static_cast<Out>(half(w, i));
  }
}
// The bf16 roundings as the float32 bit pattern they give (the bf16 in the high half, the low half
// zero): only 32-bit integer operations and selects, so the tile loops that round moments keep one
// element width and vectorise at every ISA (AVX-512F has no 16-bit lanes). bf16_rne / bf16_sr are
// its high half.
LV_TILE_INLINE std::uint32_t bf16_rne_bits(float x) noexcept {
  const std::uint32_t u = f2u(x);
  const bool nan = (u & 0x7FFFFFFFu) > 0x7F800000u;
  const std::uint32_t rounded = (u + 0x7FFFu + ((u >> 16) & 1u)) & 0xFFFF0000u;
  return nan ? ((u & 0xFFFF0000u) | 0x00400000u) : rounded;
}

// Finite x: the high half of u + (r & 0xFFFF). Infinity and NaN: what bf16_rne gives, which for
// them is u's high half with NaN made quiet (0x0040), so no random bits are added.
LV_TILE_INLINE std::uint32_t bf16_sr_bits(float x, std::uint32_t r) noexcept {
  const std::uint32_t u = f2u(x);
  const bool finite = (u & 0x7F800000u) != 0x7F800000u;
  const bool nan = (u & 0x7FFFFFFFu) > 0x7F800000u;
  const std::uint32_t add = finite ? (r & 0xFFFFu) : 0u;
  const std::uint32_t quiet = nan ? 0x00400000u : 0u;
  return ((u + add) & 0xFFFF0000u) | quiet;
}

LV_TILE_INLINE std::uint16_t bf16_rne(float x) noexcept {
  return static_cast<std::uint16_t>(bf16_rne_bits(x) >> 16);
}
LV_TILE_INLINE std::uint16_t bf16_sr(float x, std::uint32_t r) noexcept {
  return static_cast<std::uint16_t>(bf16_sr_bits(x, r) >> 16);
}

// Branch-free IEEE half conversions (round to nearest even), exact for every input including
// subnormals, infinities and NaN; they rely only on float32 arithmetic in the default mode.
LV_TILE_INLINE float f16_to_f32(std::uint16_t h) noexcept {
  const std::uint32_t w = static_cast<std::uint32_t>(h) << 16;
  const std::uint32_t sign = w & 0x80000000u;
  const std::uint32_t two_w = w + w;
  const std::uint32_t exp_offset = 0xE0u << 23;
  const float normalized = u2f((two_w >> 4) + exp_offset) * 0x1.0p-112f;
  const float denormalized = u2f((two_w >> 17) | (126u << 23)) - 0.5f;
  const std::uint32_t bits = two_w < (1u << 27) ? f2u(denormalized) : f2u(normalized);
  return u2f(sign | bits);
}

LV_TILE_INLINE std::uint16_t f32_to_f16(float x) noexcept {
  float base = (std::fabs(x) * 0x1.0p+112f) * 0x1.0p-110f;
  const std::uint32_t w = f2u(x);
  const std::uint32_t shl1_w = w + w;
  const std::uint32_t sign = w & 0x80000000u;
  std::uint32_t bias = shl1_w & 0xFF000000u;
  if (bias < 0x71000000u) bias = 0x71000000u;
  base = u2f((bias >> 1) + 0x07800000u) + base;
  const std::uint32_t bits = f2u(base);
  const std::uint32_t exp_bits = (bits >> 13) & 0x00007C00u;
  const std::uint32_t mantissa_bits = bits & 0x00000FFFu;
  const std::uint32_t nonsign = exp_bits + mantissa_bits;
  return static_cast<std::uint16_t>((sign >> 16) | (shl1_w > 0xFF000000u ? 0x7E00u : nonsign));
}

// tanh(a) for 0 <= a < 0.625, tanh_f32's first branch: a + a^3 P(a^2).
LV_TILE_INLINE float tanh_small_abs(float a) noexcept {
  const float z = a * a;
  float ps = -5.70498872745e-3f;
  ps = ps * z + 2.06390887954e-2f;
  ps = ps * z - 5.37397155531e-2f;
  ps = ps * z + 1.33314422036e-1f;
  ps = ps * z - 3.33332819422e-1f;
  return a + a * z * ps;
}

constexpr std::uint32_t kTanhSmallBits = 0x3F200000u;  // 0.625f: |x| below it takes tanh_small_abs

// tanh in float32, within one ulp of the exact value (98.7 % of the inputs test_cpu_math.cpp
// sweeps are the correctly rounded tanh). For |x| < 0.625 an odd polynomial, x + x^3 P(x^2)
// (Cephes' tanhf coefficients); above, 1 - 2 / (e^{2|x|} + 1) with e^{2|x|} = 2^k e^r, |r| <=
// ln2/2, e^r by its degree-7 polynomial. Both are computed and one is selected, with integer
// selects for the cap (|x| at 10, where tanh rounds to 1), the sign (-0 stays -0) and NaN, so the
// loop that calls it stays one vector loop. Plain float32 operations in a fixed order: the same
// bits at every vector width.
LV_TILE_INLINE float tanh_f32(float x) noexcept {
  const std::uint32_t xb = f2u(x);
  const std::uint32_t ab0 = xb & 0x7FFFFFFFu;
  const std::uint32_t cap = 0x41200000u;  // 10.0f
  const float a = u2f(ab0 < cap ? ab0 : cap);  // NaN: restored below
  // |x| < 0.625
  const float small = tanh_small_abs(a);
  // |x| >= 0.625
  const float y = 2.0f * a;
  const float shift = 0x1.8p23f;  // y * log2(e) + shift: k in the low bits
  const float ks = y * 0x1.715476p0f + shift;
  const float k = ks - shift;
  const float r = (y - k * 0x1.62e4p-1f) - k * 0x1.7f7d1cp-20f;  // ln2 in two parts
  float pe = 1.9875691500e-4f;
  pe = pe * r + 1.3981999507e-3f;
  pe = pe * r + 8.3334519073e-3f;
  pe = pe * r + 4.1665795894e-2f;
  pe = pe * r + 1.6666665459e-1f;
  pe = pe * r + 5.0000001201e-1f;
  const float er = (pe * r) * r + r + 1.0f;            // e^r
  const float scale = u2f((f2u(ks) + 127u) << 23);      // 2^k, k in [0, 29]
  const float large = 1.0f - 2.0f / (er * scale + 1.0f);
  // Selected with an integer mask: a ?: of the two floats lets the compiler move each side under
  // a branch, which then stays scalar wherever the division must not be speculated (no masked
  // vector ops below AVX-512).
  const std::uint32_t use_small = 0u - static_cast<std::uint32_t>(a < 0.625f);
  const std::uint32_t t = (f2u(small) & use_small) | (f2u(large) & ~use_small);
  const std::uint32_t nan = 0u - static_cast<std::uint32_t>(ab0 > 0x7F800000u);
  return u2f(t | (xb & 0x80000000u) | (nan & 0x7FC00000u));
}

// tanh_f32(x) for |x| < 0.625 (f2u(x) & 0x7FFFFFFF below kTanhSmallBits), which is its first
// branch with x's sign: the same bits, without the second branch's exponential and division.
LV_TILE_INLINE float tanh_f32_small(float x) noexcept {
  const std::uint32_t xb = f2u(x);
  return u2f(f2u(tanh_small_abs(u2f(xb & 0x7FFFFFFFu))) | (xb & 0x80000000u));
}

}  // namespace numerics
}  // namespace cpu
}  // namespace luminav
