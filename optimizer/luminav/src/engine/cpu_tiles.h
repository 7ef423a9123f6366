// src/engine/cpu_tiles.h: the CPU passes' per-tile loops (load/store, moments, direction, soft
// clip, update), inline for cpu_kernels.cpp, which compiles them at each vector width
//
// Every loop is elementwise float32 arithmetic in the order docs/internals.md gives, written for
// the vectoriser (integer selects, no branches inside a loop), so the baseline, AVX2 and AVX-512F
// builds of a loop give the same bits.
#pragma once

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>

#include "engine/cpu_kernels.h"
#include "engine/cpu_numerics.h"

namespace luminav {
namespace cpu {
namespace tiles {

constexpr int kTile = 256;  // elements per tile buffer: 8 float buffers + 3 word buffers fit L1

using namespace numerics;

// ----------------------------------------------------------------------------- tile load/store

LV_TILE_INLINE void load_tile(DType d, const void* base, std::int64_t off, int n, float* out) {
  switch (d) {
    case DType::kFloat32:
      std::memcpy(out, static_cast<const float*>(base) + off, sizeof(float) * n);
      break;
    case DType::kBFloat16: {
      const std::uint16_t* s = static_cast<const std::uint16_t*>(base) + off;
      for (int i = 0; i < n; ++i) out[i] = u2f(static_cast<std::uint32_t>(s[i]) << 16);
      break;
    }
    case DType::kFloat16: {
      const std::uint16_t* s = static_cast<const std::uint16_t*>(base) + off;
      for (int i = 0; i < n; ++i) out[i] = f16_to_f32(s[i]);
      break;
    }
    case DType::kQ8: break;  // codes are decoded a q8 block at a time (cpu_quant.h)
  }
}

// Store rounding to `d`: bf16 rounds stochastically with `words` when non-null.
LV_TILE_INLINE void store_tile(DType d, void* base, std::int64_t off, int n, const float* in,
                const std::uint16_t* words) {
  switch (d) {
    case DType::kFloat32:
      std::memcpy(static_cast<float*>(base) + off, in, sizeof(float) * n);
      break;
    case DType::kBFloat16: {
      std::uint16_t* dst = static_cast<std::uint16_t*>(base) + off;
      if (words) {
        for (int i = 0; i < n; ++i) dst[i] = bf16_sr(in[i], words[i]);
      } else {
        for (int i = 0; i < n; ++i) dst[i] = bf16_rne(in[i]);
      }
      break;
    }
    case DType::kFloat16: {
      std::uint16_t* dst = static_cast<std::uint16_t*>(base) + off;
      for (int i = 0; i < n; ++i) dst[i] = f32_to_f16(in[i]);
      break;
    }
    case DType::kQ8: break;  // codes are encoded a q8 block at a time (cpu_quant.h)
  }
}

// 16-bit words copied a tile at a time: a whole tile as one copy of a fixed size (vector moves;
// a copy whose length is known only at run time becomes a string move, slow to start).
LV_TILE_INLINE void copy_words16(std::uint16_t* dst, const std::uint16_t* src, int n) {
  if (n == kTile) {
    std::memcpy(dst, src, sizeof(std::uint16_t) * kTile);
  } else {
    std::memcpy(dst, src, sizeof(std::uint16_t) * static_cast<std::size_t>(n));
  }
}

// Per-tensor constants of one step.
struct TensorConsts {
  float sign, beta1, one_minus_beta1, beta2, one_minus_beta2, eps;
  float rbc1, rbc2;  // 1 / bc1, 1 / bc2, each rounded to float32
  std::uint64_t key;  // seed_tk
  bool state_words;   // states are bf16 with stochastic rounding
  bool param_words;   // params are bf16 with stochastic rounding
};

inline TensorConsts tensor_consts(const GroupConfig& cfg, const TensorRow& row) {
  TensorConsts c{};
  const Hyper& h = cfg.hyper;
  c.sign = h.maximize ? -1.0f : 1.0f;
  c.beta1 = static_cast<float>(h.beta1);
  c.beta2 = static_cast<float>(h.beta2);
  c.one_minus_beta1 = 1.0f - c.beta1;
  c.one_minus_beta2 = 1.0f - c.beta2;
  c.eps = static_cast<float>(h.eps);
  const std::int64_t t = *row.step + 1;
  c.rbc1 = 1.0f / bias_correction(c.beta1, t);
  c.rbc2 = 1.0f / bias_correction(c.beta2, t);
  c.key = stream_key(cfg.seed, t, row.param_index);
  const bool sr = cfg.sr();
  c.state_words = sr && cfg.state_dtype == DType::kBFloat16;
  c.param_words = sr && cfg.param_dtype == DType::kBFloat16;
  return c;
}

struct Tile {
  float g[kTile], m[kTile], v[kTile], u[kTile], p[kTile], p0[kTile];
  std::uint16_t w[kTile], w1[kTile], w2[kTile];  // random words of streams 0, 1, 2
  std::uint8_t large[kTile];                      // pass 2: |u / tau| takes tanh's second branch
};

// How moments are rounded to their storage dtype (step 3).
enum class StateRound { kNone, kBf16Rne, kBf16Sr, kF16Rne };

inline StateRound state_round(const GroupConfig& cfg, const TensorConsts& c) {
  switch (cfg.state_dtype) {
    case DType::kFloat32:
    case DType::kQ8: return StateRound::kNone;  // q8: m', v' unrounded, then requantized
    case DType::kBFloat16: return c.state_words ? StateRound::kBf16Sr : StateRound::kBf16Rne;
    case DType::kFloat16: break;
  }
  return StateRound::kF16Rne;
}

template <StateRound R>
LV_TILE_INLINE float round_state(float x, std::uint32_t word) {
  if constexpr (R == StateRound::kBf16Rne) return u2f(bf16_rne_bits(x));
  if constexpr (R == StateRound::kBf16Sr) return u2f(bf16_sr_bits(x, word));
  if constexpr (R == StateRound::kF16Rne) return f16_to_f32(f32_to_f16(x));
  (void)word;
  return x;
}

// An operand of a tile: float32 storage is used in place, other dtypes through a tile buffer.
LV_TILE_INLINE const float* tile_in(DType d, const void* base, std::int64_t off, int n, float* buf) {
  if (d == DType::kFloat32) return static_cast<const float*>(base) + off;
  load_tile(d, base, off, n, buf);
  return buf;
}
LV_TILE_INLINE float* tile_inout(DType d, void* base, std::int64_t off, int n, float* buf) {
  if (d == DType::kFloat32) return static_cast<float*>(base) + off;
  load_tile(d, base, off, n, buf);
  return buf;
}
// Writes a tile operand back when it went through a buffer (float32 ones were written in place).
LV_TILE_INLINE void tile_out(DType d, void* base, std::int64_t off, int n, const float* buf,
                             const std::uint16_t* words) {
  if (d != DType::kFloat32) store_tile(d, base, off, n, buf, words);
}

// Steps 1-3 of one element: g -> m', v', rounded to their storage dtype.
template <StateRound R>
LV_TILE_INLINE void moments_only(const TensorConsts& c, float g, float& m, float& v,
                                 std::uint32_t w1, std::uint32_t w2) {
  const float gi = g * c.sign;
  const float mi = round_state<R>(c.beta1 * m + c.one_minus_beta1 * gi, w1);
  const float vi = round_state<R>(c.beta2 * v + c.one_minus_beta2 * (gi * gi), w2);
  m = mi;
  v = vi;
}

// Steps 1-4 of one element: m', v' and u.
template <StateRound R>
LV_TILE_INLINE float moments_one(const TensorConsts& c, float g, float& m, float& v,
                                 std::uint32_t w1, std::uint32_t w2) {
  moments_only<R>(c, g, m, v, w1, w2);
  return (m * c.rbc1) / (std::sqrt(v * c.rbc2) + c.eps);
}

// Pass 1's steps 1-4 in one loop: u of every element; the moments are not stored (with KEEP,
// bf16 moments only, their bf16 bits go to ms/vs, for pass 2: DirectionCache).
template <StateRound R, bool KEEP = false>
LV_TILE_INLINE void direction_tile(const TensorConsts& c, int n, const float* __restrict g,
                                   const float* __restrict m, const float* __restrict v,
                                   float* __restrict u, const std::uint16_t* __restrict w1,
                                   const std::uint16_t* __restrict w2,
                                   std::uint16_t* __restrict ms = nullptr,
                                   std::uint16_t* __restrict vs = nullptr) {
  static_assert(!KEEP || R == StateRound::kBf16Rne || R == StateRound::kBf16Sr, "bf16 moments only");
  // With KEEP, m' and v' (bf16 values already: their stored bits are the high halves) are kept
  // as 32-bit words and narrowed in a second loop, so the first runs at the full float32 width.
  alignas(64) std::uint32_t mb[KEEP ? kTile : 1], vb[KEEP ? kTile : 1];
  for (int i = 0; i < n; ++i) {
    float mi = m[i], vi = v[i];
    u[i] = moments_one<R>(c, g[i], mi, vi, R == StateRound::kBf16Sr ? w1[i] : 0u,
                          R == StateRound::kBf16Sr ? w2[i] : 0u);
    if constexpr (KEEP) {
      mb[i] = f2u(mi);
      vb[i] = f2u(vi);
    }
  }
  if constexpr (KEEP) {
    for (int i = 0; i < n; ++i) {
      ms[i] = static_cast<std::uint16_t>(mb[i] >> 16);  // what pass 2's store_tile writes
      vs[i] = static_cast<std::uint16_t>(vb[i] >> 16);
    }
  }
}

// Soft clip of step 5, as pass 2 applies it.
enum class Clip { kOff, kTanh, kZero };

// Pass 2's steps 1-6 in one loop: m and v updated in place, p <- p (1 - lr wd) - lr clip(u).
template <StateRound R, Clip C>
LV_TILE_INLINE void update_tile(const TensorConsts& c, int n, float tau, float decay, float lr,
                                const float* __restrict g, float* __restrict m,
                                float* __restrict v, float* __restrict p,
                                const std::uint16_t* __restrict w1,
                                const std::uint16_t* __restrict w2) {
  const float rtau = C == Clip::kTanh ? 1.0f / tau : 0.0f;
  for (int i = 0; i < n; ++i) {
    float mi = m[i], vi = v[i];
    float u = moments_one<R>(c, g[i], mi, vi, R == StateRound::kBf16Sr ? w1[i] : 0u,
                             R == StateRound::kBf16Sr ? w2[i] : 0u);
    if constexpr (C == Clip::kTanh) u = tau * tanh_f32(u * rtau);
    if constexpr (C == Clip::kZero) u = 0.0f;
    m[i] = mi;
    v[i] = vi;
    p[i] = p[i] * decay - lr * u;
  }
}

// Pass 2's steps 1-6 with the soft clip: moments and u (into `u`), then p <- p (1 - lr wd) -
// lr tau tanh(u / tau). Where |u / tau| < 0.625 tanh_f32 selects its polynomial branch, which
// tanh_f32_small computes alone (the same bits, without the exponential and the division): a tile
// whose elements all are below takes it throughout; otherwise each chunk of kClipChunk does,
// unless one of its elements is at or above 0.625 (or NaN), when the chunk takes tanh_f32 whole.
constexpr int kClipChunk = 16;

LV_TILE_INLINE void clip_step(int n, float tau, float rtau, float decay, float lr,
                              const float* __restrict u, float* __restrict p) {
  for (int i = 0; i < n; ++i) p[i] = p[i] * decay - lr * (tau * tanh_f32(u[i] * rtau));
}
LV_TILE_INLINE void clip_step_small(int n, float tau, float rtau, float decay, float lr,
                                    const float* __restrict u, float* __restrict p) {
  for (int i = 0; i < n; ++i) p[i] = p[i] * decay - lr * (tau * tanh_f32_small(u[i] * rtau));
}

// Step 5 and 6 of a tile given u: p <- p (1 - lr wd) - lr tau tanh(u / tau).
LV_TILE_INLINE void clip_tile(int n, float tau, float decay, float lr, const float* __restrict u,
                              float* __restrict p, std::uint8_t* __restrict large) {
  const float rtau = 1.0f / tau;
  std::uint32_t any_large = 0;
  for (int i = 0; i < n; ++i) {
    const std::uint32_t l = static_cast<std::uint32_t>((f2u(u[i] * rtau) & 0x7FFFFFFFu) >= kTanhSmallBits);
    large[i] = static_cast<std::uint8_t>(l);
    any_large |= l;
  }
  if (any_large == 0) {
    clip_step_small(n, tau, rtau, decay, lr, u, p);
    return;
  }
  static_assert(kClipChunk == 16, "a chunk's flags are read as two 64-bit words");
  int i = 0;
  for (; i + kClipChunk <= n; i += kClipChunk) {
    std::uint64_t f[2];
    std::memcpy(f, large + i, kClipChunk);
    if ((f[0] | f[1]) == 0) {
      clip_step_small(kClipChunk, tau, rtau, decay, lr, u + i, p + i);
    } else {
      clip_step(kClipChunk, tau, rtau, decay, lr, u + i, p + i);
    }
  }
  clip_step(n - i, tau, rtau, decay, lr, u + i, p + i);
}

// Pass 2's steps 1-6 with the soft clip: m', v' and u (into `u`), then clip_tile.
template <StateRound R>
LV_TILE_INLINE void update_tile_tanh(const TensorConsts& c, int n, float tau, float decay, float lr,
                                     const float* __restrict g, float* __restrict m,
                                     float* __restrict v, float* __restrict p,
                                     const std::uint16_t* __restrict w1,
                                     const std::uint16_t* __restrict w2, float* __restrict u,
                                     std::uint8_t* __restrict large) {
  for (int i = 0; i < n; ++i) {
    float mi = m[i], vi = v[i];
    u[i] = moments_one<R>(c, g[i], mi, vi, R == StateRound::kBf16Sr ? w1[i] : 0u,
                          R == StateRound::kBf16Sr ? w2[i] : 0u);
    m[i] = mi;
    v[i] = vi;
  }
  clip_tile(n, tau, decay, lr, u, p, large);
}

// The same with u from pass 1 (DirectionCache): the moments alone, no square root or division.
template <StateRound R>
LV_TILE_INLINE void update_tile_tanh_cached(const TensorConsts& c, int n, float tau, float decay,
                                            float lr, const float* __restrict g,
                                            float* __restrict m, float* __restrict v,
                                            float* __restrict p,
                                            const std::uint16_t* __restrict w1,
                                            const std::uint16_t* __restrict w2,
                                            const float* __restrict u,
                                            std::uint8_t* __restrict large) {
  for (int i = 0; i < n; ++i) {
    float mi = m[i], vi = v[i];
    moments_only<R>(c, g[i], mi, vi, R == StateRound::kBf16Sr ? w1[i] : 0u,
                    R == StateRound::kBf16Sr ? w2[i] : 0u);
    m[i] = mi;
    v[i] = vi;
  }
  clip_tile(n, tau, decay, lr, u, p, large);
}

// Step 7 of pass 2, the bound (modes 1 "abs", 2 "rel"), on the tile q of new weights.
LV_TILE_INLINE void bound_tile(int mode, float bound, int n, const float* __restrict p0, float* __restrict q) {
  for (int i = 0; i < n; ++i) {
    const float r = mode == 1 ? bound : bound * std::sqrt(p0[i] * p0[i] + 1e-4f);
    const float lo = p0[i] - r;
    const float hi = p0[i] + r;
    float x = q[i] < lo ? lo : q[i];
    x = x > hi ? hi : x;
    q[i] = x;
  }
}

LV_TILE_INLINE bool tile_all_finite(const float* g, int n) {
  std::uint32_t bad = 0;
  for (int i = 0; i < n; ++i) bad |= static_cast<std::uint32_t>((f2u(g[i]) & 0x7F800000u) == 0x7F800000u);
  return bad == 0;
}

template <StateRound R>
LV_TILE_INLINE void update_clip(Clip clip, const TensorConsts& c, int n, float tau, float decay,
                                float lr, const float* g, float* m, float* v, float* p,
                                const std::uint16_t* w1, const std::uint16_t* w2, float* u,
                                const float* cached_u, std::uint8_t* large) {
  switch (clip) {
    case Clip::kOff: update_tile<R, Clip::kOff>(c, n, tau, decay, lr, g, m, v, p, w1, w2); break;
    case Clip::kTanh:
      if (cached_u) {
        update_tile_tanh_cached<R>(c, n, tau, decay, lr, g, m, v, p, w1, w2, cached_u, large);
      } else {
        update_tile_tanh<R>(c, n, tau, decay, lr, g, m, v, p, w1, w2, u, large);
      }
      break;
    case Clip::kZero: update_tile<R, Clip::kZero>(c, n, tau, decay, lr, g, m, v, p, w1, w2); break;
  }
}

LV_TILE_INLINE void update(StateRound r, Clip clip, const TensorConsts& c, int n, float tau,
                           float decay, float lr, const float* g, float* m, float* v, float* p,
                           const std::uint16_t* w1, const std::uint16_t* w2, float* u,
                           const float* cached_u, std::uint8_t* large) {
  switch (r) {
    case StateRound::kNone: update_clip<StateRound::kNone>(clip, c, n, tau, decay, lr, g, m, v, p, w1, w2, u, cached_u, large); break;
    case StateRound::kBf16Rne: update_clip<StateRound::kBf16Rne>(clip, c, n, tau, decay, lr, g, m, v, p, w1, w2, u, cached_u, large); break;
    case StateRound::kBf16Sr: update_clip<StateRound::kBf16Sr>(clip, c, n, tau, decay, lr, g, m, v, p, w1, w2, u, cached_u, large); break;
    case StateRound::kF16Rne: update_clip<StateRound::kF16Rne>(clip, c, n, tau, decay, lr, g, m, v, p, w1, w2, u, cached_u, large); break;
  }
}

}  // namespace tiles
}  // namespace cpu
}  // namespace luminav
