// src/engine/cpu_kernels.h: the CPU engine's passes over a launch group, its random streams and
// storage conversions (docs/tdclm.md, docs/internals.md)
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>

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

// Pass 1 over a group: stats[j] = S_j (float32), *found_inf = 1 where a gradient element is
// not finite (never lowered). Reads host memory only.
void pass1(const GroupConfig& cfg, const TensorRow* rows, std::size_t n, float* stats,
           std::int32_t* found_inf, ThreadPool& pool);
// Pass 2 (the update). With cfg.check_flag() and *found_inf != 0 it touches nothing.
// stats may be null when clip == 0.
void pass2(const GroupConfig& cfg, const TensorRow* rows, std::size_t n, float lr,
           const float* stats, const std::int32_t* found_inf, ThreadPool& pool);
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
