// src/engine/cpu_kernels.h: the CPU engine's passes over a launch group, its random streams and
// storage conversions (docs/tdclm.md, docs/internals.md)
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

#include "engine/engine.h"

namespace luminav {

// Host-side engine numerics shared by every CPU entry point.
namespace cpu {

class ThreadPool;  // engine/thread_pool.h

// Elements per work item and per pass-1 partial sum. Fixed: S does not depend on threads.
constexpr std::int64_t kChunk = 2048;

// Vector width of the passes' loops: the widest this CPU has, or LUMINAV_CPU_ISA ("baseline",
// "avx2", "avx512"; Error kInvalidArgument naming the value when it is not one or this CPU lacks
// it). Every width gives the same bits.
enum class CpuIsa : int { kBaseline = 0, kAvx2 = 1, kAvx512 = 2 };
CpuIsa cpu_isa();
std::string cpu_isa_name(CpuIsa isa);

// Pass 1's directions u, kept for pass 2 of the same step so it need not recompute them (the
// square root and division of step 4): float32, one per element of the group, filled by a pass 1
// with clip > 0 whose group has at most kDirectionCacheBytes of them. With bfloat16 moments pass
// 1 also keeps m' and v' as stored (their bf16 bits, rounded with streams 1 and 2), and pass 2
// writes those instead of computing the moments again (no gradient read, no Philox calls for
// streams 1 and 2). Pass 2 takes them only for the very rows pass 1 saw (addresses, sizes and
// step counters unchanged), once; otherwise, and without a cache, it recomputes u and the
// moments, which gives the same bits. Owned by whoever runs the passes (one per group); nothing
// else reads it, so a step that pass 1 refuses writes only it.
constexpr std::size_t kDirectionCacheBytes = std::size_t{8} << 20;
struct DirectionCache {
  std::vector<float> u;
  std::vector<std::uint16_t> m, v;  // bf16 moments only: m', v' as stored, as u is laid out
  std::vector<std::int64_t> base;  // row j's elements start at u[base[j]]
  std::vector<std::int64_t> key;   // the rows pass 1 saw
  bool ready = false;              // u holds pass 1's of this step, not yet used
};

// Pass 1 over a group: stats[j] = S_j (float32), *found_inf = 1 where a gradient element is
// not finite (never lowered). Reads host memory only (and writes `cache` when given).
void pass1(const GroupConfig& cfg, const TensorRow* rows, std::size_t n, float* stats,
           std::int32_t* found_inf, ThreadPool& pool, DirectionCache* cache = nullptr);
// Pass 2 (the update). With cfg.check_flag() and *found_inf != 0 it touches nothing (but marks
// `cache` used). stats may be null when clip == 0.
void pass2(const GroupConfig& cfg, const TensorRow* rows, std::size_t n, float lr,
           const float* stats, const std::int32_t* found_inf, ThreadPool& pool,
           DirectionCache* cache = nullptr);
// Step counters += 1 - found_inf (check_flag) or += 1.
void commit(const GroupConfig& cfg, const TensorRow* rows, std::size_t n,
            const std::int32_t* found_inf);
// Index (into rows) of the first tensor with a non-finite gradient element, or -1.
std::int64_t first_nonfinite(const GroupConfig& cfg, const TensorRow* rows, std::size_t n,
                             ThreadPool& pool);

// The random streams (docs/tdclm.md "Random streams").
std::uint64_t splitmix64(std::uint64_t z) noexcept;
std::uint64_t stream_key(std::uint64_t seed, std::int64_t t, std::int64_t k) noexcept;
void philox4x32_10(std::uint32_t key0, std::uint32_t key1, const std::uint32_t ctr[4],
                   std::uint32_t out[4]) noexcept;
// R16(i, stream) for elements [first, first + count) of a tensor (rounding stream format 2:
// half i & 1 of word (i >> 1) & 3 of Philox(j = i >> 3)), values below 2^16.
void random_words(std::uint64_t key, std::int64_t first, std::int64_t count, std::uint32_t stream,
                  std::uint32_t* out) noexcept;

// Storage conversions (bit-exact, round to nearest even unless stochastic).
float bf16_to_float(std::uint16_t h) noexcept;
std::uint16_t float_to_bf16_rne(float x) noexcept;
std::uint16_t float_to_bf16_sr(float x, std::uint32_t r) noexcept;
float f16_to_float(std::uint16_t h) noexcept;
std::uint16_t float_to_f16_rne(float x) noexcept;

// The passes' soft-clip tanh: float32, within one ulp of tanh (see cpu_kernels.cpp).
float tanh_float(float x) noexcept;

// Bias correction as internals.md: float32(1 - float64(beta_f)^t), binary exponentiation.
float bias_correction(float beta_f, std::int64_t t) noexcept;

}  // namespace cpu

}  // namespace luminav
