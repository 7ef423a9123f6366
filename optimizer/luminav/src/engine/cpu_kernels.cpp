// src/engine/cpu_kernels.cpp: the CPU engine's passes over a launch group (the element primitives
// they use are in cpu_numerics.h)
//
// TDCLM's passes (docs/tdclm.md) over a launch group, with the per-element operations of
// docs/internals.md in the same order as the reference and the kernels.
//
// Layout: a group's elements are cut into work items of kChunk elements (a tensor's last item
// may be shorter), handed to the threads in blocks. Each item is processed in tiles of kTile
// elements, each pass one loop per tile: float32 operands are read and written in place, other
// dtypes converted through tile buffers. Pass 1 writes one float32 partial per item; S_j
// combines the partials of tensor j in index order, so it does not depend on the thread count.
//
// Vector width: the tile loops are compiled three times on x86-64 (baseline SSE2, AVX2 and
// AVX-512F) and each pass picks one at run time (cpu_isa()); every loop is elementwise IEEE
// arithmetic without contraction (-ffp-contract=off), and the sums run in a fixed 16-lane
// pattern, so the three give the same bits (tests/test_native_cpu.py compares them).
//
// errno is never read by the engine: the file is compiled with -fno-math-errno (CMakeLists.txt),
// without which every sqrt loop keeps a branch and stays scalar.

#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <string>
#include <vector>

#include "engine/cpu_kernels.h"
#include "engine/cpu_numerics.h"
#include "engine/cpu_philox.h"
#include "engine/thread_pool.h"

// x86-64 with GCC or clang: the passes are also compiled for AVX2 and AVX-512F (target attribute)
#if defined(__x86_64__) && (defined(__GNUC__) || defined(__clang__))
#define LV_X86_CLONES 1
#else
#define LV_X86_CLONES 0
#endif

namespace luminav {
namespace cpu {

namespace {

constexpr int kTile = 256;  // elements per tile buffer: 8 float buffers + 3 word buffers fit L1

using namespace numerics;

}  // namespace

namespace {

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
  }
}

// Store rounding to `d`: bf16 rounds stochastically with `words` when non-null.
LV_TILE_INLINE void store_tile(DType d, void* base, std::int64_t off, int n, const float* in,
                const std::uint32_t* words) {
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
  std::uint32_t w[kTile], w1[kTile], w2[kTile];  // random words of streams 0, 1, 2
};

// How moments are rounded to their storage dtype (step 3).
enum class StateRound { kNone, kBf16Rne, kBf16Sr, kF16Rne };

StateRound state_round(const GroupConfig& cfg, const TensorConsts& c) {
  switch (cfg.state_dtype) {
    case DType::kFloat32: return StateRound::kNone;
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
                             const std::uint32_t* words) {
  if (d != DType::kFloat32) store_tile(d, base, off, n, buf, words);
}

// Steps 1-4 of one element: g -> m', v' (rounded to their storage dtype) and u.
template <StateRound R>
LV_TILE_INLINE float moments_one(const TensorConsts& c, float g, float& m, float& v,
                                 std::uint32_t w1, std::uint32_t w2) {
  const float gi = g * c.sign;
  const float mi = round_state<R>(c.beta1 * m + c.one_minus_beta1 * gi, w1);
  const float vi = round_state<R>(c.beta2 * v + c.one_minus_beta2 * (gi * gi), w2);
  m = mi;
  v = vi;
  return (mi * c.rbc1) / (std::sqrt(vi * c.rbc2) + c.eps);
}

// Pass 1's steps 1-4 in one loop: u of every element; the moments are not stored.
template <StateRound R>
LV_TILE_INLINE void direction_tile(const TensorConsts& c, int n, const float* __restrict g,
                                   const float* __restrict m, const float* __restrict v,
                                   float* __restrict u, const std::uint32_t* __restrict w1,
                                   const std::uint32_t* __restrict w2) {
  for (int i = 0; i < n; ++i) {
    float mi = m[i], vi = v[i];
    u[i] = moments_one<R>(c, g[i], mi, vi, R == StateRound::kBf16Sr ? w1[i] : 0u,
                          R == StateRound::kBf16Sr ? w2[i] : 0u);
  }
}

// Soft clip of step 5, as pass 2 applies it.
enum class Clip { kOff, kTanh, kZero };

// Pass 2's steps 1-6 in one loop: m and v updated in place, p <- p (1 - lr wd) - lr clip(u).
template <StateRound R, Clip C>
LV_TILE_INLINE void update_tile(const TensorConsts& c, int n, float tau, float decay, float lr,
                                const float* __restrict g, float* __restrict m,
                                float* __restrict v, float* __restrict p,
                                const std::uint32_t* __restrict w1,
                                const std::uint32_t* __restrict w2) {
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

LV_TILE_INLINE bool tile_all_finite(const float* g, int n) {
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

// Row of work item `item`: the last j with starts[j] <= item (rows with no elements skipped).
LV_TILE_INLINE std::size_t first_row(const std::int64_t* starts, std::size_t n, std::int64_t item) {
  return static_cast<std::size_t>(std::upper_bound(starts, starts + n + 1, item) - starts - 1);
}

// Row of `item` and the element range it covers, walking j forward.
LV_TILE_INLINE void locate(const std::int64_t* starts, const TensorRow* rows, std::int64_t item,
                           std::size_t& j, std::int64_t& first, std::int64_t& count) {
  while (starts[j + 1] <= item) ++j;
  first = (item - starts[j]) * kChunk;
  count = std::min<std::int64_t>(kChunk, rows[j].numel - first);
}

// Calls fn(row, item, first, count) for every item of [begin, end).
template <class Fn>
void for_items(const std::vector<std::int64_t>& starts, std::int64_t begin, std::int64_t end,
               const TensorRow* rows, Fn&& fn) {
  std::size_t j = first_row(starts.data(), starts.size() - 1, begin);
  for (std::int64_t item = begin; item < end; ++item) {
    std::int64_t first = 0, count = 0;
    locate(starts.data(), rows, item, j, first, count);
    fn(j, item, first, count);
  }
}

}  // namespace

// ------------------------------------------------------------------------------ vector width

namespace {

struct IsaChoice {
  CpuIsa isa;
  std::string error;  // non-empty: LUMINAV_CPU_ISA names a width this CPU lacks, or none
};

CpuIsa best_isa() noexcept {
#if LV_X86_CLONES
  __builtin_cpu_init();
  if (__builtin_cpu_supports("avx512f")) return CpuIsa::kAvx512;
  if (__builtin_cpu_supports("avx2")) return CpuIsa::kAvx2;
#endif
  return CpuIsa::kBaseline;
}

IsaChoice choose_isa() {
  const CpuIsa best = best_isa();
  const char* env = std::getenv("LUMINAV_CPU_ISA");
  if (!env || !*env) return {best, ""};
  const std::string v(env);
  CpuIsa want;
  if (v == "baseline") {
    want = CpuIsa::kBaseline;
  } else if (v == "avx2") {
    want = CpuIsa::kAvx2;
  } else if (v == "avx512") {
    want = CpuIsa::kAvx512;
  } else {
    return {best, "LUMINAV_CPU_ISA='" + v + "' is not a vector width: use baseline, avx2 or avx512, "
                  "or unset it for the widest this CPU has (" + cpu_isa_name(best) + ")"};
  }
  if (static_cast<int>(want) > static_cast<int>(best))
    return {best, "LUMINAV_CPU_ISA=" + v + ": this CPU's widest is " + cpu_isa_name(best) +
                  "; ask for that or a narrower one, or unset it"};
  return {want, ""};
}

const IsaChoice& isa_choice() {
  static const IsaChoice choice = choose_isa();
  return choice;
}

// What one range of work items of a pass reads and writes.
struct Pass1Work {
  const GroupConfig* cfg;
  const TensorRow* rows;
  const std::int64_t* starts;  // item_starts, n + 1 of them
  std::size_t n;
  const TensorConsts* consts;
  float* partial;              // per item
  std::uint8_t* bad;           // per item
  bool need_sum;
  RandomWordsFn words;         // the rounding streams at this width (cpu_philox.h)
};

struct Pass2Work {
  const GroupConfig* cfg;
  const TensorRow* rows;
  const std::int64_t* starts;
  std::size_t n;
  const TensorConsts* consts;
  const float* taus;
  float lr;
  RandomWordsFn words;
};

LV_TILE_INLINE void pass1_items(const Pass1Work& w, std::int64_t begin, std::int64_t end) {
  const GroupConfig& cfg = *w.cfg;
  Tile tile;
  std::size_t j = first_row(w.starts, w.n, begin);
  for (std::int64_t item = begin; item < end; ++item) {
    std::int64_t first = 0, count = 0;
    locate(w.starts, w.rows, item, j, first, count);
    const TensorRow& row = w.rows[j];
    const TensorConsts& c = w.consts[j];
    bool all_finite = true;
    // Lane accumulators in a fixed pattern: the sum does not depend on the machine's vector width.
    constexpr int kLanes = 16;
    float lanes[kLanes] = {};
    for (std::int64_t off = 0; off < count; off += kTile) {
      const int nt = static_cast<int>(std::min<std::int64_t>(kTile, count - off));
      const std::int64_t local = first + off;
      const float* g = tile_in(cfg.grad_dtype, row.grad, local, nt, tile.g);
      all_finite = all_finite && tile_all_finite(g, nt);
      if (!w.need_sum) continue;
      const float* m = tile_in(cfg.state_dtype, row.exp_avg, local, nt, tile.m);
      const float* v = tile_in(cfg.state_dtype, row.exp_avg_sq, local, nt, tile.v);
      const std::int64_t global_first = row.elem_offset + local;
      if (c.state_words) {
        w.words(c.key, global_first, nt, 1u, tile.w1);
        w.words(c.key, global_first, nt, 2u, tile.w2);
      }
      switch (state_round(cfg, c)) {
        case StateRound::kNone: direction_tile<StateRound::kNone>(c, nt, g, m, v, tile.u, tile.w1, tile.w2); break;
        case StateRound::kBf16Rne: direction_tile<StateRound::kBf16Rne>(c, nt, g, m, v, tile.u, tile.w1, tile.w2); break;
        case StateRound::kBf16Sr: direction_tile<StateRound::kBf16Sr>(c, nt, g, m, v, tile.u, tile.w1, tile.w2); break;
        case StateRound::kF16Rne: direction_tile<StateRound::kF16Rne>(c, nt, g, m, v, tile.u, tile.w1, tile.w2); break;
      }
      int i = 0;
      for (; i + kLanes <= nt; i += kLanes)
        for (int l = 0; l < kLanes; ++l) lanes[l] += tile.u[i + l] * tile.u[i + l];
      for (int l = 0; i < nt; ++i, ++l) lanes[l] += tile.u[i] * tile.u[i];
    }
    float s = 0.0f;
    if (w.need_sum) {
      for (int width = kLanes / 2; width >= 1; width /= 2)
        for (int l = 0; l < width; ++l) lanes[l] += lanes[l + width];
      s = lanes[0];
    }
    w.partial[item] = s;
    w.bad[item] = all_finite ? 0 : 1;
  }
}

template <StateRound R>
LV_TILE_INLINE void update_clip(Clip clip, const TensorConsts& c, int n, float tau, float decay,
                                float lr, const float* g, float* m, float* v, float* p,
                                const std::uint32_t* w1, const std::uint32_t* w2) {
  switch (clip) {
    case Clip::kOff: update_tile<R, Clip::kOff>(c, n, tau, decay, lr, g, m, v, p, w1, w2); break;
    case Clip::kTanh: update_tile<R, Clip::kTanh>(c, n, tau, decay, lr, g, m, v, p, w1, w2); break;
    case Clip::kZero: update_tile<R, Clip::kZero>(c, n, tau, decay, lr, g, m, v, p, w1, w2); break;
  }
}

LV_TILE_INLINE void update(StateRound r, Clip clip, const TensorConsts& c, int n, float tau,
                           float decay, float lr, const float* g, float* m, float* v, float* p,
                           const std::uint32_t* w1, const std::uint32_t* w2) {
  switch (r) {
    case StateRound::kNone: update_clip<StateRound::kNone>(clip, c, n, tau, decay, lr, g, m, v, p, w1, w2); break;
    case StateRound::kBf16Rne: update_clip<StateRound::kBf16Rne>(clip, c, n, tau, decay, lr, g, m, v, p, w1, w2); break;
    case StateRound::kBf16Sr: update_clip<StateRound::kBf16Sr>(clip, c, n, tau, decay, lr, g, m, v, p, w1, w2); break;
    case StateRound::kF16Rne: update_clip<StateRound::kF16Rne>(clip, c, n, tau, decay, lr, g, m, v, p, w1, w2); break;
  }
}

LV_TILE_INLINE void pass2_items(const Pass2Work& w, std::int64_t begin, std::int64_t end) {
  const GroupConfig& cfg = *w.cfg;
  const Hyper& h = cfg.hyper;
  const bool use_clip = h.clip > 0;
  const float wd = static_cast<float>(h.weight_decay);
  const float bound = static_cast<float>(h.bound);
  const int mode = static_cast<int>(h.bound_mode);
  const float lr = w.lr;
  Tile tile;
  std::size_t j = first_row(w.starts, w.n, begin);
  for (std::int64_t item = begin; item < end; ++item) {
    std::int64_t first = 0, count = 0;
    locate(w.starts, w.rows, item, j, first, count);
    const TensorRow& row = w.rows[j];
    const TensorConsts& c = w.consts[j];
    const float tau = w.taus[j];
    for (std::int64_t off = 0; off < count; off += kTile) {
      const int nt = static_cast<int>(std::min<std::int64_t>(kTile, count - off));
      const std::int64_t local = first + off;
      const std::int64_t global_first = row.elem_offset + local;
      const float* g = tile_in(cfg.grad_dtype, row.grad, local, nt, tile.g);
      float* m = tile_inout(cfg.state_dtype, row.exp_avg, local, nt, tile.m);
      float* v = tile_inout(cfg.state_dtype, row.exp_avg_sq, local, nt, tile.v);
      float* p = tile_inout(cfg.param_dtype, row.param, local, nt, tile.p);
      if (c.state_words) {
        w.words(c.key, global_first, nt, 1u, tile.w1);
        w.words(c.key, global_first, nt, 2u, tile.w2);
      }
      // 1-6: moments, direction, soft clip (pass 2 only), decoupled decay and step. tau == 0
      // (every u zero) gives 0; a NaN tau (non-finite grads with nonfinite "propagate") gives
      // NaN, as the kernels and the reference do.
      const Clip clip = !use_clip ? Clip::kOff : (tau == 0.0f ? Clip::kZero : Clip::kTanh);
      const float decay = 1.0f - lr * wd;
      update(state_round(cfg, c), clip, c, nt, tau, decay, lr, g, m, v, p, tile.w1, tile.w2);
      // 7. bound (modes 1, 2)
      if (mode != 0) {
        const float* __restrict p0 = tile_in(cfg.param_dtype, row.p_init, local, nt, tile.p0);
        float* __restrict q = p;
        for (int i = 0; i < nt; ++i) {
          const float r = mode == 1 ? bound : bound * std::sqrt(p0[i] * p0[i] + 1e-4f);
          const float lo = p0[i] - r;
          const float hi = p0[i] + r;
          float x = q[i] < lo ? lo : q[i];
          x = x > hi ? hi : x;
          q[i] = x;
        }
      }
      // 8. store p (stream 0), m, v, each rounded to its storage dtype (float32 ones are
      // already in place)
      if (c.param_words) w.words(c.key, global_first, nt, 0u, tile.w);
      tile_out(cfg.param_dtype, row.param, local, nt, p, c.param_words ? tile.w : nullptr);
      tile_out(cfg.state_dtype, row.exp_avg, local, nt, m, nullptr);
      tile_out(cfg.state_dtype, row.exp_avg_sq, local, nt, v, nullptr);
    }
  }
}

// The same loops at each vector width.
void pass1_baseline(const Pass1Work& w, std::int64_t b, std::int64_t e) { pass1_items(w, b, e); }
void pass2_baseline(const Pass2Work& w, std::int64_t b, std::int64_t e) { pass2_items(w, b, e); }
#if LV_X86_CLONES
__attribute__((target("avx2"))) void pass1_avx2(const Pass1Work& w, std::int64_t b, std::int64_t e) {
  pass1_items(w, b, e);
}
__attribute__((target("avx2"))) void pass2_avx2(const Pass2Work& w, std::int64_t b, std::int64_t e) {
  pass2_items(w, b, e);
}
__attribute__((target("avx512f"))) void pass1_avx512(const Pass1Work& w, std::int64_t b, std::int64_t e) {
  pass1_items(w, b, e);
}
__attribute__((target("avx512f"))) void pass2_avx512(const Pass2Work& w, std::int64_t b, std::int64_t e) {
  pass2_items(w, b, e);
}
#endif

template <class Work>
using ItemsFn = void (*)(const Work&, std::int64_t, std::int64_t);

template <class Work>
ItemsFn<Work> pick(ItemsFn<Work> baseline, ItemsFn<Work> avx2, ItemsFn<Work> avx512) {
  switch (cpu_isa()) {
    case CpuIsa::kAvx512: return avx512 ? avx512 : baseline;
    case CpuIsa::kAvx2: return avx2 ? avx2 : baseline;
    case CpuIsa::kBaseline: break;
  }
  return baseline;
}

ItemsFn<Pass1Work> pass1_fn() {
#if LV_X86_CLONES
  return pick<Pass1Work>(pass1_baseline, pass1_avx2, pass1_avx512);
#else
  return pick<Pass1Work>(pass1_baseline, nullptr, nullptr);
#endif
}

ItemsFn<Pass2Work> pass2_fn() {
#if LV_X86_CLONES
  return pick<Pass2Work>(pass2_baseline, pass2_avx2, pass2_avx512);
#else
  return pick<Pass2Work>(pass2_baseline, nullptr, nullptr);
#endif
}

}  // namespace

CpuIsa cpu_isa() {
  const IsaChoice& c = isa_choice();
  if (!c.error.empty()) throw Error(Status::kInvalidArgument, c.error);
  return c.isa;
}

std::string cpu_isa_name(CpuIsa isa) {
  switch (isa) {
    case CpuIsa::kAvx512: return "avx512";
    case CpuIsa::kAvx2: return "avx2";
    case CpuIsa::kBaseline: break;
  }
  return "baseline";
}

// ----------------------------------------------------------------------------------- the passes

void pass1(const GroupConfig& cfg, const TensorRow* rows, std::size_t n, float* stats,
           std::int32_t* found_inf, ThreadPool& pool) {
  const auto run = pass1_fn();
  const std::vector<std::int64_t> starts = item_starts(rows, n);
  const std::int64_t items = starts[n];
  std::vector<float> partial(static_cast<std::size_t>(items), 0.0f);
  std::vector<std::uint8_t> bad(static_cast<std::size_t>(items), 0);
  std::vector<TensorConsts> consts(n);
  for (std::size_t j = 0; j < n; ++j) consts[j] = tensor_consts(cfg, rows[j]);
  const Pass1Work work{&cfg, rows, starts.data(), n, consts.data(), partial.data(), bad.data(),
                       cfg.hyper.clip > 0, random_words_fn(cpu_isa())};
  pool.parallel_for(items, [&](std::int64_t begin, std::int64_t end) { run(work, begin, end); });

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
  const auto run = pass2_fn();
  const std::vector<std::int64_t> starts = item_starts(rows, n);
  std::vector<TensorConsts> consts(n);
  std::vector<float> taus(n, 0.0f);
  const float clip = static_cast<float>(h.clip);
  for (std::size_t j = 0; j < n; ++j) {
    consts[j] = tensor_consts(cfg, rows[j]);
    if (use_clip) taus[j] = clip * std::sqrt(stats[j] / static_cast<float>(rows[j].global_numel));
  }
  const Pass2Work work{&cfg, rows, starts.data(), n, consts.data(), taus.data(), lr,
                       random_words_fn(cpu_isa())};
  pool.parallel_for(starts[n], [&](std::int64_t begin, std::int64_t end) { run(work, begin, end); });
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
