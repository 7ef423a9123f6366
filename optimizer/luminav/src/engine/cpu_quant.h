// src/engine/cpu_quant.h: q8 moments in the CPU engine (docs/tdclm.md "Quantized moments (q8)"):
// the codebooks, the block layout, decode, the block scale and the stochastic store rule
//
// The codebooks' formulas in C++: cpu_quant.cpp's (the tables) and value_m / value_v below (the
// same products for the vector loops; tests/test_cpu_quant.cpp checks every entry); Python's are
// kernels/quant.py, and tests/test_contract.py compares the 256 float32 values of each. The
// element functions below are inline so that the q8 passes (cpu_q8.cpp), compiled at each vector
// width, vectorise them; each is float32 IEEE arithmetic in a fixed order without contraction
// (-ffp-contract=off), with integer masks and selects where it picks, so every width gives the
// same bits. The store rule's search is an estimate and an exact fix (bracket_m, bracket_v), not a
// search over a table, and no element divides: one reciprocal a block.
#pragma once

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <limits>

#include "engine/cpu_numerics.h"

namespace luminav {
namespace cpu {
namespace quant {

// Elements of a q8 block (kernels/quant.py BLOCK): one float32 scale per 256 one-byte codes.
constexpr int kBlock = 256;
// The codes whose value is 0: what a fresh, all-zero or non-finite block stores.
constexpr std::uint8_t kZeroCodeM = 128;
constexpr std::uint8_t kZeroCodeV = 0;

// fl(1/127) and fl(1/255), the float32 quotients (IEEE division; tests/test_cpu_quant.cpp
// checks the bit patterns 0x3C010204 and 0x3B808081).
float inv127() noexcept;
float inv255() noexcept;

// The codebooks' entries by their formulas (float32 products, each rounded to nearest):
// C_m[c] = -(t*t)*t, t = (128 - c) * 2^-7 for c < 128; C_m[128] = 0;
// C_m[c] = (t*t)*t, t = (c - 128) * fl(1/127) for c > 128. C_v[c] = s*s, s = t*t, t = c * fl(1/255).
float codebook_m(int c) noexcept;
float codebook_v(int c) noexcept;
// The 256 values of each, computed once by those formulas (ascending).
const float* codebook_m_table() noexcept;
const float* codebook_v_table() noexcept;

// The block layout of a tensor of `numel` elements read as rows of `row_len` (K) elements: nb =
// ceil(K / 256) blocks a row, numel / K * nb blocks in all (block index qb = r * nb + b).
inline std::int64_t blocks_per_row(std::int64_t row_len) noexcept { return (row_len + kBlock - 1) / kBlock; }
inline std::int64_t num_blocks(std::int64_t numel, std::int64_t row_len) noexcept {
  return row_len > 0 ? numel / row_len * blocks_per_row(row_len) : 0;
}
// Block qb's first element and element count.
inline void block_range(std::int64_t qb, std::int64_t row_len, std::int64_t& first, int& count) noexcept {
  const std::int64_t nb = blocks_per_row(row_len);
  const std::int64_t r = qb / nb, b = qb % nb;
  first = r * row_len + b * kBlock;
  const std::int64_t left = row_len - b * kBlock;
  count = static_cast<int>(left < kBlock ? left : kBlock);
}

using numerics::f2u;
using numerics::u2f;

// value = scale * C[code] (float32 product) for n codes of one block, C from a table (the
// reference of decode_block_m / decode_block_v).
LV_TILE_INLINE void decode_block(const float* __restrict table, float scale, const std::uint8_t* __restrict codes,
                                 int n, float* __restrict out) noexcept {
  for (int i = 0; i < n; ++i) out[i] = scale * table[codes[i]];
}

// The block's scale: the largest |x| (by the bits of |x|, exact), NaN where any x is not finite.
LV_TILE_INLINE float block_scale(const float* __restrict x, int n) noexcept {
  // |x|'s bits as non-negative int32: signed compares, which SSE2 has
  std::int32_t most = 0, bad = 0;
  for (int i = 0; i < n; ++i) {
    const std::int32_t a = static_cast<std::int32_t>(f2u(x[i]) & 0x7FFFFFFFu);
    bad |= static_cast<std::int32_t>(a >= 0x7F800000);
    most = a > most ? a : most;
  }
  return bad ? std::numeric_limits<float>::quiet_NaN() : u2f(static_cast<std::uint32_t>(most));
}

// lo: the largest code with C[lo] <= y, for y >= C[0] (C ascending): a branch-free binary search
// over the computed values, exact (comparisons only). The reference of bracket_m / bracket_v.
LV_TILE_INLINE int bracket(const float* __restrict table, float y) noexcept {
  int lo = 0;
  for (int step = 128; step >= 1; step >>= 1) lo += table[lo + step] <= y ? step : 0;
  return lo;
}

// The same quotients as inv127() / inv255(), as constants for the element functions below
// (tests/test_cpu_quant.cpp checks that the bits agree).
constexpr float kInv127 = 1.0f / 127.0f;
constexpr float kInv255 = 1.0f / 255.0f;

// C_m[c] and C_v[c] for a code held as an int in [0, 255]: codebook_m / codebook_v's products,
// written so that a loop over codes vectorises (no table, no gather, no branch). For c < 128, t
// is signed here, t = (c - 128) * 2^-7 (exact), and (t*t)*t is -(|t|*|t|)*|t| bit for bit
// (rounding to nearest is symmetric in the sign). The factor is blended by a mask of d's sign:
// with a select GCC 12 vectorises none of the loops that call this for AVX2 or SSE2.
LV_TILE_INLINE float value_m(std::int32_t c) noexcept {
  const std::int32_t d = c - 128;
  const std::uint32_t neg = static_cast<std::uint32_t>(d >> 31);  // all ones for c < 128
  const float t = static_cast<float>(d) * u2f((f2u(0x1.0p-7f) & neg) | (f2u(kInv127) & ~neg));
  const float square = t * t;
  return square * t;
}
LV_TILE_INLINE float value_v(std::int32_t c) noexcept {
  const float t = static_cast<float>(c) * kInv255;
  const float s = t * t;
  return s * s;
}

// value = scale * C[code] (float32 product) for n codes of one block, C by value_m / value_v: the
// same bits as decode_block with the tables, vectorised without gathers.
LV_TILE_INLINE void decode_block_m(float scale, const std::uint8_t* __restrict codes, int n,
                                   float* __restrict out) noexcept {
  for (int i = 0; i < n; ++i) out[i] = scale * value_m(codes[i]);
}
LV_TILE_INLINE void decode_block_v(float scale, const std::uint8_t* __restrict codes, int n,
                                   float* __restrict out) noexcept {
  for (int i = 0; i < n; ++i) out[i] = scale * value_v(codes[i]);
}

// The exact bracket from an estimate e of lo's position (within one code of it, e >= -1): k =
// floor(e) - 1 clamped to [0, 253], then lo = k + [C[k+1] <= y] + [C[k+2] <= y], C computed by
// the codebook's formula. Exact wherever lo lies in [k, k + 2]; tests/test_cpu_quant.cpp
// compares it with bracket() over every code's neighbourhood and a dense sample of [-1, 1].
template <bool kSigned>
LV_TILE_INLINE int bracket_fix(float e, float y) noexcept {
  // truncation is floor for e >= 0; e in (-1, 0) gives k = -1 either way, clamped to 0
  const std::int32_t k = std::min(std::max(static_cast<std::int32_t>(e) - 1, 0), 253);
  const float c1 = kSigned ? value_m(k + 1) : value_v(k + 1);
  const float c2 = kSigned ? value_m(k + 2) : value_v(k + 2);
  return k + (c1 <= y ? 1 : 0) + (c2 <= y ? 1 : 0);
}

// bracket(C_m, y) for y in [-1, 1] without a search: C_m[c] ~ ((c - 128) / 127)^3 (c > 128),
// -((128 - c) / 128)^3 (c < 128), so lo ~ 128 + 127 cbrt(y) (y >= 0) or 128 - 128 cbrt(-y).
// cbrt(|y|) = |y| r^2 with r ~ |y|^(-1/3): a first guess from the float's bits (the exponent over
// 3), then two Newton steps r <- r (4 - |y| r^3) / 3: the estimate is within 0.004 codes of that
// position (one step would leave 0.55); products and differences only (no division, no libm),
// |y| below 2^-60 taken as 2^-60 (lo is 127 or 128 there either way). With bracket_fix every
// float32 y in [-1, 1] gives bracket()'s code (all 2.1e9 of them checked when this was written, at
// each width; the tests check a dense sample).
LV_TILE_INLINE int bracket_m(float y) noexcept {
  const std::uint32_t yb = f2u(y);
  // |y| and its bits, at least 2^-60's (selects on the bits: a float select here keeps GCC from
  // vectorising the loop)
  std::int32_t ab = static_cast<std::int32_t>(yb & 0x7FFFFFFFu);
  ab = ab > 0x21800000 ? ab : 0x21800000;
  const float a = u2f(static_cast<std::uint32_t>(ab));
  const float third = static_cast<float>(ab) * (1.0f / 3.0f);
  float r = u2f(0x54A2FA8Cu - static_cast<std::uint32_t>(static_cast<std::int32_t>(third)));
  const float a3 = a * (1.0f / 3.0f);
  r = r * (4.0f / 3.0f - a3 * ((r * r) * r));
  r = r * (4.0f / 3.0f - a3 * ((r * r) * r));
  const float root = (a * r) * r;
  const float coef = 127.0f - 255.0f * static_cast<float>(static_cast<std::int32_t>(yb >> 31));  // -128 for y < 0
  const float e = 128.0f + coef * root;
  return bracket_fix<true>(e, y);
}

// bracket(C_v, y) for y in [0, 1]: C_v[c] ~ (c / 255)^4, so lo ~ 255 sqrt(sqrt(y)) (IEEE square
// roots: the same bits at every width).
LV_TILE_INLINE int bracket_v(float y) noexcept {
  const std::int32_t yb = static_cast<std::int32_t>(f2u(y));
  const float a = u2f(static_cast<std::uint32_t>(yb > 0 ? yb : 0));  // max(y, 0), by the bits
  const float e = std::sqrt(std::sqrt(a)) * 255.0f;
  return bracket_fix<false>(e, y);
}

// One element's code from y (its value over the block's scale, in [C[0], 1]) and R16 `word`:
// hi = min(lo + 1, 255), T = (R16 + 0.5) * 2^-16 (exact), code = hi iff
// fl(T * fl(C[hi] - C[lo])) < fl(y - C[lo]). With the table and the binary search: the
// reference of encode_m / encode_v.
LV_TILE_INLINE std::uint8_t encode_one(const float* __restrict table, float y, std::uint32_t word) noexcept {
  const int lo = bracket(table, y);
  const int hi = lo < 255 ? lo + 1 : 255;
  const float clo = table[lo];
  const float gap = table[hi] - clo;
  const float above = y - clo;
  const float t = (static_cast<float>(word) + 0.5f) * 0x1.0p-16f;
  const float draw = t * gap;
  return static_cast<std::uint8_t>(lo + (draw < above ? 1 : 0));
}

// The same decision with bracket_m / bracket_v and the computed C (what encode_block runs).
template <bool kSigned>
LV_TILE_INLINE std::uint8_t encode_fast(float y, std::uint32_t word) noexcept {
  const std::int32_t lo = kSigned ? bracket_m(y) : bracket_v(y);
  const std::int32_t hi = lo < 255 ? lo + 1 : 255;
  const float clo = kSigned ? value_m(lo) : value_v(lo);
  const float chi = kSigned ? value_m(hi) : value_v(hi);
  const float gap = chi - clo;
  const float above = y - clo;
  const float t = (static_cast<float>(static_cast<std::int32_t>(word)) + 0.5f) * 0x1.0p-16f;
  const float draw = t * gap;
  return static_cast<std::uint8_t>(lo + (draw < above ? 1 : 0));
}
LV_TILE_INLINE std::uint8_t encode_m(float y, std::uint32_t word) noexcept { return encode_fast<true>(y, word); }
LV_TILE_INLINE std::uint8_t encode_v(float y, std::uint32_t word) noexcept { return encode_fast<false>(y, word); }

// The store rule of one block of m (kSigned) or v: codes of x[0..n) under `scale`
// (block_scale's), R16 words of the moment's stream (3: m, 4: v). y = sign(x) where |x| ==
// scale, else fl(x * fl(1 / scale)) (the reciprocal once a block); a scale of 0 or NaN stores
// the zero code (128 for m, 0 for v) everywhere. One loop over the block's elements, each
// element's estimate, fix and decision branch-free, so that it vectorises.
template <bool kSigned>
LV_TILE_INLINE void encode_block(float scale, const float* __restrict x, int n,
                                 const std::uint16_t* __restrict words, std::uint8_t* __restrict codes) noexcept {
  if (!(scale > 0.0f) || !(scale <= std::numeric_limits<float>::max())) {
    for (int i = 0; i < n; ++i) codes[i] = kSigned ? kZeroCodeM : kZeroCodeV;
    return;
  }
  const float r = 1.0f / scale;
  const std::uint32_t scale_bits = f2u(scale);
  for (int i = 0; i < n; ++i) {
    // y = sign(x) (x != 0 here) or x * r, blended by a mask of the bits (with a select, float or
    // integer, GCC 12 no longer vectorises this loop)
    const std::uint32_t xb = f2u(x[i]);
    const std::uint32_t one = (xb & 0x80000000u) | 0x3F800000u;
    const std::uint32_t scaled = f2u(x[i] * r);
    const std::uint32_t at_max = 0u - static_cast<std::uint32_t>((xb & 0x7FFFFFFFu) == scale_bits);
    const float y = u2f((scaled & ~at_max) | (one & at_max));
    codes[i] = encode_fast<kSigned>(y, words[i]);
  }
}
LV_TILE_INLINE void encode_block_m(float scale, const float* __restrict x, int n,
                                   const std::uint16_t* __restrict words, std::uint8_t* __restrict codes) noexcept {
  encode_block<true>(scale, x, n, words, codes);
}
LV_TILE_INLINE void encode_block_v(float scale, const float* __restrict x, int n,
                                   const std::uint16_t* __restrict words, std::uint8_t* __restrict codes) noexcept {
  encode_block<false>(scale, x, n, words, codes);
}

// Nearest code (ties to the lower), as kernels/quant.py quantize_nearest: the conversion of a
// float moment to q8 where no step draws random bits (state import of another state dtype).
LV_TILE_INLINE std::uint8_t nearest_one(const float* __restrict table, float y) noexcept {
  const int lo = bracket(table, y);
  const int hi = lo < 255 ? lo + 1 : 255;
  return static_cast<std::uint8_t>(lo + ((table[hi] - y) < (y - table[lo]) ? 1 : 0));
}

}  // namespace quant
}  // namespace cpu
}  // namespace luminav
