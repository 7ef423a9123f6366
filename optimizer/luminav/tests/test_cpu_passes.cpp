// tests/test_cpu_passes.cpp: the CPU passes' direction cache and soft-clip fast path
// (src/engine/cpu_kernels.cpp): the same bits as recomputing, all-or-nothing on a refused step
#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
#include <random>
#include <vector>

#include "engine/cpu_kernels.h"
#include "engine/engine.h"
#include "engine/thread_pool.h"

namespace cpu = luminav::cpu;
using luminav::DType;
using luminav::GroupConfig;
using luminav::NonFinite;
using luminav::TensorRow;

namespace {

std::uint16_t to_bf16(float x) {
  std::uint32_t u;
  std::memcpy(&u, &x, 4);
  return static_cast<std::uint16_t>(u >> 16);
}

// One group's tensors in host memory, in its storage dtypes.
struct Group {
  GroupConfig cfg;
  std::vector<std::int64_t> numels;
  std::vector<std::vector<unsigned char>> p, g, m, v;
  std::vector<std::int64_t> steps;

  Group(const GroupConfig& c, const std::vector<std::int64_t>& sizes, unsigned seed) : cfg(c), numels(sizes) {
    std::mt19937 rng(seed);
    std::normal_distribution<float> normal;
    for (std::int64_t n : numels) {
      p.emplace_back(bytes(cfg.param_dtype, n));
      g.emplace_back(bytes(cfg.grad_dtype, n));
      m.emplace_back(bytes(cfg.state_dtype, n), 0);
      v.emplace_back(bytes(cfg.state_dtype, n), 0);
      for (std::int64_t i = 0; i < n; ++i) put(cfg.param_dtype, p.back(), i, normal(rng));
      steps.push_back(0);
    }
    new_grads(seed + 1);
  }
  static std::size_t bytes(DType d, std::int64_t n) {
    return static_cast<std::size_t>(n) * (d == DType::kFloat32 ? 4 : 2);
  }
  static void put(DType d, std::vector<unsigned char>& buf, std::int64_t i, float x) {
    if (d == DType::kFloat32) {
      std::memcpy(buf.data() + 4 * i, &x, 4);
    } else {
      const std::uint16_t h = to_bf16(x);
      std::memcpy(buf.data() + 2 * i, &h, 2);
    }
  }
  // Gradients of mixed scale (a few elements 100x the rest), so that after a few steps |u| / tau
  // falls on both sides of tanh's 0.625 branch point, in chunks that mix the two.
  void new_grads(unsigned seed) {
    std::mt19937 rng(seed);
    std::normal_distribution<float> normal;
    std::uniform_int_distribution<int> pick(0, 40);
    for (std::size_t j = 0; j < numels.size(); ++j)
      for (std::int64_t i = 0; i < numels[j]; ++i)
        put(cfg.grad_dtype, g[j], i, normal(rng) * (pick(rng) == 0 ? 1e-1f : 1e-3f));
  }
  std::vector<TensorRow> rows() {
    std::vector<TensorRow> r(numels.size());
    for (std::size_t j = 0; j < numels.size(); ++j) {
      r[j].param = p[j].data();
      r[j].grad = g[j].data();
      r[j].exp_avg = m[j].data();
      r[j].exp_avg_sq = v[j].data();
      r[j].step = &steps[j];
      r[j].numel = numels[j];
      r[j].param_index = static_cast<std::int64_t>(j);
      r[j].global_numel = numels[j];
    }
    return r;
  }
  // One step as the CPU device runs it; returns found_inf.
  std::int32_t step(cpu::ThreadPool& pool, cpu::DirectionCache* cache, float lr = 1e-2f) {
    std::vector<TensorRow> r = rows();
    std::vector<float> stats(r.size(), 0.0f);
    std::int32_t found_inf = 0;
    if (cfg.needs_pass1()) cpu::pass1(cfg, r.data(), r.size(), stats.data(), &found_inf, pool, cache);
    cpu::pass2(cfg, r.data(), r.size(), lr, stats.data(), &found_inf, pool, cache);
    cpu::commit(cfg, r.data(), r.size(), &found_inf);
    return found_inf;
  }
  bool same_state(const Group& o) const { return p == o.p && m == o.m && v == o.v && steps == o.steps; }
};

GroupConfig config(DType param, DType state, bool sr, NonFinite nonfinite = NonFinite::kSkip) {
  GroupConfig c;
  c.param_dtype = c.grad_dtype = param;
  c.state_dtype = state;
  c.hyper.state_dtype = state;
  c.hyper.stochastic_rounding = sr;
  c.hyper.nonfinite = nonfinite;
  c.hyper.clip = 1.0;  // tau = RMS(u): many |u| / tau above 0.625
  c.seed = 12345;
  return c;
}

const std::vector<std::int64_t> kSizes = {1, 7, 16, 17, 300, 2048, 2049, 5000, 70001};

}  // namespace

TEST(CpuPasses, DirectionCacheGivesTheBitsOfRecomputing) {
  auto pool = cpu::make_thread_pool(2);
  for (const GroupConfig& cfg : {config(DType::kFloat32, DType::kFloat32, false),
                                 config(DType::kBFloat16, DType::kBFloat16, true),
                                 config(DType::kBFloat16, DType::kFloat32, true),
                                 config(DType::kFloat32, DType::kBFloat16, false),
                                 config(DType::kFloat32, DType::kBFloat16, true),
                                 config(DType::kBFloat16, DType::kBFloat16, true, NonFinite::kPropagate)}) {
    Group cached(cfg, kSizes, 3), plain(cfg, kSizes, 3);
    cpu::DirectionCache cache;
    for (int step = 1; step <= 6; ++step) {
      cached.new_grads(100 + step);
      plain.new_grads(100 + step);
      EXPECT_EQ(cached.step(*pool, &cache), 0);
      EXPECT_FALSE(cache.ready) << "pass 2 uses the cache once";
      EXPECT_EQ(plain.step(*pool, nullptr), 0);
      ASSERT_TRUE(cached.same_state(plain)) << "step " << step;
    }
    EXPECT_FALSE(cache.u.empty());
    // with bf16 moments pass 1 keeps m' and v' too, and pass 2 copies them
    EXPECT_EQ(cache.m.size(), cfg.state_dtype == DType::kBFloat16 ? cache.u.size() : 0u);
    EXPECT_EQ(cache.v.size(), cache.m.size());
  }
}

TEST(CpuPasses, KeptMomentsGiveTheBitsOfRecomputingWithNonFiniteGradients) {
  // nonfinite "propagate" with bf16 moments: a NaN and an inf gradient element make m', v' (and
  // tau) non-finite; the kept bits are the ones pass 2 would store
  auto pool = cpu::make_thread_pool(2);
  const GroupConfig cfg = config(DType::kBFloat16, DType::kBFloat16, true, NonFinite::kPropagate);
  Group cached(cfg, kSizes, 5), plain(cfg, kSizes, 5);
  cpu::DirectionCache cache;
  for (int step = 1; step <= 3; ++step) {
    for (Group* grp : {&cached, &plain}) {
      grp->new_grads(200 + step);
      Group::put(cfg.grad_dtype, grp->g[4], 3, std::numeric_limits<float>::quiet_NaN());
      Group::put(cfg.grad_dtype, grp->g[8], 70000, -std::numeric_limits<float>::infinity());
    }
    cached.step(*pool, &cache);
    plain.step(*pool, nullptr);
    ASSERT_TRUE(cached.same_state(plain)) << "step " << step;
  }
  EXPECT_FALSE(cache.m.empty());
}

TEST(CpuPasses, ClipFastPathMatchesTanhOnEveryElement) {
  // Pass 2's soft clip against tanh_float element by element (float32, one step from chosen
  // moments, so u is known): chunks of 16 wholly below tanh's branch point and chunks that mix
  // both sides, with and without the cache.
  auto pool = cpu::make_thread_pool(2);
  GroupConfig cfg = config(DType::kFloat32, DType::kFloat32, false, NonFinite::kPropagate);
  cfg.hyper.weight_decay = 0.0;
  const int n = 4099;
  for (bool with_cache : {false, true}) {
    Group grp(cfg, {n}, 9);
    std::vector<float> p0(n);
    std::memcpy(p0.data(), grp.p[0].data(), 4 * p0.size());
    float* g = reinterpret_cast<float*>(grp.g[0].data());
    float* m = reinterpret_cast<float*>(grp.m[0].data());
    float* v = reinterpret_cast<float*>(grp.v[0].data());
    std::mt19937 rng(6);
    std::uniform_real_distribution<float> uni(-1.0f, 1.0f);
    for (int i = 0; i < n; ++i) {
      g[i] = 1e-3f * uni(rng);
      m[i] = (i / 16) % 3 == 0 ? 0.05f * uni(rng) : 4.0f * uni(rng);
      v[i] = 1.0f;
    }
    // u as step 4 computes it at t = 1
    const float b1 = 0.9f, b2 = 0.999f, eps = 1e-8f;
    const float rbc1 = 1.0f / cpu::bias_correction(b1, 1), rbc2 = 1.0f / cpu::bias_correction(b2, 1);
    std::vector<float> u(n);
    for (int i = 0; i < n; ++i) {
      const float mi = b1 * m[i] + (1.0f - b1) * g[i];
      const float vi = b2 * v[i] + (1.0f - b2) * (g[i] * g[i]);
      u[i] = (mi * rbc1) / (std::sqrt(vi * rbc2) + eps);
    }
    cpu::DirectionCache cache;
    std::vector<TensorRow> r = grp.rows();
    std::vector<float> stats(1);
    std::int32_t found_inf = 0;
    const float lr = 1e-2f;
    cpu::pass1(cfg, r.data(), 1, stats.data(), &found_inf, *pool, with_cache ? &cache : nullptr);
    EXPECT_EQ(cache.ready, with_cache);
    const float tau = 1.0f * std::sqrt(stats[0] / static_cast<float>(n));
    cpu::pass2(cfg, r.data(), 1, lr, stats.data(), &found_inf, *pool, with_cache ? &cache : nullptr);
    const float decay = 1.0f - lr * 0.0f;
    int small = 0, large = 0;
    const float* p = reinterpret_cast<const float*>(grp.p[0].data());
    for (int i = 0; i < n; ++i) {
      const float x = u[i] * (1.0f / tau);
      (std::fabs(x) < 0.625f ? small : large)++;
      const float want = p0[i] * decay - lr * (tau * cpu::tanh_float(x));
      std::uint32_t a, b;
      std::memcpy(&a, &p[i], 4);
      std::memcpy(&b, &want, 4);
      ASSERT_EQ(a, b) << "element " << i << " x " << x;
    }
    EXPECT_GT(small, 1500);
    EXPECT_GT(large, 1000);
  }
  // a NaN gradient with nonfinite "propagate": tau is NaN and so is every weight
  for (bool with_cache : {false, true}) {
    Group grp(cfg, {n}, 9);
    reinterpret_cast<float*>(grp.g[0].data())[4000] = std::numeric_limits<float>::quiet_NaN();
    cpu::DirectionCache cache;
    grp.step(*pool, with_cache ? &cache : nullptr);
    const float* p = reinterpret_cast<const float*>(grp.p[0].data());
    for (int i = 0; i < n; ++i) ASSERT_TRUE(std::isnan(p[i])) << i;
  }
}

TEST(CpuPasses, RefusedStepWritesNothingAndDropsTheCache) {
  auto pool = cpu::make_thread_pool(2);
  const GroupConfig cfg = config(DType::kBFloat16, DType::kBFloat16, true);
  Group grp(cfg, kSizes, 4), ref(cfg, kSizes, 4);
  cpu::DirectionCache cache;
  grp.step(*pool, &cache);
  ref.step(*pool, nullptr);
  const Group before = grp;
  // a non-finite gradient: pass 1 fills the cache and flags the step, pass 2 writes nothing
  const std::uint16_t inf = 0x7F80;
  std::memcpy(grp.g[5].data() + 2 * 77, &inf, 2);
  std::vector<TensorRow> r = grp.rows();
  std::vector<float> stats(r.size());
  std::int32_t found_inf = 0;
  cpu::pass1(cfg, r.data(), r.size(), stats.data(), &found_inf, *pool, &cache);
  EXPECT_EQ(found_inf, 1);
  EXPECT_TRUE(cache.ready);
  cpu::pass2(cfg, r.data(), r.size(), 1e-2f, stats.data(), &found_inf, *pool, &cache);
  cpu::commit(cfg, r.data(), r.size(), &found_inf);
  EXPECT_FALSE(cache.ready);
  EXPECT_TRUE(grp.same_state(before));
  // the next step, with fresh gradients, as from a state that never saw the refused one
  grp.new_grads(55);
  ref.new_grads(55);
  grp.step(*pool, &cache);
  ref.step(*pool, nullptr);
  EXPECT_TRUE(grp.same_state(ref));
}

TEST(CpuPasses, Pass2RecomputesForRowsPass1DidNotSee) {
  auto pool = cpu::make_thread_pool(2);
  const GroupConfig cfg = config(DType::kFloat32, DType::kFloat32, false);
  Group grp(cfg, kSizes, 8), ref(cfg, kSizes, 8);
  cpu::DirectionCache cache;
  std::vector<TensorRow> r = grp.rows(), rr = ref.rows();
  std::vector<float> stats(r.size()), rstats(r.size());
  std::int32_t found_inf = 0;
  cpu::pass1(cfg, r.data(), r.size(), stats.data(), &found_inf, *pool, &cache);
  cpu::pass1(cfg, rr.data(), rr.size(), rstats.data(), &found_inf, *pool, nullptr);
  ASSERT_TRUE(cache.ready);
  // new gradients at new addresses between the passes: pass 2 must not use pass 1's u
  std::vector<std::vector<unsigned char>> other = grp.g;
  Group fresh(cfg, kSizes, 99);
  for (std::size_t j = 0; j < r.size(); ++j) {
    other[j] = fresh.g[j];
    r[j].grad = other[j].data();
    std::memcpy(ref.g[j].data(), other[j].data(), other[j].size());
  }
  cpu::pass2(cfg, r.data(), r.size(), 1e-2f, stats.data(), &found_inf, *pool, &cache);
  cpu::pass2(cfg, rr.data(), rr.size(), 1e-2f, stats.data(), &found_inf, *pool, nullptr);
  EXPECT_FALSE(cache.ready);
  EXPECT_TRUE(grp.p == ref.p && grp.m == ref.m && grp.v == ref.v);
}

TEST(CpuPasses, NoCacheBeyondItsCapOrWithoutClip) {
  auto pool = cpu::make_thread_pool(2);
  GroupConfig cfg = config(DType::kBFloat16, DType::kBFloat16, false);
  const std::int64_t over = static_cast<std::int64_t>(cpu::kDirectionCacheBytes / sizeof(float)) + 1;
  {
    Group grp(cfg, {over / 2, over - over / 2}, 1);
    cpu::DirectionCache cache;
    std::vector<TensorRow> r = grp.rows();
    std::vector<float> stats(r.size());
    std::int32_t found_inf = 0;
    cpu::pass1(cfg, r.data(), r.size(), stats.data(), &found_inf, *pool, &cache);
    EXPECT_FALSE(cache.ready);
    EXPECT_TRUE(cache.u.empty());
  }
  cfg.hyper.clip = 0.0;  // pass 1 only checks the gradients
  Group grp(cfg, kSizes, 1);
  cpu::DirectionCache cache;
  std::vector<TensorRow> r = grp.rows();
  std::vector<float> stats(r.size());
  std::int32_t found_inf = 0;
  cpu::pass1(cfg, r.data(), r.size(), stats.data(), &found_inf, *pool, &cache);
  EXPECT_FALSE(cache.ready);
}
