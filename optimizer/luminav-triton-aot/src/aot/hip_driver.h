// src/aot/hip_driver.h: the HIP runtime table, loaded at run time with dlopen("libamdhip64.so")
// and dlsym; the AMD twin of luminav/cuda_driver.h
//
// No ROCm is needed to build luminav: the few HIP types used are declared here, layout-compatible
// with hip_runtime_api.h (hipModule_t, hipFunction_t and hipStream_t are the same struct tags,
// so a stream from PyTorch's ROCm build passes through unchanged). Every hip* symbol the library
// calls is listed once, in LUMINAV_HIP_SYMBOLS; hip_driver() loads that table once. Tests inject
// their own table with ScopedHipOverride (tests/fakes/fake_hip.h).
#pragma once

#include <cstddef>
#include <string>

struct ihipModule_t;
struct ihipModuleSymbol_t;
struct ihipStream_t;

namespace luminav {

using hipError_t = int;
using hipModule_t = ::ihipModule_t*;
using hipFunction_t = ::ihipModuleSymbol_t*;
using hipStream_t = ::ihipStream_t*;
using hipDeviceAttribute_t = int;
using hipMemcpyKind = int;

// The values of hip_runtime_api.h that luminav uses.
constexpr hipError_t hipSuccess = 0;
constexpr hipError_t hipErrorInvalidValue = 1;
constexpr hipError_t hipErrorOutOfMemory = 2;
constexpr hipError_t hipErrorInvalidImage = 200;
constexpr hipError_t hipErrorNotFound = 500;
constexpr hipError_t hipErrorLaunchFailure = 719;
constexpr hipDeviceAttribute_t hipDeviceAttributeMaxThreadsPerBlock = 56;
constexpr hipMemcpyKind hipMemcpyHostToDevice = 1;
constexpr hipMemcpyKind hipMemcpyDeviceToHost = 2;
constexpr hipMemcpyKind hipMemcpyDeviceToDevice = 3;

// X(member, return type, parameter list): each is dlsym'ed by its own name.
#define LUMINAV_HIP_SYMBOLS(X)                                                                              \
  X(hipGetErrorName, const char*, (hipError_t))                                                             \
  X(hipGetErrorString, const char*, (hipError_t))                                                           \
  X(hipInit, hipError_t, (unsigned int))                                                                    \
  X(hipDriverGetVersion, hipError_t, (int*))                                                                \
  X(hipGetDeviceCount, hipError_t, (int*))                                                                  \
  X(hipGetDevice, hipError_t, (int*))                                                                       \
  X(hipSetDevice, hipError_t, (int))                                                                        \
  X(hipDeviceGetAttribute, hipError_t, (int*, hipDeviceAttribute_t, int))                                   \
  X(hipModuleLoadData, hipError_t, (hipModule_t*, const void*))                                             \
  X(hipModuleUnload, hipError_t, (hipModule_t))                                                             \
  X(hipModuleGetFunction, hipError_t, (hipFunction_t*, hipModule_t, const char*))                           \
  X(hipModuleLaunchKernel, hipError_t,                                                                      \
    (hipFunction_t, unsigned int, unsigned int, unsigned int, unsigned int, unsigned int, unsigned int,     \
     unsigned int, hipStream_t, void**, void**))                                                            \
  X(hipMalloc, hipError_t, (void**, size_t))                                                                \
  X(hipFree, hipError_t, (void*))                                                                           \
  X(hipMemcpy, hipError_t, (void*, const void*, size_t, hipMemcpyKind))                                    \
  X(hipMemcpyAsync, hipError_t, (void*, const void*, size_t, hipMemcpyKind, hipStream_t))                   \
  X(hipDeviceSynchronize, hipError_t, ())                                                                   \
  X(hipMemsetAsync, hipError_t, (void*, int, size_t, hipStream_t))                                          \
  X(hipMemsetD32Async, hipError_t, (void*, int, size_t, hipStream_t))                                       \
  X(hipStreamSynchronize, hipError_t, (hipStream_t))

// The HIP table. A plain aggregate of function pointers: a test builds one by hand (an entry it
// leaves null reads as "the runtime lacks this symbol").
struct HipApi {
#define LUMINAV_HIP_MEMBER(member, ret, params) ret(*member) params = nullptr;
  LUMINAV_HIP_SYMBOLS(LUMINAV_HIP_MEMBER)
#undef LUMINAV_HIP_MEMBER
  int runtime_version = 0;  // hipDriverGetVersion at load, 0 for an injected table
  std::string origin;       // "libamdhip64.so", or a name a test gives its fake
};

// The process's HIP table: the injected one while a ScopedHipOverride is alive, else
// libamdhip64.so (load_hip_driver(nullptr)), loaded (dlopen + dlsym of every symbol) and hipInit(0)-ed once, thread-safely.
// Throws Error(kDriverError) when there is no HIP runtime ("no HIP runtime (libamdhip64.so):
// <dlerror>; ...") or a symbol is missing (naming it and dlerror()). A failed load is remembered.
const HipApi& hip_driver();
bool hip_driver_available() noexcept;
// Loads a table from the named library without caching it and without hipInit; throws as
// hip_driver() does. Null: the libamdhip64.so the process has already loaded (a ROCm build of
// torch brings its own), else libamdhip64.so (then .so.7, .so.6, .so.5) from the library path.
HipApi load_hip_driver(const char* library_name);

// Makes hip_driver() return `fake` for the lifetime of this object (nesting restores the previous
// one). `fake` must outlive it.
class ScopedHipOverride {
 public:
  explicit ScopedHipOverride(const HipApi* fake);
  ~ScopedHipOverride();
  ScopedHipOverride(const ScopedHipOverride&) = delete;
  ScopedHipOverride& operator=(const ScopedHipOverride&) = delete;

 private:
  const HipApi* previous_;
};

// "hipErrorX (<code>): <string>" from the table (or "HIP error <code>" where it cannot say).
std::string describe_hip_error(const HipApi& api, hipError_t result);
// Throws Error(kDriverError) when `result` is not hipSuccess:
// "<symbol> failed: hipErrorX (<code>): <string> [while <context>]".
void check_hip(const HipApi& api, hipError_t result, const char* symbol, const std::string& context = "");

}  // namespace luminav
