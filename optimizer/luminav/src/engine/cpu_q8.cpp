// src/engine/cpu_q8.cpp: the CPU engine's passes over q8 tensors (docs/tdclm.md "Quantized
// moments (q8)"), a q8 block at a time
//
// A tensor's work items are runs of kItemBlocks q8 blocks in (row, block) order; each block (up
// to 256 elements of one row) is one tile: its codes are decoded (scale * C[code]), steps 1-6 run
// on the decoded moments exactly as for float32 moments (cpu_tiles.h, StateRound::kNone: m', v'
// unrounded), and pass 2 stores p as cpu_kernels.cpp does, then each moment's new block scale
// and its codes, rounded stochastically with R16 of streams 3 (m) and 4 (v). Pass 1 writes one
// partial sum a work item, combined per tensor in item order, so S does not depend on the thread
// count. The loops are compiled at each vector width as cpu_kernels.cpp's are (the same target
// attributes, -ffp-contract=off, -O3 and -fno-math-errno from CMakeLists.txt), and give the same
// bits at every width (tests/test_cpu_quant.cpp compares them).
#include "engine/cpu_q8.h"

#include <algorithm>
#include <vector>

#include "engine/cpu_philox.h"
#include "engine/thread_pool.h"

#if defined(__x86_64__) && (defined(__GNUC__) || defined(__clang__))
#define LV_Q8_CLONES 1
#else
#define LV_Q8_CLONES 0
#endif

namespace luminav {
namespace cpu {
namespace q8 {

namespace {

using namespace tiles;

// Work items of a group of q8 rows: starts[j] = first item of row j; starts[n] = total.
std::vector<std::int64_t> item_starts(const TensorRow* rows, std::size_t n) {
  std::vector<std::int64_t> starts(n + 1, 0);
  for (std::size_t j = 0; j < n; ++j) {
    const std::int64_t blocks = quant::num_blocks(rows[j].numel, rows[j].row_len);
    starts[j + 1] = starts[j] + (blocks + kItemBlocks - 1) / kItemBlocks;
  }
  return starts;
}

// Row j of `item` (walking j forward) and its q8 blocks [qb0, qb1).
LV_TILE_INLINE void locate(const std::int64_t* starts, const TensorRow* rows, std::int64_t item, std::size_t& j,
                           std::int64_t& qb0, std::int64_t& qb1) {
  while (starts[j + 1] <= item) ++j;
  qb0 = (item - starts[j]) * kItemBlocks;
  qb1 = std::min<std::int64_t>(qb0 + kItemBlocks, quant::num_blocks(rows[j].numel, rows[j].row_len));
}

std::size_t first_row(const std::vector<std::int64_t>& starts, std::int64_t item) {
  return static_cast<std::size_t>(std::upper_bound(starts.begin(), starts.end(), item) - starts.begin() - 1);
}

struct Work {
  const GroupConfig* cfg;
  const TensorRow* rows;
  const std::int64_t* starts;
  std::size_t first_row;  // row of the range's first item
  const TensorConsts* consts;
  RandomWordsFn words;
  // pass 1
  float* partial;
  std::uint8_t* bad;
  bool need_sum;
  // pass 2
  const float* taus;
  float lr;
};

LV_TILE_INLINE void pass1_items(const Work& w, std::int64_t begin, std::int64_t end) {
  const GroupConfig& cfg = *w.cfg;
  Tile tile;
  std::size_t j = w.first_row;
  while (w.starts[j + 1] <= begin) ++j;
  for (std::int64_t item = begin; item < end; ++item) {
    std::int64_t qb0 = 0, qb1 = 0;
    locate(w.starts, w.rows, item, j, qb0, qb1);
    const TensorRow& row = w.rows[j];
    const TensorConsts& c = w.consts[j];
    bool all_finite = true;
    constexpr int kLanes = 64;  // the fixed lane pattern of cpu_kernels.cpp's pass 1
    float lanes[kLanes] = {};
    for (std::int64_t qb = qb0; qb < qb1; ++qb) {
      std::int64_t first = 0;
      int nt = 0;
      quant::block_range(qb, row.row_len, first, nt);
      const float* g = tile_in(cfg.grad_dtype, row.grad, first, nt, tile.g);
      all_finite = all_finite && tile_all_finite(g, nt);
      if (!w.need_sum) continue;
      quant::decode_block_m(row.scale_m[qb], static_cast<const std::uint8_t*>(row.exp_avg) + first, nt, tile.m);
      quant::decode_block_v(row.scale_v[qb], static_cast<const std::uint8_t*>(row.exp_avg_sq) + first, nt, tile.v);
      direction_tile<StateRound::kNone>(c, nt, g, tile.m, tile.v, tile.u, tile.w1, tile.w2);
      const float* u = tile.u;
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

// A moment's new block scale and codes (m: stream 3, v: stream 4), written in place of the old
// ones.
template <bool kSigned>
LV_TILE_INLINE void store_block(const Work& w, const TensorConsts& c, std::int64_t global_first, const float* x, int nt,
                                std::uint16_t* words, float* scale, std::uint8_t* codes) {
  const float s = quant::block_scale(x, nt);
  w.words(c.key, global_first, nt, kSigned ? 3u : 4u, words);
  quant::encode_block<kSigned>(s, x, nt, words, codes);
  *scale = s;
}

LV_TILE_INLINE void pass2_items(const Work& w, std::int64_t begin, std::int64_t end) {
  const GroupConfig& cfg = *w.cfg;
  const Hyper& h = cfg.hyper;
  const bool use_clip = h.clip > 0;
  const float wd = static_cast<float>(h.weight_decay);
  const float bound = static_cast<float>(h.bound);
  const int mode = static_cast<int>(h.bound_mode);
  const float lr = w.lr;
  const float decay = 1.0f - lr * wd;
  Tile tile;
  std::size_t j = w.first_row;
  while (w.starts[j + 1] <= begin) ++j;
  for (std::int64_t item = begin; item < end; ++item) {
    std::int64_t qb0 = 0, qb1 = 0;
    locate(w.starts, w.rows, item, j, qb0, qb1);
    const TensorRow& row = w.rows[j];
    const TensorConsts& c = w.consts[j];
    const float tau = w.taus[j];
    const Clip clip = !use_clip ? Clip::kOff : (tau == 0.0f ? Clip::kZero : Clip::kTanh);
    auto* codes_m = static_cast<std::uint8_t*>(row.exp_avg);
    auto* codes_v = static_cast<std::uint8_t*>(row.exp_avg_sq);
    for (std::int64_t qb = qb0; qb < qb1; ++qb) {
      std::int64_t first = 0;
      int nt = 0;
      quant::block_range(qb, row.row_len, first, nt);
      const std::int64_t global_first = row.elem_offset + first;
      const float* g = tile_in(cfg.grad_dtype, row.grad, first, nt, tile.g);
      float* p = tile_inout(cfg.param_dtype, row.param, first, nt, tile.p);
      quant::decode_block_m(row.scale_m[qb], codes_m + first, nt, tile.m);
      quant::decode_block_v(row.scale_v[qb], codes_v + first, nt, tile.v);
      // 1-6: moments (unrounded), direction, soft clip, decoupled decay and step
      update(StateRound::kNone, clip, c, nt, tau, decay, lr, g, tile.m, tile.v, p, tile.w1, tile.w2, tile.u, nullptr,
             tile.large);
      // 7. bound (modes 1, 2)
      if (mode != 0) bound_tile(mode, bound, nt, tile_in(cfg.param_dtype, row.p_init, first, nt, tile.p0), p);
      // 8. store p (stream 0), then m and v: new block scales, codes rounded with streams 3 and 4
      if (c.param_words) w.words(c.key, global_first, nt, 0u, tile.w);
      tile_out(cfg.param_dtype, row.param, first, nt, p, c.param_words ? tile.w : nullptr);
      store_block<true>(w, c, global_first, tile.m, nt, tile.w1, row.scale_m + qb, codes_m + first);
      store_block<false>(w, c, global_first, tile.v, nt, tile.w2, row.scale_v + qb, codes_v + first);
    }
  }
}

// The same loops at each vector width.
void pass1_baseline(const Work& w, std::int64_t b, std::int64_t e) { pass1_items(w, b, e); }
void pass2_baseline(const Work& w, std::int64_t b, std::int64_t e) { pass2_items(w, b, e); }
#if LV_Q8_CLONES
__attribute__((target("avx2"))) void pass1_avx2(const Work& w, std::int64_t b, std::int64_t e) {
  pass1_items(w, b, e);
}
__attribute__((target("avx2"))) void pass2_avx2(const Work& w, std::int64_t b, std::int64_t e) {
  pass2_items(w, b, e);
}
__attribute__((target(LV_AVX512_TARGET))) void pass1_avx512(const Work& w, std::int64_t b, std::int64_t e) {
  pass1_items(w, b, e);
}
__attribute__((target(LV_AVX512_TARGET))) void pass2_avx512(const Work& w, std::int64_t b, std::int64_t e) {
  pass2_items(w, b, e);
}
#endif

// bracket_many / encode_block_at's loops at each width (the passes inline the same functions).
LV_TILE_INLINE void bracket_loop(bool m, const float* __restrict y, std::int64_t n, std::int32_t* __restrict lo) {
  if (m) {
    for (std::int64_t i = 0; i < n; ++i) lo[i] = quant::bracket_m(y[i]);
  } else {
    for (std::int64_t i = 0; i < n; ++i) lo[i] = quant::bracket_v(y[i]);
  }
}
LV_TILE_INLINE void encode_one_block(bool m, float scale, const float* x, int n, const std::uint16_t* words,
                                     std::uint8_t* codes) {
  if (m) {
    quant::encode_block<true>(scale, x, n, words, codes);
  } else {
    quant::encode_block<false>(scale, x, n, words, codes);
  }
}
void bracket_baseline(bool m, const float* y, std::int64_t n, std::int32_t* lo) { bracket_loop(m, y, n, lo); }
void encode_baseline(bool m, float s, const float* x, int n, const std::uint16_t* w, std::uint8_t* c) {
  encode_one_block(m, s, x, n, w, c);
}
#if LV_Q8_CLONES
__attribute__((target("avx2"))) void bracket_avx2(bool m, const float* y, std::int64_t n, std::int32_t* lo) {
  bracket_loop(m, y, n, lo);
}
__attribute__((target("avx2"))) void encode_avx2(bool m, float s, const float* x, int n, const std::uint16_t* w,
                                                 std::uint8_t* c) {
  encode_one_block(m, s, x, n, w, c);
}
__attribute__((target(LV_AVX512_TARGET))) void bracket_avx512(bool m, const float* y, std::int64_t n,
                                                              std::int32_t* lo) {
  bracket_loop(m, y, n, lo);
}
__attribute__((target(LV_AVX512_TARGET))) void encode_avx512(bool m, float s, const float* x, int n,
                                                             const std::uint16_t* w, std::uint8_t* c) {
  encode_one_block(m, s, x, n, w, c);
}
#endif

using ItemsFn = void (*)(const Work&, std::int64_t, std::int64_t);

ItemsFn pick(bool pass1, CpuIsa isa) {
#if LV_Q8_CLONES
  switch (isa) {
    case CpuIsa::kAvx512: return pass1 ? pass1_avx512 : pass2_avx512;
    case CpuIsa::kAvx2: return pass1 ? pass1_avx2 : pass2_avx2;
    case CpuIsa::kBaseline: break;
  }
#else
  (void)isa;
#endif
  return pass1 ? pass1_baseline : pass2_baseline;
}

Work make_work(const GroupConfig& cfg, const TensorRow* rows, const std::vector<std::int64_t>& starts,
               const TensorConsts* consts, CpuIsa isa) {
  Work w{};
  w.cfg = &cfg;
  w.rows = rows;
  w.starts = starts.data();
  w.consts = consts;
  w.words = random_words_fn(isa);
  return w;
}

}  // namespace

void bracket_many(CpuIsa isa, bool m, const float* y, std::int64_t n, std::int32_t* lo) {
#if LV_Q8_CLONES
  if (isa == CpuIsa::kAvx512) return bracket_avx512(m, y, n, lo);
  if (isa == CpuIsa::kAvx2) return bracket_avx2(m, y, n, lo);
#else
  (void)isa;
#endif
  bracket_baseline(m, y, n, lo);
}

void encode_block_at(CpuIsa isa, bool m, float scale, const float* x, int n, const std::uint16_t* words,
                     std::uint8_t* codes) {
#if LV_Q8_CLONES
  if (isa == CpuIsa::kAvx512) return encode_avx512(m, scale, x, n, words, codes);
  if (isa == CpuIsa::kAvx2) return encode_avx2(m, scale, x, n, words, codes);
#else
  (void)isa;
#endif
  encode_baseline(m, scale, x, n, words, codes);
}

void pass1(const GroupConfig& cfg, const TensorRow* rows, std::size_t n, const TensorConsts* consts, float* stats,
           std::int32_t* found_inf, ThreadPool& pool, CpuIsa isa) {
  const auto run = pick(true, isa);
  const std::vector<std::int64_t> starts = item_starts(rows, n);
  const std::int64_t items = starts[n];
  std::vector<float> partial(static_cast<std::size_t>(items), 0.0f);
  std::vector<std::uint8_t> bad(static_cast<std::size_t>(items), 0);
  Work w = make_work(cfg, rows, starts, consts, isa);
  w.partial = partial.data();
  w.bad = bad.data();
  w.need_sum = cfg.hyper.clip > 0;
  pool.parallel_for(items, [&](std::int64_t begin, std::int64_t end) {
    Work mine = w;
    mine.first_row = first_row(starts, begin);
    run(mine, begin, end);
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

void pass2(const GroupConfig& cfg, const TensorRow* rows, std::size_t n, const TensorConsts* consts, const float* taus,
           float lr, ThreadPool& pool, CpuIsa isa) {
  const auto run = pick(false, isa);
  const std::vector<std::int64_t> starts = item_starts(rows, n);
  Work w = make_work(cfg, rows, starts, consts, isa);
  w.taus = taus;
  w.lr = lr;
  pool.parallel_for(starts[n], [&](std::int64_t begin, std::int64_t end) {
    Work mine = w;
    mine.first_row = first_row(starts, begin);
    run(mine, begin, end);
  });
}

}  // namespace q8
}  // namespace cpu
}  // namespace luminav
