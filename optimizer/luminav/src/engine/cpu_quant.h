// src/engine/cpu_quant.h: q8 moments in the CPU engine (docs/tdclm.md "Quantized moments (q8)"):
// the codebooks, the block layout, decode, the block scale and the stochastic store rule
//
// The one place the codebooks' formulas are written in C++ (cpu_quant.cpp); Python's are
// kernels/quant.py, and tests/test_contract.py compares the 256 float32 values of each. The
// element functions below are inline so that the q8 passes (cpu_q8.cpp), compiled at each vector
// width, vectorise them; each is float32 IEEE arithmetic in a fixed order without contraction
// (-ffp-contract=off) or integer selects, so every width gives the same bits.
#pragma once

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

// value = scale * C[code] (float32 product) for n codes of one block.
LV_TILE_INLINE void decode_block(const float* __restrict table, float scale, const std::uint8_t* __restrict codes,
                                 int n, float* __restrict out) noexcept {
  for (int i = 0; i < n; ++i) out[i] = scale * table[codes[i]];
}

// The block's scale: the largest |x| (by the bits of |x|, exact), NaN where any x is not finite.
LV_TILE_INLINE float block_scale(const float* __restrict x, int n) noexcept {
  std::uint32_t most = 0, bad = 0;
  for (int i = 0; i < n; ++i) {
    const std::uint32_t a = f2u(x[i]) & 0x7FFFFFFFu;
    bad |= static_cast<std::uint32_t>(a >= 0x7F800000u);
    most = a > most ? a : most;
  }
  return bad ? std::numeric_limits<float>::quiet_NaN() : u2f(most);
}

// lo: the largest code with C[lo] <= y, for y >= C[0] (C ascending): a branch-free binary search
// over the computed values, exact (comparisons only).
LV_TILE_INLINE int bracket(const float* __restrict table, float y) noexcept {
  int lo = 0;
  for (int step = 128; step >= 1; step >>= 1) lo += table[lo + step] <= y ? step : 0;
  return lo;
}

// One element's code from y (its value over the block's scale, in [C[0], 1]) and R16 `word`:
// hi = min(lo + 1, 255), T = (R16 + 0.5) * 2^-16 (exact), code = hi iff
// fl(T * fl(C[hi] - C[lo])) < fl(y - C[lo]).
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

// The store rule of one block: codes of x[0..n) under `scale` (block_scale's), R16 words of the
// moment's stream (3: m, 4: v). y = sign(x) where |x| == scale, else fl(x * fl(1 / scale)) (the
// reciprocal once a block); a scale of 0 or NaN stores `zero` everywhere.
LV_TILE_INLINE void encode_block(const float* __restrict table, std::uint8_t zero, float scale,
                                 const float* __restrict x, int n, const std::uint16_t* __restrict words,
                                 std::uint8_t* __restrict codes) noexcept {
  if (!(scale > 0.0f) || !(scale <= std::numeric_limits<float>::max())) {
    for (int i = 0; i < n; ++i) codes[i] = zero;
    return;
  }
  const float r = 1.0f / scale;
  // One loop a stage over the block's elements (y, then each step of the bracket search, then
  // the decision), so that each vectorises (the search's loads as gathers); the same operations
  // as encode_one, element by element.
  alignas(64) float y[kBlock];
  alignas(64) std::int32_t lo[kBlock];
  const std::uint32_t scale_bits = f2u(scale);
  for (int i = 0; i < n; ++i) {
    const std::uint32_t xb = f2u(x[i]);
    const float one = u2f((xb & 0x80000000u) | 0x3F800000u);  // sign(x), x != 0 here
    y[i] = (xb & 0x7FFFFFFFu) == scale_bits ? one : x[i] * r;
    lo[i] = 0;
  }
  for (int step = 128; step >= 1; step >>= 1) {
    for (int i = 0; i < n; ++i) lo[i] += table[lo[i] + step] <= y[i] ? step : 0;
  }
  for (int i = 0; i < n; ++i) {
    const int hi = lo[i] < 255 ? lo[i] + 1 : 255;
    const float clo = table[lo[i]];
    const float gap = table[hi] - clo;
    const float above = y[i] - clo;
    const float t = (static_cast<float>(words[i]) + 0.5f) * 0x1.0p-16f;
    const float draw = t * gap;
    codes[i] = static_cast<std::uint8_t>(lo[i] + (draw < above ? 1 : 0));
  }
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
