// tests/test_aot_real_bundle.cpp: the manifest and runtime (src/aot/) on a real bundle
//
// A real bundle written by the Python builder (`python -m luminamoon.aot build --arch 90 --out
// DIR`): the loader accepts it, and every variant's argument list is the one docs/internals.md
// gives for its kernel. With a CUDA driver, every variant the device can run is also loaded and
// its parameter list checked by the driver. Skipped when no bundle is present: set
// LUMINAV_TEST_BUNDLE, or build one into <repo>/bundle-test.
#include <gtest/gtest.h>

#include <cstdlib>
#include <filesystem>
#include <map>
#include <string>
#include <utility>
#include <vector>

#include "aot/manifest.h"
#include "aot/runtime.h"
#include "luminav/cuda_driver.h"

using luminav::AotManifest;

namespace {

std::string bundle_dir() {
  if (const char* env = std::getenv("LUMINAV_TEST_BUNDLE")) return env;
  return LUMINAV_TEST_BUNDLE_DIR;
}

bool has_bundle() { return std::filesystem::exists(bundle_dir() + "/manifest.json"); }

// Expected user arguments per logical kernel (docs/internals.md "Kernels").
const std::map<std::string, std::vector<std::pair<std::string, std::string>>>& expected_args() {
  static const std::map<std::string, std::vector<std::pair<std::string, std::string>>> args = {
      {"pass1",
       {{"table", "*i64"}, {"block_map", "*i32"}, {"partial_sum", "*fp32"}, {"partial_bad", "*i32"}, {"seed", "i64"},
        {"sign", "fp32"}, {"beta1", "fp32"}, {"beta2", "fp32"}, {"eps", "fp32"}}},
      {"reduce",
       {{"table", "*i64"}, {"partial_sum", "*fp32"}, {"partial_bad", "*i32"}, {"stats", "*fp32"},
        {"found_inf", "*i32"}, {"ntensors", "i32"}}},
      {"pass2",
       {{"table", "*i64"}, {"block_map", "*i32"}, {"stats", "*fp32"}, {"found_inf", "*i32"}, {"lr", "*fp32"},
        {"seed", "i64"}, {"sign", "fp32"}, {"beta1", "fp32"}, {"beta2", "fp32"}, {"eps", "fp32"},
        {"weight_decay", "fp32"}, {"clip", "fp32"}, {"bound", "fp32"}}},
      {"commit", {{"table", "*i64"}, {"found_inf", "*i32"}, {"ntensors", "i32"}}},
  };
  return args;
}

}  // namespace

TEST(AotRealBundle, LoadsAndMatchesTheDocumentedKernelAbi) {
  if (!has_bundle()) GTEST_SKIP() << "no bundle at " << bundle_dir() << " (set LUMINAV_TEST_BUNDLE)";
  const AotManifest m = AotManifest::load(bundle_dir());
  ASSERT_FALSE(m.kernels().empty());
  m.verify_cubins();  // every cubin: a whole ELF image with the recorded hash
  for (const luminav::KernelMetadata& k : m.kernels()) {
    EXPECT_TRUE(k.image_verified()) << k.key;
    EXPECT_EQ(k.image().size(), k.cubin_bytes) << k.key;
  }
  for (const luminav::KernelMetadata& k : m.kernels()) {
    SCOPED_TRACE(k.key);
    const std::string kind = k.kernel == "single_pass" ? "pass2" : k.kernel;  // same argument list
    const auto& want = expected_args().at(kind);
    ASSERT_EQ(k.arg_names.size(), want.size());
    for (std::size_t i = 0; i < want.size(); ++i) {
      EXPECT_EQ(k.arg_names[i], want[i].first) << i;
      EXPECT_EQ(k.signature[i], want[i].second) << i;
    }
    EXPECT_EQ(k.key.rfind(k.kernel + ".", 0), 0u) << "a variant key starts with its kernel";
    EXPECT_EQ(k.num_params, static_cast<int>(k.signature.size()) + k.num_trailing_scratch_ptrs);
    // The Triton that built it fixes the trailing count (docs/triton-abi.md).
    int major = 0, minor = 0;
    ASSERT_EQ(std::sscanf(k.triton_version.c_str(), "%d.%d", &major, &minor), 2);
    const int expected_trailing = major > 3 || (major == 3 && minor >= 5) ? 2 : (major == 3 && minor >= 3 ? 1 : 0);
    EXPECT_EQ(k.num_trailing_scratch_ptrs, expected_trailing) << k.triton_version;
    EXPECT_EQ(k.global_scratch_size, 0) << "the TDCLM kernels need no global scratch";
    EXPECT_EQ(k.num_ctas, 1);
  }
}

TEST(AotRealBundle, LoadsOnTheDeviceWhereThereIsOne) {
  if (!has_bundle()) GTEST_SKIP() << "no bundle at " << bundle_dir() << " (set LUMINAV_TEST_BUNDLE)";
  if (!luminav::cuda_driver_available()) GTEST_SKIP() << "no CUDA driver";
  luminav::AotRuntime rt(AotManifest::load(bundle_dir()));
  const luminav::DeviceInfo info = rt.device_info(0);
  int loaded = 0;
  for (const luminav::KernelMetadata& k : rt.manifest().kernels()) {
    if (!k.runs_on(info.cc_major, info.cc_minor)) continue;
    SCOPED_TRACE(k.key);
    const luminav::LoadedKernel& lk = rt.load(k, 0);
    EXPECT_NE(lk.function, nullptr);
    if (lk.params_checked >= 0) {
      EXPECT_EQ(lk.params_checked, k.num_params);
    }
    ++loaded;
  }
  if (loaded == 0) GTEST_SKIP() << "no variant for sm_" << info.cc_major << info.cc_minor;
}
