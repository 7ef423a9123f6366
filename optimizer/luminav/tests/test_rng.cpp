// tests/test_rng.cpp: the CPU engine's random streams and storage conversions
// (src/engine/cpu_kernels.cpp, docs/tdclm.md)
#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <cstring>
#include <random>
#include <vector>

#include "engine/cpu_kernels.h"
#include "float_bits.h"
#include "engine/engine.h"

namespace cpu = luminav::cpu;

using luminav_test::bits;
using luminav_test::from_bits;


class RngTest : public ::testing::Test {};

// Known-answer vectors of Random123 (kat_vectors, philox4x32 10 rounds).
TEST_F(RngTest, Philox4x32_10MatchesRandom123KnownAnswers) {
  struct Kat {
    std::uint32_t key[2], ctr[4], out[4];
  };
  const Kat kats[] = {
      {{0, 0}, {0, 0, 0, 0}, {0x6627e8d5, 0xe169c58d, 0xbc57ac4c, 0x9b00dbd8}},
      {{0xffffffff, 0xffffffff}, {0xffffffff, 0xffffffff, 0xffffffff, 0xffffffff},
       {0x408f276d, 0x41c83b0e, 0xa20bc7c6, 0x6d5451fd}},
      {{0xa4093822, 0x299f31d0}, {0x243f6a88, 0x85a308d3, 0x13198a2e, 0x03707344},
       {0xd16cfe09, 0x94fdcceb, 0x5001e420, 0x24126ea1}},
  };
  for (const Kat& k : kats) {
    std::uint32_t out[4];
    cpu::philox4x32_10(k.key[0], k.key[1], k.ctr, out);
    for (int i = 0; i < 4; ++i) EXPECT_EQ(out[i], k.out[i]) << "word " << i;
  }
}

TEST_F(RngTest, Splitmix64KnownValues) {
  // Checked against an independent Python implementation of the spec's definition.
  EXPECT_EQ(cpu::splitmix64(0), 0xe220a8397b1dcdafull);
  EXPECT_EQ(cpu::splitmix64(1), 0x910a2dec89025cc1ull);
  EXPECT_EQ(cpu::stream_key(5, 3, 7), 0x4fdd0195376e4451ull);  // splitmix64(splitmix64(5 + 3) + 7)
}

TEST_F(RngTest, StreamKeyWrapsAndComposes) {
  const std::uint64_t seed = 0xFFFFFFFFFFFFFFFFull;  // seed + t wraps around 2^64
  EXPECT_EQ(cpu::stream_key(seed, 2, 9), cpu::splitmix64(cpu::splitmix64(1) + 9));
  EXPECT_NE(cpu::stream_key(1, 1, 0), cpu::stream_key(1, 1, 1));
  EXPECT_NE(cpu::stream_key(1, 1, 0), cpu::stream_key(1, 2, 0));
}

TEST_F(RngTest, RandomWordsAreTheHalfWordsOfPhiloxAtTheGroupCounter) {
  // Format 2: index i takes half i & 1 of word (i >> 1) & 3 of Philox at j = i >> 3; runs that
  // start and end inside a group, and groups past 2^32, as a shard's offset puts them.
  const std::uint64_t key = 0x0123456789ABCDEFull;
  for (std::int64_t first : {std::int64_t(0), std::int64_t(5), std::int64_t(4294967290LL),
                             (std::int64_t(1) << 40) + 3}) {
    for (std::int64_t count : {std::int64_t(1), std::int64_t(7), std::int64_t(37)}) {
      for (std::uint32_t stream : {0u, 1u, 2u}) {
        std::vector<std::uint32_t> words(static_cast<std::size_t>(count));
        cpu::random_words(key, first, count, stream, words.data());
        for (std::int64_t k = 0; k < count; ++k) {
          const std::uint64_t i = static_cast<std::uint64_t>(first + k);
          const std::uint64_t j = i >> 3;
          const std::uint32_t ctr[4] = {static_cast<std::uint32_t>(j),
                                        static_cast<std::uint32_t>(j >> 32), stream, 0};
          std::uint32_t out[4];
          cpu::philox4x32_10(static_cast<std::uint32_t>(key), static_cast<std::uint32_t>(key >> 32),
                             ctr, out);
          const std::uint32_t want = (out[(i >> 1) & 3] >> (16 * (i & 1))) & 0xFFFFu;
          ASSERT_EQ(words[static_cast<std::size_t>(k)], want)
              << "first " << first << " count " << count << " k " << k << " stream " << stream;
        }
      }
    }
  }
}

TEST_F(RngTest, Bf16RoundToNearestEven) {
  EXPECT_EQ(cpu::float_to_bf16_rne(1.0f), 0x3F80);
  EXPECT_EQ(cpu::float_to_bf16_rne(from_bits(0x3F808000)), 0x3F80);  // tie, even stays
  EXPECT_EQ(cpu::float_to_bf16_rne(from_bits(0x3F818000)), 0x3F82);  // tie, odd rounds up
  EXPECT_EQ(cpu::float_to_bf16_rne(from_bits(0x3F808001)), 0x3F81);
  EXPECT_EQ(cpu::float_to_bf16_rne(INFINITY), 0x7F80);
  EXPECT_TRUE(std::isnan(cpu::bf16_to_float(cpu::float_to_bf16_rne(NAN))));
  EXPECT_EQ(cpu::bf16_to_float(0x3F80), 1.0f);
}

TEST_F(RngTest, Bf16StochasticRoundingAddsTheLow16BitsOfTheWord) {
  const float x = from_bits(0x3F80FFFF);
  EXPECT_EQ(cpu::float_to_bf16_sr(x, 0x00000000u), 0x3F80);
  EXPECT_EQ(cpu::float_to_bf16_sr(x, 0xABCD0001u), 0x3F81);  // only R & 0xFFFF counts
  EXPECT_EQ(cpu::float_to_bf16_sr(INFINITY, 0xFFFFu), 0x7F80);  // non-finite: nearest
  // Unbiased: the mean over all 2^16 words equals x exactly.
  const float y = from_bits(0x3F812345);
  double sum = 0;
  for (std::uint32_t r = 0; r < 65536; ++r) sum += cpu::bf16_to_float(cpu::float_to_bf16_sr(y, r));
  EXPECT_EQ(sum / 65536.0, static_cast<double>(y));
}

TEST_F(RngTest, Fp16ConversionsRoundTripEveryHalf) {
  for (std::uint32_t h = 0; h < 65536; ++h) {
    const float f = cpu::f16_to_float(static_cast<std::uint16_t>(h));
    if (std::isnan(f)) {
      EXPECT_EQ(h & 0x7C00u, 0x7C00u);
      continue;
    }
    ASSERT_EQ(cpu::float_to_f16_rne(f), h) << std::hex << h;
  }
}

#if defined(__FLT16_MAX__)
TEST_F(RngTest, Fp16RoundingMatchesTheCompilersFloat16) {
  std::mt19937 gen(123);
  std::uniform_int_distribution<std::uint32_t> any;
  for (int i = 0; i < 200000; ++i) {
    std::uint32_t u = any(gen);
    if (i % 3 == 0) u = (u & 0x807FFFFFu) | ((101u + u % 40u) << 23);  // exponents near half's range
    const float x = from_bits(u);
    if (std::isnan(x)) continue;
    const _Float16 h = static_cast<_Float16>(x);
    std::uint16_t hb;
    std::memcpy(&hb, &h, 2);
    ASSERT_EQ(cpu::float_to_f16_rne(x), hb) << std::hex << u;
    ASSERT_EQ(bits(cpu::f16_to_float(hb)), bits(static_cast<float>(h)));
  }
}
#endif

TEST_F(RngTest, BiasCorrectionIsFloat64PowerRoundedOnce) {
  for (float beta : {0.9f, 0.999f, 0.0f, 0.5f}) {
    for (std::int64_t t : {1, 2, 3, 10, 1000, 123457}) {
      const double expect = 1.0 - std::pow(static_cast<double>(beta), static_cast<double>(t));
      // Binary exponentiation and pow may differ in the last double bit; after rounding to
      // float32 they agree except within one double ulp of a float32 rounding edge.
      EXPECT_NEAR(cpu::bias_correction(beta, t), static_cast<float>(expect), std::abs(expect) * 1.2e-7)
          << beta << " " << t;
    }
  }
  EXPECT_EQ(cpu::bias_correction(0.9f, 1), static_cast<float>(1.0 - static_cast<double>(0.9f)));
}
