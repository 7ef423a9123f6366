// tests/float_bits.h: a float32's bit pattern and back, for the CPU numerics tests
#pragma once

#include <cstdint>
#include <cstring>

namespace luminav_test {
inline std::uint32_t bits(float x) {
  std::uint32_t u;
  std::memcpy(&u, &x, 4);
  return u;
}
inline float from_bits(std::uint32_t u) {
  float x;
  std::memcpy(&x, &u, 4);
  return x;
}
}  // namespace luminav_test
