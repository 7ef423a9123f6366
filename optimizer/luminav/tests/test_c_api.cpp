// tests/test_c_api.cpp: the C API's contract (src/c_api.cpp): status codes, lv_last_error
// messages, handle validation, hyperparameters checked as float32, byte counts that cannot
// overflow, ownership of state, and the C++ RAII layer over it
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <string>
#include <vector>

#include "luminav/cuda_driver.h"
#include "luminav/luminav.h"
#include "luminav/luminav.hpp"

namespace {

class CApiTest : public ::testing::Test {
 protected:
  void SetUp() override {
    ASSERT_EQ(lv_optimizer_options_init(&options_), LV_STATUS_OK);
    options_.num_threads = 2;
    ASSERT_EQ(lv_optimizer_create(&options_, &opt_), LV_STATUS_OK);
    ASSERT_EQ(lv_hyperparams_init(&hyper_), LV_STATUS_OK);
    ASSERT_EQ(lv_param_desc_init(&desc_), LV_STATUS_OK);
    desc_.data = param_.data();
    desc_.grad = grad_.data();
    desc_.numel = static_cast<int64_t>(param_.size());
  }
  void TearDown() override {
    if (opt_) {
      EXPECT_EQ(lv_optimizer_destroy(opt_), LV_STATUS_OK);
    }
  }
  std::string last() const { return lv_last_error(); }

  lv_optimizer_options options_{};
  lv_optimizer* opt_ = nullptr;
  lv_hyperparams hyper_{};
  lv_param_desc desc_{};
  std::vector<float> param_ = std::vector<float>(33, 1.0f);
  std::vector<float> grad_ = std::vector<float>(33, 0.25f);
};

TEST_F(CApiTest, VersionAndStatusNames) {
  EXPECT_EQ(lv_api_version(), static_cast<uint32_t>(LV_API_VERSION));
  EXPECT_STREQ(lv_status_string(LV_STATUS_NON_FINITE), "LV_STATUS_NON_FINITE");
  EXPECT_EQ(static_cast<int>(LV_STATUS_BUNDLE_ERROR), static_cast<int>(luminav::Status::kBundleError));
  EXPECT_EQ(static_cast<int>(LV_STATUS_INTERNAL), static_cast<int>(luminav::Status::kInternal));
}

TEST_F(CApiTest, AStepUpdatesTheParameterAndItsCounter) {
  size_t g = 99, k = 99;
  ASSERT_EQ(lv_optimizer_add_group(opt_, &hyper_, &g), LV_STATUS_OK);
  ASSERT_EQ(lv_optimizer_add_param(opt_, g, &desc_, &k), LV_STATUS_OK);
  EXPECT_EQ(g, 0u);
  EXPECT_EQ(k, 0u);
  ASSERT_EQ(lv_optimizer_step(opt_, nullptr), LV_STATUS_OK);
  int64_t step = -1;
  ASSERT_EQ(lv_optimizer_get_param_step(opt_, 0, &step), LV_STATUS_OK);
  EXPECT_EQ(step, 1);
  EXPECT_LT(param_[0], 1.0f);  // descended along a positive gradient
}

TEST_F(CApiTest, NullPointersAreRefusedByName) {
  EXPECT_EQ(lv_optimizer_create(nullptr, &opt_), LV_STATUS_INVALID_ARGUMENT);
  EXPECT_EQ(last(), "options must not be null");
  EXPECT_EQ(lv_optimizer_add_group(opt_, nullptr, nullptr), LV_STATUS_INVALID_ARGUMENT);
  EXPECT_EQ(last(), "hyper must not be null");
  EXPECT_EQ(lv_optimizer_add_group(nullptr, &hyper_, nullptr), LV_STATUS_INVALID_ARGUMENT);
  EXPECT_EQ(last(), "optimizer handle must not be null");
  EXPECT_EQ(lv_optimizer_get_skipped_steps(opt_, nullptr), LV_STATUS_INVALID_ARGUMENT);
  EXPECT_EQ(last(), "out_skipped must not be null");
  size_t g = 0;
  ASSERT_EQ(lv_optimizer_add_group(opt_, &hyper_, &g), LV_STATUS_OK);
  desc_.data = nullptr;
  EXPECT_EQ(lv_optimizer_add_param(opt_, g, &desc_, nullptr), LV_STATUS_INVALID_ARGUMENT);
  EXPECT_EQ(last(), "parameter 0 has numel 33 but a null data pointer; pass its storage");
}

TEST_F(CApiTest, UnknownDtypeAndSizeMismatch) {
  size_t g = 0;
  ASSERT_EQ(lv_optimizer_add_group(opt_, &hyper_, &g), LV_STATUS_OK);
  desc_.dtype = 7;
  EXPECT_EQ(lv_optimizer_add_param(opt_, g, &desc_, nullptr), LV_STATUS_INVALID_ARGUMENT);
  EXPECT_EQ(last(), "desc->dtype must be a dtype code 0 (float32), 1 (bfloat16) or 2 (float16), got 7");
  desc_.dtype = LV_DTYPE_FLOAT32;
  desc_.numel = -4;
  EXPECT_EQ(lv_optimizer_add_param(opt_, g, &desc_, nullptr), LV_STATUS_INVALID_ARGUMENT);
  EXPECT_EQ(last(), "numel of parameter 0 must be >= 0, got -4");
  desc_.numel = 33;
  EXPECT_EQ(lv_optimizer_add_param(opt_, 5, &desc_, nullptr), LV_STATUS_INVALID_ARGUMENT);
  EXPECT_EQ(last(), "param group 5 is out of range: the optimizer has 1 groups");
  hyper_.state_dtype = LV_DTYPE_FLOAT16;
  EXPECT_EQ(lv_optimizer_add_group(opt_, &hyper_, nullptr), LV_STATUS_INVALID_ARGUMENT);
  EXPECT_EQ(last(), "state_dtype must be float32 (0), bfloat16 (1) or q8 (3: one-byte codes with a float32 scale a block of 256), got float16 (2)");
  lv_param_desc old{};
  old.struct_size = 8;  // from an older, smaller header
  EXPECT_EQ(lv_optimizer_add_param(opt_, g, &old, nullptr), LV_STATUS_INVALID_ARGUMENT);
  EXPECT_NE(last().find("desc->struct_size is 8"), std::string::npos) << last();
  // A state buffer from another optimizer shape.
  ASSERT_EQ(lv_optimizer_add_param(opt_, g, &desc_, nullptr), LV_STATUS_OK);
  size_t n = 0;
  ASSERT_EQ(lv_optimizer_export_state(opt_, nullptr, 0, &n), LV_STATUS_OK);
  std::vector<unsigned char> buf(n);
  EXPECT_EQ(lv_optimizer_export_state(opt_, buf.data(), n - 1, &n), LV_STATUS_INVALID_ARGUMENT);
  EXPECT_NE(last().find("export buffer too small"), std::string::npos);
  ASSERT_EQ(lv_optimizer_export_state(opt_, buf.data(), buf.size(), &n), LV_STATUS_OK);
  EXPECT_EQ(lv_optimizer_import_state(opt_, buf.data(), buf.size() - 1), LV_STATUS_INVALID_ARGUMENT);
  EXPECT_NE(last().find("truncated"), std::string::npos) << last();
}

TEST_F(CApiTest, BadHyperparametersNameTheValueAndTheRange) {
  struct Case {
    void (*set)(lv_hyperparams*);
    const char* message;
  };
  const Case cases[] = {
      {[](lv_hyperparams* h) { h->lr = -0.5; }, "lr must be a finite number >= 0, got -0.5"},
      {[](lv_hyperparams* h) { h->beta1 = 1.5; }, "beta1 must be in [0, 1), got 1.5"},
      {[](lv_hyperparams* h) { h->eps = 0.0; }, "eps must be a finite number > 0, got 0"},
      {[](lv_hyperparams* h) { h->weight_decay = -1.0; }, "weight_decay must be a finite number >= 0, got -1"},
      {[](lv_hyperparams* h) { h->clip = NAN; }, "clip must be a finite number >= 0 (0 turns clipping off), got nan"},
      {[](lv_hyperparams* h) { h->bound_mode = 3; }, "bound_mode must be 0 (none), 1 (abs) or 2 (rel), got 3"},
      {[](lv_hyperparams* h) { h->bound_mode = LV_BOUND_ABS; h->bound = -2; },
       "bound must be a finite number > 0 when bound_mode='abs', got -2"},
      {[](lv_hyperparams* h) { h->nonfinite = 9; }, "nonfinite must be 0 (skip), 1 (raise) or 2 (propagate), got 9"},
      {[](lv_hyperparams* h) { h->maximize = 2; }, "maximize must be 0 or 1, got 2"},
  };
  for (const Case& c : cases) {
    lv_hyperparams h;
    ASSERT_EQ(lv_hyperparams_init(&h), LV_STATUS_OK);
    c.set(&h);
    EXPECT_EQ(lv_optimizer_add_group(opt_, &h, nullptr), LV_STATUS_INVALID_ARGUMENT) << c.message;
    EXPECT_EQ(last(), c.message);
  }
  size_t ng = 0;
  ASSERT_EQ(lv_optimizer_add_group(opt_, &hyper_, &ng), LV_STATUS_OK);
  EXPECT_EQ(ng, 0u);  // no refused group was added
  EXPECT_EQ(lv_optimizer_set_lr(opt_, 0, -1.0), LV_STATUS_INVALID_ARGUMENT);
  EXPECT_EQ(last(), "lr must be a finite number >= 0, got -1");
  double lr = 0;
  ASSERT_EQ(lv_optimizer_get_lr(opt_, 0, &lr), LV_STATUS_OK);
  EXPECT_EQ(lr, 1e-3);
}

TEST_F(CApiTest, HyperparametersAreCheckedAsFloat32TheKernelsSeeThem) {
  struct Case {
    void (*set)(lv_hyperparams*);
    const char* message;
  };
  const Case refused[] = {
      {[](lv_hyperparams* h) { h->lr = 1e39; }, "lr must be finite in float32, got 1e+39"},
      {[](lv_hyperparams* h) { h->beta1 = 0.999999999999; },
       "betas[0] rounds to 1.0 in float32 (got 0.999999999999); use a value <= 0.99999994"},
      {[](lv_hyperparams* h) { h->beta2 = 0.99999999; },
       "betas[1] rounds to 1.0 in float32 (got 0.99999999); use a value <= 0.99999994"},
      {[](lv_hyperparams* h) { h->eps = 1e-50; }, "eps rounds to 0 in float32 (got 1e-50); use eps >= 1e-38"},
      {[](lv_hyperparams* h) { h->eps = 1e39; }, "eps must be finite in float32, got 1e+39"},
      {[](lv_hyperparams* h) { h->weight_decay = 3.5e38; }, "weight_decay must be finite in float32, got 3.5e+38"},
      {[](lv_hyperparams* h) { h->clip = 1e300; }, "clip must be finite in float32, got 1e+300"},
      {[](lv_hyperparams* h) { h->clip = 1e-50; },
       "clip rounds to 0 in float32 (got 1e-50); use clip = 0 to turn clipping off, or clip >= 1e-38"},
      {[](lv_hyperparams* h) { h->bound_mode = LV_BOUND_REL; h->bound = 1e39; },
       "bound must be finite in float32, got 1e+39"},
      {[](lv_hyperparams* h) { h->bound_mode = LV_BOUND_ABS; h->bound = 1e-50; },
       "bound rounds to 0 in float32 (got 1e-50); use bound >= 1e-38"},
  };
  for (const Case& c : refused) {
    lv_hyperparams h;
    ASSERT_EQ(lv_hyperparams_init(&h), LV_STATUS_OK);
    c.set(&h);
    EXPECT_EQ(lv_optimizer_add_group(opt_, &h, nullptr), LV_STATUS_INVALID_ARGUMENT) << c.message;
    EXPECT_EQ(last(), c.message);
  }
  // The edges that are still float32 values pass: the largest float32, the largest beta below 1,
  // the smallest subnormal eps, and bounds or clips that only an unbounded group would ignore.
  const Case accepted[] = {
      {[](lv_hyperparams* h) { h->lr = 3.4028234663852886e38; }, "lr = FLT_MAX"},
      {[](lv_hyperparams* h) { h->beta1 = 0.99999994; h->beta2 = 0.99999997; }, "betas just below 1"},
      {[](lv_hyperparams* h) { h->eps = 1e-45; }, "eps a float32 subnormal"},
      {[](lv_hyperparams* h) { h->clip = 0.0; h->bound = 1e-50; }, "bound unused with bound_mode none"},
  };
  for (const Case& c : accepted) {
    lv_hyperparams h;
    ASSERT_EQ(lv_hyperparams_init(&h), LV_STATUS_OK);
    c.set(&h);
    EXPECT_EQ(lv_optimizer_add_group(opt_, &h, nullptr), LV_STATUS_OK) << c.message << ": " << last();
  }
  // lr set between steps is checked the same way, and a refused one changes nothing.
  EXPECT_EQ(lv_optimizer_set_lr(opt_, 0, 1e39), LV_STATUS_INVALID_ARGUMENT);
  EXPECT_EQ(last(), "lr must be finite in float32, got 1e+39");
  double lr = 0;
  ASSERT_EQ(lv_optimizer_get_lr(opt_, 0, &lr), LV_STATUS_OK);
  EXPECT_EQ(lr, 3.4028234663852886e38);
}

TEST_F(CApiTest, ANumelWhoseByteCountOverflowsIsRefusedWithTheLimit) {
  size_t g = 0;
  ASSERT_EQ(lv_optimizer_add_group(opt_, &hyper_, &g), LV_STATUS_OK);
  desc_.numel = int64_t{1} << 62;  // numel * 4 wraps to 0 in 64 bits
  EXPECT_EQ(lv_optimizer_add_param(opt_, g, &desc_, nullptr), LV_STATUS_INVALID_ARGUMENT);
  EXPECT_EQ(last(), "numel of parameter 0 is 4611686018427387904: its float32 storage, 4 bytes per element, needs "
                    "more than 2^63-1 bytes; numel must be <= 2305843009213693951");
  desc_.numel = int64_t{2305843009213693951} + 1;  // the first numel past the limit
  EXPECT_EQ(lv_optimizer_add_param(opt_, g, &desc_, nullptr), LV_STATUS_INVALID_ARGUMENT);
  EXPECT_NE(last().find("is 2305843009213693952:"), std::string::npos) << last();
  // 16-bit params with float32 states: the states' 4 bytes set the limit.
  desc_.dtype = LV_DTYPE_BFLOAT16;
  desc_.grad_dtype = LV_DTYPE_BFLOAT16;
  EXPECT_EQ(lv_optimizer_add_param(opt_, g, &desc_, nullptr), LV_STATUS_INVALID_ARGUMENT);
  EXPECT_NE(last().find("float32 storage, 4 bytes per element"), std::string::npos) << last();
  // All of 2 bytes: the limit doubles.
  lv_hyperparams bf16 = hyper_;
  bf16.state_dtype = LV_DTYPE_BFLOAT16;
  size_t g16 = 0;
  ASSERT_EQ(lv_optimizer_add_group(opt_, &bf16, &g16), LV_STATUS_OK);
  desc_.numel = int64_t{1} << 62;
  EXPECT_EQ(lv_optimizer_add_param(opt_, g16, &desc_, nullptr), LV_STATUS_INVALID_ARGUMENT);
  EXPECT_EQ(last(), "numel of parameter 0 is 4611686018427387904: its bfloat16 storage, 2 bytes per element, needs "
                    "more than 2^63-1 bytes; numel must be <= 4611686018427387903");
  size_t n = 99;
  ASSERT_EQ(lv_optimizer_get_num_params(opt_, &n), LV_STATUS_OK);
  EXPECT_EQ(n, 0u);  // nothing was added
}

TEST_F(CApiTest, NonFiniteRaiseReturnsItsStatusAndChangesNothing) {
  hyper_.nonfinite = LV_NONFINITE_RAISE;
  ASSERT_EQ(lv_optimizer_add_group(opt_, &hyper_, nullptr), LV_STATUS_OK);
  ASSERT_EQ(lv_optimizer_add_param(opt_, 0, &desc_, nullptr), LV_STATUS_OK);
  grad_[4] = NAN;
  EXPECT_EQ(lv_optimizer_step(opt_, nullptr), LV_STATUS_NON_FINITE);
  EXPECT_NE(last().find("parameter 0"), std::string::npos);
  EXPECT_EQ(param_, std::vector<float>(33, 1.0f));
  int64_t step = -1;
  ASSERT_EQ(lv_optimizer_get_param_step(opt_, 0, &step), LV_STATUS_OK);
  EXPECT_EQ(step, 0);
}

TEST_F(CApiTest, ADestroyedOptimizerIsRecognised) {
  lv_optimizer* stale = opt_;
  ASSERT_EQ(lv_optimizer_destroy(opt_), LV_STATUS_OK);
  opt_ = nullptr;
  EXPECT_EQ(lv_optimizer_step(stale, nullptr), LV_STATUS_STATE_ERROR);
  EXPECT_NE(last().find("is not live"), std::string::npos) << last();
  EXPECT_EQ(lv_optimizer_destroy(stale), LV_STATUS_STATE_ERROR);
  EXPECT_EQ(lv_optimizer_destroy(nullptr), LV_STATUS_INVALID_ARGUMENT);
  // A new optimizer never reuses the stale token.
  lv_optimizer* fresh = nullptr;
  ASSERT_EQ(lv_optimizer_create(&options_, &fresh), LV_STATUS_OK);
  EXPECT_NE(fresh, stale);
  EXPECT_EQ(lv_optimizer_add_group(stale, &hyper_, nullptr), LV_STATUS_STATE_ERROR);
  EXPECT_EQ(lv_optimizer_destroy(fresh), LV_STATUS_OK);
  // A made-up token.
  EXPECT_EQ(lv_optimizer_step(reinterpret_cast<lv_optimizer*>(0x1234), nullptr), LV_STATUS_STATE_ERROR);
}

TEST_F(CApiTest, CudaWithoutABundleOrDriverIsRefused) {
  lv_optimizer_options o;
  ASSERT_EQ(lv_optimizer_options_init(&o), LV_STATUS_OK);
  o.device = LV_DEVICE_CUDA;
  lv_optimizer* out = reinterpret_cast<lv_optimizer*>(0x1);
  EXPECT_EQ(lv_optimizer_create(&o, &out), LV_STATUS_INVALID_ARGUMENT);
  EXPECT_NE(last().find("needs an AOT bundle"), std::string::npos) << last();
  EXPECT_EQ(out, reinterpret_cast<lv_optimizer*>(0x1));  // untouched
  o.device = 5;
  EXPECT_EQ(lv_optimizer_create(&o, &out), LV_STATUS_INVALID_ARGUMENT);
  EXPECT_EQ(last(), "device must be LV_DEVICE_CPU (0), LV_DEVICE_CUDA (1) or LV_DEVICE_HIP (2), got 5");
  o.device = LV_DEVICE_CUDA;
  o.bundle_dir = "/nonexistent/bundle";
  if (!lv_cuda_driver_available()) {
    EXPECT_EQ(lv_optimizer_create(&o, &out), LV_STATUS_DRIVER_ERROR);
    EXPECT_NE(last().find("libcuda"), std::string::npos) << last();
  }
  // With a driver (here a fake table that is never called), a missing bundle is a bundle error.
  luminav::CudaDriverApi fake;
  fake.origin = "fake driver (test_c_api)";
  luminav::ScopedDriverOverride use_fake(&fake);
  EXPECT_EQ(lv_optimizer_create(&o, &out), LV_STATUS_BUNDLE_ERROR);
  EXPECT_NE(last().find("/nonexistent/bundle"), std::string::npos) << last();
  EXPECT_EQ(out, reinterpret_cast<lv_optimizer*>(0x1));
}

TEST_F(CApiTest, CppApiThrowsWithTheStatusAndRoundTripsState) {
  std::vector<float> w(100, 0.5f), g(100, -0.1f), w2 = w;
  luminav::Optimizer a(luminav::OptimizerOptions().threads(2).with_seed(3));
  const auto ga = a.add_group(luminav::Hyperparams().with_lr(1e-2).with_clip(1.0));
  a.add_param(ga, luminav::ParamRef::f32(w.data(), g.data(), 100));
  a.step();
  const std::vector<std::uint8_t> state = a.export_state();
  a.step();

  luminav::Optimizer b(luminav::OptimizerOptions().threads(1));
  const auto gb = b.add_group(luminav::Hyperparams().with_lr(1e-2).with_clip(1.0));
  b.add_param(gb, luminav::ParamRef::f32(w2.data(), g.data(), 100));
  b.step();  // the first step, bitwise as a's (the seed only matters for bf16)
  b.import_state(state);
  b.step();
  EXPECT_EQ(w, w2);
  EXPECT_EQ(b.param_step(0), 2);
  EXPECT_EQ(b.seed(), 3u);
  try {
    b.add_group(luminav::Hyperparams().with_betas(0.9, -0.1));
    FAIL();
  } catch (const luminav::Error& e) {
    EXPECT_EQ(e.status(), luminav::Status::kInvalidArgument);
    EXPECT_STREQ(e.what(), "beta2 must be in [0, 1), got -0.10000000000000001");
  }
  luminav::Optimizer moved = std::move(b);
  EXPECT_EQ(moved.num_params(), 1u);
}

}  // namespace
