// tests/test_cuda_driver.cpp: the CUDA driver table (src/aot/cuda_driver.cpp): loading (and its
// failures), the injectable override, and check()
#include <gtest/gtest.h>

#include <string>

#include "fakes/expect_error.h"
#include "fakes/fake_driver.h"
#include "luminav/cuda_driver.h"
#include "luminav/error.h"

using luminav::CudaDriverApi;
using luminav::Status;
using namespace luminav_test;

TEST(CudaDriver, AMissingLibraryIsAClearError) {
  expect_error([] { luminav::load_cuda_driver("libluminav-no-such-driver.so.1"); }, Status::kDriverError,
               {"no CUDA driver (libluminav-no-such-driver.so.1): ", "libluminav-no-such-driver.so.1",
                "the GPU path needs an NVIDIA driver; the CPU engine works without one"});
}

TEST(CudaDriver, ALibraryWithoutTheSymbolsNamesTheFirstMissingOne) {
  // libm loads but exports no cu* symbol: the first entry of the list is reported, with dlerror.
  expect_error([] { luminav::load_cuda_driver("libm.so.6"); }, Status::kDriverError,
               {"the CUDA driver (libm.so.6) lacks cuGetErrorName", "dlsym(\"cuGetErrorName\")",
                "the driver has no cuGetProcAddress"});
}

TEST(CudaDriver, TheProcessDriverEitherLoadsOrSaysWhy) {
  if (luminav::cuda_driver_available()) {
    const CudaDriverApi& api = luminav::cuda_driver();
    EXPECT_EQ(api.origin, "libcuda.so.1");
    EXPECT_GT(api.driver_version, 0);
#define LUMINAV_EXPECT_REQUIRED(member, proc, dls, ver, required, params) \
  if (required) {                                                 \
    EXPECT_NE(api.member, nullptr) << #member;                    \
  }
    LUMINAV_CUDA_DRIVER_SYMBOLS(LUMINAV_EXPECT_REQUIRED)
#undef LUMINAV_EXPECT_REQUIRED
    return;
  }
  // No driver on this machine: the error is the documented one, and it is the same every time
  // (the failed load is remembered, not retried).
  std::string first, second;
  try {
    luminav::cuda_driver();
    ADD_FAILURE() << "cuda_driver() returned although cuda_driver_available() is false";
  } catch (const luminav::Error& e) {
    EXPECT_EQ(e.status(), Status::kDriverError);
    first = e.what();
  }
  try {
    luminav::cuda_driver();
  } catch (const luminav::Error& e) {
    second = e.what();
  }
  EXPECT_EQ(first, second);
  const bool no_library = first.find("no CUDA driver (libcuda.so.1): ") != std::string::npos;
  const bool no_device = first.find("cuInit(0) failed") != std::string::npos;
  EXPECT_TRUE(no_library || no_device) << first;
  EXPECT_NE(first.find("the CPU engine works without one"), std::string::npos) << first;
}

TEST(CudaDriver, TheOverrideIsUsedAndNestsAndRestores) {
  CudaDriverApi outer = make_fake_driver();
  outer.origin = "outer";
  CudaDriverApi inner = make_fake_driver();
  inner.origin = "inner";
  const bool real_available = luminav::cuda_driver_available();
  {
    luminav::ScopedDriverOverride a(&outer);
    EXPECT_EQ(&luminav::cuda_driver(), &outer);
    EXPECT_TRUE(luminav::cuda_driver_available());
    {
      luminav::ScopedDriverOverride b(&inner);
      EXPECT_EQ(luminav::cuda_driver().origin, "inner");
    }
    EXPECT_EQ(luminav::cuda_driver().origin, "outer");
  }
  EXPECT_EQ(luminav::cuda_driver_available(), real_available);
}

TEST(CudaDriver, CheckNamesTheSymbolTheErrorAndTheContext) {
  const CudaDriverApi api = make_fake_driver();
  EXPECT_NO_THROW(luminav::check(api, luminav::CUDA_SUCCESS, "cuLaunchKernel"));
  expect_error([&] { luminav::check(api, luminav::CUDA_ERROR_LAUNCH_FAILED, "cuLaunchKernel", "launching pass2"); },
               Status::kDriverError,
               {"cuLaunchKernel failed: CUDA_ERROR_LAUNCH_FAILED (719): unspecified launch failure",
                "[while launching pass2]"});
  // A code the driver cannot name still gives its number.
  expect_error([&] { luminav::check(api, 999, "cuMemAlloc"); }, Status::kDriverError,
               {"cuMemAlloc failed: CUDA error (999)"});
  // A table without the error functions (a minimal fake) still gives a message.
  CudaDriverApi bare;
  EXPECT_EQ(luminav::describe_cuda_error(bare, 2), "CUDA error (2)");
  // The overload without a table uses the injected one.
  luminav::ScopedDriverOverride o(&api);
  expect_error([] { luminav::check(luminav::CUDA_ERROR_OUT_OF_MEMORY, "cuMemAlloc", "scratch"); },
               Status::kDriverError, {"cuMemAlloc failed: CUDA_ERROR_OUT_OF_MEMORY (2): out of memory", "scratch"});
}

TEST(CudaDriver, TheTableListsEveryDocumentedSymbol) {
  // The X-macro list is the one place symbols are named; spot-check the versioned names that
  // plain dlsym needs on drivers without cuGetProcAddress.
  std::map<std::string, std::string> dlsym_names;
#define LUMINAV_COLLECT(member, proc, dls, ver, required, params) dlsym_names[#member] = dls;
  LUMINAV_CUDA_DRIVER_SYMBOLS(LUMINAV_COLLECT)
#undef LUMINAV_COLLECT
  EXPECT_EQ(dlsym_names.at("cuMemAlloc"), "cuMemAlloc_v2");
  EXPECT_EQ(dlsym_names.at("cuMemFree"), "cuMemFree_v2");
  EXPECT_EQ(dlsym_names.at("cuCtxPushCurrent"), "cuCtxPushCurrent_v2");
  EXPECT_EQ(dlsym_names.at("cuDevicePrimaryCtxRelease"), "cuDevicePrimaryCtxRelease_v2");
  EXPECT_EQ(dlsym_names.at("cuStreamBeginCapture"), "cuStreamBeginCapture_v2");
  for (const char* s : {"cuInit", "cuDriverGetVersion", "cuDeviceGet", "cuDeviceGetCount", "cuDeviceGetAttribute",
                        "cuDevicePrimaryCtxRetain", "cuCtxGetCurrent", "cuCtxSetCurrent", "cuCtxPopCurrent",
                        "cuCtxGetDevice", "cuCtxSynchronize", "cuModuleLoadData", "cuModuleUnload",
                        "cuModuleGetFunction", "cuFuncGetAttribute", "cuFuncSetAttribute", "cuFuncGetParamInfo",
                        "cuLaunchKernel", "cuMemcpyHtoD", "cuMemcpyDtoH", "cuMemcpyHtoDAsync", "cuMemcpyDtoHAsync",
                        "cuMemcpyDtoDAsync", "cuMemsetD8Async", "cuMemsetD32Async", "cuStreamCreate",
                        "cuStreamDestroy", "cuStreamSynchronize", "cuStreamEndCapture", "cuGraphInstantiateWithFlags",
                        "cuGraphLaunch", "cuGraphDestroy", "cuGraphExecDestroy", "cuEventCreate", "cuEventRecord",
                        "cuEventSynchronize", "cuEventElapsedTime", "cuEventDestroy", "cuGetErrorName",
                        "cuGetErrorString", "cuPointerGetAttribute"}) {
    EXPECT_EQ(dlsym_names.count(s), 1u) << s;
  }
}
