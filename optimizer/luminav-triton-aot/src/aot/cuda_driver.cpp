// src/aot/cuda_driver.cpp: the CUDA driver table (dlopen + cuGetProcAddress, loaded once), its
// injectable override, and the error check
#include "luminav/cuda_driver.h"

#include <dlfcn.h>

#include <atomic>
#include <string>

#include "luminav/error.h"

namespace luminav {

namespace {

// cuGetProcAddress as exported by CUDA 12+ drivers (cuGetProcAddress_v2, with a symbol status
// out-argument) and by 11.3-11.8 drivers (4 arguments).
using GetProcAddressV2 = CUresult (*)(const char*, void**, int, unsigned long long, int*);
using GetProcAddressV1 = CUresult (*)(const char*, void**, int, unsigned long long);

std::string dl_error_text() {
  const char* e = dlerror();
  return e != nullptr ? std::string(e) : std::string("(dlerror gave no message)");
}

std::atomic<const CudaDriverApi*> g_override{nullptr};

struct LoadedDriver {
  CudaDriverApi api;
  bool ok = false;
  std::string error;
};

const LoadedDriver& process_driver() {
  // Function-local static: loaded once, thread-safely, on first use (never at program start).
  static const LoadedDriver loaded = [] {
    LoadedDriver d;
    try {
      d.api = load_cuda_driver("libcuda.so.1");
      const CUresult r = d.api.cuInit(0);
      if (r != CUDA_SUCCESS) {
        d.error = "the CUDA driver (libcuda.so.1) is present but cuInit(0) failed: " +
                  describe_cuda_error(d.api, r) +
                  "; the GPU path needs a working NVIDIA GPU (check nvidia-smi and "
                  "CUDA_VISIBLE_DEVICES); the CPU engine works without one";
        return d;
      }
      d.ok = true;
    } catch (const Error& e) {
      d.error = e.what();
    }
    return d;
  }();
  return loaded;
}

}  // namespace

CudaDriverApi load_cuda_driver(const char* library_name) {
  const std::string lib = library_name != nullptr ? library_name : "";
  dlerror();
  void* handle = dlopen(lib.c_str(), RTLD_NOW | RTLD_LOCAL);
  if (handle == nullptr) {
    throw Error(Status::kDriverError, "no CUDA driver (" + lib + "): " + dl_error_text() +
                                          "; the GPU path needs an NVIDIA driver; the CPU engine works without one");
  }
  // The handle is never closed: the table's pointers live as long as the process.
  CudaDriverApi api;
  api.origin = lib;
  dlerror();
  auto get_v2 = reinterpret_cast<GetProcAddressV2>(dlsym(handle, "cuGetProcAddress_v2"));
  GetProcAddressV1 get_v1 = nullptr;
  if (get_v2 == nullptr) {
    dlerror();
    get_v1 = reinterpret_cast<GetProcAddressV1>(dlsym(handle, "cuGetProcAddress"));
  }

  auto resolve = [&](const char* proc_name, const char* dlsym_name, int version, bool required) -> void* {
    void* fn = nullptr;
    std::string why;
    if (get_v2 != nullptr) {
      int symbol_status = 0;
      const CUresult r = get_v2(proc_name, &fn, version, 0, &symbol_status);
      if (r != CUDA_SUCCESS || fn == nullptr) {
        why = "cuGetProcAddress_v2(\"" + std::string(proc_name) + "\", version " + std::to_string(version) +
              ") returned " + std::to_string(r) + " (symbol status " + std::to_string(symbol_status) + ")";
        fn = nullptr;
      }
    } else if (get_v1 != nullptr) {
      const CUresult r = get_v1(proc_name, &fn, version, 0);
      if (r != CUDA_SUCCESS || fn == nullptr) {
        why = "cuGetProcAddress(\"" + std::string(proc_name) + "\", version " + std::to_string(version) +
              ") returned " + std::to_string(r);
        fn = nullptr;
      }
    } else {
      why = "the driver has no cuGetProcAddress";
    }
    if (fn == nullptr) {
      dlerror();
      fn = dlsym(handle, dlsym_name);
      if (fn == nullptr) why += "; dlsym(\"" + std::string(dlsym_name) + "\"): " + dl_error_text();
    }
    if (fn == nullptr && required) {
      throw Error(Status::kDriverError, "the CUDA driver (" + lib + ") lacks " + proc_name + ": " + why +
                                            "; luminav needs an NVIDIA driver for CUDA 11.4 or newer");
    }
    return fn;
  };

#define LUMINAV_CUDA_DRIVER_RESOLVE(member, proc_name, dlsym_name, version, required, params) \
  api.member = reinterpret_cast<decltype(api.member)>(resolve(proc_name, dlsym_name, version, required));
  LUMINAV_CUDA_DRIVER_SYMBOLS(LUMINAV_CUDA_DRIVER_RESOLVE)
#undef LUMINAV_CUDA_DRIVER_RESOLVE

  int version = 0;
  if (api.cuDriverGetVersion(&version) == CUDA_SUCCESS) api.driver_version = version;
  return api;
}

const CudaDriverApi& cuda_driver() {
  if (const CudaDriverApi* fake = g_override.load(std::memory_order_acquire)) return *fake;
  const LoadedDriver& d = process_driver();
  if (!d.ok) throw Error(Status::kDriverError, d.error);
  return d.api;
}

bool cuda_driver_available() noexcept {
  if (g_override.load(std::memory_order_acquire) != nullptr) return true;
  try {
    return process_driver().ok;
  } catch (...) {
    return false;
  }
}

ScopedDriverOverride::ScopedDriverOverride(const CudaDriverApi* fake)
    : previous_(g_override.exchange(fake, std::memory_order_acq_rel)) {}

ScopedDriverOverride::~ScopedDriverOverride() { g_override.store(previous_, std::memory_order_release); }

std::string describe_cuda_error(const CudaDriverApi& api, CUresult result) {
  const char* name = nullptr;
  const char* text = nullptr;
  if (api.cuGetErrorName == nullptr || api.cuGetErrorName(result, &name) != CUDA_SUCCESS) name = nullptr;
  if (api.cuGetErrorString == nullptr || api.cuGetErrorString(result, &text) != CUDA_SUCCESS) text = nullptr;
  std::string out = name != nullptr ? std::string(name) : std::string("CUDA error");
  out += " (" + std::to_string(result) + ")";
  if (text != nullptr) out += ": " + std::string(text);
  return out;
}

void check(const CudaDriverApi& api, CUresult result, const char* symbol, const std::string& context) {
  if (result == CUDA_SUCCESS) return;
  std::string msg = std::string(symbol) + " failed: " + describe_cuda_error(api, result);
  if (!context.empty()) msg += " [while " + context + "]";
  throw Error(Status::kDriverError, msg);
}

void check(CUresult result, const char* symbol, const std::string& context) {
  if (result == CUDA_SUCCESS) return;
  check(cuda_driver(), result, symbol, context);
}

}  // namespace luminav
