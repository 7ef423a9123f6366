// src/engine/cpu_kernels.cpp: the CPU engine's passes over a launch group, its random streams and
// storage conversions
//
// TDCLM's passes (docs/tdclm.md) over a launch group, with the per-element operations of
// docs/internals.md in the same order as the reference and the kernels.
//
// Layout: a group's elements are cut into work items of kChunk elements (a tensor's last item
// may be shorter); items are split over threads in contiguous ranges. Each item is processed in
// tiles of kTile elements: loads convert the storage dtype into float32 tile buffers, the math
// runs as plain loops over those buffers (no aliasing, vectorisable at -O3), and stores convert
// back. Pass 1 writes one float32 partial per item; S_j combines the partials of tensor j in
// index order, so it does not depend on the number of threads.
//
// errno is never read by the engine; without it GCC vectorises the sqrt loops.
#if defined(__GNUC__) && !defined(__clang__)
#pragma GCC optimize("no-math-errno")
#endif

#include <algorithm>
#include <cmath>
#include <cstring>
#include <string>
#include <vector>

#include "engine/cpu_kernels.h"
#include "engine/thread_pool.h"

namespace luminav {
namespace cpu {

namespace {

constexpr int kTile = 256;  // elements per tile buffer: 8 float buffers + 3 word buffers fit L1

inline std::uint32_t f2u(float x) noexcept {
  std::uint32_t u;
  std::memcpy(&u, &x, 4);
  return u;
}
inline float u2f(std::uint32_t u) noexcept {
  float x;
  std::memcpy(&x, &u, 4);
  return x;
}

}  // namespace

// ------------------------------------------------------------------------------ random streams

std::uint64_t splitmix64(std::uint64_t z) noexcept {
  z += 0x9E3779B97F4A7C15ull;
  z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
  z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
  return z ^ (z >> 31);
}

std::uint64_t stream_key(std::uint64_t seed, std::int64_t t, std::int64_t k) noexcept {
  return splitmix64(splitmix64(seed + static_cast<std::uint64_t>(t)) + static_cast<std::uint64_t>(k));
}

namespace {
constexpr std::uint32_t kPhiloxKeyA = 0x9E3779B9u;    // key bump, word 0
constexpr std::uint32_t kPhiloxKeyB = 0xBB67AE85u;    // key bump, word 1
constexpr std::uint32_t kPhiloxRoundA = 0xD2511F53u;  // multiplier of counter word 0
constexpr std::uint32_t kPhiloxRoundB = 0xCD9E8D57u;  // multiplier of counter word 2

// The ten Philox4x32 rounds on counter (c0, c1, c2, c3) with key (k0, k1), in place.
inline void philox_rounds(std::uint32_t& c0, std::uint32_t& c1, std::uint32_t& c2, std::uint32_t& c3,
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
}  // namespace

void philox4x32_10(std::uint32_t key0, std::uint32_t key1, const std::uint32_t ctr[4],
                   std::uint32_t out[4]) noexcept {
  std::uint32_t c0 = ctr[0], c1 = ctr[1], c2 = ctr[2], c3 = ctr[3];
  philox_rounds(c0, c1, c2, c3, key0, key1);
  out[0] = c0;
  out[1] = c1;
  out[2] = c2;
  out[3] = c3;
}

void random_words(std::uint64_t key, std::int64_t first, std::int64_t count, std::uint32_t stream,
                  std::uint32_t* out) noexcept {
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
    for (; i < stop; ++i) out[i - first] = half(w, i);
  }
  // whole groups
  const std::int64_t groups = (end - i) >> 3;
  std::uint32_t* dst = out + (i - first);
  const std::uint64_t j0 = static_cast<std::uint64_t>(i) >> 3;
  for (std::int64_t g = 0; g < groups; ++g) {
    const std::uint64_t j = j0 + static_cast<std::uint64_t>(g);
    std::uint32_t c0 = static_cast<std::uint32_t>(j), c1 = static_cast<std::uint32_t>(j >> 32);
    std::uint32_t c2 = stream, c3 = 0;
    philox_rounds(c0, c1, c2, c3, key0, key1);
    std::uint32_t* o = dst + 8 * g;
    o[0] = c0 & 0xFFFFu;
    o[1] = c0 >> 16;
    o[2] = c1 & 0xFFFFu;
    o[3] = c1 >> 16;
    o[4] = c2 & 0xFFFFu;
    o[5] = c2 >> 16;
    o[6] = c3 & 0xFFFFu;
    o[7] = c3 >> 16;
  }
  i += groups * 8;
  // a partial group at the end
  if (i < end) {
    std::uint32_t w[4];
    group(static_cast<std::uint64_t>(i) >> 3, w);
    for (; i < end; ++i) out[i - first] = half(w, i);
  }
}

// --------------------------------------------------------------------------------- conversions

float bf16_to_float(std::uint16_t h) noexcept { return u2f(static_cast<std::uint32_t>(h) << 16); }

std::uint16_t float_to_bf16_rne(float x) noexcept {
  const std::uint32_t u = f2u(x);
  const bool nan = (u & 0x7FFFFFFFu) > 0x7F800000u;
  const std::uint32_t rounded = (u + 0x7FFFu + ((u >> 16) & 1u)) >> 16;
  return static_cast<std::uint16_t>(nan ? ((u >> 16) | 0x0040u) : rounded);
}

std::uint16_t float_to_bf16_sr(float x, std::uint32_t r) noexcept {
  const std::uint32_t u = f2u(x);
  const bool finite = (u & 0x7F800000u) != 0x7F800000u;
  const std::uint32_t sr = (u + (r & 0xFFFFu)) >> 16;
  return finite ? static_cast<std::uint16_t>(sr) : float_to_bf16_rne(x);
}

// Branch-free IEEE half conversions (round to nearest even), exact for every input including
// subnormals, infinities and NaN; they rely only on float32 arithmetic in the default mode.
float f16_to_float(std::uint16_t h) noexcept {
  const std::uint32_t w = static_cast<std::uint32_t>(h) << 16;
  const std::uint32_t sign = w & 0x80000000u;
  const std::uint32_t two_w = w + w;
  const std::uint32_t exp_offset = 0xE0u << 23;
  const float normalized = u2f((two_w >> 4) + exp_offset) * 0x1.0p-112f;
  const float denormalized = u2f((two_w >> 17) | (126u << 23)) - 0.5f;
  const std::uint32_t bits = two_w < (1u << 27) ? f2u(denormalized) : f2u(normalized);
  return u2f(sign | bits);
}

std::uint16_t float_to_f16_rne(float x) noexcept {
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

float bias_correction(float beta_f, std::int64_t t) noexcept {
  double base = static_cast<double>(beta_f);
  double power = 1.0;
  std::uint64_t e = t > 0 ? static_cast<std::uint64_t>(t) : 0;
  while (e) {
    if (e & 1u) power *= base;
    base *= base;
    e >>= 1;
  }
  return static_cast<float>(1.0 - power);
}

namespace {

// ----------------------------------------------------------------------------- tile load/store

void load_tile(DType d, const void* base, std::int64_t off, int n, float* out) {
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
      for (int i = 0; i < n; ++i) out[i] = f16_to_float(s[i]);
      break;
    }
  }
}

// Store rounding to `d`: bf16 rounds stochastically with `words` when non-null.
void store_tile(DType d, void* base, std::int64_t off, int n, const float* in,
                const std::uint32_t* words) {
  switch (d) {
    case DType::kFloat32:
      std::memcpy(static_cast<float*>(base) + off, in, sizeof(float) * n);
      break;
    case DType::kBFloat16: {
      std::uint16_t* dst = static_cast<std::uint16_t*>(base) + off;
      if (words) {
        for (int i = 0; i < n; ++i) dst[i] = float_to_bf16_sr(in[i], words[i]);
      } else {
        for (int i = 0; i < n; ++i) dst[i] = float_to_bf16_rne(in[i]);
      }
      break;
    }
    case DType::kFloat16: {
      std::uint16_t* dst = static_cast<std::uint16_t*>(base) + off;
      for (int i = 0; i < n; ++i) dst[i] = float_to_f16_rne(in[i]);
      break;
    }
  }
}

// Round in place to what `d` will store (step 3): the stored value is then exact.
void round_tile(DType d, int n, float* x, const std::uint32_t* words) {
  switch (d) {
    case DType::kFloat32:
      break;
    case DType::kBFloat16:
      if (words) {
        for (int i = 0; i < n; ++i) x[i] = u2f(static_cast<std::uint32_t>(float_to_bf16_sr(x[i], words[i])) << 16);
      } else {
        for (int i = 0; i < n; ++i) x[i] = u2f(static_cast<std::uint32_t>(float_to_bf16_rne(x[i])) << 16);
      }
      break;
    case DType::kFloat16:
      for (int i = 0; i < n; ++i) x[i] = f16_to_float(float_to_f16_rne(x[i]));
      break;
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

TensorConsts tensor_consts(const GroupConfig& cfg, const TensorRow& row) {
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
  std::uint32_t w[kTile];
};

// Steps 1-4 of docs/internals.md on one tile: g (loaded) -> m', v' (rounded), u.
void moments_direction(const GroupConfig& cfg, const TensorConsts& c, std::int64_t global_first,
                       int n, Tile& t) {
  float* __restrict g = t.g;
  float* __restrict m = t.m;
  float* __restrict v = t.v;
  float* __restrict u = t.u;
  // 1. gradient, sign applied
  for (int i = 0; i < n; ++i) g[i] = g[i] * c.sign;
  // 2. moments
  for (int i = 0; i < n; ++i) {
    m[i] = c.beta1 * m[i] + c.one_minus_beta1 * g[i];
    v[i] = c.beta2 * v[i] + c.one_minus_beta2 * (g[i] * g[i]);
  }
  // 3. round moments to their storage dtype (streams 1 and 2)
  if (c.state_words) random_words(c.key, global_first, n, 1u, t.w);
  round_tile(cfg.state_dtype, n, m, c.state_words ? t.w : nullptr);
  if (c.state_words) random_words(c.key, global_first, n, 2u, t.w);
  round_tile(cfg.state_dtype, n, v, c.state_words ? t.w : nullptr);
  // 4. Adam direction
  for (int i = 0; i < n; ++i) u[i] = (m[i] * c.rbc1) / (std::sqrt(v[i] * c.rbc2) + c.eps);
}

bool tile_all_finite(const float* g, int n) {
  std::uint32_t bad = 0;
  for (int i = 0; i < n; ++i) bad |= static_cast<std::uint32_t>((f2u(g[i]) & 0x7F800000u) == 0x7F800000u);
  return bad == 0;
}

// Work items of a group: item_start[j] = first item of row j; item_start[n] = total.
std::vector<std::int64_t> item_starts(const TensorRow* rows, std::size_t n) {
  std::vector<std::int64_t> starts(n + 1, 0);
  for (std::size_t j = 0; j < n; ++j) starts[j + 1] = starts[j] + (rows[j].numel + kChunk - 1) / kChunk;
  return starts;
}

// Calls fn(row, first, count) for every item of [begin, end).
template <class Fn>
void for_items(const std::vector<std::int64_t>& starts, std::int64_t begin, std::int64_t end,
               const TensorRow* rows, Fn&& fn) {
  std::size_t j = static_cast<std::size_t>(
      std::upper_bound(starts.begin(), starts.end(), begin) - starts.begin() - 1);
  for (std::int64_t item = begin; item < end; ++item) {
    while (starts[j + 1] <= item) ++j;
    const std::int64_t first = (item - starts[j]) * kChunk;
    const std::int64_t count = std::min<std::int64_t>(kChunk, rows[j].numel - first);
    fn(j, item, first, count);
  }
}

}  // namespace

// ----------------------------------------------------------------------------------- the passes

void pass1(const GroupConfig& cfg, const TensorRow* rows, std::size_t n, float* stats,
           std::int32_t* found_inf, ThreadPool& pool) {
  const std::vector<std::int64_t> starts = item_starts(rows, n);
  const std::int64_t items = starts[n];
  std::vector<float> partial(static_cast<std::size_t>(items), 0.0f);
  std::vector<std::uint8_t> bad(static_cast<std::size_t>(items), 0);
  const bool need_sum = cfg.hyper.clip > 0;
  std::vector<TensorConsts> consts(n);
  for (std::size_t j = 0; j < n; ++j) consts[j] = tensor_consts(cfg, rows[j]);

  pool.parallel_for(items, [&](std::int64_t begin, std::int64_t end) {
    Tile tile;
    for_items(starts, begin, end, rows, [&](std::size_t j, std::int64_t item, std::int64_t first, std::int64_t count) {
      const TensorRow& row = rows[j];
      const TensorConsts& c = consts[j];
      bool all_finite = true;
      // Lane accumulators in a fixed pattern: the sum does not depend on the machine's vector width.
      constexpr int kLanes = 16;
      float lanes[kLanes] = {};
      for (std::int64_t off = 0; off < count; off += kTile) {
        const int nt = static_cast<int>(std::min<std::int64_t>(kTile, count - off));
        const std::int64_t local = first + off;
        load_tile(cfg.grad_dtype, row.grad, local, nt, tile.g);
        all_finite = all_finite && tile_all_finite(tile.g, nt);
        if (!need_sum) continue;
        load_tile(cfg.state_dtype, row.exp_avg, local, nt, tile.m);
        load_tile(cfg.state_dtype, row.exp_avg_sq, local, nt, tile.v);
        moments_direction(cfg, c, row.elem_offset + local, nt, tile);
        int i = 0;
        for (; i + kLanes <= nt; i += kLanes)
          for (int l = 0; l < kLanes; ++l) lanes[l] += tile.u[i + l] * tile.u[i + l];
        for (int l = 0; i < nt; ++i, ++l) lanes[l] += tile.u[i] * tile.u[i];
      }
      float s = 0.0f;
      if (need_sum) {
        for (int width = kLanes / 2; width >= 1; width /= 2)
          for (int l = 0; l < width; ++l) lanes[l] += lanes[l + width];
        s = lanes[0];
      }
      partial[static_cast<std::size_t>(item)] = s;
      bad[static_cast<std::size_t>(item)] = all_finite ? 0 : 1;
    });
  });

  bool any_bad = false;
  for (std::size_t j = 0; j < n; ++j) {
    double s = 0.0;
    for (std::int64_t item = starts[j]; item < starts[j + 1]; ++item) {
      s += partial[static_cast<std::size_t>(item)];
      any_bad = any_bad || bad[static_cast<std::size_t>(item)];
    }
    if (stats) stats[j] = static_cast<float>(s);
  }
  if (any_bad && found_inf) *found_inf = 1;
}

void pass2(const GroupConfig& cfg, const TensorRow* rows, std::size_t n, float lr,
           const float* stats, const std::int32_t* found_inf, ThreadPool& pool) {
  if (cfg.check_flag() && found_inf && *found_inf != 0) return;
  const Hyper& h = cfg.hyper;
  const bool use_clip = h.clip > 0;
  if (use_clip && !stats) throw Error(Status::kInternal, "pass2 with clip > 0 needs pass 1's stats");
  const std::vector<std::int64_t> starts = item_starts(rows, n);
  std::vector<TensorConsts> consts(n);
  std::vector<float> taus(n, 0.0f);
  const float clip = static_cast<float>(h.clip);
  for (std::size_t j = 0; j < n; ++j) {
    consts[j] = tensor_consts(cfg, rows[j]);
    if (use_clip) taus[j] = clip * std::sqrt(stats[j] / static_cast<float>(rows[j].global_numel));
  }
  const float wd = static_cast<float>(h.weight_decay);
  const float bound = static_cast<float>(h.bound);
  const int mode = static_cast<int>(h.bound_mode);

  pool.parallel_for(starts[n], [&](std::int64_t begin, std::int64_t end) {
    Tile tile;
    for_items(starts, begin, end, rows, [&](std::size_t j, std::int64_t, std::int64_t first, std::int64_t count) {
      const TensorRow& row = rows[j];
      const TensorConsts& c = consts[j];
      const float tau = taus[j];
      for (std::int64_t off = 0; off < count; off += kTile) {
        const int nt = static_cast<int>(std::min<std::int64_t>(kTile, count - off));
        const std::int64_t local = first + off;
        const std::int64_t global_first = row.elem_offset + local;
        load_tile(cfg.grad_dtype, row.grad, local, nt, tile.g);
        load_tile(cfg.state_dtype, row.exp_avg, local, nt, tile.m);
        load_tile(cfg.state_dtype, row.exp_avg_sq, local, nt, tile.v);
        load_tile(cfg.param_dtype, row.param, local, nt, tile.p);
        moments_direction(cfg, c, global_first, nt, tile);
        float* __restrict u = tile.u;
        float* __restrict p = tile.p;
        const float* __restrict p0 = tile.p0;
        // 5. soft clip (pass 2 only)
        if (use_clip) {
          // tau == 0 (every u zero) gives 0; a NaN tau (non-finite grads with nonfinite
          // "propagate") gives NaN, as the kernels and the reference do
          if (tau == 0.0f) {
            for (int i = 0; i < nt; ++i) u[i] = 0.0f;
          } else {
            const float rtau = 1.0f / tau;
            for (int i = 0; i < nt; ++i) u[i] = tau * std::tanh(u[i] * rtau);
          }
        }
        // 6. decoupled decay and step
        const float decay = 1.0f - lr * wd;
        for (int i = 0; i < nt; ++i) p[i] = p[i] * decay - lr * u[i];
        // 7. bound (modes 1, 2)
        if (mode != 0) {
          load_tile(cfg.param_dtype, row.p_init, local, nt, tile.p0);
          for (int i = 0; i < nt; ++i) {
            const float r = mode == 1 ? bound : bound * std::sqrt(p0[i] * p0[i] + 1e-4f);
            const float lo = p0[i] - r;
            const float hi = p0[i] + r;
            float q = p[i] < lo ? lo : p[i];
            q = q > hi ? hi : q;
            p[i] = q;
          }
        }
        // 8. store p (stream 0), m, v, each rounded to its storage dtype
        if (c.param_words) random_words(c.key, global_first, nt, 0u, tile.w);
        store_tile(cfg.param_dtype, row.param, local, nt, p, c.param_words ? tile.w : nullptr);
        store_tile(cfg.state_dtype, row.exp_avg, local, nt, tile.m, nullptr);
        store_tile(cfg.state_dtype, row.exp_avg_sq, local, nt, tile.v, nullptr);
      }
    });
  });
}

void commit(const GroupConfig& cfg, const TensorRow* rows, std::size_t n, const std::int32_t* found_inf) {
  const std::int64_t add = (cfg.check_flag() && found_inf && *found_inf != 0) ? 0 : 1;
  for (std::size_t j = 0; j < n; ++j) *rows[j].step += add;
}

std::int64_t first_nonfinite(const GroupConfig& cfg, const TensorRow* rows, std::size_t n, ThreadPool& pool) {
  const std::vector<std::int64_t> starts = item_starts(rows, n);
  std::vector<std::uint8_t> bad(static_cast<std::size_t>(starts[n]), 0);
  pool.parallel_for(starts[n], [&](std::int64_t begin, std::int64_t end) {
    float g[kTile];
    for_items(starts, begin, end, rows, [&](std::size_t j, std::int64_t item, std::int64_t first, std::int64_t count) {
      bool ok = true;
      for (std::int64_t off = 0; off < count && ok; off += kTile) {
        const int nt = static_cast<int>(std::min<std::int64_t>(kTile, count - off));
        load_tile(cfg.grad_dtype, rows[j].grad, first + off, nt, g);
        ok = tile_all_finite(g, nt);
      }
      bad[static_cast<std::size_t>(item)] = ok ? 0 : 1;
    });
  });
  for (std::size_t j = 0; j < n; ++j)
    for (std::int64_t item = starts[j]; item < starts[j + 1]; ++item)
      if (bad[static_cast<std::size_t>(item)]) return static_cast<std::int64_t>(j);
  return -1;
}

}  // namespace cpu
}  // namespace luminav
