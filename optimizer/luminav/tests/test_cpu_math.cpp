// tests/test_cpu_math.cpp: the CPU engine's soft-clip tanh and its vector-width choice
// (src/engine/cpu_kernels.cpp)
#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <string>

#include "engine/cpu_kernels.h"
#include "float_bits.h"

namespace cpu = luminav::cpu;

using luminav_test::bits;
using luminav_test::from_bits;

namespace {
// tanh in long double (64-bit mantissa on x86-64; float64 elsewhere), rounded once to float32.
float tanh_rounded(float x) { return static_cast<float>(std::tanh(static_cast<long double>(x))); }
}  // namespace

// Every sampled float32 from 2^-30 to 12 (both signs, one in 61): tanh_float is within one ulp of
// tanh rounded once, odd, and the correctly rounded value for all but a few percent.
TEST(CpuMath, TanhIsWithinOneUlp) {
  long exact = 0, n = 0, far = 0;
  for (std::uint32_t u = 0x30800000u; u < 0x41400000u; u += 61) {
    const float x = from_bits(u);
    const float t = cpu::tanh_float(x);
    ASSERT_EQ(bits(cpu::tanh_float(-x)), bits(-t)) << x;
    const std::uint32_t a = bits(t), b = bits(tanh_rounded(x));
    const std::uint32_t ulps = a > b ? a - b : b - a;
    ++n;
    exact += ulps == 0;
    if (ulps > 1 && ++far <= 5) ADD_FAILURE() << "tanh_float(" << x << ") is " << ulps << " ulps off";
  }
  EXPECT_EQ(far, 0) << "of " << n;
  EXPECT_GT(n, 4500000);
  EXPECT_GT(static_cast<double>(exact) / static_cast<double>(n), 0.98);
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
  EXPECT_EQ(cpu::tanh_float(1e-30f), 1e-30f);
  for (const float x : {0.6249f, 0.625f, 0.6251f})  // where the two formulas meet
    EXPECT_LE(std::abs(static_cast<double>(cpu::tanh_float(x)) - std::tanh(static_cast<double>(x))),
              std::ldexp(1.0, -24)) << x;
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
