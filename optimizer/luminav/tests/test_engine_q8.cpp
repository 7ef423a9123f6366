// tests/test_engine_q8.cpp: q8 moments through the engine and the C and C++ APIs (src/engine/
// engine.cpp, state_io.cpp, src/c_api.cpp): state the engine allocates or the caller lends, the
// refusals of a bad q8 description (which change nothing), and the state's export and import
#include <gtest/gtest.h>

#include <cstddef>
#include <cstdint>
#include <cstring>
#include <string>
#include <vector>

#include "luminav/luminav.h"
#include "luminav/luminav.hpp"

namespace {

constexpr std::int64_t kRows = 12, kRowLen = 300;  // 2 q8 blocks a row, the second short
constexpr std::int64_t kNumel = kRows * kRowLen;
constexpr std::int64_t kBlocks = kRows * 2;

struct Model {
  std::vector<float> p, g;
  explicit Model(std::uint32_t seed) : p(kNumel), g(kNumel) {
    std::uint32_t s = seed;
    for (std::int64_t i = 0; i < kNumel; ++i) {
      s = s * 1664525u + 1013904223u;
      p[static_cast<std::size_t>(i)] = static_cast<float>(s >> 9) / (1u << 23) - 0.5f;
      g[static_cast<std::size_t>(i)] = static_cast<float>((s >> 3) & 1023u) / 1024.0f * 0.02f - 0.01f;
    }
  }
};

// The caller's q8 state: codes at the zero codes, scales zero.
struct LentState {
  std::vector<std::uint8_t> m = std::vector<std::uint8_t>(kNumel, 128), v = std::vector<std::uint8_t>(kNumel, 0);
  std::vector<float> sm = std::vector<float>(kBlocks, 0.0f), sv = std::vector<float>(kBlocks, 0.0f);
};

class EngineQ8 : public ::testing::Test {
 protected:
  void SetUp() override {
    ASSERT_EQ(lv_optimizer_options_init(&options_), LV_STATUS_OK);
    options_.num_threads = 2;
    options_.seed = 77;
    ASSERT_EQ(lv_hyperparams_init(&hyper_), LV_STATUS_OK);
    hyper_.state_dtype = LV_DTYPE_Q8;
    hyper_.lr = 1e-2;
  }
  lv_optimizer* make(Model& model, LentState* lent, std::int64_t scale_numel = kBlocks) {
    lv_optimizer* opt = nullptr;
    EXPECT_EQ(lv_optimizer_create(&options_, &opt), LV_STATUS_OK);
    size_t g = 0;
    EXPECT_EQ(lv_optimizer_add_group(opt, &hyper_, &g), LV_STATUS_OK) << lv_last_error();
    lv_param_desc d;
    lv_param_desc_init(&d);
    d.data = model.p.data();
    d.grad = model.g.data();
    d.numel = kNumel;
    d.row_len = kRowLen;
    if (lent) {
      d.exp_avg = lent->m.data();
      d.exp_avg_sq = lent->v.data();
      d.exp_avg_scale = lent->sm.data();
      d.exp_avg_sq_scale = lent->sv.data();
      d.scale_numel = scale_numel;
    }
    EXPECT_EQ(lv_optimizer_add_param(opt, g, &d, nullptr), LV_STATUS_OK) << lv_last_error();
    return opt;
  }
  static std::vector<std::uint8_t> state(lv_optimizer* opt) {
    size_t size = 0;
    EXPECT_EQ(lv_optimizer_export_state(opt, nullptr, 0, &size), LV_STATUS_OK);
    std::vector<std::uint8_t> out(size);
    EXPECT_EQ(lv_optimizer_export_state(opt, out.data(), out.size(), &size), LV_STATUS_OK);
    return out;
  }
  lv_optimizer_options options_{};
  lv_hyperparams hyper_{};
};

TEST_F(EngineQ8, AllocatedAndLentStateStepAlikeAndTheLentOneIsWritten) {
  Model a(1), b(1);
  LentState lent;
  lv_optimizer* own = make(a, nullptr);
  lv_optimizer* borrowed = make(b, &lent);
  for (int t = 0; t < 3; ++t) {
    ASSERT_EQ(lv_optimizer_step(own, nullptr), LV_STATUS_OK) << lv_last_error();
    ASSERT_EQ(lv_optimizer_step(borrowed, nullptr), LV_STATUS_OK) << lv_last_error();
  }
  EXPECT_EQ(a.p, b.p);
  EXPECT_NE(a.p, Model(1).p);
  EXPECT_EQ(state(own), state(borrowed));
  // the lent buffers hold the moments: every block scale set, codes moved off the zero codes
  for (float s : lent.sm) EXPECT_GT(s, 0.0f);
  for (float s : lent.sv) EXPECT_GT(s, 0.0f);
  int moved = 0;
  for (std::uint8_t c : lent.m) moved += c != 128;
  EXPECT_GT(moved, kNumel / 2);
  lv_optimizer_destroy(own);
  lv_optimizer_destroy(borrowed);
}

TEST_F(EngineQ8, ExportImportRoundTripResumesBitwise) {
  Model a(3);
  lv_optimizer* first = make(a, nullptr);
  for (int t = 0; t < 2; ++t) ASSERT_EQ(lv_optimizer_step(first, nullptr), LV_STATUS_OK);
  const std::vector<std::uint8_t> saved = state(first);
  Model b = a;  // the weights at the save
  LentState lent;
  lv_optimizer* second = make(b, &lent);
  ASSERT_EQ(lv_optimizer_import_state(second, saved.data(), saved.size()), LV_STATUS_OK) << lv_last_error();
  EXPECT_EQ(state(second), saved);
  for (int t = 0; t < 2; ++t) {
    ASSERT_EQ(lv_optimizer_step(first, nullptr), LV_STATUS_OK);
    ASSERT_EQ(lv_optimizer_step(second, nullptr), LV_STATUS_OK);
  }
  EXPECT_EQ(a.p, b.p);
  EXPECT_EQ(state(first), state(second));
  lv_optimizer_destroy(first);
  lv_optimizer_destroy(second);
}

TEST_F(EngineQ8, AStateOfAnotherRowLenOrStateDtypeIsRefusedAndChangesNothing) {
  Model a(4);
  lv_optimizer* q8 = make(a, nullptr);
  ASSERT_EQ(lv_optimizer_step(q8, nullptr), LV_STATUS_OK);
  const std::vector<std::uint8_t> saved = state(q8);
  // the same parameter in rows of 600
  Model b(5);
  lv_optimizer* other = nullptr;
  ASSERT_EQ(lv_optimizer_create(&options_, &other), LV_STATUS_OK);
  size_t g = 0;
  ASSERT_EQ(lv_optimizer_add_group(other, &hyper_, &g), LV_STATUS_OK);
  lv_param_desc d;
  lv_param_desc_init(&d);
  d.data = b.p.data();
  d.grad = b.g.data();
  d.numel = kNumel;
  d.row_len = 2 * kRowLen;
  ASSERT_EQ(lv_optimizer_add_param(other, g, &d, nullptr), LV_STATUS_OK);
  const std::vector<std::uint8_t> before = state(other);
  EXPECT_EQ(lv_optimizer_import_state(other, saved.data(), saved.size()), LV_STATUS_INVALID_ARGUMENT);
  EXPECT_NE(std::string(lv_last_error()).find("q8 blocks are rows of 300 elements, the optimizer's of 600"),
            std::string::npos)
      << lv_last_error();
  EXPECT_EQ(state(other), before);
  // a float32 optimizer does not take a q8 state
  lv_optimizer* f32 = nullptr;
  ASSERT_EQ(lv_optimizer_create(&options_, &f32), LV_STATUS_OK);
  lv_hyperparams h = hyper_;
  h.state_dtype = LV_DTYPE_FLOAT32;
  ASSERT_EQ(lv_optimizer_add_group(f32, &h, &g), LV_STATUS_OK);
  d.row_len = 0;
  ASSERT_EQ(lv_optimizer_add_param(f32, g, &d, nullptr), LV_STATUS_OK);
  EXPECT_EQ(lv_optimizer_import_state(f32, saved.data(), saved.size()), LV_STATUS_INVALID_ARGUMENT);
  EXPECT_NE(std::string(lv_last_error()).find("state dtype 3"), std::string::npos) << lv_last_error();
  lv_optimizer_destroy(q8);
  lv_optimizer_destroy(other);
  lv_optimizer_destroy(f32);
}

TEST_F(EngineQ8, BadQ8DescriptionsAreRefusedByNameAndAddNothing) {
  Model a(6);
  lv_optimizer* opt = nullptr;
  ASSERT_EQ(lv_optimizer_create(&options_, &opt), LV_STATUS_OK);
  size_t q8 = 0, f32 = 0;
  ASSERT_EQ(lv_optimizer_add_group(opt, &hyper_, &q8), LV_STATUS_OK);
  lv_hyperparams h = hyper_;
  h.state_dtype = LV_DTYPE_FLOAT32;
  ASSERT_EQ(lv_optimizer_add_group(opt, &h, &f32), LV_STATUS_OK);
  LentState lent;
  auto desc = [&] {
    lv_param_desc d;
    lv_param_desc_init(&d);
    d.data = a.p.data();
    d.grad = a.g.data();
    d.numel = kNumel;
    d.row_len = kRowLen;
    d.exp_avg = lent.m.data();
    d.exp_avg_sq = lent.v.data();
    d.exp_avg_scale = lent.sm.data();
    d.exp_avg_sq_scale = lent.sv.data();
    d.scale_numel = kBlocks;
    return d;
  };
  auto refused = [&](size_t group, const lv_param_desc& d, const std::string& words) {
    EXPECT_EQ(lv_optimizer_add_param(opt, group, &d, nullptr), LV_STATUS_INVALID_ARGUMENT);
    EXPECT_NE(std::string(lv_last_error()).find(words), std::string::npos) << lv_last_error();
    size_t count = 99;
    lv_optimizer_get_num_params(opt, &count);
    EXPECT_EQ(count, 0u);
  };
  lv_param_desc d = desc();
  d.exp_avg_scale = nullptr;
  refused(q8, d, "parameter 0: q8 exp_avg_scale is null but exp_avg is lent; lend a moment's codes and scales together");
  d = desc();
  d.exp_avg_sq = nullptr;
  refused(q8, d, "q8 exp_avg_sq is null but exp_avg_sq_scale is lent");
  d = desc();
  d.scale_numel = kBlocks - 1;
  refused(q8, d, "the lent q8 scales must hold 24 float32 values each (numel 3600 in rows of 300, ceil(row_len / 256) "
                 "blocks a row), scale_numel is 23");
  d = desc();
  d.row_len = 7;
  refused(q8, d, "row_len 7 does not divide numel 3600");
  d = desc();
  d.row_len = -1;
  refused(q8, d, "row_len must be >= 0 (0: one row of numel), got -1");
  d = desc();
  d.exp_avg = d.exp_avg_sq = d.exp_avg_scale = d.exp_avg_sq_scale = nullptr;
  refused(q8, d, "scale_numel is 24 but no q8 scales are lent; leave it 0");
  d = desc();
  d.exp_avg = d.exp_avg_sq = nullptr;
  refused(f32, d, "q8 scales, scale_numel or row_len given, but its group's state_dtype is float32");
  // a desc of the first release (struct_size ending at p_init) is taken, without the q8 fields
  d = desc();
  d.struct_size = static_cast<uint32_t>(offsetof(lv_param_desc, exp_avg_scale));
  d.exp_avg = d.exp_avg_sq = nullptr;
  EXPECT_EQ(lv_optimizer_add_param(opt, q8, &d, nullptr), LV_STATUS_OK) << lv_last_error();
  // state_dtype float16 and other codes are refused with the choices
  h.state_dtype = LV_DTYPE_FLOAT16;
  EXPECT_EQ(lv_optimizer_add_group(opt, &h, nullptr), LV_STATUS_INVALID_ARGUMENT);
  EXPECT_NE(std::string(lv_last_error()).find("or q8 (3"), std::string::npos) << lv_last_error();
  lv_optimizer_destroy(opt);
}

TEST_F(EngineQ8, TheCxxApiLendsQ8State) {
  Model a(8), b(8);
  LentState lent;
  luminav::OptimizerOptions o;
  o.threads(2).with_seed(77);
  luminav::Optimizer own(o), borrowed(o);
  const auto h = luminav::Hyperparams().with_state_dtype(LV_DTYPE_Q8).with_lr(1e-2);
  const std::size_t g1 = own.add_group(h), g2 = borrowed.add_group(h);
  own.add_param(g1, luminav::ParamRef::f32(a.p.data(), a.g.data(), kNumel).with_row_len(kRowLen));
  borrowed.add_param(g2, luminav::ParamRef::f32(b.p.data(), b.g.data(), kNumel)
                             .with_row_len(kRowLen)
                             .with_q8_state(lent.m.data(), lent.sm.data(), lent.v.data(), lent.sv.data(), kBlocks));
  own.step();
  borrowed.step();
  EXPECT_EQ(a.p, b.p);
  EXPECT_GT(lent.sm[0], 0.0f);
}

}  // namespace
