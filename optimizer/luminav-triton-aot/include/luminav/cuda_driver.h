// include/luminav/cuda_driver.h: the CUDA driver table, loaded at run time with
// dlopen("libcuda.so.1") and cuGetProcAddress
//
// Public only because examples/cpp and the luminav tools allocate device memory and make
// contexts with it (no CUDA toolkit needed to build them); a program that only steps an
// optimizer needs luminav.h / luminav.hpp alone. Everything else of the AOT runtime is in src/.
//
// No CUDA toolkit is needed to build luminav: the few driver types used are declared here,
// layout-compatible with cuda.h (the opaque handle types are the very same struct tags, so a
// CUstream from cuda.h or from PyTorch passes through unchanged). Every cu* symbol the library
// calls is listed once, in LUMINAV_CUDA_DRIVER_SYMBOLS; `cuda_driver()` loads that table once.
// Tests (and tools that want to observe launches) inject their own table with
// ScopedDriverOverride.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

#include "luminav/error.h"  // LUMINAV_CXX_API

// Opaque handle tags, spelled as in cuda.h so the pointer types are interchangeable.
struct CUctx_st;
struct CUmod_st;
struct CUfunc_st;
struct CUstream_st;
struct CUgraph_st;
struct CUgraphExec_st;
struct CUevent_st;

namespace luminav {

using CUresult = int;
using CUdevice = int;
using CUdeviceptr = unsigned long long;  // CUdeviceptr_v2 of cuda.h on 64-bit hosts
using CUcontext = ::CUctx_st*;
using CUmodule = ::CUmod_st*;
using CUfunction = ::CUfunc_st*;
using CUstream = ::CUstream_st*;
using CUgraph = ::CUgraph_st*;
using CUgraphExec = ::CUgraphExec_st*;
using CUevent = ::CUevent_st*;
using CUdevice_attribute = int;
using CUfunction_attribute = int;
using CUpointer_attribute = int;
using CUstreamCaptureMode = int;
using CUstreamCaptureStatus = int;

// The values of cuda.h that luminav uses.
constexpr CUresult CUDA_SUCCESS = 0;
constexpr CUresult CUDA_ERROR_INVALID_VALUE = 1;
constexpr CUresult CUDA_ERROR_OUT_OF_MEMORY = 2;
constexpr CUresult CUDA_ERROR_NOT_INITIALIZED = 3;
constexpr CUresult CUDA_ERROR_NO_DEVICE = 100;
constexpr CUresult CUDA_ERROR_INVALID_DEVICE = 101;
constexpr CUresult CUDA_ERROR_INVALID_IMAGE = 200;
constexpr CUresult CUDA_ERROR_NO_BINARY_FOR_GPU = 209;
constexpr CUresult CUDA_ERROR_NOT_FOUND = 500;
constexpr CUresult CUDA_ERROR_LAUNCH_FAILED = 719;

constexpr CUdevice_attribute CU_DEVICE_ATTRIBUTE_MAX_THREADS_PER_BLOCK = 1;
constexpr CUdevice_attribute CU_DEVICE_ATTRIBUTE_MULTIPROCESSOR_COUNT = 16;
constexpr CUdevice_attribute CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MAJOR = 75;
constexpr CUdevice_attribute CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MINOR = 76;
constexpr CUdevice_attribute CU_DEVICE_ATTRIBUTE_MAX_SHARED_MEMORY_PER_BLOCK_OPTIN = 97;

constexpr CUfunction_attribute CU_FUNC_ATTRIBUTE_MAX_THREADS_PER_BLOCK = 0;
constexpr CUfunction_attribute CU_FUNC_ATTRIBUTE_SHARED_SIZE_BYTES = 1;
constexpr CUfunction_attribute CU_FUNC_ATTRIBUTE_NUM_REGS = 4;
constexpr CUfunction_attribute CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES = 8;

constexpr CUpointer_attribute CU_POINTER_ATTRIBUTE_CONTEXT = 1;
constexpr CUpointer_attribute CU_POINTER_ATTRIBUTE_MEMORY_TYPE = 2;
constexpr CUpointer_attribute CU_POINTER_ATTRIBUTE_DEVICE_ORDINAL = 9;

constexpr CUstreamCaptureMode CU_STREAM_CAPTURE_MODE_GLOBAL = 0;
constexpr CUstreamCaptureMode CU_STREAM_CAPTURE_MODE_THREAD_LOCAL = 1;
constexpr CUstreamCaptureMode CU_STREAM_CAPTURE_MODE_RELAXED = 2;
constexpr CUstreamCaptureStatus CU_STREAM_CAPTURE_STATUS_NONE = 0;
constexpr CUstreamCaptureStatus CU_STREAM_CAPTURE_STATUS_ACTIVE = 1;
constexpr CUstreamCaptureStatus CU_STREAM_CAPTURE_STATUS_INVALIDATED = 2;
constexpr unsigned int CU_STREAM_DEFAULT = 0;
constexpr unsigned int CU_STREAM_NON_BLOCKING = 1;
constexpr unsigned int CU_EVENT_DEFAULT = 0;
constexpr unsigned int CU_EVENT_DISABLE_TIMING = 2;

// X(member, symbol for cuGetProcAddress, versioned name for plain dlsym, CUDA version of the
//   ABI asked for, required, parameter list). Every entry returns CUresult.
// The versions pin the ABI of the signatures below: e.g. cuMemAlloc at 3020 is cuMemAlloc_v2
// (size_t sizes), cuStreamBeginCapture at 10010 is _v2 (with a capture mode),
// cuDevicePrimaryCtxRelease at 11000 is _v2. cuFuncGetParamInfo exists from CUDA 12.4 on and is
// optional: where the driver lacks it, the parameter-count check at load is left out. The capture
// and graph entries are optional too: without them the engine launches every step's kernels
// itself instead of replaying them as one graph.
#define LUMINAV_CUDA_DRIVER_SYMBOLS(X)                                                                   \
  X(cuGetErrorName, "cuGetErrorName", "cuGetErrorName", 6000, true, (CUresult, const char**))            \
  X(cuGetErrorString, "cuGetErrorString", "cuGetErrorString", 6000, true, (CUresult, const char**))      \
  X(cuInit, "cuInit", "cuInit", 2000, true, (unsigned int))                                              \
  X(cuDriverGetVersion, "cuDriverGetVersion", "cuDriverGetVersion", 2020, true, (int*))                  \
  X(cuDeviceGet, "cuDeviceGet", "cuDeviceGet", 2000, true, (CUdevice*, int))                             \
  X(cuDeviceGetCount, "cuDeviceGetCount", "cuDeviceGetCount", 2000, true, (int*))                        \
  X(cuDeviceGetAttribute, "cuDeviceGetAttribute", "cuDeviceGetAttribute", 2000, true,                    \
    (int*, CUdevice_attribute, CUdevice))                                                                \
  X(cuDevicePrimaryCtxRetain, "cuDevicePrimaryCtxRetain", "cuDevicePrimaryCtxRetain", 7000, true,        \
    (CUcontext*, CUdevice))                                                                              \
  X(cuDevicePrimaryCtxRelease, "cuDevicePrimaryCtxRelease", "cuDevicePrimaryCtxRelease_v2", 11000,       \
    true, (CUdevice))                                                                                    \
  X(cuCtxGetCurrent, "cuCtxGetCurrent", "cuCtxGetCurrent", 4000, true, (CUcontext*))                     \
  X(cuCtxSetCurrent, "cuCtxSetCurrent", "cuCtxSetCurrent", 4000, true, (CUcontext))                      \
  X(cuCtxPushCurrent, "cuCtxPushCurrent", "cuCtxPushCurrent_v2", 4000, true, (CUcontext))                \
  X(cuCtxPopCurrent, "cuCtxPopCurrent", "cuCtxPopCurrent_v2", 4000, true, (CUcontext*))                  \
  X(cuCtxGetDevice, "cuCtxGetDevice", "cuCtxGetDevice", 2000, true, (CUdevice*))                         \
  X(cuCtxSynchronize, "cuCtxSynchronize", "cuCtxSynchronize", 2000, true, ())                            \
  X(cuModuleLoadData, "cuModuleLoadData", "cuModuleLoadData", 2000, true, (CUmodule*, const void*))      \
  X(cuModuleUnload, "cuModuleUnload", "cuModuleUnload", 2000, true, (CUmodule))                          \
  X(cuModuleGetFunction, "cuModuleGetFunction", "cuModuleGetFunction", 2000, true,                       \
    (CUfunction*, CUmodule, const char*))                                                                \
  X(cuFuncGetAttribute, "cuFuncGetAttribute", "cuFuncGetAttribute", 2020, true,                          \
    (int*, CUfunction_attribute, CUfunction))                                                            \
  X(cuFuncSetAttribute, "cuFuncSetAttribute", "cuFuncSetAttribute", 9000, true,                          \
    (CUfunction, CUfunction_attribute, int))                                                             \
  X(cuFuncGetParamInfo, "cuFuncGetParamInfo", "cuFuncGetParamInfo", 12040, false,                        \
    (CUfunction, size_t, size_t*, size_t*))                                                              \
  X(cuLaunchKernel, "cuLaunchKernel", "cuLaunchKernel", 4000, true,                                      \
    (CUfunction, unsigned int, unsigned int, unsigned int, unsigned int, unsigned int, unsigned int,     \
     unsigned int, CUstream, void**, void**))                                                            \
  X(cuMemAlloc, "cuMemAlloc", "cuMemAlloc_v2", 3020, true, (CUdeviceptr*, size_t))                       \
  X(cuMemFree, "cuMemFree", "cuMemFree_v2", 3020, true, (CUdeviceptr))                                   \
  X(cuMemcpyHtoD, "cuMemcpyHtoD", "cuMemcpyHtoD_v2", 3020, true, (CUdeviceptr, const void*, size_t))     \
  X(cuMemcpyDtoH, "cuMemcpyDtoH", "cuMemcpyDtoH_v2", 3020, true, (void*, CUdeviceptr, size_t))           \
  X(cuMemcpyHtoDAsync, "cuMemcpyHtoDAsync", "cuMemcpyHtoDAsync_v2", 3020, true,                          \
    (CUdeviceptr, const void*, size_t, CUstream))                                                        \
  X(cuMemcpyDtoHAsync, "cuMemcpyDtoHAsync", "cuMemcpyDtoHAsync_v2", 3020, true,                          \
    (void*, CUdeviceptr, size_t, CUstream))                                                              \
  X(cuMemcpyDtoDAsync, "cuMemcpyDtoDAsync", "cuMemcpyDtoDAsync_v2", 3020, true,                          \
    (CUdeviceptr, CUdeviceptr, size_t, CUstream))                                                        \
  X(cuMemsetD8Async, "cuMemsetD8Async", "cuMemsetD8Async", 3020, true,                                   \
    (CUdeviceptr, unsigned char, size_t, CUstream))                                                      \
  X(cuMemsetD32Async, "cuMemsetD32Async", "cuMemsetD32Async", 3020, true,                                \
    (CUdeviceptr, unsigned int, size_t, CUstream))                                                       \
  X(cuStreamCreate, "cuStreamCreate", "cuStreamCreate", 2000, true, (CUstream*, unsigned int))           \
  X(cuStreamDestroy, "cuStreamDestroy", "cuStreamDestroy_v2", 4000, true, (CUstream))                    \
  X(cuStreamSynchronize, "cuStreamSynchronize", "cuStreamSynchronize", 2000, true, (CUstream))           \
  X(cuStreamBeginCapture, "cuStreamBeginCapture", "cuStreamBeginCapture_v2", 10010, false,                \
    (CUstream, CUstreamCaptureMode))                                                                     \
  X(cuStreamEndCapture, "cuStreamEndCapture", "cuStreamEndCapture", 10000, false, (CUstream, CUgraph*))   \
  X(cuStreamIsCapturing, "cuStreamIsCapturing", "cuStreamIsCapturing", 10000, true,                      \
    (CUstream, CUstreamCaptureStatus*))                                                                  \
  X(cuGraphInstantiateWithFlags, "cuGraphInstantiateWithFlags", "cuGraphInstantiateWithFlags", 11040,    \
    true, (CUgraphExec*, CUgraph, unsigned long long))                                                   \
  X(cuGraphLaunch, "cuGraphLaunch", "cuGraphLaunch", 10000, false, (CUgraphExec, CUstream))               \
  X(cuGraphDestroy, "cuGraphDestroy", "cuGraphDestroy", 10000, false, (CUgraph))                          \
  X(cuGraphExecDestroy, "cuGraphExecDestroy", "cuGraphExecDestroy", 10000, false, (CUgraphExec))          \
  X(cuEventCreate, "cuEventCreate", "cuEventCreate", 2000, false, (CUevent*, unsigned int))               \
  X(cuEventRecord, "cuEventRecord", "cuEventRecord", 2000, true, (CUevent, CUstream))                    \
  X(cuEventSynchronize, "cuEventSynchronize", "cuEventSynchronize", 2000, true, (CUevent))               \
  X(cuEventElapsedTime, "cuEventElapsedTime", "cuEventElapsedTime", 2000, true, (float*, CUevent, CUevent)) \
  X(cuEventDestroy, "cuEventDestroy", "cuEventDestroy_v2", 4000, true, (CUevent))                        \
  X(cuPointerGetAttribute, "cuPointerGetAttribute", "cuPointerGetAttribute", 4000, true,                 \
    (void*, CUpointer_attribute, CUdeviceptr))

// The driver table. A plain aggregate of function pointers: a test builds one by hand (any
// entry it leaves null reads as "the driver lacks this symbol").
struct CudaDriverApi {
#define LUMINAV_CUDA_DRIVER_MEMBER(member, proc_name, dlsym_name, version, required, params) \
  CUresult(*member) params = nullptr;
  LUMINAV_CUDA_DRIVER_SYMBOLS(LUMINAV_CUDA_DRIVER_MEMBER)
#undef LUMINAV_CUDA_DRIVER_MEMBER

  // The version cuDriverGetVersion reported at load (e.g. 12040), 0 for an injected table.
  int driver_version = 0;
  // Where the table came from: "libcuda.so.1", or a name a test gives its fake.
  std::string origin;
};

// The process's driver table: the injected one while a ScopedDriverOverride is alive, else the
// real driver, loaded (dlopen + cuGetProcAddress) and cuInit(0)-ed once, thread-safely.
// Throws Error(kDriverError) when there is no driver: "no CUDA driver (libcuda.so.1): <dlerror>;
// the GPU path needs an NVIDIA driver; the CPU engine works without one", or when a required
// symbol is missing (naming the symbol and the dlerror()/cuGetProcAddress result). A failed load
// is remembered: later calls throw the same error without retrying.
LUMINAV_CXX_API const CudaDriverApi& cuda_driver();

// True when cuda_driver() would succeed. Never throws.
LUMINAV_CXX_API bool cuda_driver_available() noexcept;

// Loads a driver table from the named library (normally "libcuda.so.1") without caching it and
// without calling cuInit. cuda_driver() is built on it; tests use it to see the error a missing
// library gives. Throws as cuda_driver() does.
LUMINAV_CXX_API CudaDriverApi load_cuda_driver(const char* library_name);

// Makes cuda_driver() return `fake` for the lifetime of this object (nesting restores the
// previous table). `fake` must outlive the override. Intended for tests and tools; not meant to
// be switched while other threads use the driver.
class LUMINAV_CXX_API ScopedDriverOverride {
 public:
  explicit ScopedDriverOverride(const CudaDriverApi* fake);
  ~ScopedDriverOverride();
  ScopedDriverOverride(const ScopedDriverOverride&) = delete;
  ScopedDriverOverride& operator=(const ScopedDriverOverride&) = delete;

 private:
  const CudaDriverApi* previous_;
};

// Throws Error(kDriverError) when `result` is not CUDA_SUCCESS:
// "<symbol> failed: CUDA_ERROR_X (<code>): <error string> [while <context>]". The name and
// string come from the table's cuGetErrorName/cuGetErrorString.
LUMINAV_CXX_API void check(const CudaDriverApi& api, CUresult result, const char* symbol,
                           const std::string& context = "");
// The same with a context that is a C string: nothing is built unless the call failed (for hot
// paths, where a std::string argument would be built, and maybe allocated, on every call).
inline void check(const CudaDriverApi& api, CUresult result, const char* symbol, const char* context) {
  if (result != CUDA_SUCCESS) check(api, result, symbol, std::string(context != nullptr ? context : ""));
}
// The same, with the table of cuda_driver().
LUMINAV_CXX_API void check(CUresult result, const char* symbol, const std::string& context = "");

// "CUDA_ERROR_X (<code>): <string>", from the table (or "CUDA error <code>" where it cannot say).
LUMINAV_CXX_API std::string describe_cuda_error(const CudaDriverApi& api, CUresult result);

}  // namespace luminav
