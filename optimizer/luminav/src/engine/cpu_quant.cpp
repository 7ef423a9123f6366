// src/engine/cpu_quant.cpp: the q8 codebooks' formulas (docs/tdclm.md "Quantized moments (q8)",
// Python's kernels/quant.py power_3_signed_f32 / power_4_unsigned_f32), computed in float32
#include "engine/cpu_quant.h"

#include <array>

namespace luminav {
namespace cpu {
namespace quant {

namespace {

// Kept out of constant folding's reach: the quotients are IEEE float32 divisions at run time too
// (the file is compiled with -ffp-contract=off, so no product below is fused with another).
float divide(float a, float b) noexcept {
  volatile float x = a;
  return x / b;
}

std::array<float, 256> make_table(float (*entry)(int)) noexcept {
  std::array<float, 256> t{};
  for (int c = 0; c < 256; ++c) t[static_cast<std::size_t>(c)] = entry(c);
  return t;
}

}  // namespace

float inv127() noexcept {
  static const float v = divide(1.0f, 127.0f);
  return v;
}

float inv255() noexcept {
  static const float v = divide(1.0f, 255.0f);
  return v;
}

float codebook_m(int c) noexcept {
  if (c == 128) return 0.0f;
  if (c < 128) {
    const float t = static_cast<float>(128 - c) * 0x1.0p-7f;  // exact
    const float square = t * t;
    return -(square * t);
  }
  const float t = static_cast<float>(c - 128) * inv127();
  const float square = t * t;
  return square * t;
}

float codebook_v(int c) noexcept {
  const float t = static_cast<float>(c) * inv255();
  const float s = t * t;
  return s * s;
}

const float* codebook_m_table() noexcept {
  static const std::array<float, 256> table = make_table(codebook_m);
  return table.data();
}

const float* codebook_v_table() noexcept {
  static const std::array<float, 256> table = make_table(codebook_v);
  return table.data();
}

}  // namespace quant
}  // namespace cpu
}  // namespace luminav
