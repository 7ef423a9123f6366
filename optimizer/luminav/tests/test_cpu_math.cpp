// tests/test_cpu_math.cpp: the CPU engine's soft-clip tanh and its vector-width choice
// (src/engine/cpu_kernels.cpp)
#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <string>

#include "engine/cpu_kernels.h"

namespace cpu = luminav::cpu;

namespace {
std::uint32_t bits(float x) {
  std::uint32_t u;
  std::memcpy(&u, &x, 4);
  return u;
}
float from_bits(std::uint32_t u) {
  float x;
  std::memcpy(&x, &u, 4);
  return x;
}
// tanh in long double (64-bit mantissa on x86-64; float64 elsewhere), rounded once to float32.
float tanh_rounded(float x) { return static_cast<float>(std::tanh(static_cast<long double>(x))); }
}  // namespace

// Every sampled float32 from 2^-30 to 12 (both signs, one in 61): tanh_float is tanh rounded once.
TEST(CpuMath, TanhIsCorrectlyRounded) {
  long mismatches = 0, n = 0;
  for (std::uint32_t u = 0x30800000u; u < 0x41400000u; u += 61) {
    for (const float x : {from_bits(u), -from_bits(u)}) {
      ++n;
      if (bits(cpu::tanh_float(x)) != bits(tanh_rounded(x))) {
        if (++mismatches <= 5) ADD_FAILURE() << "tanh_float(" << x << ") differs from tanh rounded once";
      }
    }
  }
  EXPECT_EQ(mismatches, 0) << "of " << n;
  EXPECT_GT(n, 9000000);
}

TEST(CpuMath, TanhEdgeValues) {
  EXPECT_EQ(bits(cpu::tanh_float(0.0f)), bits(0.0f));
  EXPECT_EQ(bits(cpu::tanh_float(-0.0f)), bits(-0.0f));
  EXPECT_EQ(cpu::tanh_float(INFINITY), 1.0f);
  EXPECT_EQ(cpu::tanh_float(-INFINITY), -1.0f);
  EXPECT_TRUE(std::isnan(cpu::tanh_float(NAN)));
  EXPECT_TRUE(std::isnan(cpu::tanh_float(-NAN)));
  EXPECT_EQ(cpu::tanh_float(from_bits(1)), from_bits(1));  // the least subnormal
  EXPECT_EQ(cpu::tanh_float(3e38f), 1.0f);
  EXPECT_EQ(cpu::tanh_float(10.0f), 1.0f);
  EXPECT_EQ(cpu::tanh_float(9.0f), tanh_rounded(9.0f));  // just below 1
  EXPECT_LT(cpu::tanh_float(9.0f), 1.0f);
}

// The names LUMINAV_CPU_ISA takes, and the chosen width's name is one of them.
TEST(CpuMath, IsaNames) {
  EXPECT_EQ(cpu::cpu_isa_name(cpu::CpuIsa::kBaseline), "baseline");
  EXPECT_EQ(cpu::cpu_isa_name(cpu::CpuIsa::kAvx2), "avx2");
  EXPECT_EQ(cpu::cpu_isa_name(cpu::CpuIsa::kAvx512), "avx512");
  const char* env = std::getenv("LUMINAV_CPU_ISA");
  if (env && *env) GTEST_SKIP() << "LUMINAV_CPU_ISA is set";
  const std::string name = cpu::cpu_isa_name(cpu::cpu_isa());
  EXPECT_TRUE(name == "baseline" || name == "avx2" || name == "avx512") << name;
}
