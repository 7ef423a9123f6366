// tests/test_group.cpp: the launch groups Python's native backends drive (src/engine/group.h):
// make_config and make_rows refusals, CpuGroup against the engine's own passes
#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <string>
#include <vector>

#include "engine/cpu_kernels.h"
#include "engine/engine.h"
#include "engine/group.h"
#include "luminav/error.h"

using luminav::CpuGroup;
using luminav::GroupConfig;
using luminav::RowTuple;
using luminav::Status;

namespace {

// Expects `fn` to throw luminav::Error with `status` and exactly `message`.
template <typename Fn>
void expect_refused(Fn&& fn, Status status, const std::string& message) {
  try {
    fn();
    ADD_FAILURE() << "did not throw; expected: " << message;
  } catch (const luminav::Error& e) {
    EXPECT_EQ(e.status(), status) << e.what();
    EXPECT_EQ(std::string(e.what()), message);
  }
}

GroupConfig default_config(int bound_mode = 0) {
  return luminav::make_config(0, 0, 0, 0.9, 0.999, 1e-8, 0.01, 1.0, bound_mode, 0.5, false, 0, false, 7);
}

std::uintptr_t addr(const void* p) { return reinterpret_cast<std::uintptr_t>(p); }

// One tensor of host memory with its state, as Python's cpu backend hands it over.
struct HostTensor {
  std::vector<float> p, g, m, v, p0;
  std::int64_t step = 0;
  explicit HostTensor(std::size_t n, float grad = 0.5f) : p(n, 1.0f), g(n, grad), m(n, 0.0f), v(n, 0.0f), p0(n, 1.0f) {}
  RowTuple row(std::int64_t k, bool bounded = false) {
    const auto n = static_cast<std::int64_t>(p.size());
    return RowTuple{addr(p.data()), addr(g.data()), addr(m.data()), addr(v.data()), bounded ? addr(p0.data()) : 0,
                    addr(&step), n, 0, k, n};
  }
};

TEST(MakeConfig, CopiesTheValuesAndValidatesThem) {
  const GroupConfig c = luminav::make_config(1, 2, 1, 0.8, 0.99, 1e-6, 0.1, 2.0, 2, 0.25, true, 2, true, 42);
  EXPECT_EQ(c.param_dtype, luminav::DType::kBFloat16);
  EXPECT_EQ(c.grad_dtype, luminav::DType::kFloat16);
  EXPECT_EQ(c.state_dtype, luminav::DType::kBFloat16);
  EXPECT_EQ(c.hyper.state_dtype, luminav::DType::kBFloat16);
  EXPECT_EQ(c.hyper.beta1, 0.8);
  EXPECT_EQ(c.hyper.bound_mode, luminav::BoundMode::kRel);
  EXPECT_EQ(c.hyper.nonfinite, luminav::NonFinite::kPropagate);
  EXPECT_TRUE(c.hyper.maximize);
  EXPECT_EQ(c.hyper.lr, 0.0);  // lr comes with each step
  EXPECT_EQ(c.seed, 42u);
  auto config = [](int p, double beta1, int bound_mode, int nonfinite, int state) {
    return [=] { luminav::make_config(p, 0, state, beta1, 0.999, 1e-8, 0.0, 0.0, bound_mode, 1.0, false, nonfinite, false, 0); };
  };
  expect_refused(config(5, 0.9, 0, 0, 0), Status::kInvalidArgument,
                 "param_dtype must be a dtype code 0 (float32), 1 (bfloat16) or 2 (float16), got 5");
  expect_refused(config(0, 1.5, 0, 0, 0), Status::kInvalidArgument, "beta1 must be in [0, 1), got 1.5");
  expect_refused(config(0, 0.9, 3, 0, 0), Status::kInvalidArgument, "bound_mode must be 0 (none), 1 (abs) or 2 (rel), got 3");
  expect_refused(config(0, 0.9, 0, -1, 0), Status::kInvalidArgument,
                 "nonfinite must be 0 (skip), 1 (raise) or 2 (propagate), got -1");
  expect_refused(config(0, 0.9, 0, 0, 2), Status::kInvalidArgument, "state_dtype must be float32 (0) or bfloat16 (1), got float16 (2)");
}

TEST(MakeRows, RefusesEachBadRowByIndex) {
  HostTensor a(8), b(8);
  const RowTuple good = a.row(0);
  auto rows_with = [&](auto edit) {
    RowTuple r = b.row(1);
    edit(r);
    return std::vector<RowTuple>{good, r};
  };
  auto refused = [](const std::vector<RowTuple>& rows, bool bounded, const std::string& message) {
    expect_refused([&] { luminav::make_rows(rows, bounded); }, Status::kInvalidArgument, message);
  };
  refused(rows_with([](RowTuple& r) { std::get<6>(r) = -3; }), false, "row 1: numel must be >= 0, got -3");
  refused(rows_with([](RowTuple& r) { std::get<5>(r) = 0; }), false, "row 1: the step counter address is 0");
  for (int field : {0, 1, 2, 3}) {
    SCOPED_TRACE(field);
    RowTuple r = b.row(1);
    if (field == 0) std::get<0>(r) = 0;
    if (field == 1) std::get<1>(r) = 0;
    if (field == 2) std::get<2>(r) = 0;
    if (field == 3) std::get<3>(r) = 0;
    refused({good, r}, false, "row 1: a param/grad/exp_avg/exp_avg_sq address is 0");
  }
  refused({good}, true, "row 0: bound_mode is not none but the p_init address is 0");
  refused(rows_with([](RowTuple& r) { std::get<7>(r) = 4; }), false, "row 1: global_numel 8 < elem_offset + numel = 12");
  // An empty tensor needs no storage, but still its step counter.
  RowTuple empty = b.row(1);
  std::get<0>(empty) = std::get<1>(empty) = std::get<2>(empty) = std::get<3>(empty) = 0;
  std::get<6>(empty) = std::get<9>(empty) = 0;
  const std::vector<luminav::TensorRow> rows = luminav::make_rows({good, empty}, false);
  ASSERT_EQ(rows.size(), 2u);
  EXPECT_EQ(rows[0].param, a.p.data());
  EXPECT_EQ(rows[0].step, &a.step);
  EXPECT_EQ(rows[0].global_numel, 8);
  EXPECT_EQ(rows[1].numel, 0);
}

TEST(PoolFor, SharesOnePoolPerSizeAndRefusesANegativeCount) {
  EXPECT_EQ(luminav::pool_for(2), luminav::pool_for(2));
  EXPECT_EQ(luminav::pool_for(2)->size(), 2);
  EXPECT_GE(luminav::pool_for(0)->size(), 1);
  expect_refused([] { luminav::pool_for(-1); }, Status::kInvalidArgument, "num_threads must be >= 0, got -1");
}

TEST(CpuGroup, RunsTheEnginesPassesOnTheRows) {
  HostTensor a(3000), b(5);
  HostTensor ref_a(3000), ref_b(5);
  const GroupConfig cfg = default_config();
  CpuGroup group(cfg, {a.row(0), b.row(1)}, 2);
  EXPECT_EQ(group.size(), 2u);
  EXPECT_EQ(group.num_threads(), 2);
  std::vector<float> stats(2, 0.0f);
  std::int32_t found_inf = 0;
  group.pass1(addr(stats.data()), addr(&found_inf));
  group.pass2(1e-2, addr(stats.data()), addr(&found_inf));
  group.commit(addr(&found_inf));
  // The same through the engine's kernels directly.
  const std::vector<luminav::TensorRow> rows = luminav::make_rows({ref_a.row(0), ref_b.row(1)}, false);
  std::vector<float> ref_stats(2, 0.0f);
  std::int32_t ref_flag = 0;
  auto pool = luminav::pool_for(1);
  luminav::cpu::pass1(cfg, rows.data(), rows.size(), ref_stats.data(), &ref_flag, *pool);
  luminav::cpu::pass2(cfg, rows.data(), rows.size(), 1e-2f, ref_stats.data(), &ref_flag, *pool);
  luminav::cpu::commit(cfg, rows.data(), rows.size(), &ref_flag);
  EXPECT_EQ(stats, ref_stats);
  EXPECT_EQ(a.p, ref_a.p);
  EXPECT_EQ(b.m, ref_b.m);
  EXPECT_EQ(a.step, 1);
  EXPECT_EQ(b.step, 1);
  EXPECT_LT(a.p[0], 1.0f);
  EXPECT_EQ(group.first_nonfinite(), -1);
  b.g[3] = std::nanf("");
  EXPECT_EQ(group.first_nonfinite(), 1);
  expect_refused([&] { group.pass2(-1.0, addr(stats.data()), addr(&found_inf)); }, Status::kInvalidArgument,
                 "lr must be a finite number >= 0, got -1");
  expect_refused([&] { CpuGroup(cfg, {a.row(0)}, -2); }, Status::kInvalidArgument, "num_threads must be >= 0, got -2");
  expect_refused([&] { CpuGroup(default_config(1), {a.row(0)}, 1); }, Status::kInvalidArgument,
                 "row 0: bound_mode is not none but the p_init address is 0");
}

}  // namespace
