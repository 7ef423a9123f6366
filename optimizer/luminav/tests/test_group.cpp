// tests/test_group.cpp: the launch groups Python's native backends drive (src/engine/group.h):
// make_config and make_rows refusals, CpuGroup against the engine's own passes, cpu_step against
// CpuGroup's passes one by one, and AotGroup on
// the fake CUDA device: bound once, each launch with the bound arguments and one context check;
// set_lr and set_flags change only those arguments
#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <string>
#include <vector>

#include "engine/cpu_kernels.h"
#include "engine/engine.h"
#include "engine/group.h"
#include "engine/group_launch.h"
#include "fakes/expect_error.h"
#include "fakes/fake_cuda_device.h"
#include "luminav/error.h"

using luminav::AotGroup;
using luminav::CpuGroup;
using luminav::CUdeviceptr;
using luminav::CUstream;
using luminav::GroupConfig;
using luminav::Hyper;
using luminav::RowTuple;
using luminav::Status;
using namespace luminav_test;

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

// The record Python hands over (optimizer/_groups.py, Hyper): every field but lr and state_dtype.
Hyper hyper(double beta1, double clip, int bound_mode, double bound, int nonfinite, bool sr, double weight_decay = 0.01,
            double beta2 = 0.999, double eps = 1e-8, bool maximize = false) {
  Hyper h;
  h.beta1 = beta1;
  h.beta2 = beta2;
  h.eps = eps;
  h.weight_decay = weight_decay;
  h.clip = clip;
  h.bound_mode = luminav::bound_mode_from_int(bound_mode);
  h.bound = bound;
  h.maximize = maximize;
  h.nonfinite = luminav::nonfinite_from_int(nonfinite);
  h.stochastic_rounding = sr;
  return h;
}

GroupConfig default_config(int bound_mode = 0) {
  return luminav::make_config(0, 0, 0, hyper(0.9, 1.0, bound_mode, 0.5, 0, false), 7);
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
                    addr(&step), n, 0, k, n, 0, 0, 0};
  }
};

TEST(MakeConfig, CopiesTheValuesAndValidatesThem) {
  const GroupConfig c = luminav::make_config(1, 2, 1, hyper(0.8, 2.0, 2, 0.25, 2, true, 0.1, 0.99, 1e-6, true), 42);
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
    return [=] { luminav::make_config(p, 0, state, hyper(beta1, 0.0, bound_mode, 1.0, nonfinite, false, 0.0), 0); };
  };
  expect_refused(config(5, 0.9, 0, 0, 0), Status::kInvalidArgument,
                 "param_dtype must be a dtype code 0 (float32), 1 (bfloat16) or 2 (float16), got 5");
  expect_refused(config(0, 1.5, 0, 0, 0), Status::kInvalidArgument, "beta1 must be in [0, 1), got 1.5");
  expect_refused(config(0, 0.9, 3, 0, 0), Status::kInvalidArgument, "bound_mode must be 0 (none), 1 (abs) or 2 (rel), got 3");
  expect_refused(config(0, 0.9, 0, -1, 0), Status::kInvalidArgument,
                 "nonfinite must be 0 (skip), 1 (raise) or 2 (propagate), got -1");
  expect_refused([] { luminav::nonfinite_from_name("sometimes"); }, Status::kInvalidArgument,
                 "nonfinite must be \"skip\", \"raise\" or \"propagate\", got \"sometimes\"");
  expect_refused(config(0, 0.9, 0, 0, 2), Status::kInvalidArgument, "state_dtype must be float32 (0), bfloat16 (1) or q8 (3: one-byte codes with a float32 scale a block of 256), got float16 (2)");
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

TEST(MakeRows, TakesQ8FieldsOnlyInAQ8GroupAndChecksThem) {
  HostTensor a(512);
  float scales[4] = {};
  auto q8_row = [&](std::int64_t row_len, std::uintptr_t sm, std::uintptr_t sv) {
    RowTuple r = a.row(0);
    std::get<10>(r) = sm;
    std::get<11>(r) = sv;
    std::get<12>(r) = row_len;
    return std::vector<RowTuple>{r};
  };
  auto refused = [](const std::vector<RowTuple>& rows, bool q8, const std::string& message) {
    expect_refused([&] { luminav::make_rows(rows, false, q8); }, Status::kInvalidArgument, message);
  };
  const std::uintptr_t sm = addr(scales), sv = addr(scales + 2);
  refused(q8_row(256, sm, sv), false,
          "row 0: scale addresses or a row_len (256) given, but the group's state dtype is not q8; pass 0, 0, 0 or "
          "state_dtype q8 (3)");
  refused(q8_row(0, sm, sv), true, "row 0: q8 row_len must be > 0 and divide numel 512, got 0; pass the elements of one row of the "
          "parameter (numel / shape[0])");
  refused(q8_row(300, sm, sv), true, "row 0: q8 row_len must be > 0 and divide numel 512, got 300; pass the elements of one row of the "
          "parameter (numel / shape[0])");
  refused(q8_row(256, 0, sv), true, "row 0: a q8 scale address (exp_avg_scale/exp_avg_sq_scale) is 0");
  refused(q8_row(256, sm, 0), true, "row 0: a q8 scale address (exp_avg_scale/exp_avg_sq_scale) is 0");
  const std::vector<luminav::TensorRow> rows = luminav::make_rows(q8_row(256, sm, sv), false, true);
  EXPECT_EQ(rows[0].scale_m, scales);
  EXPECT_EQ(rows[0].scale_v, scales + 2);
  EXPECT_EQ(rows[0].row_len, 256);
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

TEST(CpuStep, IsTheGroupsPassesInOneCallAndCountsASkip) {
  // two groups, both with nonfinite "skip" (code 0), one flag; a third that propagates (code 2)
  // with a scratch flag of its own
  const GroupConfig skip = default_config();
  const GroupConfig propagate = luminav::make_config(0, 0, 0, hyper(0.9, 0.0, 0, 1.0, 2, false), 7);
  HostTensor a(3000), b(5), c(40);
  HostTensor ref_a(3000), ref_b(5), ref_c(40);
  CpuGroup g1(skip, {a.row(0)}, 2), g2(skip, {b.row(1)}, 2), g3(propagate, {c.row(2)}, 2);
  CpuGroup r1(skip, {ref_a.row(0)}, 2), r2(skip, {ref_b.row(1)}, 2), r3(propagate, {ref_c.row(2)}, 2);
  std::vector<float> s1(1), s2(1), s3(1), t1(1), t2(1), t3(1);
  std::int32_t flag = 0, scratch = 0, ref_flag = 0, ref_scratch = 0;
  std::int64_t skipped = 0;
  auto one_call = [&] {
    luminav::cpu_step({{&g1, 1e-2, addr(s1.data()), addr(&flag)},
                       {&g2, 2e-2, addr(s2.data()), addr(&flag)},
                       {&g3, 1e-2, addr(s3.data()), addr(&scratch)}},
                      addr(&flag), addr(&skipped));
  };
  auto by_pass = [&] {
    r1.pass1(addr(t1.data()), addr(&ref_flag));
    r2.pass1(addr(t2.data()), addr(&ref_flag));
    r1.pass2(1e-2, addr(t1.data()), addr(&ref_flag));
    r1.commit(addr(&ref_flag));
    r2.pass2(2e-2, addr(t2.data()), addr(&ref_flag));
    r2.commit(addr(&ref_flag));
    r3.pass2(1e-2, addr(t3.data()), addr(&ref_scratch));
    r3.commit(addr(&ref_scratch));
    ref_flag = 0;
  };
  one_call();
  by_pass();
  EXPECT_EQ(a.p, ref_a.p);
  EXPECT_EQ(b.v, ref_b.v);
  EXPECT_EQ(c.p, ref_c.p);
  EXPECT_EQ(s1, t1);
  EXPECT_EQ((std::vector<std::int64_t>{a.step, b.step, c.step, skipped}), (std::vector<std::int64_t>{1, 1, 1, 0}));
  // a NaN in the second group skips both skip groups, counted once; the third steps on
  b.g[2] = std::nanf("");
  const std::vector<float> pa = a.p, pb = b.p, mb = b.m;
  one_call();
  EXPECT_EQ(a.p, pa);
  EXPECT_EQ(b.p, pb);
  EXPECT_EQ(b.m, mb);
  EXPECT_EQ((std::vector<std::int64_t>{a.step, b.step, c.step, skipped}), (std::vector<std::int64_t>{1, 1, 2, 1}));
  EXPECT_EQ(flag, 0);
  EXPECT_EQ(scratch, 0);
  // a bad lr of the last group is refused before the first group changes
  b.g[2] = 0.5f;
  const std::vector<float> before = a.p;
  expect_refused([&] {
    luminav::cpu_step({{&g1, 1e-2, addr(s1.data()), addr(&flag)}, {&g2, -1.0, addr(s2.data()), addr(&flag)}},
                      addr(&flag), addr(&skipped));
  }, Status::kInvalidArgument, "lr must be a finite number >= 0, got -1");
  EXPECT_EQ(a.p, before);
  EXPECT_EQ(a.step, 1);
  expect_refused([&] { luminav::cpu_step({{nullptr, 1e-2, 0, addr(&flag)}}, 0, 0); }, Status::kInvalidArgument,
                 "cpu_step: item 0 has no group");
  // new gradients go with the step; a bad list is refused before any group takes its own
  std::vector<float> g_a(3000, -100.0f);
  const std::vector<std::uintptr_t> new_a{addr(g_a.data())}, two{addr(g_a.data()), addr(g_a.data())};
  expect_refused([&] {
    luminav::cpu_step({{&g1, 1e-2, addr(s1.data()), addr(&flag), &new_a},
                       {&g2, 1e-2, addr(s2.data()), addr(&flag), &two}},
                      addr(&flag), addr(&skipped));
  }, Status::kInvalidArgument, "set_grads: 2 addresses for 1 rows; give one per row");
  EXPECT_EQ(a.p, before);
  luminav::cpu_step({{&g1, 1e-2, addr(s1.data()), addr(&flag), &new_a}}, addr(&flag), addr(&skipped));
  EXPECT_GT(a.p[0], before[0]);  // the new gradient turned the momentum: the step went up
  EXPECT_EQ(a.step, 2);
}

// ---------------------------------------------------------------------------------------------
// AotGroup on the fake device (its memory is host memory).

// A launch group's buffers as Python's aot backend owns them, here in host memory: two tensors,
// their table and block map (from the engine's table writer), partials, stats, lr and flags.
struct AotBuffers {
  HostTensor a{3000}, b{5};
  luminav::gpu::HostTables tables;
  std::vector<float> partial_sum, stats = std::vector<float>(2, 0.0f);
  std::vector<std::int32_t> partial_bad;
  float lr = 1e-3f, lr2 = 5e-4f;
  std::int32_t found_inf = 0, found_inf2 = 0, scratch_flag = 0;
  AotBuffers() {
    const std::vector<luminav::TensorRow> rows = luminav::make_rows({a.row(0), b.row(1)}, false);
    tables = luminav::gpu::build_tables(rows.data(), rows.size());
    partial_sum.assign(static_cast<std::size_t>(tables.nblocks), 0.0f);
    partial_bad.assign(static_cast<std::size_t>(tables.nblocks), 0);
  }
  CUdeviceptr table() const { return addr(tables.table.data()); }
  void bind(AotGroup& g) {
    g.bind(table(), addr(tables.block_map.data()), tables.nblocks, addr(partial_sum.data()), addr(partial_bad.data()),
           addr(stats.data()), addr(&lr), 2, addr(&found_inf), addr(&found_inf));
  }
};

class AotGroupTest : public CudaDeviceTest {
 protected:
  // The four launches of a step, in order, as the fake device recorded them.
  std::vector<Launch> step(AotGroup& g) {
    dev().launches.clear();
    if (g.has_pass1()) {
      g.pass1(stream_);
      g.reduce(stream_);
    }
    g.update(stream_);
    g.commit(stream_);
    return dev().launches;
  }
  CUstream stream_ = reinterpret_cast<CUstream>(0x5151);
};

std::uint64_t bits(float x) {
  std::uint32_t u;
  std::memcpy(&u, &x, 4);
  return u;
}

TEST_F(AotGroupTest, ABoundGroupLaunchesWithTheBoundArgumentsAndOneContextCheckEach) {
  const GroupConfig cfg = config(clip_skip());
  write_bundle({cfg});
  AotGroup g(dir_.path(), 0, cfg);
  expect_error([&] { g.update(stream_); }, Status::kStateError, {"AotGroup.update", "call bind() first"});
  AotBuffers buf;
  buf.bind(g);
  fake().ctx_queries = fake().ctx_pushes = 0;
  const std::vector<Launch> l = step(g);
  EXPECT_EQ(fake().ctx_queries, 4);  // one cuCtxGetCurrent per launch
  EXPECT_EQ(fake().ctx_pushes, 0);   // the primary context was current
  ASSERT_EQ(kinds(l), (std::vector<std::string>{"pass1", "reduce", "pass2", "commit"}));
  const CUdeviceptr table = buf.table(), flag = addr(&buf.found_inf);
  const std::int64_t nblocks = buf.tables.nblocks;
  EXPECT_EQ(nblocks, 4);  // 3 blocks of 1024 for 3000 elements, 1 for 5
  EXPECT_EQ(l[0].grid, 4u);
  EXPECT_EQ(l[0].args, (std::vector<std::uint64_t>{table, addr(buf.tables.block_map.data()), addr(buf.partial_sum.data()),
                                                   addr(buf.partial_bad.data()), cfg.seed, bits(1.0f), bits(0.9f),
                                                   bits(0.999f), bits(1e-8f)}));
  EXPECT_EQ(l[1].grid, 2u);
  EXPECT_EQ(l[1].args, (std::vector<std::uint64_t>{table, addr(buf.partial_sum.data()), addr(buf.partial_bad.data()),
                                                   addr(buf.stats.data()), flag, 2}));
  EXPECT_EQ(l[2].grid, 4u);
  EXPECT_EQ(l[2].args, (std::vector<std::uint64_t>{table, addr(buf.tables.block_map.data()), addr(buf.stats.data()), flag,
                                                   addr(&buf.lr), cfg.seed, bits(1.0f), bits(0.9f), bits(0.999f),
                                                   bits(1e-8f), bits(0.01f), bits(4.0f), bits(1.0f)}));
  EXPECT_EQ(l[2].lr_bits, bits(1e-3f));
  EXPECT_EQ(l[3].grid, 1u);
  EXPECT_EQ(l[3].args, (std::vector<std::uint64_t>{table, flag, 2}));
  for (const Launch& launch : l) EXPECT_EQ(launch.stream, stream_) << launch.kind;
  EXPECT_EQ(buf.a.step, 1);  // the fake commit advanced each row's counter
  EXPECT_EQ(buf.b.step, 1);
  // The caller has another context current: each launch pushes the primary one and pops it.
  fake().ctx_stack.push_back(fake_user_ctx());
  fake().ctx_pushes = 0;
  step(g);
  EXPECT_EQ(fake().ctx_pushes, 4);
  EXPECT_EQ(fake().ctx_stack.back(), fake_user_ctx());
  for (const Launch& launch : dev().launches) EXPECT_EQ(launch.args[kTable], table);
}

TEST_F(AotGroupTest, LaunchesAndRebindingFlagsOrLrAllocateNothingOnTheHost) {
  const GroupConfig cfg = config(clip_skip());
  write_bundle({cfg});
  AotGroup g(dir_.path(), 0, cfg);
  AotBuffers buf;
  buf.bind(g);
  // The fake device's recording allocates; here launches are only counted.
  static int launches = 0;
  api_.cuLaunchKernel = [](luminav::CUfunction, unsigned, unsigned, unsigned, unsigned, unsigned, unsigned, unsigned,
                           CUstream, void**, void**) {
    ++launches;
    return luminav::CUDA_SUCCESS;
  };
  launches = 0;
  const long long before = host_allocations();
  for (int s = 0; s < 10; ++s) {
    g.set_lr(addr(s % 2 ? &buf.lr : &buf.lr2));
    g.set_flags(addr(s % 2 ? &buf.found_inf : &buf.found_inf2), addr(&buf.scratch_flag));
    g.pass1(stream_);
    g.reduce(stream_);
    g.update(stream_);
    g.commit(stream_);
  }
  EXPECT_EQ(host_allocations() - before, 0);
  EXPECT_EQ(launches, 40);
}

TEST_F(AotGroupTest, SetLrAndSetFlagsChangeOnlyThoseArguments) {
  const GroupConfig cfg = config(clip_skip());
  write_bundle({cfg});
  AotGroup g(dir_.path(), 0, cfg);
  AotBuffers buf;
  buf.bind(g);
  const std::vector<Launch> before = step(g);
  const int queries = fake().ctx_queries;
  g.set_lr(addr(&buf.lr2));
  g.set_lr(addr(&buf.lr2));  // unchanged: a compare
  EXPECT_EQ(fake().ctx_queries, queries);  // neither makes a driver call
  const std::vector<Launch> lr_moved = step(g);
  ASSERT_EQ(lr_moved.size(), before.size());
  for (std::size_t i = 0; i < before.size(); ++i) {
    std::vector<std::uint64_t> expected = before[i].args;
    if (before[i].kind == "pass2") expected[kPass2Lr] = addr(&buf.lr2);
    EXPECT_EQ(lr_moved[i].args, expected) << before[i].kind;
  }
  EXPECT_EQ(lr_moved[2].lr_bits, bits(5e-4f));

  g.set_flags(addr(&buf.found_inf2), addr(&buf.scratch_flag));
  const std::vector<Launch> flags_moved = step(g);
  for (std::size_t i = 0; i < before.size(); ++i) {
    std::vector<std::uint64_t> expected = lr_moved[i].args;
    const std::string& kind = before[i].kind;
    if (kind == "reduce") expected[kReduceFlag] = addr(&buf.scratch_flag);
    if (kind == "pass2") expected[kPass2Flag] = addr(&buf.found_inf2);
    if (kind == "commit") expected[kCommitFlag] = addr(&buf.found_inf2);
    EXPECT_EQ(flags_moved[i].args, expected) << kind;
  }
  // The reduce raises the flag it is bound to, the commit reads its own: no step is applied.
  dev().bad_grads = true;
  buf.found_inf2 = 1;
  step(g);
  EXPECT_EQ(buf.scratch_flag, 1);
  EXPECT_EQ(buf.a.step, 3);  // two applied steps before, none now
  // Refusals, before anything changes.
  expect_error([&] { g.set_lr(0); }, Status::kInvalidArgument, {"AotGroup: the lr address is 0"});
  expect_error([&] { g.set_flags(0, addr(&buf.found_inf)); }, Status::kInvalidArgument, {"found_inf address is 0"});
  // A new binding replaces the old one.
  AotBuffers other;
  other.bind(g);
  for (const Launch& launch : step(g)) EXPECT_EQ(launch.args[kTable], other.table()) << launch.kind;
}

TEST_F(AotGroupTest, AGroupWithoutPass1LaunchesTheSinglePassKernelAndCommitOnly) {
  Hyper h;
  h.clip = 0;
  h.nonfinite = luminav::NonFinite::kPropagate;
  const GroupConfig cfg = config(h);
  write_bundle({cfg});
  AotGroup g(dir_.path(), 0, cfg);
  EXPECT_FALSE(g.has_pass1());
  AotBuffers buf;
  buf.bind(g);
  expect_error([&] { g.pass1(stream_); }, Status::kStateError, {"AotGroup.pass1", "runs no pass 1"});
  expect_error([&] { g.reduce(stream_); }, Status::kStateError, {"AotGroup.reduce", "runs no pass 1"});
  const std::vector<Launch> l = step(g);
  ASSERT_EQ(kinds(l), (std::vector<std::string>{"single_pass", "commit"}));
  EXPECT_FALSE(l[1].reads_flag);  // commit without CHECK_FLAG
  EXPECT_EQ(buf.a.step, 1);
}

TEST_F(AotGroupTest, BindRefusesCountsOutOfRangeAndAddressesALaunchWouldRead) {
  const GroupConfig cfg = config(clip_skip());
  write_bundle({cfg});
  AotGroup g(dir_.path(), 0, cfg);
  AotBuffers b;
  const CUdeviceptr table = b.table(), map = addr(b.tables.block_map.data()), ps = addr(b.partial_sum.data()),
                    pb = addr(b.partial_bad.data()), stats = addr(b.stats.data()), lr = addr(&b.lr),
                    flag = addr(&b.found_inf);
  auto refused = [&](auto&& bind, const std::string& message) {
    expect_error(bind, Status::kInvalidArgument, {message});
    EXPECT_FALSE(g.bound());
  };
  refused([&] { g.bind(table, map, -1, ps, pb, stats, lr, 2, flag, flag); }, "nblocks must be in [0, 2^31-1]");
  refused([&] { g.bind(table, map, std::int64_t{1} << 31, ps, pb, stats, lr, 2, flag, flag); }, "got 2147483648");
  refused([&] { g.bind(table, map, 4, ps, pb, stats, lr, -2, flag, flag); }, "ntensors must be >= 0, got -2");
  refused([&] { g.bind(table, map, 4, ps, pb, stats, lr, 2, 0, flag); }, "the found_inf address is 0");
  refused([&] { g.bind(table, map, 4, ps, pb, stats, lr, 2, flag, 0); }, "the reduce_flag address is 0");
  refused([&] { g.bind(0, map, 4, ps, pb, stats, lr, 2, flag, flag); }, "the table address is 0 but ntensors > 0");
  refused([&] { g.bind(table, 0, 4, ps, pb, stats, lr, 2, flag, flag); }, "the block_map address is 0 but nblocks > 0");
  refused([&] { g.bind(table, map, 4, ps, pb, stats, 0, 2, flag, flag); }, "the lr address is 0 but nblocks > 0");
  refused([&] { g.bind(table, map, 4, 0, pb, stats, lr, 2, flag, flag); }, "partial_sum address is 0 but the group runs pass 1");
  refused([&] { g.bind(table, map, 4, ps, pb, 0, lr, 2, flag, flag); }, "stats address is 0 but the group runs pass 1");
  // Nothing to launch reads what is not there: an empty group binds without block map or lr.
  g.bind(table, 0, 0, 0, 0, stats, 0, 2, flag, flag);
  EXPECT_TRUE(g.bound());
}

}  // namespace
