// src/engine/cpu_numerics.cpp: the random streams, storage conversions, tanh and bias correction
// of the CPU engine as functions (cpu_kernels.h), for the engine's callers and tests; the tile
// loops use the inline forms of cpu_numerics.h.
#include "engine/cpu_kernels.h"
#include "engine/cpu_numerics.h"

namespace luminav {
namespace cpu {

using namespace numerics;

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
  random_words_impl(key, first, count, stream, out);
}

// --------------------------------------------------------------------------------- conversions

float bf16_to_float(std::uint16_t h) noexcept { return u2f(static_cast<std::uint32_t>(h) << 16); }
std::uint16_t float_to_bf16_rne(float x) noexcept { return bf16_rne(x); }
std::uint16_t float_to_bf16_sr(float x, std::uint32_t r) noexcept { return bf16_sr(x, r); }
float f16_to_float(std::uint16_t h) noexcept { return f16_to_f32(h); }
std::uint16_t float_to_f16_rne(float x) noexcept { return f32_to_f16(x); }
float tanh_float(float x) noexcept { return tanh_f32(x); }

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

}  // namespace cpu
}  // namespace luminav
