// tests/test_cuda_device_eager.cpp: the engine's CUDA device (src/engine/gpu_device.cpp on CUDA), eager
// steps: what a step enqueues (launches and their arguments, the device tables, memsets), what it
// allocates or synchronises, how it makes its context current, and what it refuses before
// enqueuing anything; through the fake device of tests/fakes/fake_cuda_device.h
#include <gtest/gtest.h>

#include <cstdint>
#include <cstring>
#include <fstream>
#include <iterator>
#include <memory>
#include <set>
#include <string>
#include <vector>

#include "engine/engine.h"
#include "engine/group_launch.h"
#include "fakes/expect_error.h"
#include "fakes/fake_bundle.h"
#include "fakes/fake_cuda_device.h"
#include "fakes/fake_driver.h"
#include "luminav/error.h"

using luminav::BoundMode;
using luminav::CUdeviceptr;
using luminav::CUresult;
using luminav::CUstream;
using luminav::DType;
using luminav::Engine;
using luminav::EngineOptions;
using luminav::GroupConfig;
using luminav::Hyper;
using luminav::NonFinite;
using luminav::ParamDesc;
using luminav::Status;
using namespace luminav_test;

namespace {

TEST_F(CudaDeviceTest, AStepIsItsKernelsOnlyAndTheFirstSkippingGroupCountsAppliedSteps) {
  write_bundle({config(clip_skip())});
  auto e = engine();
  const std::vector<std::int64_t> numels = {3000, 1, 1024, 0, 2500};
  add_group(*e, clip_skip(), numels);
  auto* stream = reinterpret_cast<CUstream>(0x5151);
  e->step(stream);
  const FakeDevice first = dev();
  EXPECT_EQ(kinds(first.launches), (std::vector<std::string>{"pass1", "reduce", "pass2", "commit"}));
  dev().launches.clear();
  dev().memsets32.clear();
  const int allocs = dev().allocs, syncs = dev().syncs, copies = dev().htod + dev().dtoh + dev().dtod;
  for (int s = 0; s < 3; ++s) e->step(stream);
  // No separate launch counts applied steps; nothing allocates, copies or synchronises.
  ASSERT_EQ(dev().launches.size(), 12u);
  for (int s = 0; s < 3; ++s) {
    EXPECT_EQ(kinds({dev().launches.begin() + 4 * s, dev().launches.begin() + 4 * s + 4}),
              (std::vector<std::string>{"pass1", "reduce", "pass2", "commit"}));
  }
  EXPECT_EQ(dev().allocs, allocs);
  EXPECT_EQ(dev().syncs, syncs);
  EXPECT_EQ(dev().htod + dev().dtoh + dev().dtod, copies);
  EXPECT_TRUE(dev().memsets32.empty());  // lr unchanged, flags from the ring zeroed at the first step

  const Launch& pass1 = dev().launches[0];
  const Launch& reduce = dev().launches[1];
  const Launch& pass2 = dev().launches[2];
  const Launch& commit = dev().launches[3];
  for (const Launch& l : dev().launches) EXPECT_EQ(l.stream, stream);
  const unsigned nblocks = 3 + 1 + 1 + 0 + 3;  // cdiv(numel, 1024) per tensor
  EXPECT_EQ(pass1.grid, nblocks);
  EXPECT_EQ(pass2.grid, nblocks);
  EXPECT_EQ(reduce.grid, 5u);  // one program per tensor; the counter's row is outside the grid
  EXPECT_EQ(reduce.args[kReduceCount], 5u);
  EXPECT_EQ(commit.grid, 1u);
  EXPECT_EQ(commit.args[kCommitCount], 6u);  // 5 tensors + the applied-step counter's row
  EXPECT_EQ(commit.args[kTable], pass1.args[kTable]);

  // The table: the tensors' rows, then a row with no elements whose STEP is the counter.
  constexpr std::size_t kCols = luminav::gpu::kTableCols;
  const std::vector<std::int64_t> t = table(commit, 6);
  std::int64_t start = 0;
  for (std::size_t j = 0; j < 5; ++j) {
    EXPECT_EQ(t[j * kCols + 6], numels[j]) << j;
    EXPECT_EQ(t[j * kCols + 7], start) << j;
    EXPECT_EQ(t[j * kCols + 9], static_cast<std::int64_t>(j)) << j;
    start += (numels[j] + 1023) / 1024;
  }
  const std::int64_t* counter_row = &t[5 * kCols];
  for (std::size_t col = 0; col < kCols; ++col) {
    if (col != 5) {
      EXPECT_EQ(counter_row[col], 0) << "column " << col;
    }
  }
  ASSERT_NE(counter_row[5], 0);
  std::set<std::int64_t> step_counters;
  for (std::size_t j = 0; j < 5; ++j) step_counters.insert(t[j * kCols + 5]);
  EXPECT_EQ(step_counters.count(counter_row[5]), 0u) << "the counter is none of the tensors' step counters";
  // skipped = steps with a skipping group - applied: the counter the row points at is the one read.
  *static_cast<std::int64_t*>(fake_mem::at(static_cast<CUdeviceptr>(counter_row[5]))) = 3;
  EXPECT_EQ(e->skipped_steps(), 4 - 3);
  EXPECT_EQ(first.launches[3].args[kCommitCount], 6u);

  // pass 2 and commit read the step's found_inf, which the reduce raises.
  EXPECT_EQ(reduce.args[kReduceFlag], pass2.args[kPass2Flag]);
  EXPECT_EQ(commit.args[kCommitFlag], pass2.args[kPass2Flag]);
}

TEST_F(CudaDeviceTest, EachStepTakesAZeroedFlagPairAndTheRingIsZeroedOncePerCycle) {
  write_bundle({config(clip_skip())});
  auto e = engine();
  add_group(*e, clip_skip(), {5000, 7});
  const int steps = 140;
  std::vector<CUdeviceptr> flags;
  std::vector<std::size_t> ring_zeroed_at;  // steps whose memsets included the ring's
  CUdeviceptr ring = 0;
  std::size_t ring_words = 0;
  for (int s = 0; s < steps; ++s) {
    dev().launches.clear();
    dev().memsets32.clear();
    e->step(nullptr);
    ASSERT_EQ(dev().launches.size(), 4u);
    flags.push_back(dev().launches[2].args[kPass2Flag]);
    for (const Memset& m : dev().memsets32) {
      if (m.count > 2) {
        ring_zeroed_at.push_back(static_cast<std::size_t>(s));
        if (ring == 0) {
          ring = m.at;
          ring_words = m.count;
        }
        EXPECT_EQ(m.at, ring);
        EXPECT_EQ(m.value, 0u);
      }
    }
  }
  ASSERT_NE(ring, 0u);
  // Pairs of flags, each flag on its own 16 bytes (bundle kernels assume aligned pointers).
  const std::size_t pair_bytes = 32;
  const std::size_t slots = ring_words * 4 / pair_bytes;
  ASSERT_GE(slots, 2u);
  std::vector<std::size_t> expected_zeroing;
  for (std::size_t s = 0; s < static_cast<std::size_t>(steps); s += slots) expected_zeroing.push_back(s);
  EXPECT_EQ(ring_zeroed_at, expected_zeroing);
  for (std::size_t s = 0; s < flags.size(); ++s) {
    // Inside the ring, 8-byte pairs in order; a pair is used once per cycle.
    EXPECT_EQ(flags[s], ring + (s % slots) * pair_bytes) << "step " << s;
  }
}

TEST_F(CudaDeviceTest, AStepUnderGraphCaptureZeroesItsOwnFlagsOutsideTheRing) {
  write_bundle({config(clip_skip())});
  auto e = engine();
  add_group(*e, clip_skip(), {3000});
  auto* stream = reinterpret_cast<CUstream>(0x77);
  e->step(stream);  // the first step builds the tables (not capturable)
  const CUdeviceptr ring_pair = dev().launches[2].args[kPass2Flag];
  for (int replay = 0; replay < 3; ++replay) {
    dev().capturing[stream] = luminav::CU_STREAM_CAPTURE_STATUS_ACTIVE;
    dev().launches.clear();
    dev().memsets32.clear();
    e->step(stream);
    ASSERT_EQ(dev().memsets32.size(), 1u);
    const Memset m = dev().memsets32[0];
    EXPECT_EQ(m.count, 8u);  // the step's own pair (2 flags of 16 bytes), zeroed inside the captured work
    EXPECT_EQ(m.value, 0u);
    for (const Launch& l : dev().launches) {
      const std::size_t flag = l.kind == "reduce" ? kReduceFlag : l.kind == "pass2" ? kPass2Flag : kCommitFlag;
      if (l.kind != "pass1") {
        EXPECT_EQ(l.args[flag], m.at) << l.kind;
      }
    }
    EXPECT_NE(m.at, ring_pair);
    EXPECT_FALSE(m.at >= ring_pair && m.at < ring_pair + 64 * 32) << "the captured pair is not in the ring";
  }
  // Eager again: the next pair of the ring, no memset.
  dev().capturing.clear();
  dev().launches.clear();
  dev().memsets32.clear();
  e->step(stream);
  EXPECT_TRUE(dev().memsets32.empty());
  EXPECT_EQ(dev().launches[2].args[kPass2Flag], ring_pair + 32);
  // A driver table that cannot say whether a stream is captured: every step zeroes its pair.
  api_.cuStreamIsCapturing = nullptr;
  dev().memsets32.clear();
  e->step(stream);
  e->step(stream);
  EXPECT_EQ(dev().memsets32.size(), 2u);
  for (const Memset& m : dev().memsets32) EXPECT_EQ(m.count, 8u);
}

TEST_F(CudaDeviceTest, GroupsThatDoNotSkipRaiseAFlagOfTheirOwnAndOnlyTheFirstSkippingGroupCounts) {
  Hyper propagate = clip_skip();
  propagate.nonfinite = NonFinite::kPropagate;  // pass 1 for the clip, no skip
  Hyper skip_noclip = clip_skip();
  skip_noclip.clip = 0;  // pass 1 for the flag only
  Hyper adamw = propagate;
  adamw.clip = 0;  // single pass
  const Hyper skip_too = clip_skip();
  write_bundle({config(propagate), config(skip_noclip), config(adamw), config(skip_too)});
  auto e = engine();
  add_group(*e, propagate, {2000, 30});
  add_group(*e, skip_noclip, {100});
  add_group(*e, adamw, {4096, 1, 5});
  add_group(*e, skip_too, {10, 20});
  e->step(nullptr);
  dev().launches.clear();
  e->step(nullptr);
  EXPECT_EQ(kinds(dev().launches),
            (std::vector<std::string>{"pass1", "reduce", "pass1", "reduce", "pass1", "reduce", "pass2", "pass2",
                                      "single_pass", "pass2", "commit", "commit", "commit", "commit"}));
  const auto& l = dev().launches;
  const std::uint64_t found_inf = l[7].args[kPass2Flag];  // the skipping group's pass 2
  EXPECT_EQ(l[1].args[kReduceFlag], found_inf + 16);      // propagate: its own flag
  EXPECT_EQ(l[3].args[kReduceFlag], found_inf);           // skip
  EXPECT_EQ(l[5].args[kReduceFlag], found_inf);           // skip
  EXPECT_EQ(l[9].args[kPass2Flag], found_inf);
  // Commit counts: the first skipping group's table has the counter's row, no other.
  EXPECT_EQ(l[10].args[kCommitCount], 2u);
  EXPECT_EQ(l[11].args[kCommitCount], 2u);  // 1 tensor + the counter
  EXPECT_EQ(l[12].args[kCommitCount], 3u);
  EXPECT_EQ(l[13].args[kCommitCount], 2u);
  EXPECT_EQ(table(l[11], 2)[luminav::gpu::kTableCols + 6], 0);  // the counter's row has no elements
  EXPECT_EQ(l[11].args[kCommitFlag], found_inf);
  EXPECT_EQ(l[13].args[kCommitFlag], found_inf);
  // Every pointer a bundle kernel gets is 16-byte aligned (docs/bundle-format.md).
  for (const Launch& launch : l) {
    const KernelSpec spec = kernel_spec(launch.kind);
    for (std::size_t a = 0; a < spec.signature.size(); ++a) {
      if (spec.signature[a][0] == '*') {
        EXPECT_EQ(launch.args[a] % 16, 0u) << launch.kind << " argument " << spec.arg_names[a];
      }
    }
  }
  EXPECT_EQ(l[3].grid, 1u);  // the counting group's reduce: its one tensor only
  EXPECT_EQ(l[3].args[kReduceCount], 1u);
  EXPECT_EQ(l[5].grid, 2u);
  EXPECT_EQ(l[5].args[kReduceCount], 2u);
}

TEST_F(CudaDeviceTest, TheContextIsMadeCurrentOncePerStepAndPushedOnlyWhenItIsNot) {
  write_bundle({config(clip_skip())});
  auto e = engine();
  add_group(*e, clip_skip(), {3000, 3});
  e->step(nullptr);
  fake().ctx_queries = fake().ctx_pushes = 0;
  for (int s = 0; s < 5; ++s) e->step(nullptr);
  EXPECT_EQ(fake().ctx_queries, 5);  // one cuCtxGetCurrent per step, none per launch
  EXPECT_EQ(fake().ctx_pushes, 0);   // the primary context was current
  fake().ctx_stack.push_back(fake_user_ctx());  // the caller has another context current
  fake().ctx_queries = fake().ctx_pushes = 0;
  dev().launches.clear();
  for (int s = 0; s < 5; ++s) e->step(nullptr);
  EXPECT_EQ(fake().ctx_pushes, 5);
  ASSERT_EQ(fake().ctx_stack.size(), 2u);
  EXPECT_EQ(fake().ctx_stack.back(), fake_user_ctx());  // restored after every step
}

TEST_F(CudaDeviceTest, AStepAllocatesNothingOnTheHost) {
  Hyper bounded = clip_skip();
  bounded.bound_mode = BoundMode::kRel;
  bounded.bound = 0.5;
  write_bundle({config(clip_skip()), config(bounded)});
  auto e = engine();
  add_group(*e, clip_skip(), {3000, 1, 77});
  add_group(*e, bounded, {512});
  e->step(nullptr);
  e->step(nullptr);
  // The fake's recording allocates; here launches and memsets are only counted.
  static int launches = 0, memsets = 0;
  api_.cuLaunchKernel = [](luminav::CUfunction, unsigned, unsigned, unsigned, unsigned, unsigned, unsigned, unsigned,
                           CUstream, void**, void**) {
    ++launches;
    return luminav::CUDA_SUCCESS;
  };
  api_.cuMemsetD32Async = [](CUdeviceptr, unsigned, size_t, CUstream) {
    ++memsets;
    return luminav::CUDA_SUCCESS;
  };
  launches = memsets = 0;
  const long long before = host_allocations();
  const int steps = 70;  // past the flag ring's wrap at the 64th step
  for (int s = 0; s < steps; ++s) {
    e->set_lr(0, 1e-3 * (1 + s % 3));  // a changed lr: a memset, no allocation
    e->step(nullptr);
  }
  EXPECT_EQ(host_allocations() - before, 0);
  EXPECT_EQ(launches, steps * 8);
  // Group 0's lr at every step but the first (1e-3, as before), and the flag ring once.
  EXPECT_EQ(memsets, (steps - 1) + 1);
}

TEST_F(CudaDeviceTest, ASeedSetByImportReachesTheKernels) {
  write_bundle({config(clip_skip())});
  auto source = engine(1234);
  add_group(*source, clip_skip(), {3000});
  source->step(nullptr);
  const std::vector<std::uint8_t> state = source->export_state();
  auto e = engine(99);
  add_group(*e, clip_skip(), {3000});
  e->step(nullptr);
  EXPECT_EQ(dev().launches.back().kind, "commit");
  dev().launches.clear();
  e->step(nullptr);
  EXPECT_EQ(dev().launches[0].args[kPass1Seed], 99u);
  e->import_state(state.data(), state.size());
  EXPECT_EQ(e->seed(), 1234u);
  dev().launches.clear();
  e->step(nullptr);
  ASSERT_EQ(kinds(dev().launches), (std::vector<std::string>{"pass1", "reduce", "pass2", "commit"}));
  EXPECT_EQ(dev().launches[0].args[kPass1Seed], 1234u);
  EXPECT_EQ(dev().launches[2].args[kPass2Seed], 1234u);
}

TEST_F(CudaDeviceTest, ACorruptCubinIsRefusedWhenFirstNeededBeforeAnythingIsEnqueued) {
  Hyper bounded = clip_skip();
  bounded.bound_mode = BoundMode::kAbs;  // the first step would also copy p into p_init
  const GroupConfig cfg = config(bounded);
  write_bundle({cfg});
  const std::string pass1_key = luminav::gpu::variant_keys(cfg).pass1;
  const std::vector<unsigned char> good = [&] {
    std::ifstream f(cubin_of(pass1_key), std::ios::binary);
    return std::vector<unsigned char>((std::istreambuf_iterator<char>(f)), std::istreambuf_iterator<char>());
  }();
  write_bytes(cubin_of(pass1_key), make_fake_cubin("corrupt"));
  auto e = engine();  // reads the manifest only: the corrupt cubin is not touched yet
  add_group(*e, bounded, {3000});
  const std::vector<float> before = params_.back();
  const int copies = dev().dtod;
  expect_error([&] { e->step(nullptr); }, Status::kBundleError,
               {"field \"sha256\"", cubin_of(pass1_key), "rebuild the bundle"});
  EXPECT_TRUE(dev().launches.empty());
  EXPECT_EQ(dev().dtod, copies);  // p_init not copied either
  EXPECT_EQ(fake().module_loads, 0);
  EXPECT_EQ(params_.back(), before);
  EXPECT_EQ(e->param_step(0), 0);
  // Repaired, the next step runs.
  write_bytes(cubin_of(pass1_key), good);
  e->step(nullptr);
  EXPECT_EQ(kinds(dev().launches), (std::vector<std::string>{"pass1", "reduce", "pass2", "commit"}));
  EXPECT_EQ(dev().dtod, copies + 1);
}

TEST_F(CudaDeviceTest, ABundleForAnotherTableLayoutIsRefusedBeforeAnythingIsEnqueued) {
  static_assert(luminav::gpu::kTableCols == 21, "fakes/fake_bundle.cpp writes table_cols 21");
  const Hyper h = clip_skip();
  write_bundle({config(h)});
  // A bundle of the first format: its kernels read 12-column tables.
  json man = json::parse(read_text(dir_.file("manifest.json")));
  man["format_version"] = 1;
  man.erase("table_cols");
  write_manifest(dir_, man);
  auto e = engine();
  add_group(*e, h, {3000});
  const std::vector<float> before = params_.back();
  expect_error([&] { e->step(nullptr); }, Status::kBundleError,
               {dir_.path(), "format_version 1", "tables of 12 columns", "writes 21",
                "luminamoon aot build --out " + dir_.path()});
  EXPECT_TRUE(dev().launches.empty());
  EXPECT_EQ(params_.back(), before);
  EXPECT_EQ(e->param_step(0), 0);
}

}  // namespace
