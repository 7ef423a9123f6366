// tests/test_hip_group.cpp: HipAotGroup (engine/group.h), a launch group on an AMD device, driven by
// the fake HIP (luminav-triton-aot/tests/fakes/fake_hip.h): each kernel of one step launched with
// block 64·num_warps, the bound buffers' addresses and scalars in the order of docs/internals.md,
// and the trailing scratch pointers; HIP errors reach the caller and change nothing
#include <gtest/gtest.h>

#include <cstdint>
#include <cstring>
#include <map>
#include <string>
#include <vector>

#include "engine/group.h"
#include "engine/group_launch.h"
#include "fakes/expect_error.h"
#include "fakes/fake_bundle.h"
#include "fakes/fake_cuda_device.h"
#include "fakes/fake_hip.h"
#include "fakes/fake_hsaco.h"

namespace {

using luminav::CUdeviceptr;
using luminav::GroupConfig;
using luminav::HipAotGroup;
using luminav::Status;
using luminav_test::expect_error;
using luminav_test::fake_hip;
using luminav_test::json;

std::uint64_t bits(float x) {
  std::uint32_t u;
  std::memcpy(&u, &x, 4);
  return u;
}

class HipGroupTest : public luminav_test::FakeHipFixture {
 protected:
  // A bundle with the group's HIP variants for gfx942 (and nothing for other archs).
  void write_bundle(const GroupConfig& cfg) {
    const luminav::gpu::VariantKeys k = luminav::gpu::variant_keys(cfg);
    std::vector<json> entries;
    for (const auto& [key, kind] : {std::make_pair(k.pass1, "pass1"), std::make_pair(k.reduce, "reduce"),
                                    std::make_pair(k.pass2, "pass2"), std::make_pair(k.single_pass, "single_pass"),
                                    std::make_pair(k.commit, "commit")}) {
      if (key.empty()) continue;
      luminav_test::VariantOptions o;
      o.spec = luminav_test::kernel_spec(kind);
      entries.push_back(luminav_test::add_hip_variant(dir_, key, "gfx942", o));
      const luminav_test::KernelSpec& s = o.spec;
      fake_hip().param_counts[s.name] = {s.signature.size(), 2};
      warps_[s.name] = entries.back()["num_warps"].get<int>();
    }
    luminav_test::write_manifest(dir_, luminav_test::manifest_v3_with(entries));
  }
  static GroupConfig config() {
    GroupConfig c;
    c.hyper = luminav_test::clip_skip();
    c.state_dtype = c.hyper.state_dtype;
    return c;
  }
  // The values the launch's parameters point at (each an 8-byte slot or a 4-byte scalar).
  static std::vector<std::uint64_t> values(const luminav_test::HipLaunchRecord& r, const std::vector<int>& sizes) {
    std::vector<std::uint64_t> out;
    EXPECT_LE(sizes.size(), r.params.size());
    for (std::size_t i = 0; i < sizes.size() && i < r.params.size(); ++i) {
      std::uint64_t v = 0;
      std::memcpy(&v, r.params[i], static_cast<std::size_t>(sizes[i]));
      out.push_back(v);
    }
    return out;
  }
  luminav_test::TempDir dir_;
  std::map<std::string, int> warps_;
  const luminav::hipStream_t stream_ = reinterpret_cast<luminav::hipStream_t>(std::uintptr_t{0x7171});
};

TEST_F(HipGroupTest, LaunchesEachKernelOfAStepWithItsArgumentsAndBlock) {
  const GroupConfig cfg = config();
  write_bundle(cfg);
  HipAotGroup g(dir_.path(), 0, "gfx942:sramecc+:xnack-", cfg);
  EXPECT_EQ(fake_hip().module_loads, 4);
  expect_error([&] { g.update(stream_); }, Status::kStateError, {"HipAotGroup.update", "call bind() first"});
  const CUdeviceptr table = 0x10000, block_map = 0x20000, psum = 0x30000, pbad = 0x40000, stats = 0x50000,
                    lr = 0x60000, flag = 0x70000;
  g.bind(table, block_map, 4, psum, pbad, stats, lr, 2, flag, flag);
  g.pass1(stream_);
  g.reduce(stream_);
  g.update(stream_);
  g.commit(stream_);
  const auto& l = fake_hip().launches;
  ASSERT_EQ(l.size(), 4u);
  const std::vector<std::string> names = {"_lumina_tdclm_pass1_kernel", "_lumina_tdclm_reduce_kernel",
                                          "_lumina_tdclm_pass2_kernel", "_lumina_tdclm_commit_kernel"};
  for (std::size_t i = 0; i < 4; ++i) {
    SCOPED_TRACE(names[i]);
    EXPECT_EQ(l[i].function, names[i]);
    EXPECT_EQ(l[i].block[0], static_cast<unsigned>(64 * warps_[names[i]]));  // a wavefront is 64 lanes
    EXPECT_EQ(l[i].block[1] * l[i].block[2], 1u);
    EXPECT_EQ(l[i].stream, stream_);
    EXPECT_TRUE(l[i].extra_null);
    EXPECT_EQ(l[i].trailing, (std::vector<unsigned long long>{0, 0}));  // global and profile scratch: none
  }
  EXPECT_EQ(l[0].block[0], 64u * luminav::gpu::kBlockWarps);
  EXPECT_EQ(l[1].block[0], 64u * luminav::gpu::kReduceWarps);
  EXPECT_EQ(l[0].grid[0], 4u);
  EXPECT_EQ(values(l[0], {8, 8, 8, 8, 8, 4, 4, 4, 4}),
            (std::vector<std::uint64_t>{table, block_map, psum, pbad, cfg.seed, bits(1.0f), bits(0.9f), bits(0.999f),
                                        bits(1e-8f)}));
  EXPECT_EQ(l[1].grid[0], 2u);
  EXPECT_EQ(values(l[1], {8, 8, 8, 8, 8, 4}), (std::vector<std::uint64_t>{table, psum, pbad, stats, flag, 2}));
  EXPECT_EQ(l[2].grid[0], 4u);
  EXPECT_EQ(values(l[2], {8, 8, 8, 8, 8, 8, 4, 4, 4, 4, 4, 4, 4}),
            (std::vector<std::uint64_t>{table, block_map, stats, flag, lr, cfg.seed, bits(1.0f), bits(0.9f),
                                        bits(0.999f), bits(1e-8f), bits(0.01f), bits(4.0f), bits(1.0f)}));
  EXPECT_EQ(l[3].grid[0], 1u);
  EXPECT_EQ(values(l[3], {8, 8, 4}), (std::vector<std::uint64_t>{table, flag, 2}));
  // set_lr and set_flags change only those arguments
  g.set_lr(0x61000);
  g.set_flags(0x71000, 0x72000);
  fake_hip().launches.clear();
  g.reduce(stream_);
  g.update(stream_);
  g.commit(stream_);
  EXPECT_EQ(values(l[0], {8, 8, 8, 8, 8, 4})[4], 0x72000u);
  EXPECT_EQ(values(l[1], {8, 8, 8, 8, 8, 8, 4, 4, 4, 4, 4, 4, 4})[3], 0x71000u);
  EXPECT_EQ(values(l[1], {8, 8, 8, 8, 8, 8, 4, 4, 4, 4, 4, 4, 4})[4], 0x61000u);
  EXPECT_EQ(values(l[2], {8, 8, 4})[1], 0x71000u);
  expect_error([&] { g.set_lr(0); }, Status::kInvalidArgument, {"HipAotGroup: the lr address is 0"});
}

TEST_F(HipGroupTest, HipErrorsReachTheCallerAndChangeNothing) {
  const GroupConfig cfg = config();
  write_bundle(cfg);
  // no variant for another arch: named with the fix
  expect_error([&] { HipAotGroup(dir_.path(), 0, "gfx90a", cfg); }, Status::kNotFound,
               {"for a HIP device of arch gfx90a", "luminamoon aot build --arch gfx90a"});
  // a module HIP refuses
  fake_hip().module_load_result = luminav::hipErrorInvalidImage;
  expect_error([&] { HipAotGroup(dir_.path(), 0, "gfx942", cfg); }, Status::kDriverError,
               {"hipModuleLoadData failed: hipErrorInvalidImage"});
  fake_hip().module_load_result = luminav::hipSuccess;
  // a kernel HIP does not find
  fake_hip().missing_functions = {"_lumina_tdclm_commit_kernel"};
  expect_error([&] { HipAotGroup(dir_.path(), 0, "gfx942", cfg); }, Status::kDriverError,
               {"hipModuleGetFunction failed: hipErrorNotFound", "_lumina_tdclm_commit_kernel"});
  fake_hip().missing_functions.clear();
  // a launch that fails: the error names the kernel, grid and block; the binding stays
  HipAotGroup g(dir_.path(), 0, "gfx942", cfg);
  g.bind(0x10000, 0x20000, 4, 0x30000, 0x40000, 0x50000, 0x60000, 2, 0x70000, 0x70000);
  fake_hip().launch_result = luminav::hipErrorLaunchFailure;
  expect_error([&] { g.update(stream_); }, Status::kDriverError,
               {"hipModuleLaunchKernel failed: hipErrorLaunchFailure (719)", "_lumina_tdclm_pass2_kernel",
                "grid (4, 1, 1)", "block (256, 1, 1)"});
  EXPECT_TRUE(fake_hip().launches.empty());
  fake_hip().launch_result = luminav::hipSuccess;
  g.update(stream_);
  ASSERT_EQ(fake_hip().launches.size(), 1u);
  EXPECT_EQ(values(fake_hip().launches[0], {8, 8, 8, 8, 8})[4], 0x60000u);
  expect_error([&] { g.bind(0x10000, 0, 4, 0x30000, 0x40000, 0x50000, 0x60000, 2, 0x70000, 0x70000); },
               Status::kInvalidArgument, {"HipAotGroup: the block_map address is 0 but nblocks > 0"});
}

}  // namespace
