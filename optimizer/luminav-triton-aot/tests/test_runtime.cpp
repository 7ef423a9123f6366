// tests/test_runtime.cpp: the AOT runtime (src/aot/runtime.cpp)
//
// AotRuntime, the module cache and launcher, driven through an injected driver table: what it
// asks the driver (the kernelParams, grid, block and shared sizes of each launch), what it
// caches, and every refusal before a launch.
#include <gtest/gtest.h>

#include <atomic>
#include <functional>
#include <string>
#include <thread>
#include <vector>

#include "aot/runtime.h"
#include "aot/triton_abi.h"
#include "fakes/expect_error.h"
#include "fakes/fake_bundle.h"
#include "fakes/fake_driver.h"
#include "luminav/error.h"

using luminav::AotManifest;
using luminav::AotRuntime;
using luminav::CUdeviceptr;
using luminav::LoadedKernel;
using luminav::Status;
using namespace luminav_test;

class RuntimeTest : public FakeDriverFixture {
 protected:
  // A bundle with the pass-2 variant for the given archs; `edit` may change the first entry.
  AotManifest bundle(const std::vector<int>& archs, const std::function<void(json&)>& edit = nullptr) {
    std::vector<json> entries;
    for (int a : archs) entries.push_back(add_variant(dir_, kPass2Key, a));
    if (edit) edit(entries[0]);
    write_manifest(dir_, manifest_with(entries));
    return AotManifest::load(dir_.path());
  }
  // Pass-2 argument values and the pointers the launcher takes.
  struct Args {
    CUdeviceptr table = 0x1000, block_map = 0x2000, stats = 0x3000, found_inf = 0x4000, lr = 0x5000;
    std::int64_t seed = 1234;
    float sign = 1.f, beta1 = 0.9f, beta2 = 0.999f, eps = 1e-8f, wd = 0.01f, clip = 4.f, bound = 1.f;
    std::vector<void*> ptrs() {
      return {&table, &block_map, &stats, &found_inf, &lr, &seed, &sign, &beta1, &beta2, &eps, &wd, &clip, &bound};
    }
  };
  TempDir dir_;
};

TEST_F(RuntimeTest, LoadsLazilyOncePerDeviceInThePrimaryContext) {
  fake().device_count = 2;
  {
    AotRuntime rt(bundle({90}));
    EXPECT_EQ(rt.loaded_count(), 0u);
    EXPECT_EQ(fake().module_loads, 0);
    EXPECT_FALSE(rt.manifest().kernels()[0].image_verified());  // read when first loaded, not before
    const LoadedKernel& k = rt.get(kPass2Key, 0);
    EXPECT_TRUE(rt.manifest().kernels()[0].image_verified());
    EXPECT_EQ(rt.loaded_count(), 1u);
    EXPECT_EQ(fake().module_loads, 1);
    // The driver got the bytes the manifest verified, not a second read of the file.
    ASSERT_EQ(fake().loaded_images.size(), 1u);
    EXPECT_EQ(fake().loaded_images[0], static_cast<const void*>(rt.manifest().kernels()[0].image().data()));
    EXPECT_EQ(k.meta, &rt.manifest().kernels()[0]);
    EXPECT_EQ(k.device, 0);
    EXPECT_EQ(k.context, fake_primary_ctx(0));
    EXPECT_EQ(k.params_checked, 15);
    EXPECT_EQ(k.num_regs, 40);
    EXPECT_EQ(&rt.get(kPass2Key, 0), &k);  // cached
    EXPECT_EQ(fake().module_loads, 1);
    const LoadedKernel& k1 = rt.get(kPass2Key, 1);
    EXPECT_NE(&k1, &k);
    EXPECT_EQ(k1.context, fake_primary_ctx(1));
    EXPECT_EQ(fake().module_loads, 2);
    EXPECT_EQ(fake().retains, 2);  // one primary-context retain per device
    EXPECT_TRUE(fake().ctx_stack.empty());  // the caller's (absent) context is restored
  }
  EXPECT_EQ(fake().module_unloads, 2);
  EXPECT_EQ(fake().releases, 2);
}

TEST_F(RuntimeTest, LaunchPassesUserArgumentsThenNullScratchAndTheVariantsSizes) {
  AotRuntime rt(bundle({90}));
  const LoadedKernel& k = rt.get(kPass2Key, 0);
  Args a;
  const std::vector<void*> user = a.ptrs();
  auto* stream = reinterpret_cast<luminav::CUstream>(0x5151);
  fake().ctx_stack.push_back(fake_user_ctx());  // the caller has another context current
  rt.launch(k, {37, 1, 1}, user, stream);
  ASSERT_EQ(fake().launches.size(), 1u);
  const LaunchRecord& r = fake().launches[0];
  EXPECT_EQ(r.function, k.function);
  EXPECT_EQ(r.grid[0], 37u);
  EXPECT_EQ(r.grid[1], 1u);
  EXPECT_EQ(r.grid[2], 1u);
  EXPECT_EQ(r.block[0], 256u);  // num_warps 8 x 32
  EXPECT_EQ(r.block[1], 1u);
  EXPECT_EQ(r.block[2], 1u);
  EXPECT_EQ(r.shared, 0u);
  EXPECT_EQ(r.stream, stream);
  EXPECT_EQ(r.current, fake_primary_ctx(0));  // launched in the device's primary context
  for (std::size_t i = 0; i < user.size(); ++i) EXPECT_EQ(r.params[i], user[i]) << "argument " << i;
  ASSERT_EQ(r.trailing.size(), 2u);
  EXPECT_EQ(r.trailing[0], 0u);
  EXPECT_EQ(r.trailing[1], 0u);
  EXPECT_EQ(r.params[13], static_cast<const void*>(&luminav::TRITON_NULL_SCRATCH));
  EXPECT_TRUE(fake().allocations.empty());  // no scratch needed, none allocated
  ASSERT_EQ(fake().ctx_stack.size(), 1u);
  EXPECT_EQ(fake().ctx_stack.back(), fake_user_ctx());  // the caller's context is back
}

TEST_F(RuntimeTest, ABundleOfAnOlderTritonLaunchesWithItsOwnTrailingCount) {
  for (int trailing : {0, 1}) {
    SCOPED_TRACE(trailing);
    TempDir dir;
    VariantOptions older;
    older.trailing = trailing;
    older.triton_version = trailing == 0 ? "3.2.0" : "3.4.0";  // what each appends (docs/triton-abi.md)
    write_manifest(dir, manifest_with({add_variant(dir, kPass2Key, 90, older)}));
    fake().use_param_sizes = true;
    fake().param_sizes = {8, 8, 8, 8, 8, 8, 4, 4, 4, 4, 4, 4, 4};
    for (int t = 0; t < trailing; ++t) fake().param_sizes.push_back(8);
    fake().n_trailing = trailing;
    fake().launches.clear();
    AotRuntime rt(AotManifest::load(dir.path()));
    Args a;
    rt.launch(rt.get(kPass2Key, 0), {3, 1, 1}, a.ptrs(), nullptr);
    ASSERT_EQ(fake().launches.size(), 1u);
    EXPECT_EQ(fake().launches[0].trailing, std::vector<CUdeviceptr>(static_cast<std::size_t>(trailing), 0));
  }
}

TEST_F(RuntimeTest, GlobalScratchIsAllocatedAlignedOncePerGridAndFreed) {
  fake().use_param_sizes = true;
  fake().param_sizes = {8, 8, 8, 8, 8, 8, 4, 4, 4, 4, 4, 4, 4, 8, 8};
  std::vector<CUdeviceptr> freed_expected;
  {
    AotRuntime rt(bundle({90}, [](json& e) {
      e["global_scratch_size"] = 96;
      e["global_scratch_align"] = 512;  // above cuMemAlloc's 256: the runtime over-allocates
    }));
    const LoadedKernel& k = rt.get(kPass2Key, 0);
    Args a;
    rt.launch(k, {10, 2, 1}, a.ptrs(), nullptr);
    ASSERT_EQ(fake().allocations.size(), 1u);
    EXPECT_EQ(fake().allocations[0], 10u * 2 * 96 + 511);
    const CUdeviceptr first = fake().launches[0].trailing[0];
    EXPECT_NE(first, 0u);
    EXPECT_EQ(first % 512, 0u);
    EXPECT_EQ(fake().launches[0].trailing[1], 0u);  // profile scratch stays null
    rt.launch(k, {10, 2, 1}, a.ptrs(), nullptr);    // same grid: reused, no allocation
    EXPECT_EQ(fake().allocations.size(), 1u);
    EXPECT_EQ(fake().launches[1].trailing[0], first);
    rt.launch(k, {11, 2, 1}, a.ptrs(), nullptr);  // another grid: its own buffer
    EXPECT_EQ(fake().allocations.size(), 2u);
    EXPECT_EQ(fake().allocations[1], 11u * 2 * 96 + 511);
    EXPECT_NE(fake().launches[2].trailing[0], first);
    EXPECT_EQ(fake().launches[2].trailing[0] % 512, 0u);
  }
  EXPECT_EQ(fake().freed.size(), 2u);
}

TEST_F(RuntimeTest, LargeSharedMemoryIsOptedIntoAndTooMuchIsRefused) {
  {
    AotRuntime rt(bundle({90}, [](json& e) { e["shared_mem"] = 100000; }));
    const LoadedKernel& k = rt.get(kPass2Key, 0);
    ASSERT_EQ(fake().func_set_attributes.size(), 1u);
    EXPECT_EQ(fake().func_set_attributes[0].first, luminav::CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES);
    EXPECT_EQ(fake().func_set_attributes[0].second, 100000);
    Args a;
    rt.launch(k, {1, 1, 1}, a.ptrs(), nullptr);
    EXPECT_EQ(fake().launches.back().shared, 100000u);
  }
  TempDir other;
  json e = add_variant(other, kPass2Key, 90);
  e["shared_mem"] = 300000;
  write_manifest(other, manifest_with({e}));
  AotRuntime rt(AotManifest::load(other.path()));
  expect_error([&] { rt.get(kPass2Key, 0); }, Status::kBundleError,
               {"field \"shared_mem\"", "expected at most 232448", "found 300000"});
  EXPECT_EQ(fake().module_loads, 1);  // only the first runtime's load
}

TEST_F(RuntimeTest, SmallSharedMemoryNeedsNoAttribute) {
  AotRuntime rt(bundle({90}, [](json& e) { e["shared_mem"] = 49152; }));
  rt.get(kPass2Key, 0);
  EXPECT_TRUE(fake().func_set_attributes.empty());
}

TEST_F(RuntimeTest, AModuleTheDriverRejectsIsADriverErrorAndNothingIsCached) {
  fake().module_load_result = luminav::CUDA_ERROR_INVALID_IMAGE;
  AotRuntime rt(bundle({90}));
  expect_error([&] { rt.get(kPass2Key, 0); }, Status::kDriverError,
               {"cuModuleLoadData failed: CUDA_ERROR_INVALID_IMAGE (200): device kernel image is invalid",
                rt.manifest().kernels()[0].cubin_path, kPass2Key, "device 0"});
  EXPECT_EQ(rt.loaded_count(), 0u);
  EXPECT_TRUE(fake().ctx_stack.empty());
  fake().module_load_result = luminav::CUDA_SUCCESS;  // a later call retries and succeeds
  EXPECT_NO_THROW(rt.get(kPass2Key, 0));
  EXPECT_EQ(rt.loaded_count(), 1u);
}

TEST_F(RuntimeTest, AMissingEntrySymbolIsRefusedAndTheModuleUnloaded) {
  fake().entries = {"some_other_kernel"};
  AotRuntime rt(bundle({90}));
  expect_error([&] { rt.get(kPass2Key, 0); }, Status::kBundleError,
               {"field \"entry\"", "a kernel named \"_lumina_tdclm_pass2_kernel\"", "CUDA_ERROR_NOT_FOUND"});
  EXPECT_EQ(fake().module_loads, 1);
  EXPECT_EQ(fake().module_unloads, 1);
  EXPECT_EQ(rt.loaded_count(), 0u);
}

TEST_F(RuntimeTest, AParameterCountThatDisagreesIsRefusedBeforeAnyLaunch) {
  fake().use_param_sizes = true;
  fake().param_sizes = {8, 8, 8, 8, 8, 8, 4, 4, 4, 4, 4, 4, 4, 8};  // 14: one trailing pointer
  AotRuntime rt(bundle({90}));
  expect_error([&] { rt.get(kPass2Key, 0); }, Status::kBundleError,
               {"field \"num_params\"", "the manifest says 15", "len(signature) 13 + num_trailing_scratch_ptrs 2",
                "has 14 parameters (cuFuncGetParamInfo)", "ABI mismatch", "refused before any launch"});
  EXPECT_TRUE(fake().launches.empty());
  EXPECT_EQ(fake().module_unloads, fake().module_loads);
  EXPECT_EQ(rt.loaded_count(), 0u);
}

TEST_F(RuntimeTest, AParameterSizeThatDisagreesIsRefused) {
  fake().use_param_sizes = true;
  fake().param_sizes = {8, 8, 8, 8, 8, 4, 4, 4, 4, 4, 4, 4, 4, 8, 8};  // seed 4 bytes, not i64's 8
  AotRuntime rt(bundle({90}));
  expect_error([&] { rt.get(kPass2Key, 0); }, Status::kBundleError,
               {"field \"signature\"", "parameter 5 \"seed\" (i64) is 8 bytes by the manifest but 4 bytes"});
  EXPECT_TRUE(fake().launches.empty());
}

TEST_F(RuntimeTest, WithoutParamInfoTheCountIsNotChecked) {
  api_.cuFuncGetParamInfo = nullptr;  // drivers before CUDA 12.4
  AotRuntime rt(bundle({90}));
  const LoadedKernel& k = rt.get(kPass2Key, 0);
  EXPECT_EQ(k.params_checked, -1);
}

TEST_F(RuntimeTest, ADeviceOfAnotherArchIsRefused) {
  fake().cc_major = 8;
  fake().cc_minor = 0;
  AotRuntime rt(bundle({90}));
  expect_error([&] { rt.get(kPass2Key, 0); }, Status::kNotFound,
               {kPass2Key, "compute capability 8.0", "sm_90", "luminamoon aot build --arch 80"});
  expect_error([&] { rt.load(rt.manifest().kernels()[0], 0); }, Status::kBundleError,
               {"field \"target.arch\"", "device 0 (compute capability 8.0)", "found 90",
                "luminamoon aot build --arch 80"});
  EXPECT_EQ(fake().module_loads, 0);
  EXPECT_TRUE(fake().launches.empty());
}

TEST_F(RuntimeTest, ANewerMajorIsRefusedAndANewerMinorRunsTheOlderCubin) {
  fake().cc_major = 10;
  fake().cc_minor = 0;
  {
    AotRuntime rt(bundle({80, 90}));
    expect_error([&] { rt.get(kPass2Key, 0); }, Status::kNotFound,
                 {"compute capability 10.0", "sm_80, sm_90", "--arch 100"});
  }
  fake().cc_major = 8;
  fake().cc_minor = 9;
  TempDir dir;
  write_manifest(dir, manifest_with({add_variant(dir, kPass2Key, 80), add_variant(dir, kPass2Key, 86),
                                     add_variant(dir, kPass2Key, 90)}));
  AotRuntime rt(AotManifest::load(dir.path()));
  EXPECT_EQ(rt.get(kPass2Key, 0).meta->arch, 86);
}

TEST_F(RuntimeTest, AnUnknownDeviceOrdinalIsNotFound) {
  fake().device_count = 2;
  AotRuntime rt(bundle({90}));
  expect_error([&] { rt.get(kPass2Key, 5); }, Status::kNotFound,
               {"CUDA device 5 does not exist", "sees 2 device(s) (ordinals 0..1)"});
  expect_error([&] { rt.device_info(-1); }, Status::kNotFound, {"CUDA device -1 does not exist"});
  const luminav::DeviceInfo info = rt.device_info(1);
  EXPECT_EQ(info.cc_major, 9);
  EXPECT_EQ(info.multiprocessors, 132);
}

TEST_F(RuntimeTest, TooManyThreadsPerBlockIsRefused) {
  fake().max_threads = 128;
  AotRuntime rt(bundle({90}));
  expect_error([&] { rt.get(kPass2Key, 0); }, Status::kBundleError,
               {"field \"num_warps\"", "expected at most 4", "found 8"});
}

TEST_F(RuntimeTest, ClusterLaunchesAreRefused) {
  AotRuntime rt(bundle({90}, [](json& e) { e["num_ctas"] = 2; }));
  expect_error([&] { rt.get(kPass2Key, 0); }, Status::kBundleError, {"field \"num_ctas\"", "expected 1", "found 2"});
  EXPECT_EQ(fake().module_loads, 0);
}

TEST_F(RuntimeTest, LaunchErrorsPropagateWithTheSymbolAndTheErrorString) {
  AotRuntime rt(bundle({90}));
  const LoadedKernel& k = rt.get(kPass2Key, 0);
  fake().launch_result = luminav::CUDA_ERROR_LAUNCH_FAILED;
  Args a;
  expect_error([&] { rt.launch(k, {5, 1, 1}, a.ptrs(), nullptr); }, Status::kDriverError,
               {"cuLaunchKernel failed: CUDA_ERROR_LAUNCH_FAILED (719): unspecified launch failure",
                "_lumina_tdclm_pass2_kernel", kPass2Key, "grid (5, 1, 1)", "block 256"});
  EXPECT_TRUE(fake().ctx_stack.empty());  // the context is popped even on failure
}

TEST_F(RuntimeTest, BadLaunchArgumentsAreRefusedBeforeTheDriverSeesThem) {
  AotRuntime rt(bundle({90}));
  const LoadedKernel& k = rt.get(kPass2Key, 0);
  Args a;
  std::vector<void*> short_list = a.ptrs();
  short_list.pop_back();
  expect_error([&] { rt.launch(k, {1, 1, 1}, short_list, nullptr); }, Status::kInvalidArgument,
               {"expected 13 argument pointers (table, block_map,", "got 12"});
  std::vector<void*> with_null = a.ptrs();
  with_null[4] = nullptr;
  expect_error([&] { rt.launch(k, {1, 1, 1}, with_null, nullptr); }, Status::kInvalidArgument,
               {"kernel argument 4 is a null pointer"});
  expect_error([&] { rt.launch(k, {1, 70000, 1}, a.ptrs(), nullptr); }, Status::kInvalidArgument,
               {"grid (1, 70000, 1) exceeds the driver's limits"});
  LoadedKernel never_loaded;
  expect_error([&] { rt.launch(never_loaded, {1, 1, 1}, a.ptrs(), nullptr); }, Status::kInvalidArgument,
               {"was not loaded"});
  EXPECT_TRUE(fake().launches.empty());
  rt.launch(k, {0, 1, 1}, a.ptrs(), nullptr);  // an empty grid launches nothing
  EXPECT_TRUE(fake().launches.empty());
}

TEST_F(RuntimeTest, MetadataFromAnotherManifestIsRefused) {
  AotRuntime rt(bundle({90}));
  TempDir other;
  write_manifest(other, manifest_with({add_variant(other, kPass2Key, 90)}));
  const AotManifest m2 = AotManifest::load(other.path());
  expect_error([&] { rt.load(m2.kernels()[0], 0); }, Status::kInvalidArgument,
               {"not an entry of this runtime's manifest"});
}

TEST_F(RuntimeTest, ConcurrentGetsLoadEachModuleOnce) {
  AotRuntime rt(bundle({90}));
  std::vector<const LoadedKernel*> got(8, nullptr);
  std::vector<std::thread> threads;
  for (std::size_t i = 0; i < got.size(); ++i) {
    threads.emplace_back([&, i] { got[i] = &rt.get(kPass2Key, 0); });
  }
  for (auto& t : threads) t.join();
  for (const LoadedKernel* k : got) EXPECT_EQ(k, got[0]);
  EXPECT_EQ(fake().module_loads, 1);
  EXPECT_EQ(rt.loaded_count(), 1u);
}

TEST(RuntimeNoDriver, ARuntimeWithoutADriverIsADriverError) {
  if (luminav::cuda_driver_available()) GTEST_SKIP() << "this machine has a CUDA driver";
  TempDir dir;
  write_manifest(dir, manifest_with({add_variant(dir, kPass2Key, 90)}));
  expect_error([&] { AotRuntime rt(AotManifest::load(dir.path())); }, Status::kDriverError,
               {"the CPU engine works without one"});
}

// ---------------------------------------------------------------------------------------------
// Cubins read on first load.

TEST_F(RuntimeTest, ACorruptCubinIsRefusedAtItsFirstLoadBeforeTheDriverSeesIt) {
  std::vector<json> entries = {add_variant(dir_, kPass2Key, 90)};
  write_manifest(dir_, manifest_with(entries));
  const std::string cubin = dir_.file(entries[0]["cubin"].get<std::string>());
  const std::vector<unsigned char> good = read_bytes(cubin);
  write_bytes(cubin, make_fake_cubin("modified"));
  AotRuntime rt(AotManifest::load(dir_.path()));  // the manifest alone: accepted
  for (int attempt = 0; attempt < 2; ++attempt) {
    expect_error([&] { rt.get(kPass2Key, 0); }, Status::kBundleError,
                 {"field \"sha256\"", cubin, "rebuild the bundle (luminamoon aot build)"});
  }
  EXPECT_EQ(fake().module_loads, 0);
  EXPECT_EQ(rt.loaded_count(), 0u);
  EXPECT_TRUE(fake().ctx_stack.empty());
  write_bytes(cubin, good);  // repaired: the next load reads it again and succeeds
  EXPECT_NO_THROW(rt.get(kPass2Key, 0));
  EXPECT_EQ(fake().module_loads, 1);
}

TEST_F(RuntimeTest, ConcurrentFirstLoadsOfACorruptCubinAllRefuseIt) {
  std::vector<json> entries = {add_variant(dir_, kPass2Key, 90)};
  write_manifest(dir_, manifest_with(entries));
  write_bytes(dir_.file(entries[0]["cubin"].get<std::string>()), make_fake_cubin("modified"));
  AotRuntime rt(AotManifest::load(dir_.path()));
  std::atomic<int> refused{0};
  std::vector<std::thread> threads;
  for (int i = 0; i < 8; ++i) {
    threads.emplace_back([&] {
      try {
        rt.get(kPass2Key, 0);
      } catch (const luminav::Error& e) {
        if (e.status() == Status::kBundleError) ++refused;
      }
    });
  }
  for (auto& t : threads) t.join();
  EXPECT_EQ(refused.load(), 8);
  EXPECT_EQ(fake().module_loads, 0);
}

// ---------------------------------------------------------------------------------------------
// The launch without a vector, and KernelLaunch: the same kernelParams as launch(), bound once.

TEST_F(RuntimeTest, ThePointerArrayLaunchPacksAsTheVectorLaunch) {
  AotRuntime rt(bundle({90}));
  const LoadedKernel& k = rt.get(kPass2Key, 0);
  Args a;
  const std::vector<void*> user = a.ptrs();
  rt.launch(k, {9, 1, 1}, user.data(), user.size(), nullptr);
  rt.launch(k, {9, 1, 1}, user, nullptr);
  ASSERT_EQ(fake().launches.size(), 2u);
  EXPECT_EQ(fake().launches[0].params, fake().launches[1].params);
  EXPECT_EQ(fake().launches[0].trailing, fake().launches[1].trailing);
  expect_error([&] { rt.launch(k, {1, 1, 1}, user.data(), user.size() - 1, nullptr); }, Status::kInvalidArgument,
               {"expected 13 argument pointers", "got 12"});
}

TEST_F(RuntimeTest, ABoundLaunchPassesItsCopiedValuesAndMakesOneDriverCall) {
  AotRuntime rt(bundle({90}));
  const LoadedKernel& k = rt.get(kPass2Key, 0);
  Args a;
  const std::vector<void*> user = a.ptrs();
  luminav::KernelLaunch bound(rt, k, {37, 1, 1}, std::vector<const void*>(user.begin(), user.end()));
  a.seed = 999;  // the values were copied: a later change of the caller's variables does not reach it
  a.clip = 0.f;
  auto* stream = reinterpret_cast<luminav::CUstream>(0x5151);
  fake().ctx_stack.push_back(fake_primary_ctx(0));  // the caller made the context current
  fake().ctx_queries = fake().ctx_pushes = 0;
  bound.launch(stream);
  bound.launch(stream);
  EXPECT_EQ(fake().ctx_queries, 0);  // launch() relies on the caller's context
  EXPECT_EQ(fake().ctx_pushes, 0);
  ASSERT_EQ(fake().launches.size(), 2u);
  const LaunchRecord& r = fake().launches[0];
  EXPECT_EQ(r.function, k.function);
  EXPECT_EQ(r.grid[0], 37u);
  EXPECT_EQ(r.block[0], 256u);
  EXPECT_EQ(r.stream, stream);
  EXPECT_EQ(*static_cast<const CUdeviceptr*>(r.params[0]), 0x1000u);  // table
  EXPECT_EQ(*static_cast<const CUdeviceptr*>(r.params[4]), 0x5000u);  // lr
  EXPECT_EQ(*static_cast<const std::int64_t*>(r.params[5]), 1234);    // seed as bound
  EXPECT_EQ(*static_cast<const float*>(r.params[11]), 4.f);           // clip as bound
  EXPECT_EQ(r.trailing, (std::vector<CUdeviceptr>{0, 0}));
  // set() changes one value in place; get() reads it back.
  bound.set<std::int64_t>(5, 42);
  bound.set<CUdeviceptr>(3, 0x4444);
  EXPECT_EQ(bound.get<std::int64_t>(5), 42);
  bound.launch(stream);
  EXPECT_EQ(*static_cast<const std::int64_t*>(fake().launches[2].params[5]), 42);
  EXPECT_EQ(*static_cast<const CUdeviceptr*>(fake().launches[2].params[3]), 0x4444u);
  EXPECT_EQ(*static_cast<const float*>(fake().launches[2].params[6]), 1.f);  // sign untouched
  // A value of the wrong size, or an argument that does not exist, is refused by name.
  expect_error([&] { bound.set<std::int32_t>(5, 1); }, Status::kInvalidArgument,
               {"argument 5 (\"seed\", i64) is 8 bytes, got a value of 4"});
  expect_error([&] { bound.set<float>(13, 1.f); }, Status::kInvalidArgument, {"argument 13 does not exist"});
  // Moved, it still launches its own values.
  luminav::KernelLaunch moved = std::move(bound);
  moved.launch(stream);
  EXPECT_EQ(*static_cast<const std::int64_t*>(fake().launches[3].params[5]), 42);
  luminav::KernelLaunch empty;
  EXPECT_FALSE(empty.bound());
  expect_error([&] { empty.launch(stream); }, Status::kInvalidArgument, {"no kernel is bound"});
}

TEST_F(RuntimeTest, ABoundLaunchIsCheckedOnceAndAnEmptyGridLaunchesNothing) {
  AotRuntime rt(bundle({90}));
  const LoadedKernel& k = rt.get(kPass2Key, 0);
  Args a;
  std::vector<void*> user = a.ptrs();
  std::vector<const void*> values(user.begin(), user.end());
  values[2] = nullptr;
  expect_error([&] { luminav::KernelLaunch(rt, k, {1, 1, 1}, values); }, Status::kInvalidArgument,
               {"kernel argument 2 is a null pointer"});
  values.assign(user.begin(), user.end() - 1);
  expect_error([&] { luminav::KernelLaunch(rt, k, {1, 1, 1}, values); }, Status::kInvalidArgument,
               {"expected 13 argument pointers"});
  values.assign(user.begin(), user.end());
  expect_error([&] { luminav::KernelLaunch(rt, k, {1, 70000, 1}, values); }, Status::kInvalidArgument,
               {"exceeds the driver's limits"});
  luminav::KernelLaunch none(rt, k, {0, 1, 1}, values);
  none.launch(nullptr);
  EXPECT_TRUE(fake().launches.empty());
}

TEST_F(RuntimeTest, ABoundLaunchGetsScratchPerStreamFromTheRuntime) {
  fake().use_param_sizes = true;
  fake().param_sizes = {8, 8, 8, 8, 8, 8, 4, 4, 4, 4, 4, 4, 4, 8, 8};
  {
    AotRuntime rt(bundle({90}, [](json& e) {
      e["global_scratch_size"] = 64;
      e["global_scratch_align"] = 256;
    }));
    const LoadedKernel& k = rt.get(kPass2Key, 0);
    Args a;
    const std::vector<void*> user = a.ptrs();
    luminav::KernelLaunch bound(rt, k, {4, 1, 1}, std::vector<const void*>(user.begin(), user.end()));
    EXPECT_TRUE(fake().allocations.empty());  // allocated at the first launch on a stream
    auto* s1 = reinterpret_cast<luminav::CUstream>(0x1);
    auto* s2 = reinterpret_cast<luminav::CUstream>(0x2);
    bound.launch(s1);
    bound.launch(s1);
    ASSERT_EQ(fake().allocations.size(), 1u);
    EXPECT_EQ(fake().allocations[0], 4u * 64);
    bound.launch(s2);
    ASSERT_EQ(fake().allocations.size(), 2u);
    ASSERT_EQ(fake().launches.size(), 3u);
    EXPECT_NE(fake().launches[0].trailing[0], 0u);
    EXPECT_EQ(fake().launches[0].trailing[0], fake().launches[1].trailing[0]);
    EXPECT_NE(fake().launches[2].trailing[0], fake().launches[0].trailing[0]);
    // The same buffer AotRuntime::launch uses for that (kernel, grid, stream).
    rt.launch(k, {4, 1, 1}, user, s1);
    EXPECT_EQ(fake().launches[3].trailing[0], fake().launches[0].trailing[0]);
    EXPECT_EQ(fake().allocations.size(), 2u);
  }
  EXPECT_EQ(fake().freed.size(), 2u);
}

TEST_F(RuntimeTest, AScopedContextPushesOnlyWhenAnotherIsCurrent) {
  const luminav::CudaDriverApi& api = api_;
  {
    luminav::ScopedContext s(api, fake_primary_ctx(0));
    EXPECT_TRUE(s.pushed());
    EXPECT_EQ(fake().ctx_stack.back(), fake_primary_ctx(0));
    luminav::ScopedContext nested(api, fake_primary_ctx(0));
    EXPECT_FALSE(nested.pushed());
    EXPECT_EQ(fake().ctx_stack.size(), 1u);
  }
  EXPECT_TRUE(fake().ctx_stack.empty());
}
