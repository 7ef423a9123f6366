// tests/test_hip_runtime.cpp: the HIP launch path (aot/hip_runtime.h) against the fake HIP
// (tests/fakes/fake_hip.h): each kernel of one step loaded once and launched with block
// 64·num_warps, its arguments' addresses and the trailing scratch pointers; every HIP failure
// reaches the caller with its HIP name and leaves nothing loaded; the table's loader names a
// missing library
#include <gtest/gtest.h>

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "aot/hip_driver.h"
#include "aot/hip_runtime.h"
#include "aot/manifest.h"
#include "fakes/expect_error.h"
#include "fakes/fake_bundle.h"
#include "fakes/fake_hip.h"
#include "fakes/fake_hsaco.h"

namespace {

using luminav::AotManifest;
using luminav::HipRuntime;
using luminav::Status;
using luminav_test::expect_error;
using luminav_test::fake_hip;
using luminav_test::json;
using luminav_test::TempDir;

// The kernels of one step of a group that skips on non-finite gradients: pass 1, reduce, pass 2,
// commit.
const char* const kStepKeys[] = {"pass1.g0s1.n1.w8", "reduce.B1024.R16384.w16", "pass2.p1g1s0.sr1.b2.c1.f1.B2048.w8",
                                 "commit.f1.T1024.w4"};

class HipRuntimeTest : public luminav_test::FakeHipFixture {
 protected:
  std::shared_ptr<const AotManifest> bundle(const luminav_test::VariantOptions& options = {}) {
    std::vector<json> entries;
    for (const char* key : kStepKeys) entries.push_back(luminav_test::add_hip_variant(dir_, key, "gfx942", options));
    luminav_test::write_manifest(dir_, luminav_test::manifest_v3_with(entries));
    return std::make_shared<const AotManifest>(AotManifest::load(dir_.path()));
  }
  TempDir dir_;
};

TEST_F(HipRuntimeTest, LaunchesEachKernelOfAStep) {
  HipRuntime rt(bundle(), "gfx942:sramecc+:xnack-");
  EXPECT_EQ(rt.arch(), "gfx942");
  const auto stream = reinterpret_cast<luminav::hipStream_t>(std::uintptr_t{0x5000});
  std::vector<std::vector<std::uint64_t>> values;  // one 8-byte slot per user argument
  std::vector<std::vector<void*>> args;
  for (const char* key : kStepKeys) {
    const luminav::HipLoadedKernel& k = rt.get(key, 0);
    ASSERT_EQ(&rt.get(key, 0), &k);  // cached
    const luminav::KernelMetadata& m = *k.meta;
    fake_hip().param_counts[m.entry] = {m.signature.size(), m.num_trailing_scratch_ptrs};
    values.emplace_back(m.signature.size());
    args.emplace_back();
    for (std::size_t i = 0; i < m.signature.size(); ++i) {
      values.back()[i] = 0x1000 * (args.size()) + i;
      args.back().push_back(&values.back()[i]);
    }
    rt.launch(k, {7, 1, 1}, args.back(), stream);
  }
  EXPECT_EQ(rt.loaded_count(), 4u);
  EXPECT_EQ(fake_hip().module_loads, 4);
  ASSERT_EQ(fake_hip().launches.size(), 4u);
  for (std::size_t i = 0; i < 4; ++i) {
    const luminav::KernelMetadata& m = rt.manifest().kernels()[i];
    const luminav_test::HipLaunchRecord& r = fake_hip().launches[i];
    SCOPED_TRACE(m.key);
    EXPECT_EQ(r.function, m.entry);
    EXPECT_EQ(r.grid[0], 7u);
    EXPECT_EQ(r.block[0], static_cast<unsigned>(64 * m.num_warps));
    EXPECT_EQ(r.block[1], 1u);
    EXPECT_EQ(r.block[2], 1u);
    EXPECT_EQ(r.shared, 512u);
    EXPECT_EQ(r.stream, stream);
    EXPECT_TRUE(r.extra_null);
    EXPECT_EQ(r.params, args[i]);  // the very addresses the caller gave, in order
    // Triton 3.6's global_scratch and profile_scratch: both 0 (no scratch in these kernels)
    EXPECT_EQ(r.trailing, (std::vector<unsigned long long>{0, 0}));
  }
}

TEST_F(HipRuntimeTest, PassesAScratchBufferInTheTrailingPointer) {
  std::vector<json> entries = {luminav_test::add_hip_variant(dir_, kStepKeys[3])};
  entries[0]["global_scratch_size"] = 256;
  entries[0]["global_scratch_align"] = 128;
  luminav_test::write_manifest(dir_, luminav_test::manifest_v3_with(entries));
  HipRuntime rt(std::make_shared<const AotManifest>(AotManifest::load(dir_.path())), "gfx942");
  const luminav::HipLoadedKernel& k = rt.get(kStepKeys[3], 0);
  fake_hip().param_counts[k.meta->entry] = {3, 2};
  std::uint64_t table = 1, flag = 2;
  std::int32_t n = 3;
  rt.launch(k, {4, 1, 1}, {&table, &flag, &n}, nullptr);
  rt.launch(k, {4, 1, 1}, {&table, &flag, &n}, nullptr);
  ASSERT_EQ(fake_hip().allocations.size(), 1u);  // reused by the second launch
  EXPECT_EQ(fake_hip().allocations[0], 4u * 256u + 128u);
  ASSERT_EQ(fake_hip().launches.size(), 2u);
  const unsigned long long global = fake_hip().launches[0].trailing[0];
  EXPECT_NE(global, 0u);
  EXPECT_EQ(global % 128, 0u);
  EXPECT_EQ(fake_hip().launches[0].trailing[1], 0u);
  EXPECT_EQ(fake_hip().launches[1].trailing[0], global);
}

TEST_F(HipRuntimeTest, LoadsOnTheGivenDeviceAndRestoresTheCurrentOne) {
  fake_hip().device_count = 2;
  HipRuntime rt(bundle(), "gfx942");
  (void)rt.get(kStepKeys[0], 1);
  EXPECT_EQ(fake_hip().current_device, 0);
  EXPECT_EQ(fake_hip().set_device_calls, 2);  // to 1 and back
}

TEST_F(HipRuntimeTest, ALoadFailureReachesTheCallerAndLoadsNothing) {
  HipRuntime rt(bundle(), "gfx942");
  fake_hip().module_load_result = luminav::hipErrorInvalidImage;
  expect_error([&] { (void)rt.get(kStepKeys[2], 0); }, Status::kDriverError,
               {"hipModuleLoadData failed: hipErrorInvalidImage (200)", "_lumina_tdclm_pass2_kernel", ".gfx942.hsaco"});
  EXPECT_EQ(rt.loaded_count(), 0u);
  fake_hip().module_load_result = luminav::hipSuccess;
  fake_hip().missing_functions = {"_lumina_tdclm_pass2_kernel"};
  expect_error([&] { (void)rt.get(kStepKeys[2], 0); }, Status::kDriverError,
               {"hipModuleGetFunction failed: hipErrorNotFound (500): named symbol not found", "finding kernel"});
  EXPECT_EQ(rt.loaded_count(), 0u);
  EXPECT_EQ(fake_hip().module_unloads, 1);  // the module of the missing kernel is not kept
  EXPECT_TRUE(fake_hip().launches.empty());
}

TEST_F(HipRuntimeTest, ALaunchFailureNamesKernelGridAndBlock) {
  HipRuntime rt(bundle(), "gfx942");
  const luminav::HipLoadedKernel& k = rt.get(kStepKeys[3], 0);
  fake_hip().launch_result = luminav::hipErrorLaunchFailure;
  std::uint64_t table = 1, flag = 2;
  std::int32_t n = 3;
  expect_error([&] { rt.launch(k, {2, 1, 1}, {&table, &flag, &n}, nullptr); }, Status::kDriverError,
               {"hipModuleLaunchKernel failed: hipErrorLaunchFailure (719)", "_lumina_tdclm_commit_kernel",
                "grid (2, 1, 1)", "block (256, 1, 1)"});
  fake_hip().launch_result = luminav::hipSuccess;
  expect_error([&] { rt.launch(k, {2, 1, 1}, {&table, &flag}, nullptr); }, Status::kInvalidArgument,
               {"takes 3 arguments", "got 2"});
  expect_error([&] { rt.launch(k, {2, 1, 1}, {&table, nullptr, &n}, nullptr); }, Status::kInvalidArgument, {"null"});
  rt.launch(k, {0, 1, 1}, {&table, &flag, &n}, nullptr);  // an empty grid launches nothing
  EXPECT_TRUE(fake_hip().launches.empty());
}

TEST_F(HipRuntimeTest, RefusesAnotherArchOrABadCodeObjectBeforeHipSeesIt) {
  HipRuntime rt90a(bundle(), "gfx90a");
  expect_error([&] { (void)rt90a.get(kStepKeys[0], 0); }, Status::kNotFound,
               {"for a HIP device of arch gfx90a", "luminamoon aot build --arch gfx90a"});
  // a code object changed after the manifest was written: the rule book refuses it
  HipRuntime rt(bundle(), "gfx942");
  const luminav::KernelMetadata& m = rt.manifest().kernels()[0];
  auto bytes = luminav_test::read_bytes(m.cubin_path);
  bytes.back() ^= 1;
  luminav_test::write_bytes(m.cubin_path, bytes);
  luminav_test::expect_refusal([&] { (void)rt.load(m, 0); }, luminav::BundleRule::kSha256, "kernels[0].sha256");
  EXPECT_EQ(fake_hip().module_loads, 0);
  fake_hip().max_threads = 512;
  expect_error([&] { (void)rt.get(kStepKeys[1], 0); }, Status::kBundleError,
               {"a block of 1024 threads, the device allows 512"});
  EXPECT_EQ(rt.loaded_count(), 0u);
}

TEST(HipDriver, AMissingLibraryIsAClearError) {
  expect_error([] { (void)luminav::load_hip_driver("libamdhip64-does-not-exist.so"); }, Status::kDriverError,
               {"no HIP runtime (libamdhip64-does-not-exist.so)", "libamdhip64.so", "the CPU engine works without one"});
  // a library without the HIP symbols: the first one missing is named with dlerror()
  expect_error([] { (void)luminav::load_hip_driver("libm.so.6"); }, Status::kDriverError,
               {"the HIP runtime (libm.so.6) lacks hipGetErrorName", "dlsym(\"hipGetErrorName\")"});
}

}  // namespace
