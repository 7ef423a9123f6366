// tests/test_cpu_quant.cpp: q8 moments in the CPU engine (src/engine/cpu_quant.{h,cpp},
// cpu_q8.cpp): the codebooks against their formulas, the exact bracket, the stochastic store rule
// and its unbiasedness, the passes at every vector width, and q8 state through the engine
#include <gtest/gtest.h>

#include <cmath>
#include <cstdlib>
#include <cstdint>
#include <cstring>
#include <limits>
#include <memory>
#include <string>
#include <vector>

#include "engine/cpu_kernels.h"
#include "engine/cpu_q8.h"
#include "engine/cpu_quant.h"
#include "engine/engine.h"
#include "engine/thread_pool.h"

namespace {

namespace quant = luminav::cpu::quant;
using luminav::DType;

std::uint32_t bits(float x) {
  std::uint32_t u;
  std::memcpy(&u, &x, 4);
  return u;
}

// The formulas of docs/tdclm.md written out here, one float32 operation a statement.
float expected_m(int c) {
  if (c == 128) return 0.0f;
  float t;
  if (c < 128) {
    t = static_cast<float>(128 - c) / 128.0f;  // exact
  } else {
    const float inv = 1.0f / 127.0f;
    t = static_cast<float>(c - 128) * inv;
  }
  const float square = t * t;
  const float cube = square * t;
  return c < 128 ? -cube : cube;
}
float expected_v(int c) {
  const float inv = 1.0f / 255.0f;
  const float t = static_cast<float>(c) * inv;
  const float s = t * t;
  const float q = s * s;
  return q;
}

TEST(Q8Codebooks, TheReciprocalsAreTheFloat32Quotients) {
  EXPECT_EQ(bits(quant::inv127()), 0x3C010204u);
  EXPECT_EQ(bits(quant::inv255()), 0x3B808081u);
  EXPECT_EQ(bits(quant::kInv127), 0x3C010204u);
  EXPECT_EQ(bits(quant::kInv255), 0x3B808081u);
}

TEST(Q8Codebooks, EveryEntryIsItsFormulaAndNearTheRealPowerLaw) {
  const float* m = quant::codebook_m_table();
  const float* v = quant::codebook_v_table();
  for (int c = 0; c < 256; ++c) {
    EXPECT_EQ(bits(m[c]), bits(expected_m(c))) << "C_m[" << c << "]";
    EXPECT_EQ(bits(v[c]), bits(expected_v(c))) << "C_v[" << c << "]";
    EXPECT_EQ(bits(quant::codebook_m(c)), bits(m[c]));
    EXPECT_EQ(bits(quant::codebook_v(c)), bits(v[c]));
    EXPECT_EQ(bits(quant::value_m(c)), bits(m[c])) << "value_m(" << c << ")";
    EXPECT_EQ(bits(quant::value_v(c)), bits(v[c])) << "value_v(" << c << ")";
    // within 8 float32 steps of the float32 nearest ((c - 128) / 127)^3 (c < 128: ((c - 128) /
    // 128)^3) and (c / 255)^4, as tests/test_q8.py measures the Python twins
    const float rm = static_cast<float>(c < 128 ? std::pow((c - 128) / 128.0, 3) : std::pow((c - 128) / 127.0, 3));
    const float rv = static_cast<float>(std::pow(c / 255.0, 4));
    auto steps = [](float a, float b) {
      return std::llabs(static_cast<long long>(static_cast<std::int32_t>(bits(a))) -
                        static_cast<long long>(static_cast<std::int32_t>(bits(b))));
    };
    EXPECT_LE(steps(m[c], rm), 8) << c;
    EXPECT_LE(steps(v[c], rv), 8) << c;
    if (c > 0) {
      EXPECT_LT(m[c - 1], m[c]) << c;
      EXPECT_LT(v[c - 1], v[c]) << c;
    }
  }
  // the entries docs/tdclm.md prints
  EXPECT_EQ(m[0], -1.0f);
  EXPECT_EQ(m[1], -0.9767451f);
  EXPECT_EQ(m[64], -0.125f);
  EXPECT_EQ(m[127], -4.7683716e-07f);
  EXPECT_EQ(m[129], 4.881899e-07f);
  EXPECT_EQ(m[192], 0.12797606f);
  EXPECT_EQ(m[254], 0.97656345f);
  EXPECT_EQ(m[255], 1.0f);
  EXPECT_EQ(v[1], 2.3650448e-10f);
  EXPECT_EQ(v[128], 0.06348619f);
  EXPECT_EQ(v[254], 0.984406f);
  EXPECT_EQ(v[255], 1.0f);
  EXPECT_EQ(m[quant::kZeroCodeM], 0.0f);
  EXPECT_EQ(v[quant::kZeroCodeV], 0.0f);
}

TEST(Q8Bracket, ExactOnEveryCodeAndItsNeighbours) {
  for (const float* table : {quant::codebook_m_table(), quant::codebook_v_table()}) {
    for (int c = 0; c < 256; ++c) {
      const float y = table[c];
      EXPECT_EQ(quant::bracket(table, y), c);
      const float up = std::nextafter(y, 2.0f);
      if (c < 255) {
        EXPECT_EQ(quant::bracket(table, up), up < table[c + 1] ? c : c + 1);
      }
      if (c > 0) {
        EXPECT_EQ(quant::bracket(table, std::nextafter(y, -2.0f)), c - 1);
      }
      // y on a code stores that code, whatever the random word
      for (std::uint32_t w : {0u, 1u, 32767u, 32768u, 65535u}) EXPECT_EQ(quant::encode_one(table, y, w), c);
    }
  }
  const float* m = quant::codebook_m_table();
  const float* v = quant::codebook_v_table();
  EXPECT_EQ(quant::bracket(m, 1.0f), 255);
  EXPECT_EQ(quant::bracket(m, -1.0f), 0);
  EXPECT_EQ(quant::bracket(v, 1.0f), 255);
  for (float tiny : {1e-30f, std::numeric_limits<float>::denorm_min(), 4e-7f}) {
    EXPECT_EQ(quant::bracket(m, tiny), 128) << tiny;   // below C_m[129] = 4.88e-7
    EXPECT_EQ(quant::bracket(m, -tiny), 127) << tiny;  // above C_m[127] = -4.77e-7
    int largest = 0;  // by a linear scan
    while (largest < 255 && v[largest + 1] <= tiny) ++largest;
    EXPECT_EQ(quant::bracket(v, tiny), largest) << tiny;
  }
  EXPECT_EQ(quant::bracket(m, -0.0f), 128);
  EXPECT_EQ(quant::bracket(v, 0.0f), 0);
}

// bracket_m / bracket_v (an estimate from a cube / fourth root, fixed by comparing y with the
// computed C of the neighbouring codes) against the plain binary search over the table.
void expect_fast_bracket(float y, int& compared) {
  const float* m = quant::codebook_m_table();
  const float* v = quant::codebook_v_table();
  if (y >= -1.0f && y <= 1.0f) {
    ASSERT_EQ(quant::bracket_m(y), quant::bracket(m, y)) << "C_m, y = " << std::hexfloat << y;
    ++compared;
  }
  if (y >= 0.0f && y <= 1.0f) {
    ASSERT_EQ(quant::bracket_v(y), quant::bracket(v, y)) << "C_v, y = " << std::hexfloat << y;
    ++compared;
  }
}

TEST(Q8Bracket, FastSearchEqualsTheBinarySearchAroundEveryCode) {
  int compared = 0;
  for (const float* table : {quant::codebook_m_table(), quant::codebook_v_table()}) {
    for (int c = 0; c < 256; ++c) {
      // the code's value, its 300 float32 neighbours each side, and the midpoints to the next code
      float up = table[c], down = table[c];
      for (int k = 0; k <= 300; ++k) {
        expect_fast_bracket(up, compared);
        expect_fast_bracket(down, compared);
        up = std::nextafter(up, 2.0f);
        down = std::nextafter(down, -2.0f);
      }
      if (c < 255) {
        for (int q = 1; q < 64; ++q) {
          const double at = table[c] + (static_cast<double>(table[c + 1]) - table[c]) * q / 64.0;
          expect_fast_bracket(static_cast<float>(at), compared);
        }
      }
    }
  }
  // 0, the smallest normals and the denormals, and the ends
  for (std::uint32_t b = 0; b < (1u << 24); b += 4093) {
    float y;
    std::memcpy(&y, &b, 4);
    expect_fast_bracket(y, compared);
    expect_fast_bracket(-y, compared);
  }
  for (float y : {0.0f, -0.0f, 1.0f, -1.0f, std::numeric_limits<float>::denorm_min(),
                  -std::numeric_limits<float>::denorm_min(), std::numeric_limits<float>::min(),
                  -std::numeric_limits<float>::min(), 0x1.0p-60f, -0x1.0p-60f, 0x1.0p-61f})
    expect_fast_bracket(y, compared);
  EXPECT_GT(compared, 2 * 256 * 2 * 301);
}

// The vector widths this CPU runs.
std::vector<luminav::cpu::CpuIsa> isas_here() {
  using luminav::cpu::CpuIsa;
  std::vector<CpuIsa> out;
  for (CpuIsa isa : {CpuIsa::kBaseline, CpuIsa::kAvx2, CpuIsa::kAvx512}) {
    if (static_cast<int>(isa) <= static_cast<int>(luminav::cpu::cpu_isa())) out.push_back(isa);
  }
  return out;
}

// Every 97th float32 bit pattern of [-1, 1] (about 22 million values of each sign), the search of
// both codebooks, as the passes run it at every vector width, against the binary search.
TEST(Q8Bracket, FastSearchEqualsTheBinarySearchOnADenseSampleOfMinusOneToOneAtEveryWidth) {
  const float* m = quant::codebook_m_table();
  const float* v = quant::codebook_v_table();
  constexpr std::uint32_t kOne = 0x3F800000u;
  constexpr std::uint32_t kStride = 97;
  constexpr int kChunk = 1 << 16;
  std::vector<float> pos(kChunk), neg(kChunk);
  std::vector<std::int32_t> ref_m_pos(kChunk), ref_m_neg(kChunk), ref_v(kChunk), got(kChunk);
  std::int64_t compared = 0;
  for (std::uint32_t b = 0; b <= kOne;) {
    int n = 0;
    for (; n < kChunk && b <= kOne; ++n, b += kStride) {
      std::memcpy(&pos[static_cast<std::size_t>(n)], &b, 4);
      neg[static_cast<std::size_t>(n)] = -pos[static_cast<std::size_t>(n)];
    }
    for (int i = 0; i < n; ++i) {
      const auto k = static_cast<std::size_t>(i);
      ref_m_pos[k] = quant::bracket(m, pos[k]);
      ref_m_neg[k] = quant::bracket(m, neg[k]);
      ref_v[k] = quant::bracket(v, pos[k]);
    }
    for (luminav::cpu::CpuIsa isa : isas_here()) {
      const struct {
        bool m;
        const std::vector<float>& y;
        const std::vector<std::int32_t>& ref;
      } cases[] = {{true, pos, ref_m_pos}, {true, neg, ref_m_neg}, {false, pos, ref_v}};
      for (const auto& cs : cases) {
        luminav::cpu::q8::bracket_many(isa, cs.m, cs.y.data(), n, got.data());
        for (int i = 0; i < n; ++i) {
          const auto k = static_cast<std::size_t>(i);
          ASSERT_EQ(got[k], cs.ref[k]) << (cs.m ? "C_m" : "C_v") << " at " << luminav::cpu::cpu_isa_name(isa)
                                       << ", y = " << std::hexfloat << cs.y[k];
        }
        compared += n;
      }
    }
  }
  EXPECT_GT(compared, 3 * static_cast<std::int64_t>(kOne / kStride));
}

// encode_m / encode_v (what encode_block runs) against encode_one (table and binary search) for
// y across both codebooks and words across the range.
TEST(Q8Encode, FastEncodeEqualsTheReference) {
  const float* m = quant::codebook_m_table();
  const float* v = quant::codebook_v_table();
  std::uint32_t s = 77;
  int compared = 0;
  for (int i = 0; i < 200000; ++i) {
    s = s * 1664525u + 1013904223u;
    const std::uint32_t word = s >> 16;
    s = s * 1664525u + 1013904223u;
    // |y| spread over many binades: a random mantissa and an exponent in [2^-40, 1]
    const float mag = std::ldexp(static_cast<float>(s >> 8) / (1 << 24), -static_cast<int>(i % 41));
    const float y = (i & 1) ? -mag : mag;
    ASSERT_EQ(quant::encode_m(y, word), quant::encode_one(m, y, word)) << std::hexfloat << y << " " << word;
    ASSERT_EQ(quant::encode_v(mag, word), quant::encode_one(v, mag, word)) << std::hexfloat << mag << " " << word;
    compared += 2;
  }
  for (int c = 0; c < 256; ++c) {
    for (std::uint32_t word : {0u, 1u, 32767u, 32768u, 65535u}) {
      if (c < 255) {
        const float mid_m = static_cast<float>(0.5 * (static_cast<double>(m[c]) + m[c + 1]));
        const float mid_v = static_cast<float>(0.5 * (static_cast<double>(v[c]) + v[c + 1]));
        EXPECT_EQ(quant::encode_m(mid_m, word), quant::encode_one(m, mid_m, word)) << c;
        EXPECT_EQ(quant::encode_v(mid_v, word), quant::encode_one(v, mid_v, word)) << c;
      }
      EXPECT_EQ(quant::encode_m(m[c], word), c);
      EXPECT_EQ(quant::encode_v(v[c], word), c);
      compared += 4;
    }
  }
  EXPECT_GT(compared, 400000);
}

// encode_block element by element, at every vector width: y = sign(x) at the block's max,
// fl(x * fl(1 / scale)) elsewhere, then encode_one's decision.
TEST(Q8Encode, EncodeBlockIsEncodeOneOfEachElementAtEveryWidth) {
  const float* m = quant::codebook_m_table();
  const float* v = quant::codebook_v_table();
  std::uint32_t s = 5;
  float x[quant::kBlock], ax[quant::kBlock];
  std::uint16_t words[quant::kBlock];
  std::uint8_t cm[quant::kBlock], cv[quant::kBlock];
  for (int rep = 0; rep < 200; ++rep) {
    const int n = rep % 7 == 0 ? 1 + rep % quant::kBlock : quant::kBlock;
    for (int i = 0; i < n; ++i) {
      s = s * 1664525u + 1013904223u;
      x[i] = std::ldexp(static_cast<float>(static_cast<std::int32_t>(s) >> 7) / (1 << 24), -(rep % 30));
      ax[i] = std::fabs(x[i]);
      s = s * 1664525u + 1013904223u;
      words[i] = static_cast<std::uint16_t>(s >> 16);
    }
    const float sm = quant::block_scale(x, n), sv = quant::block_scale(ax, n);
    const float rm = 1.0f / sm, rv = 1.0f / sv;
    // each width's form, then the inline one of this file (-1)
    for (int form = -1; form < static_cast<int>(isas_here().size()); ++form) {
      std::string name = "inline";
      if (form < 0) {
        quant::encode_block_m(sm, x, n, words, cm);
        quant::encode_block_v(sv, ax, n, words, cv);
      } else {
        const luminav::cpu::CpuIsa isa = isas_here()[static_cast<std::size_t>(form)];
        name = luminav::cpu::cpu_isa_name(isa);
        luminav::cpu::q8::encode_block_at(isa, true, sm, x, n, words, cm);
        luminav::cpu::q8::encode_block_at(isa, false, sv, ax, n, words, cv);
      }
      for (int i = 0; i < n; ++i) {
        const float ym = std::fabs(x[i]) == sm ? std::copysign(1.0f, x[i]) : x[i] * rm;
        const float yv = ax[i] == sv ? 1.0f : ax[i] * rv;
        ASSERT_EQ(cm[i], quant::encode_one(m, ym, words[i])) << name << " " << rep << " " << i;
        ASSERT_EQ(cv[i], quant::encode_one(v, yv, words[i])) << name << " " << rep << " " << i;
      }
    }
  }
}

// Over all 65536 words the upper code is taken with probability (y - C[lo]) / (C[hi] - C[lo])
// to within 2^-16 (the threshold's grid) and float32 rounding of the two differences.
TEST(Q8Encode, TheRoundingIsUnbiased) {
  for (const float* table : {quant::codebook_m_table(), quant::codebook_v_table()}) {
    for (int c : {0, 1, 60, 127, 128, 129, 200, 254}) {
      for (double frac : {0.001, 0.25, 0.5, 0.7071, 0.999}) {
        const float y = static_cast<float>(table[c] + frac * (static_cast<double>(table[c + 1]) - table[c]));
        if (!(y > table[c] && y < table[c + 1])) continue;
        int hi = 0;
        for (std::uint32_t w = 0; w < 65536; ++w) {
          const int code = quant::encode_one(table, y, w);
          ASSERT_TRUE(code == c || code == c + 1) << code;
          hi += code == c + 1;
        }
        const double p = (static_cast<double>(y) - table[c]) / (static_cast<double>(table[c + 1]) - table[c]);
        EXPECT_NEAR(hi / 65536.0, p, 1.0 / 65536 + 1e-6 * p) << "code " << c << " frac " << frac;
      }
    }
  }
}

TEST(Q8Encode, BlockScaleAndSpecialBlocks) {
  const float* m = quant::codebook_m_table();
  std::vector<std::uint16_t> words(4, 12345);
  std::vector<std::uint8_t> codes(4, 7);
  const float x[4] = {-3.0f, 1.5f, 3.0f, 0.0f};
  const float s = quant::block_scale(x, 4);
  EXPECT_EQ(s, 3.0f);
  quant::encode_block_m(s, x, 4, words.data(), codes.data());
  EXPECT_EQ(codes[0], 0);    // -scale: y = -1 exactly
  EXPECT_EQ(codes[2], 255);  // +scale: y = 1 exactly
  EXPECT_EQ(codes[3], 128);  // 0
  EXPECT_TRUE(codes[1] == quant::bracket(m, 0.5f) || codes[1] == quant::bracket(m, 0.5f) + 1);
  const float zeros[3] = {0.0f, -0.0f, 0.0f};
  EXPECT_EQ(quant::block_scale(zeros, 3), 0.0f);
  quant::encode_block_v(0.0f, zeros, 3, words.data(), codes.data());
  EXPECT_EQ(codes[0], 0);
  const float bad[3] = {1.0f, std::numeric_limits<float>::infinity(), 2.0f};
  const float nan_scale = quant::block_scale(bad, 3);
  EXPECT_TRUE(std::isnan(nan_scale));
  quant::encode_block_m(nan_scale, bad, 3, words.data(), codes.data());
  EXPECT_EQ(codes[0], 128);
  EXPECT_EQ(codes[2], 128);
  float decoded[3];
  quant::decode_block(m, nan_scale, codes.data(), 3, decoded);
  EXPECT_TRUE(std::isnan(decoded[1]));
}

// decode_block_m / decode_block_v (C by its formula) against decode_block with the tables: every
// code under scales of several binades, 0 and NaN.
TEST(Q8Decode, TheFormulaDecodeIsTheTableDecode) {
  std::uint8_t codes[256];
  for (int c = 0; c < 256; ++c) codes[c] = static_cast<std::uint8_t>(255 - c);
  float a[256], b[256];
  for (float scale : {1.0f, 3.0f, 1e-30f, 0.7f, 6.5e4f, 0.0f, std::numeric_limits<float>::quiet_NaN()}) {
    quant::decode_block_m(scale, codes, 256, a);
    quant::decode_block(quant::codebook_m_table(), scale, codes, 256, b);
    for (int i = 0; i < 256; ++i) EXPECT_EQ(bits(a[i]), bits(b[i])) << "m, code " << int(codes[i]) << " scale " << scale;
    quant::decode_block_v(scale, codes, 256, a);
    quant::decode_block(quant::codebook_v_table(), scale, codes, 256, b);
    for (int i = 0; i < 256; ++i) EXPECT_EQ(bits(a[i]), bits(b[i])) << "v, code " << int(codes[i]) << " scale " << scale;
  }
}

TEST(Q8Layout, BlocksFollowRowsOfRowLen) {
  EXPECT_EQ(quant::num_blocks(17 * 257, 257), 17 * 2);
  EXPECT_EQ(quant::num_blocks(5000, 5000), 20);
  std::int64_t first = 0;
  int count = 0;
  quant::block_range(3, 257, first, count);  // row 1, block 1: one element
  EXPECT_EQ(first, 257 + 256);
  EXPECT_EQ(count, 1);
  quant::block_range(2, 257, first, count);
  EXPECT_EQ(first, 257);
  EXPECT_EQ(count, 256);
}

// ------------------------------------------------------------------------ the passes, every ISA

struct Q8Tensor {
  std::vector<float> p, g;
  std::vector<std::uint8_t> m, v;
  std::vector<float> sm, sv;
  std::int64_t step = 0;
  std::int64_t row_len;
  Q8Tensor(std::int64_t rows, std::int64_t k, std::uint32_t seed) : row_len(k) {
    const std::size_t n = static_cast<std::size_t>(rows * k);
    p.resize(n);
    g.resize(n);
    std::uint32_t s = seed;
    auto next = [&] {
      s = s * 1664525u + 1013904223u;
      return static_cast<float>(static_cast<std::int32_t>(s >> 8) - (1 << 23)) / (1 << 23);
    };
    for (std::size_t i = 0; i < n; ++i) {
      p[i] = next();
      g[i] = next() * 0.01f;
    }
    m.assign(n, quant::kZeroCodeM);
    v.assign(n, quant::kZeroCodeV);
    const auto nb = static_cast<std::size_t>(quant::num_blocks(rows * k, k));
    sm.assign(nb, 0.0f);
    sv.assign(nb, 0.0f);
  }
  luminav::TensorRow row(std::int64_t k) {
    luminav::TensorRow r;
    r.param = p.data();
    r.grad = g.data();
    r.exp_avg = m.data();
    r.exp_avg_sq = v.data();
    r.step = &step;
    r.numel = static_cast<std::int64_t>(p.size());
    r.param_index = k;
    r.global_numel = r.numel;
    r.scale_m = sm.data();
    r.scale_v = sv.data();
    r.row_len = row_len;
    return r;
  }
};

luminav::GroupConfig q8_config(double clip, luminav::BoundMode bound = luminav::BoundMode::kNone) {
  luminav::GroupConfig cfg;
  cfg.state_dtype = DType::kQ8;
  cfg.hyper.state_dtype = DType::kQ8;
  cfg.hyper.clip = clip;
  cfg.hyper.bound_mode = bound;
  cfg.hyper.bound = 0.5;
  cfg.seed = 1234;
  return cfg;
}

// Three steps of a group of q8 tensors at `isa` with `threads`; every byte of their state.
std::vector<std::uint8_t> run_steps(luminav::cpu::CpuIsa isa, int threads, double clip) {
  std::vector<Q8Tensor> ts;
  ts.emplace_back(1, 5000, 1);
  ts.emplace_back(17, 257, 2);
  ts.emplace_back(64, 300, 3);
  const luminav::GroupConfig cfg = q8_config(clip);
  auto pool = luminav::cpu::make_thread_pool(threads);
  for (int t = 0; t < 3; ++t) {
    std::vector<luminav::TensorRow> rows;
    for (std::size_t j = 0; j < ts.size(); ++j) rows.push_back(ts[j].row(static_cast<std::int64_t>(j)));
    std::vector<luminav::cpu::tiles::TensorConsts> consts;
    for (const auto& r : rows) consts.push_back(luminav::cpu::tiles::tensor_consts(cfg, r));
    std::vector<float> stats(rows.size(), 0.0f), taus(rows.size(), 0.0f);
    std::int32_t flag = 0;
    luminav::cpu::q8::pass1(cfg, rows.data(), rows.size(), consts.data(), stats.data(), &flag, *pool, isa);
    for (std::size_t j = 0; j < rows.size(); ++j) {
      if (clip > 0) taus[j] = static_cast<float>(clip) * std::sqrt(stats[j] / static_cast<float>(rows[j].numel));
    }
    luminav::cpu::q8::pass2(cfg, rows.data(), rows.size(), consts.data(), taus.data(), 1e-2f, *pool, isa);
    for (auto& x : ts) x.step += 1;
  }
  std::vector<std::uint8_t> out;
  auto append = [&](const void* d, std::size_t n) {
    const auto* b = static_cast<const std::uint8_t*>(d);
    out.insert(out.end(), b, b + n);
  };
  for (const auto& x : ts) {
    append(x.p.data(), x.p.size() * 4);
    append(x.m.data(), x.m.size());
    append(x.v.data(), x.v.size());
    append(x.sm.data(), x.sm.size() * 4);
    append(x.sv.data(), x.sv.size() * 4);
  }
  return out;
}

TEST(Q8Passes, EveryVectorWidthAndThreadCountStoresTheSameBits) {
  using luminav::cpu::CpuIsa;
  const CpuIsa widest = luminav::cpu::cpu_isa();
  for (double clip : {0.0, 1.0}) {
    const std::vector<std::uint8_t> base = run_steps(CpuIsa::kBaseline, 1, clip);
    int compared = 0;
    for (CpuIsa isa : {CpuIsa::kBaseline, CpuIsa::kAvx2, CpuIsa::kAvx512}) {
      if (static_cast<int>(isa) > static_cast<int>(widest)) continue;
      EXPECT_EQ(run_steps(isa, 3, clip), base) << luminav::cpu::cpu_isa_name(isa) << " clip " << clip;
      ++compared;
    }
    EXPECT_GE(compared, 1);
  }
}

TEST(Q8Passes, AStepMovesTheCodesAndKeepsTheBlockMaxExact) {
  Q8Tensor t(4, 300, 9);
  const luminav::GroupConfig cfg = q8_config(0.0);
  auto pool = luminav::cpu::make_thread_pool(2);
  luminav::TensorRow row = t.row(0);
  const luminav::cpu::tiles::TensorConsts c = luminav::cpu::tiles::tensor_consts(cfg, row);
  const float tau = 0.0f;
  luminav::cpu::q8::pass2(cfg, &row, 1, &c, &tau, 1e-2f, *pool, luminav::cpu::cpu_isa());
  // first step from zero moments: m' = (1 - beta1) g, each block's scale its largest |m'|
  const float* table = quant::codebook_m_table();
  const float omb1 = 1.0f - static_cast<float>(cfg.hyper.beta1);
  for (std::int64_t qb = 0; qb < quant::num_blocks(1200, 300); ++qb) {
    std::int64_t first = 0;
    int count = 0;
    quant::block_range(qb, 300, first, count);
    float most = 0.0f;
    for (int i = 0; i < count; ++i) most = std::max(most, std::fabs(omb1 * t.g[static_cast<std::size_t>(first + i)]));
    EXPECT_EQ(t.sm[static_cast<std::size_t>(qb)], most) << qb;
    for (int i = 0; i < count; ++i) {
      const std::size_t e = static_cast<std::size_t>(first + i);
      const float x = omb1 * t.g[e];
      const float decoded = most * table[t.m[e]];
      if (std::fabs(x) == most) {
        EXPECT_EQ(decoded, x);
      }
      const int lo = quant::bracket(table, x * (1.0f / most));
      EXPECT_TRUE(t.m[e] == lo || t.m[e] == std::min(lo + 1, 255)) << e;
    }
  }
}

}  // namespace
