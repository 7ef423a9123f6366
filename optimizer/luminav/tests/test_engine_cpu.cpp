// tests/test_engine_cpu.cpp: the engine on CPU (src/engine/engine.cpp, cpu_device.cpp,
// cpu_kernels.cpp): the update against a plain scalar transcription of docs/tdclm.md,
// thread-count independence, skip/raise, borrowed state, validation
#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <cstring>
#include <random>
#include <vector>

#include "engine/cpu_kernels.h"
#include "engine/engine.h"
#include "fakes/host_model.h"

using luminav::BoundMode;
using luminav::DType;
using luminav::Engine;
using luminav::EngineOptions;
using luminav::Hyper;
using luminav::NonFinite;
using luminav::ParamDesc;
using namespace luminav_test;

namespace {

// docs/tdclm.md for float32 storage, one element at a time.
void scalar_step(std::vector<float>& p, const std::vector<float>& grad, std::vector<float>& m, std::vector<float>& v,
                 const std::vector<float>& p0, const Hyper& h, std::int64_t t) {
  const float b1 = static_cast<float>(h.beta1), b2 = static_cast<float>(h.beta2), eps = static_cast<float>(h.eps);
  const float lr = static_cast<float>(h.lr), wd = static_cast<float>(h.weight_decay);
  const float bc1 = static_cast<float>(1.0 - std::pow(static_cast<double>(b1), static_cast<double>(t)));
  const float bc2 = static_cast<float>(1.0 - std::pow(static_cast<double>(b2), static_cast<double>(t)));
  const float sign = h.maximize ? -1.0f : 1.0f;
  const std::size_t n = p.size();
  std::vector<float> u(n), mn(n), vn(n);
  double s = 0;
  for (std::size_t i = 0; i < n; ++i) {
    const float g = grad[i] * sign;
    mn[i] = b1 * m[i] + (1.0f - b1) * g;
    vn[i] = b2 * v[i] + (1.0f - b2) * (g * g);
    u[i] = (mn[i] * (1.0f / bc1)) / (std::sqrt(vn[i] * (1.0f / bc2)) + eps);
    s += static_cast<double>(u[i]) * u[i];
  }
  const float tau = static_cast<float>(h.clip) * std::sqrt(static_cast<float>(s) / static_cast<float>(n));
  for (std::size_t i = 0; i < n; ++i) {
    float ui = u[i];
    if (h.clip > 0) ui = tau > 0 ? tau * std::tanh(ui * (1.0f / tau)) : 0.0f;
    float q = p[i] * (1.0f - lr * wd) - lr * ui;
    if (h.bound_mode != BoundMode::kNone) {
      const float r = h.bound_mode == BoundMode::kAbs ? static_cast<float>(h.bound)
                                                      : static_cast<float>(h.bound) * std::sqrt(p0[i] * p0[i] + 1e-4f);
      q = std::min(std::max(q, p0[i] - r), p0[i] + r);
    }
    p[i] = q;
    m[i] = mn[i];
    v[i] = vn[i];
  }
}

class EngineCpuTest : public ::testing::Test {};

TEST_F(EngineCpuTest, AdamWModeIsBitwiseTheScalarSpec) {
  Hyper h;
  h.clip = 0.0;
  h.nonfinite = NonFinite::kPropagate;
  h.lr = 3e-3;
  h.weight_decay = 0.1;
  Model model = Model::make({1, 7, 2048, 5000}, DType::kFloat32, 1);
  auto e = make_engine(model, h, 2);
  std::vector<std::vector<float>> p = model.f32, m, v;
  for (auto& x : p) {
    m.emplace_back(x.size(), 0.0f);
    v.emplace_back(x.size(), 0.0f);
  }
  for (int step = 1; step <= 4; ++step) {
    model.perturb_grads(step);
    e->step();
    for (std::size_t j = 0; j < p.size(); ++j) scalar_step(p[j], model.grads[j], m[j], v[j], {}, h, step);
  }
  for (std::size_t j = 0; j < p.size(); ++j) {
    ASSERT_EQ(0, std::memcmp(p[j].data(), model.f32[j].data(), p[j].size() * 4)) << "tensor " << j;
    EXPECT_EQ(e->param_step(j), 4);
  }
}

TEST_F(EngineCpuTest, ClipAndBoundsMatchTheScalarSpecWithinRounding) {
  for (BoundMode mode : {BoundMode::kNone, BoundMode::kAbs, BoundMode::kRel}) {
    Hyper h;
    h.clip = 0.5;  // small enough that tanh bites
    h.bound_mode = mode;
    h.bound = 0.004;
    h.lr = 1e-2;
    h.maximize = mode == BoundMode::kRel;
    Model model = Model::make({3, 4099, 333}, DType::kFloat32, 2);
    auto e = make_engine(model, h, 3);
    std::vector<std::vector<float>> p = model.f32, m, v, p0 = model.f32;
    for (auto& x : p) {
      m.emplace_back(x.size(), 0.0f);
      v.emplace_back(x.size(), 0.0f);
    }
    for (int step = 1; step <= 3; ++step) {
      model.perturb_grads(step);
      e->step();
      for (std::size_t j = 0; j < p.size(); ++j) scalar_step(p[j], model.grads[j], m[j], v[j], p0[j], h, step);
    }
    for (std::size_t j = 0; j < p.size(); ++j) {
      for (std::size_t i = 0; i < p[j].size(); ++i) {
        // S is summed in another order: tau, hence u, differ by a few float32 ulps; the
        // step moves p by lr*u, so |dp| <= lr * |u| * 1e-5 + p's own ulp.
        ASSERT_NEAR(model.f32[j][i], p[j][i], 1e-7 + std::abs(p[j][i]) * 2.4e-7) << "mode " << static_cast<int>(mode) << " tensor " << j << " i " << i;
        if (mode != BoundMode::kNone) {
          const float r = mode == BoundMode::kAbs ? 0.004f : 0.004f * std::sqrt(p0[j][i] * p0[j][i] + 1e-4f);
          // The bounds are the float32 values p0 - r and p0 + r (step 7 of docs/internals.md).
          ASSERT_GE(model.f32[j][i], p0[j][i] - r);
          ASSERT_LE(model.f32[j][i], p0[j][i] + r);
        }
      }
    }
  }
}

TEST_F(EngineCpuTest, ThreadCountDoesNotChangeAnyBit) {
  for (DType dt : {DType::kBFloat16, DType::kFloat16, DType::kFloat32}) {
    Hyper h;
    h.clip = 1.0;
    h.bound_mode = BoundMode::kRel;
    h.bound = 0.5;
    h.state_dtype = dt == DType::kFloat16 ? DType::kFloat32 : DType::kBFloat16;
    std::vector<std::int64_t> sizes = {1, 2047, 2048, 2049, 123457, 0, 31, 70001};
    Model a = Model::make(sizes, dt, 3), b = Model::make(sizes, dt, 3);
    auto e1 = make_engine(a, h, 1);
    auto e4 = make_engine(b, h, 4);
    for (int step = 0; step < 3; ++step) {
      a.perturb_grads(step);
      b.perturb_grads(step);
      e1->step();
      e4->step();
    }
    EXPECT_EQ(a.bytes(), b.bytes()) << luminav::dtype_name(dt);
    EXPECT_EQ(e1->export_state(), e4->export_state()) << luminav::dtype_name(dt);
    EXPECT_EQ(e4->num_threads(), 4);
  }
}

TEST_F(EngineCpuTest, NonFiniteGradientSkipsTheWholeStepAcrossGroups) {
  EngineOptions o;
  o.num_threads = 2;
  Engine e(o);
  Hyper skip;  // nonfinite = skip
  Hyper prop;
  prop.nonfinite = NonFinite::kPropagate;
  prop.clip = 0.0;
  const std::size_t g0 = e.add_group(skip);
  const std::size_t g1 = e.add_group(prop);
  std::vector<float> p0(100, 1.0f), gr0(100, 0.1f), p1(50, 2.0f), gr1(50, 0.2f);
  ParamDesc d0{p0.data(), DType::kFloat32, gr0.data(), DType::kFloat32, 100};
  ParamDesc d1{p1.data(), DType::kFloat32, gr1.data(), DType::kFloat32, 50};
  e.add_param(g0, d0);
  e.add_param(g1, d1);
  e.step();
  const std::vector<float> p0_before = p0, p1_before = p1;
  const std::vector<std::uint8_t> state_before = e.export_state();
  gr0[17] = NAN;
  e.step();
  // The skip group changed nothing; its skip decision is global, but only checking groups obey it.
  EXPECT_EQ(0, std::memcmp(p0.data(), p0_before.data(), 400));
  EXPECT_EQ(e.param_step(0), 1);
  EXPECT_EQ(e.skipped_steps(), 1);
  EXPECT_EQ(e.param_step(1), 2);  // propagate: AdamW semantics, applied
  EXPECT_NE(0, std::memcmp(p1.data(), p1_before.data(), 200));
  gr0[17] = 0.1f;
  e.step();
  EXPECT_EQ(e.param_step(0), 2);
  EXPECT_EQ(e.skipped_steps(), 1);
  // A non-finite gradient in the non-skipping group does not skip the other group's step.
  gr1[3] = INFINITY;
  const std::vector<float> p0_mid = p0;
  e.step();
  EXPECT_NE(0, std::memcmp(p0.data(), p0_mid.data(), 400));
  EXPECT_EQ(e.skipped_steps(), 1);
  (void)state_before;
}

TEST_F(EngineCpuTest, RaiseRefusesTheStepNamingTheParameterAndChangesNothing) {
  Hyper h;
  h.nonfinite = NonFinite::kRaise;
  h.bound_mode = BoundMode::kAbs;
  Model m = Model::make({10, 20, 30}, DType::kFloat32, 6);
  auto e = make_engine(m, h, 2);
  m.grads[2][29] = -INFINITY;
  const std::vector<std::uint8_t> params = m.bytes();
  const std::vector<std::uint8_t> state = e->export_state();
  try {
    e->step();
    FAIL() << "step with an infinite gradient and nonfinite=raise succeeded";
  } catch (const luminav::Error& err) {
    EXPECT_EQ(err.status(), luminav::Status::kNonFinite);
    EXPECT_NE(std::string(err.what()).find("parameter 2"), std::string::npos) << err.what();
  }
  EXPECT_EQ(m.bytes(), params);
  EXPECT_EQ(e->export_state(), state);
  EXPECT_EQ(e->param_step(2), 0);
}

TEST_F(EngineCpuTest, BorrowedStateGivesTheSameBitsAsOwnedState) {
  Hyper h;
  h.bound_mode = BoundMode::kRel;
  h.state_dtype = DType::kBFloat16;
  Model a = Model::make({300, 5000}, DType::kBFloat16, 7), b = Model::make({300, 5000}, DType::kBFloat16, 7);
  auto owned = make_engine(a, h, 2);
  EngineOptions o;
  o.num_threads = 2;
  o.seed = 1234;
  Engine borrowed(o);
  const std::size_t g = borrowed.add_group(h);
  std::vector<std::vector<std::uint16_t>> ms, vs, p0s;
  for (std::size_t j = 0; j < b.size(); ++j) {
    const std::size_t n = b.grads[j].size();
    ms.emplace_back(n, 0);
    vs.emplace_back(n, 0);
    p0s.emplace_back(n, 0);
  }
  for (std::size_t j = 0; j < b.size(); ++j) {
    ParamDesc d{b.data(j), DType::kBFloat16, b.grads[j].data(), DType::kFloat32, static_cast<std::int64_t>(b.grads[j].size()),
                ms[j].data(), vs[j].data(), p0s[j].data()};
    borrowed.add_param(g, d);
  }
  for (int step = 0; step < 3; ++step) {
    a.perturb_grads(step);
    b.perturb_grads(step);
    owned->step();
    borrowed.step();
  }
  EXPECT_EQ(a.bytes(), b.bytes());
  EXPECT_EQ(owned->export_state(), borrowed.export_state());
  EXPECT_EQ(p0s[1][7], Model::make({300, 5000}, DType::kBFloat16, 7).half[1][7]);  // p_init holds the initial p
}

TEST_F(EngineCpuTest, MaximizeEqualsMinimizingTheNegatedGradient) {
  Hyper up;
  up.maximize = true;
  Hyper down;
  Model a = Model::make({1000}, DType::kBFloat16, 8), b = Model::make({1000}, DType::kBFloat16, 8);
  for (auto& x : b.grads[0]) x = -x;
  auto ea = make_engine(a, up, 2), eb = make_engine(b, down, 2);
  ea->step();
  eb->step();
  EXPECT_EQ(a.bytes(), b.bytes());
}

TEST_F(EngineCpuTest, ParamsWithoutGradientAreLeftAlone) {
  Hyper h;
  Model m = Model::make({64, 64}, DType::kFloat32, 9);
  auto e = make_engine(m, h, 1);
  e->set_grad(1, nullptr);
  const std::vector<float> before = m.f32[1];
  e->step();
  EXPECT_EQ(before, m.f32[1]);
  EXPECT_EQ(e->param_step(1), 0);
  EXPECT_EQ(e->param_step(0), 1);
}

TEST_F(EngineCpuTest, ValidationNamesTheValueAndTheRange) {
  EngineOptions o;
  Engine e(o);
  Hyper h;
  h.beta2 = 1.0;
  try {
    e.add_group(h);
    FAIL();
  } catch (const luminav::Error& err) {
    EXPECT_EQ(err.status(), luminav::Status::kInvalidArgument);
    EXPECT_STREQ(err.what(), "beta2 must be in [0, 1), got 1");
  }
  h = Hyper();
  h.bound_mode = BoundMode::kRel;
  h.bound = 0.0;
  try {
    e.add_group(h);
    FAIL();
  } catch (const luminav::Error& err) {
    EXPECT_STREQ(err.what(), "bound must be a finite number > 0 when bound_mode='rel', got 0");
  }
  EXPECT_EQ(e.num_groups(), 0u);
}

}  // namespace
