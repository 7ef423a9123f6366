// src/engine/cpu_kernels.cpp: the CPU engine's passes over a launch group (their tile loops are in
// cpu_tiles.h, the element primitives in cpu_numerics.h, the random words in cpu_philox.cpp)
//
// TDCLM's passes (docs/tdclm.md) over a launch group, with the per-element operations of
// docs/internals.md in the same order as the reference and the kernels.
//
// Layout: a group's elements are cut into work items of kChunk elements (a tensor's last item
// may be shorter), handed to the threads in blocks. Each item is processed in tiles of kTile
// elements, each pass one loop per tile: float32 operands are read and written in place, other
// dtypes converted through tile buffers. Pass 1 writes one float32 partial per item; S_j
// combines the partials of tensor j in index order, so it does not depend on the thread count.
// With the clip, pass 1 can keep every u it computes for pass 2 (DirectionCache, cpu_kernels.h,
// for groups up to kDirectionCacheBytes of them), which then skips step 4's square root and
// division, and with bf16 moments also m' and v' as stored, which pass 2 then copies instead of
// computing the moments again (with their two rounding streams); pass 2 itself writes the
// moments and weights, so a refused step changes only the cache.
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
#include "engine/cpu_q8.h"
#include "engine/cpu_tiles.h"
#include "engine/thread_pool.h"

// x86-64 with GCC or clang: the passes are also compiled for AVX2 and for AVX-512 (target
// attribute; F with BW, VL and DQ, which every AVX-512 CPU but the Xeon Phi has: 16-bit lanes
// and masked 256-bit operations let the bf16 loads and stores stay at full width)
#if defined(__x86_64__) && (defined(__GNUC__) || defined(__clang__))
#define LV_X86_CLONES 1
#else
#define LV_X86_CLONES 0
#endif

namespace luminav {
namespace cpu {

namespace {

using namespace tiles;

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
#define LV_CPU_HAS(name) __builtin_cpu_supports(name)
  if (LV_AVX512_FEATURES(LV_CPU_HAS, &&)) return CpuIsa::kAvx512;
#undef LV_CPU_HAS
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
  float* cache_u;              // null, or DirectionCache::u: row j's element i at base[j] + i
  const std::int64_t* base;
  std::uint16_t* cache_m;      // null, or DirectionCache::m, ::v (bf16 moments), as cache_u
  std::uint16_t* cache_v;
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
  const float* cache_u;        // null: u recomputed; else pass 1's, as in Pass1Work
  const std::int64_t* base;
  const std::uint16_t* cache_m;  // null: the moments recomputed; else pass 1's m', v' as stored
  const std::uint16_t* cache_v;
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
    // 64 of them: four independent chains of additions at the widest width (one chain of 16 made
    // the loop wait on each addition's latency).
    constexpr int kLanes = 64;
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
      float* __restrict u = w.cache_u ? w.cache_u + w.base[j] + local : tile.u;
      if (w.cache_m) {  // bf16 moments: m', v' kept for pass 2 too
        std::uint16_t* ms = w.cache_m + w.base[j] + local;
        std::uint16_t* vs = w.cache_v + w.base[j] + local;
        if (state_round(cfg, c) == StateRound::kBf16Sr) {
          direction_tile<StateRound::kBf16Sr, true>(c, nt, g, m, v, u, tile.w1, tile.w2, ms, vs);
        } else {
          direction_tile<StateRound::kBf16Rne, true>(c, nt, g, m, v, u, tile.w1, tile.w2, ms, vs);
        }
      } else {
        switch (state_round(cfg, c)) {
          case StateRound::kNone: direction_tile<StateRound::kNone>(c, nt, g, m, v, u, tile.w1, tile.w2); break;
          case StateRound::kBf16Rne: direction_tile<StateRound::kBf16Rne>(c, nt, g, m, v, u, tile.w1, tile.w2); break;
          case StateRound::kBf16Sr: direction_tile<StateRound::kBf16Sr>(c, nt, g, m, v, u, tile.w1, tile.w2); break;
          case StateRound::kF16Rne: direction_tile<StateRound::kF16Rne>(c, nt, g, m, v, u, tile.w1, tile.w2); break;
        }
      }
      int i = 0;
      for (; i + kLanes <= nt; i += kLanes)
        for (int l = 0; l < kLanes; ++l) lanes[l] += u[i + l] * u[i + l];
      for (int l = 0; i < nt; ++i, ++l) lanes[l] += u[i] * u[i];
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
      const float decay = 1.0f - lr * wd;
      float* p = tile_inout(cfg.param_dtype, row.param, local, nt, tile.p);
      if (w.cache_m) {
        // pass 1 kept u and the moments as stored: steps 5-6 from u, the moments copied
        const float* cached_u = w.cache_u + w.base[j] + local;
        if (tau == 0.0f) {
          for (int i = 0; i < nt; ++i) p[i] = p[i] * decay - lr * 0.0f;
        } else {
          clip_tile(nt, tau, decay, lr, cached_u, p, tile.large);
        }
        copy_words16(static_cast<std::uint16_t*>(row.exp_avg) + local, w.cache_m + w.base[j] + local, nt);
        copy_words16(static_cast<std::uint16_t*>(row.exp_avg_sq) + local, w.cache_v + w.base[j] + local, nt);
      } else {
        const float* g = tile_in(cfg.grad_dtype, row.grad, local, nt, tile.g);
        float* m = tile_inout(cfg.state_dtype, row.exp_avg, local, nt, tile.m);
        float* v = tile_inout(cfg.state_dtype, row.exp_avg_sq, local, nt, tile.v);
        if (c.state_words) {
          w.words(c.key, global_first, nt, 1u, tile.w1);
          w.words(c.key, global_first, nt, 2u, tile.w2);
        }
        // 1-6: moments, direction, soft clip (pass 2 only), decoupled decay and step. tau == 0
        // (every u zero) gives 0; a NaN tau (non-finite grads with nonfinite "propagate") gives
        // NaN, as the kernels and the reference do.
        const Clip clip = !use_clip ? Clip::kOff : (tau == 0.0f ? Clip::kZero : Clip::kTanh);
        const float* cached_u = w.cache_u ? w.cache_u + w.base[j] + local : nullptr;
        update(state_round(cfg, c), clip, c, nt, tau, decay, lr, g, m, v, p, tile.w1, tile.w2, tile.u,
               cached_u, tile.large);
        tile_out(cfg.state_dtype, row.exp_avg, local, nt, m, nullptr);
        tile_out(cfg.state_dtype, row.exp_avg_sq, local, nt, v, nullptr);
      }
      // 7. bound (modes 1, 2)
      if (mode != 0) {
        bound_tile(mode, bound, nt, tile_in(cfg.param_dtype, row.p_init, local, nt, tile.p0), p);
      }
      // 8. store p (stream 0), rounded to its storage dtype (float32 in place; m and v were
      // stored above)
      if (c.param_words) w.words(c.key, global_first, nt, 0u, tile.w);
      tile_out(cfg.param_dtype, row.param, local, nt, p, c.param_words ? tile.w : nullptr);
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
__attribute__((target(LV_AVX512_TARGET))) void pass1_avx512(const Pass1Work& w, std::int64_t b, std::int64_t e) {
  pass1_items(w, b, e);
}
__attribute__((target(LV_AVX512_TARGET))) void pass2_avx512(const Pass2Work& w, std::int64_t b, std::int64_t e) {
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

// ---------------------------------------------------------------------------- direction cache

namespace {

bool cache_fits(const TensorRow* rows, std::size_t n) {
  std::int64_t total = 0;
  for (std::size_t j = 0; j < n; ++j) total += rows[j].numel;
  return static_cast<std::uint64_t>(total) * sizeof(float) <= kDirectionCacheBytes;
}

// What identifies the rows pass 1 saw: every address, size, offset and step counter.
void cache_key(const TensorRow* rows, std::size_t n, std::vector<std::int64_t>& key) {
  key.clear();
  key.reserve(8 * n + 1);
  key.push_back(static_cast<std::int64_t>(n));
  for (std::size_t j = 0; j < n; ++j) {
    const TensorRow& r = rows[j];
    for (const void* a : {static_cast<const void*>(r.param), r.grad, static_cast<const void*>(r.exp_avg),
                          static_cast<const void*>(r.exp_avg_sq)})
      key.push_back(static_cast<std::int64_t>(reinterpret_cast<std::uintptr_t>(a)));
    key.push_back(r.numel);
    key.push_back(r.elem_offset);
    key.push_back(r.param_index);
    key.push_back(r.step ? *r.step : -1);
  }
}

void cache_layout(const TensorRow* rows, std::size_t n, std::vector<std::int64_t>& base,
                  std::vector<std::int64_t>& key) {
  base.assign(n + 1, 0);
  for (std::size_t j = 0; j < n; ++j) base[j + 1] = base[j] + rows[j].numel;
  cache_key(rows, n, key);
}

bool cache_matches(const DirectionCache& cache, const TensorRow* rows, std::size_t n) {
  std::vector<std::int64_t> key;
  cache_key(rows, n, key);
  return key == cache.key && cache.base.size() == n + 1;
}

}  // namespace

// ----------------------------------------------------------------------------------- the passes

void pass1(const GroupConfig& cfg, const TensorRow* rows, std::size_t n, float* stats,
           std::int32_t* found_inf, ThreadPool& pool, DirectionCache* cache) {
  if (cfg.state_dtype == DType::kQ8) {  // q8 moments: a q8 block at a time (cpu_q8.cpp), no cache
    if (cache) cache->ready = false;
    std::vector<TensorConsts> consts(n);
    for (std::size_t j = 0; j < n; ++j) consts[j] = tensor_consts(cfg, rows[j]);
    q8::pass1(cfg, rows, n, consts.data(), stats, found_inf, pool, cpu_isa());
    return;
  }
  const auto run = pass1_fn();
  const std::vector<std::int64_t> starts = item_starts(rows, n);
  const std::int64_t items = starts[n];
  std::vector<float> partial(static_cast<std::size_t>(items), 0.0f);
  std::vector<std::uint8_t> bad(static_cast<std::size_t>(items), 0);
  std::vector<TensorConsts> consts(n);
  for (std::size_t j = 0; j < n; ++j) consts[j] = tensor_consts(cfg, rows[j]);
  const bool need_sum = cfg.hyper.clip > 0;
  float* cache_u = nullptr;
  if (cache) {
    cache->ready = false;
    if (need_sum && cache_fits(rows, n)) {
      cache_layout(rows, n, cache->base, cache->key);
      const auto total = static_cast<std::size_t>(cache->base[n]);
      cache->u.resize(total);
      cache_u = cache->u.data();
      const bool bf16_moments = cfg.state_dtype == DType::kBFloat16;
      cache->m.resize(bf16_moments ? total : 0);
      cache->v.resize(bf16_moments ? total : 0);
    }
  }
  const bool keep_moments = cache_u && !cache->m.empty();
  const Pass1Work work{&cfg, rows, starts.data(), n, consts.data(), partial.data(), bad.data(),
                       need_sum, random_words_fn(cpu_isa()), cache_u,
                       cache_u ? cache->base.data() : nullptr,
                       keep_moments ? cache->m.data() : nullptr, keep_moments ? cache->v.data() : nullptr};
  pool.parallel_for(items, [&](std::int64_t begin, std::int64_t end) { run(work, begin, end); });
  if (cache_u) cache->ready = true;

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
           const float* stats, const std::int32_t* found_inf, ThreadPool& pool, DirectionCache* cache) {
  // pass 1's u, where it kept them for these very rows; used once
  const float* cache_u = nullptr;
  const std::int64_t* cache_base = nullptr;
  const std::uint16_t* cache_m = nullptr;
  const std::uint16_t* cache_v = nullptr;
  if (cache && cache->ready) {
    cache->ready = false;
    if (cache_matches(*cache, rows, n)) {
      cache_u = cache->u.data();
      cache_base = cache->base.data();
      if (!cache->m.empty()) {  // pass 1 kept the moments too (bf16 moments)
        cache_m = cache->m.data();
        cache_v = cache->v.data();
      }
    }
  }
  if (cfg.check_flag() && found_inf && *found_inf != 0) return;
  const Hyper& h = cfg.hyper;
  const bool use_clip = h.clip > 0;
  if (use_clip && !stats) throw Error(Status::kInternal, "pass2 with clip > 0 needs pass 1's stats");
  if (!use_clip) cache_u = nullptr, cache_base = nullptr, cache_m = nullptr, cache_v = nullptr;
  const auto run = pass2_fn();
  const std::vector<std::int64_t> starts = item_starts(rows, n);
  std::vector<TensorConsts> consts(n);
  std::vector<float> taus(n, 0.0f);
  const float clip = static_cast<float>(h.clip);
  for (std::size_t j = 0; j < n; ++j) {
    consts[j] = tensor_consts(cfg, rows[j]);
    if (use_clip) taus[j] = clip * std::sqrt(stats[j] / static_cast<float>(rows[j].global_numel));
  }
  if (cfg.state_dtype == DType::kQ8) {
    q8::pass2(cfg, rows, n, consts.data(), taus.data(), lr, pool, cpu_isa());
    return;
  }
  const Pass2Work work{&cfg, rows, starts.data(), n, consts.data(), taus.data(), lr,
                       random_words_fn(cpu_isa()), cache_u, cache_base, cache_m, cache_v};
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
