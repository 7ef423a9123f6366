// tests/test_hip_device.cpp: the engine's GPU device on HIP (src/engine/gpu_device.cpp over
// hip_gpu_driver.cpp), driven through the C API (LV_DEVICE_HIP) by the fake HIP
// (luminav-triton-aot/tests/fakes/fake_hip.h) with host memory standing in for device memory:
// each kernel of a step launched with block 64·num_warps, the device table's rows pointing at
// the caller's tensors, the scalars and flags of docs/internals.md and the trailing scratch
// pointers; every HIP error reaches the caller as an lv_status with its text, and changes nothing
#include <gtest/gtest.h>

#include <cstddef>
#include <cstdint>
#include <cstring>
#include <map>
#include <set>
#include <string>
#include <vector>

#include "engine/group_launch.h"
#include "fakes/fake_bundle.h"
#include "fakes/fake_hip.h"
#include "fakes/fake_hsaco.h"
#include "luminav/luminav.h"
#include "luminav/luminav.hpp"

namespace {

using luminav::CUdeviceptr;
using luminav_test::fake_hip;
using luminav_test::HipLaunchRecord;
using luminav_test::json;
namespace gpu = luminav::gpu;

const char* const kPass1 = "_lumina_tdclm_pass1_kernel";
const char* const kReduce = "_lumina_tdclm_reduce_kernel";
const char* const kPass2 = "_lumina_tdclm_pass2_kernel";
const char* const kCommit = "_lumina_tdclm_commit_kernel";

std::string last() { return lv_last_error(); }

std::uint64_t bits(float x) {
  std::uint32_t u;
  std::memcpy(&u, &x, 4);
  return u;
}

// The values a launch's parameters point at (8-byte slots or 4-byte scalars), read after the step
// from the arguments the group keeps bound.
std::vector<std::uint64_t> values(const HipLaunchRecord& r, const std::vector<int>& sizes) {
  std::vector<std::uint64_t> out;
  EXPECT_EQ(sizes.size(), r.params.size()) << r.function;
  for (std::size_t i = 0; i < sizes.size() && i < r.params.size(); ++i) {
    std::uint64_t v = 0;
    std::memcpy(&v, r.params[i], static_cast<std::size_t>(sizes[i]));
    out.push_back(v);
  }
  return out;
}

const std::vector<int> kPass1Sizes = {8, 8, 8, 8, 8, 4, 4, 4, 4};
const std::vector<int> kReduceSizes = {8, 8, 8, 8, 8, 4};
const std::vector<int> kPass2Sizes = {8, 8, 8, 8, 8, 8, 4, 4, 4, 4, 4, 4, 4};
const std::vector<int> kCommitSizes = {8, 8, 4};

class HipDeviceTest : public luminav_test::FakeHipFixture {
 protected:
  void SetUp() override {
    FakeHipFixture::SetUp();
    fake_hip().host_memory = true;
    write_bundle(luminav::BoundMode::kNone);
    params_ = {std::vector<float>(3000, 0.5f), std::vector<float>(100, -0.25f)};
    grads_ = {std::vector<float>(3000, 0.01f), std::vector<float>(100, 0.02f)};
    originals_ = params_;
  }

  // The HIP variants (gfx942) of the C API's default group (fp32, clip 4, nonfinite skip) with
  // the given bound mode; a second call adds to the bundle.
  void write_bundle(luminav::BoundMode bound_mode, luminav::NonFinite nonfinite = luminav::NonFinite::kSkip) {
    luminav::GroupConfig cfg;
    cfg.hyper.clip = 4.0;
    cfg.hyper.bound_mode = bound_mode;
    cfg.hyper.nonfinite = nonfinite;
    const gpu::VariantKeys k = gpu::variant_keys(cfg);
    for (const auto& [key, kind] : {std::make_pair(k.pass1, "pass1"), std::make_pair(k.reduce, "reduce"),
                                    std::make_pair(k.pass2, "pass2"), std::make_pair(k.commit, "commit")}) {
      if (!keys_.insert(key).second) continue;  // reduce and commit do not depend on the bound
      luminav_test::VariantOptions o;
      o.spec = luminav_test::kernel_spec(kind);
      entries_.push_back(luminav_test::add_hip_variant(dir_, key, "gfx942", o));
      fake_hip().param_counts[o.spec.name] = {o.spec.signature.size(), 2};
      warps_[o.spec.name] = entries_.back()["num_warps"].get<int>();
    }
    luminav_test::write_manifest(dir_, luminav_test::manifest_v3_with(entries_));
  }

  lv_optimizer_options options(const char* arch = "gfx942:sramecc+:xnack-") const {
    lv_optimizer_options o;
    EXPECT_EQ(lv_optimizer_options_init(&o), LV_STATUS_OK);
    o.device = LV_DEVICE_HIP;
    o.device_index = 0;
    o.seed = 7;
    o.bundle_dir = bundle_.c_str();
    o.arch = arch;
    return o;
  }

  // An optimizer of one default group (lr 1e-3, clip 4, nonfinite skip) over the two tensors.
  lv_optimizer* make(const char* arch = "gfx942:sramecc+:xnack-", lv_bound_mode bound_mode = LV_BOUND_NONE) {
    const lv_optimizer_options o = options(arch);
    lv_optimizer* opt = nullptr;
    EXPECT_EQ(lv_optimizer_create(&o, &opt), LV_STATUS_OK) << last();
    lv_hyperparams h;
    EXPECT_EQ(lv_hyperparams_init(&h), LV_STATUS_OK);
    h.bound_mode = bound_mode;
    size_t group = 0;
    EXPECT_EQ(lv_optimizer_add_group(opt, &h, &group), LV_STATUS_OK) << last();
    for (std::size_t i = 0; i < params_.size(); ++i) {
      lv_param_desc d;
      EXPECT_EQ(lv_param_desc_init(&d), LV_STATUS_OK);
      d.data = params_[i].data();
      d.grad = grads_[i].data();
      d.numel = static_cast<int64_t>(params_[i].size());
      EXPECT_EQ(lv_optimizer_add_param(opt, group, &d, nullptr), LV_STATUS_OK) << last();
    }
    return opt;
  }

  // Nothing a step writes has changed: the tensors and every parameter's step counter.
  void expect_unchanged(const lv_optimizer* opt) {
    EXPECT_EQ(params_, originals_);
    for (std::size_t k = 0; k < params_.size(); ++k) {
      int64_t step = -1;
      EXPECT_EQ(lv_optimizer_get_param_step(opt, k, &step), LV_STATUS_OK) << last();
      EXPECT_EQ(step, 0);
    }
  }

  // A step that fails with `status` and a last error holding every part of `parts`.
  void expect_step_fails(lv_optimizer* opt, lv_status status, const std::vector<std::string>& parts) {
    EXPECT_EQ(lv_optimizer_step(opt, stream_), status) << last();
    for (const std::string& p : parts) EXPECT_NE(last().find(p), std::string::npos) << "missing \"" << p << "\" in " << last();
    EXPECT_TRUE(fake_hip().launches.empty());
    expect_unchanged(opt);
  }

  // A raise step refused after its check: only the check's pass 1 ran, and it names parameter 1.
  void expect_step_fails_after_probe(lv_optimizer* opt) {
    EXPECT_EQ(lv_optimizer_step(opt, stream_), LV_STATUS_NON_FINITE) << last();
    EXPECT_NE(last().find("the gradient of parameter 1 (param group 0) has a non-finite element"), std::string::npos)
        << last();
    ASSERT_EQ(fake_hip().launches.size(), 1u);
    EXPECT_EQ(fake_hip().launches[0].function, kPass1);
    fake_hip().launches.clear();
    expect_unchanged(opt);
  }

  luminav_test::TempDir dir_;
  std::string bundle_ = dir_.path();
  std::vector<json> entries_;
  std::set<std::string> keys_;
  std::map<std::string, int> warps_;
  std::vector<std::vector<float>> params_, grads_, originals_;
  void* const stream_ = reinterpret_cast<void*>(std::uintptr_t{0x7171});
};

TEST_F(HipDeviceTest, AStepLaunchesEachKernelWithItsBlockArgumentsAndScratchPointers) {
  lv_optimizer* opt = make();
  EXPECT_EQ(fake_hip().module_loads, 0);  // kernels load on the first step
  ASSERT_EQ(lv_optimizer_step(opt, stream_), LV_STATUS_OK) << last();
  EXPECT_EQ(fake_hip().module_loads, 4);
  const std::vector<HipLaunchRecord> l = fake_hip().launches;
  ASSERT_EQ(l.size(), 4u);
  const std::vector<std::string> names = {kPass1, kReduce, kPass2, kCommit};
  for (std::size_t i = 0; i < 4; ++i) {
    SCOPED_TRACE(names[i]);
    EXPECT_EQ(l[i].function, names[i]);
    EXPECT_EQ(l[i].block[0], static_cast<unsigned>(64 * warps_[names[i]]));  // a wavefront is 64 lanes
    EXPECT_EQ(l[i].block[1] * l[i].block[2], 1u);
    EXPECT_EQ(l[i].stream, static_cast<luminav::hipStream_t>(stream_));
    EXPECT_EQ(l[i].device, 0);
    EXPECT_TRUE(l[i].extra_null);
    EXPECT_EQ(l[i].trailing, (std::vector<unsigned long long>{0, 0}));  // global and profile scratch: none
  }
  EXPECT_EQ(l[0].block[0], 64u * gpu::kBlockWarps);
  EXPECT_EQ(l[1].block[0], 64u * gpu::kReduceWarps);
  EXPECT_EQ(l[3].block[0], 64u * gpu::kCommitWarps);

  const std::vector<std::uint64_t> p1 = values(l[0], kPass1Sizes), red = values(l[1], kReduceSizes),
                                   p2 = values(l[2], kPass2Sizes), com = values(l[3], kCommitSizes);
  // pass 1 and pass 2: one program per 1024 elements (3 + 1), the table and block map of the group
  EXPECT_EQ(l[0].grid[0], 4u);
  EXPECT_EQ(l[2].grid[0], 4u);
  const CUdeviceptr table = p1[0];
  EXPECT_EQ(p2[0], table);
  EXPECT_EQ(red[0], table);
  EXPECT_EQ(com[0], table);
  EXPECT_EQ(p2[1], p1[1]);  // block map
  const auto* block_map = reinterpret_cast<const std::int32_t*>(static_cast<std::uintptr_t>(p1[1]));
  EXPECT_EQ(std::vector<std::int32_t>(block_map, block_map + 4), (std::vector<std::int32_t>{0, 0, 0, 1}));
  // the table's rows point at the caller's tensors, and at state the engine allocated
  const auto* t = reinterpret_cast<const std::int64_t*>(static_cast<std::uintptr_t>(table));
  for (std::size_t k = 0; k < 2; ++k) {
    const std::int64_t* row = t + k * gpu::kTableCols;
    EXPECT_EQ(row[gpu::kColParam], reinterpret_cast<std::intptr_t>(params_[k].data()));
    EXPECT_EQ(row[gpu::kColGrad], reinterpret_cast<std::intptr_t>(grads_[k].data()));
    EXPECT_NE(row[gpu::kColExpAvg], 0);
    EXPECT_NE(row[gpu::kColExpAvgSq], 0);
    EXPECT_NE(row[gpu::kColStep], 0);
    EXPECT_EQ(row[gpu::kColNumel], static_cast<std::int64_t>(params_[k].size()));
    EXPECT_EQ(row[gpu::kColParamIndex], static_cast<std::int64_t>(k));
  }
  EXPECT_EQ(t[gpu::kColBlockStart], 0);
  EXPECT_EQ(t[gpu::kTableCols + gpu::kColBlockStart], 3);
  // the applied-step counter's row: no elements, its STEP outside every tensor's
  const std::int64_t* counter_row = t + 2 * gpu::kTableCols;
  EXPECT_EQ(counter_row[gpu::kColNumel], 0);
  EXPECT_NE(counter_row[gpu::kColStep], 0);
  // partial sums and flags shared by pass 1 and reduce; stats by reduce and pass 2
  EXPECT_EQ(red[1], p1[2]);
  EXPECT_EQ(red[2], p1[3]);
  EXPECT_EQ(p2[2], red[3]);
  // a skipping group: reduce raises the flag pass 2 and commit read
  EXPECT_NE(red[4], 0u);
  EXPECT_EQ(p2[3], red[4]);
  EXPECT_EQ(com[1], red[4]);
  EXPECT_EQ(red[5], 2u);  // the reduce grid: one program per tensor
  EXPECT_EQ(l[1].grid[0], 2u);
  EXPECT_EQ(com[2], 3u);  // commit advances both tensors' counters and the applied-step counter
  EXPECT_EQ(l[3].grid[0], 1u);
  // scalars: the seed, sign, betas, eps (pass 1); and weight decay, clip, bound (pass 2)
  EXPECT_EQ(p1[4], p2[5]);
  EXPECT_EQ(std::vector<std::uint64_t>(p1.begin() + 5, p1.end()),
            (std::vector<std::uint64_t>{bits(1.0f), bits(0.9f), bits(0.999f), bits(1e-8f)}));
  EXPECT_EQ(std::vector<std::uint64_t>(p2.begin() + 6, p2.end()),
            (std::vector<std::uint64_t>{bits(1.0f), bits(0.9f), bits(0.999f), bits(1e-8f), bits(0.01f), bits(4.0f),
                                        bits(1.0f)}));
  // lr: a device float32 the step wrote
  float lr = 0;
  std::memcpy(&lr, reinterpret_cast<const void*>(static_cast<std::uintptr_t>(p2[4])), 4);
  EXPECT_EQ(lr, 1e-3f);

  // The second step: the same launches, nothing allocated or loaded again, its flags zeroed
  const std::size_t allocations = fake_hip().allocations.size();
  const int memsets = fake_hip().memsets;
  fake_hip().launches.clear();
  ASSERT_EQ(lv_optimizer_step(opt, stream_), LV_STATUS_OK) << last();
  ASSERT_EQ(fake_hip().launches.size(), 4u);
  for (std::size_t i = 0; i < 4; ++i) EXPECT_EQ(fake_hip().launches[i].function, names[i]);
  EXPECT_EQ(fake_hip().allocations.size(), allocations);
  EXPECT_EQ(fake_hip().module_loads, 4);
  EXPECT_EQ(fake_hip().memsets, memsets + 1);  // the step's flag pair (lr unchanged)
  // a new lr is written once, before the launches that read it
  ASSERT_EQ(lv_optimizer_set_lr(opt, 0, 5e-4), LV_STATUS_OK);
  ASSERT_EQ(lv_optimizer_step(opt, stream_), LV_STATUS_OK) << last();
  EXPECT_EQ(fake_hip().memsets, memsets + 3);
  std::memcpy(&lr, reinterpret_cast<const void*>(static_cast<std::uintptr_t>(p2[4])), 4);
  EXPECT_EQ(lr, 5e-4f);
  EXPECT_EQ(lv_optimizer_destroy(opt), LV_STATUS_OK);
  // the last optimizer on the bundle gone: its HIP runtime unloads every module, and every
  // allocation of the device is freed
  EXPECT_EQ(fake_hip().module_unloads, 4);
  EXPECT_EQ(fake_hip().freed.size(), fake_hip().allocations.size());
}

TEST_F(HipDeviceTest, ABoundedGroupsFirstStepCopiesTheParametersIntoPInitOnTheStream) {
  write_bundle(luminav::BoundMode::kAbs);
  lv_optimizer* opt = make("gfx942", LV_BOUND_ABS);
  ASSERT_EQ(lv_optimizer_step(opt, stream_), LV_STATUS_OK) << last();
  ASSERT_EQ(fake_hip().launches.size(), 4u);
  const CUdeviceptr table = values(fake_hip().launches[0], kPass1Sizes)[0];
  const auto* t = reinterpret_cast<const std::int64_t*>(static_cast<std::uintptr_t>(table));
  for (std::size_t k = 0; k < params_.size(); ++k) {
    const auto* p0 = reinterpret_cast<const float*>(static_cast<std::uintptr_t>(t[k * gpu::kTableCols + gpu::kColPInit]));
    ASSERT_NE(p0, nullptr);
    EXPECT_EQ(std::vector<float>(p0, p0 + params_[k].size()), params_[k]);  // hipMemcpyAsync, device to device
  }
  EXPECT_EQ(lv_optimizer_destroy(opt), LV_STATUS_OK);
}

TEST_F(HipDeviceTest, TheOptimizersDeviceIsCurrentForItsWorkAndTheCallersIsRestored) {
  fake_hip().device_count = 2;
  lv_optimizer_options o = options();
  o.device_index = 1;
  lv_optimizer* opt = nullptr;
  ASSERT_EQ(lv_optimizer_create(&o, &opt), LV_STATUS_OK) << last();
  EXPECT_EQ(fake_hip().current_device, 0);  // the caller's device, restored after the allocation
  lv_hyperparams h;
  ASSERT_EQ(lv_hyperparams_init(&h), LV_STATUS_OK);
  ASSERT_EQ(lv_optimizer_add_group(opt, &h, nullptr), LV_STATUS_OK) << last();
  lv_param_desc d;
  ASSERT_EQ(lv_param_desc_init(&d), LV_STATUS_OK);
  d.data = params_[0].data();
  d.grad = grads_[0].data();
  d.numel = static_cast<int64_t>(params_[0].size());
  ASSERT_EQ(lv_optimizer_add_param(opt, 0, &d, nullptr), LV_STATUS_OK) << last();
  ASSERT_EQ(lv_optimizer_step(opt, stream_), LV_STATUS_OK) << last();
  ASSERT_EQ(fake_hip().launches.size(), 4u);
  for (const HipLaunchRecord& r : fake_hip().launches) EXPECT_EQ(r.device, 1) << r.function;
  EXPECT_EQ(fake_hip().current_device, 0);
  EXPECT_EQ(lv_optimizer_destroy(opt), LV_STATUS_OK);
  EXPECT_EQ(fake_hip().current_device, 0);
}

TEST_F(HipDeviceTest, NonfiniteRaiseReadsTheFlagsOnTheHostAndRefusesTheStepUnchanged) {
  write_bundle(luminav::BoundMode::kNone, luminav::NonFinite::kRaise);  // pass 2 and commit without the flag
  lv_optimizer_options o = options();
  lv_optimizer* opt = nullptr;
  ASSERT_EQ(lv_optimizer_create(&o, &opt), LV_STATUS_OK) << last();
  lv_hyperparams h;
  ASSERT_EQ(lv_hyperparams_init(&h), LV_STATUS_OK);
  h.nonfinite = LV_NONFINITE_RAISE;
  ASSERT_EQ(lv_optimizer_add_group(opt, &h, nullptr), LV_STATUS_OK) << last();
  for (std::size_t i = 0; i < params_.size(); ++i) {
    lv_param_desc d;
    ASSERT_EQ(lv_param_desc_init(&d), LV_STATUS_OK);
    d.data = params_[i].data();
    d.grad = grads_[i].data();
    d.numel = static_cast<int64_t>(params_[i].size());
    ASSERT_EQ(lv_optimizer_add_param(opt, 0, &d, nullptr), LV_STATUS_OK) << last();
  }
  // pass 1 writes every block's non-finite flag: here block 3, the second tensor's only block
  std::int32_t bad_block = 3;
  fake_hip().on_launch = [&](const HipLaunchRecord& r, void** params) {
    if (r.function != kPass1) return;
    CUdeviceptr partial_bad;
    std::memcpy(&partial_bad, params[3], 8);
    auto* flags = reinterpret_cast<std::int32_t*>(static_cast<std::uintptr_t>(partial_bad));
    for (std::int32_t b = 0; b < static_cast<std::int32_t>(r.grid[0]); ++b) flags[b] = b == bad_block ? 1 : 0;
  };
  expect_step_fails_after_probe(opt);
  bad_block = -1;
  ASSERT_EQ(lv_optimizer_step(opt, stream_), LV_STATUS_OK) << last();
  // the check (pass 1 as a skipping group runs it), then the step: pass 1, reduce, pass 2, commit
  ASSERT_EQ(fake_hip().launches.size(), 5u);
  EXPECT_EQ(fake_hip().launches[0].function, kPass1);
  EXPECT_EQ(fake_hip().launches[4].function, kCommit);
  fake_hip().on_launch = nullptr;
  EXPECT_EQ(lv_optimizer_destroy(opt), LV_STATUS_OK);
}

TEST_F(HipDeviceTest, ModuleLoadFailureReachesTheCallerAndChangesNothing) {
  lv_optimizer* opt = make();
  fake_hip().module_load_result = luminav::hipErrorInvalidImage;
  expect_step_fails(opt, LV_STATUS_DRIVER_ERROR,
                    {"hipModuleLoadData failed: hipErrorInvalidImage (200)", "on HIP device 0"});
  fake_hip().module_load_result = luminav::hipSuccess;
  ASSERT_EQ(lv_optimizer_step(opt, stream_), LV_STATUS_OK) << last();
  EXPECT_EQ(fake_hip().launches.size(), 4u);
  EXPECT_EQ(lv_optimizer_destroy(opt), LV_STATUS_OK);
}

TEST_F(HipDeviceTest, MissingFunctionReachesTheCallerAndChangesNothing) {
  lv_optimizer* opt = make();
  fake_hip().missing_functions = {kCommit};
  expect_step_fails(opt, LV_STATUS_DRIVER_ERROR, {"hipModuleGetFunction failed: hipErrorNotFound", kCommit});
  fake_hip().missing_functions.clear();
  ASSERT_EQ(lv_optimizer_step(opt, stream_), LV_STATUS_OK) << last();
  EXPECT_EQ(fake_hip().launches.size(), 4u);
  EXPECT_EQ(lv_optimizer_destroy(opt), LV_STATUS_OK);
}

TEST_F(HipDeviceTest, LaunchFailureReachesTheCallerWithKernelGridAndBlock) {
  lv_optimizer* opt = make();
  fake_hip().launch_result = luminav::hipErrorLaunchFailure;
  expect_step_fails(opt, LV_STATUS_DRIVER_ERROR,
                    {"hipModuleLaunchKernel failed: hipErrorLaunchFailure (719)", kPass1, "grid (4, 1, 1)",
                     "block (256, 1, 1)"});
  fake_hip().launch_result = luminav::hipSuccess;
  ASSERT_EQ(lv_optimizer_step(opt, stream_), LV_STATUS_OK) << last();
  EXPECT_EQ(fake_hip().launches.size(), 4u);
  EXPECT_EQ(lv_optimizer_destroy(opt), LV_STATUS_OK);
}

TEST_F(HipDeviceTest, AllocationFailureReachesTheCallerAndChangesNothing) {
  // at creation (the step flags): no optimizer, *out untouched
  const lv_optimizer_options o = options();
  lv_optimizer* out = reinterpret_cast<lv_optimizer*>(0x1);
  fake_hip().malloc_result = luminav::hipErrorOutOfMemory;
  EXPECT_EQ(lv_optimizer_create(&o, &out), LV_STATUS_DRIVER_ERROR);
  EXPECT_NE(last().find("hipMalloc failed: hipErrorOutOfMemory (2)"), std::string::npos) << last();
  EXPECT_NE(last().find("bytes on HIP device 0"), std::string::npos) << last();
  EXPECT_EQ(out, reinterpret_cast<lv_optimizer*>(0x1));
  fake_hip().malloc_result = luminav::hipSuccess;
  // at the first step (the group's tables): refused before any launch
  lv_optimizer* opt = make();
  fake_hip().malloc_result = luminav::hipErrorOutOfMemory;
  expect_step_fails(opt, LV_STATUS_DRIVER_ERROR, {"hipMalloc failed: hipErrorOutOfMemory", "bytes on HIP device 0"});
  fake_hip().malloc_result = luminav::hipSuccess;
  ASSERT_EQ(lv_optimizer_step(opt, stream_), LV_STATUS_OK) << last();
  EXPECT_EQ(fake_hip().launches.size(), 4u);
  EXPECT_EQ(lv_optimizer_destroy(opt), LV_STATUS_OK);
}

TEST_F(HipDeviceTest, AWrongArchDeviceOrMissingArchIsRefusedWithTheFix) {
  // no variant for the device's arch: the first step names the build that adds it
  lv_optimizer* opt = make("gfx90a");
  expect_step_fails(opt, LV_STATUS_NOT_FOUND, {"gfx90a", "luminamoon aot build --arch gfx90a"});
  EXPECT_EQ(lv_optimizer_destroy(opt), LV_STATUS_OK);
  lv_optimizer* out = reinterpret_cast<lv_optimizer*>(0x1);
  // no arch
  lv_optimizer_options o = options(nullptr);
  EXPECT_EQ(lv_optimizer_create(&o, &out), LV_STATUS_INVALID_ARGUMENT);
  EXPECT_NE(last().find("the HIP device needs its arch"), std::string::npos) << last();
  EXPECT_NE(last().find("gcnArchName"), std::string::npos) << last();
  // a device the runtime does not have
  o = options();
  o.device_index = 3;
  EXPECT_EQ(lv_optimizer_create(&o, &out), LV_STATUS_NOT_FOUND);
  EXPECT_NE(last().find("HIP device 3 does not exist"), std::string::npos) << last();
  // no bundle
  o = options();
  o.bundle_dir = nullptr;
  EXPECT_EQ(lv_optimizer_create(&o, &out), LV_STATUS_INVALID_ARGUMENT);
  EXPECT_NE(last().find("the HIP device needs an AOT bundle"), std::string::npos) << last();
  EXPECT_EQ(out, reinterpret_cast<lv_optimizer*>(0x1));
}

TEST_F(HipDeviceTest, OptionsOfTheFirstReleaseStillWorkButCannotAskForHip) {
  // A caller built against the header before `arch`: struct_size ends at bundle_dir.
  lv_optimizer_options o;
  ASSERT_EQ(lv_optimizer_options_init(&o), LV_STATUS_OK);
  EXPECT_EQ(o.struct_size, sizeof(lv_optimizer_options));
  EXPECT_EQ(o.arch, nullptr);
  o.struct_size = static_cast<uint32_t>(offsetof(lv_optimizer_options, arch));
  lv_optimizer* opt = nullptr;
  ASSERT_EQ(lv_optimizer_create(&o, &opt), LV_STATUS_OK) << last();  // CPU
  EXPECT_EQ(lv_optimizer_destroy(opt), LV_STATUS_OK);
  o.device = LV_DEVICE_HIP;
  o.bundle_dir = bundle_.c_str();
  lv_optimizer* out = reinterpret_cast<lv_optimizer*>(0x1);
  EXPECT_EQ(lv_optimizer_create(&o, &out), LV_STATUS_INVALID_ARGUMENT);
  EXPECT_NE(last().find("LV_DEVICE_HIP needs it"), std::string::npos) << last();
  o.struct_size = 8;
  EXPECT_EQ(lv_optimizer_create(&o, &out), LV_STATUS_INVALID_ARGUMENT);
  EXPECT_NE(last().find("struct_size is 8"), std::string::npos) << last();
  EXPECT_EQ(out, reinterpret_cast<lv_optimizer*>(0x1));
  EXPECT_EQ(lv_hip_runtime_available(), 1);  // the fake's table is installed
}

TEST_F(HipDeviceTest, TheCppApiChoosesTheHipDevice) {
  luminav::Optimizer opt(luminav::OptimizerOptions().hip(0, bundle_, "gfx942").with_seed(7));
  const auto g = opt.add_group(luminav::Hyperparams());
  for (std::size_t i = 0; i < params_.size(); ++i) {
    opt.add_param(g, luminav::ParamRef::f32(params_[i].data(), grads_[i].data(), static_cast<std::int64_t>(params_[i].size())));
  }
  opt.step(stream_);
  ASSERT_EQ(fake_hip().launches.size(), 4u);
  EXPECT_EQ(fake_hip().launches[0].function, kPass1);
  EXPECT_EQ(fake_hip().launches[3].function, kCommit);
  fake_hip().launch_result = luminav::hipErrorLaunchFailure;
  try {
    opt.step(stream_);
    FAIL() << "the failed launch was not reported";
  } catch (const luminav::Error& e) {
    EXPECT_EQ(e.status(), luminav::Status::kDriverError);
    EXPECT_NE(std::string(e.what()).find("hipModuleLaunchKernel failed"), std::string::npos) << e.what();
  }
}

}  // namespace
