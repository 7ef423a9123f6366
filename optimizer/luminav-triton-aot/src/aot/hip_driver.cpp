// src/aot/hip_driver.cpp: the HIP runtime table (dlopen of libamdhip64.so + dlsym, loaded once),
// its injectable override, and the error check with HIP's error names
#include "aot/hip_driver.h"

#include <dlfcn.h>

#include <atomic>

#include "luminav/error.h"

namespace luminav {

namespace {

std::string dl_error_text() {
  const char* e = dlerror();
  return e != nullptr ? std::string(e) : std::string("(dlerror gave no message)");
}

std::atomic<const HipApi*> g_override{nullptr};

struct LoadedHip {
  HipApi api;
  bool ok = false;
  std::string error;
};

const LoadedHip& process_hip() {
  static const LoadedHip loaded = [] {
    LoadedHip d;
    try {
      d.api = load_hip_driver(nullptr);
      const hipError_t r = d.api.hipInit(0);
      if (r != hipSuccess) {
        d.error = "the HIP runtime (libamdhip64.so) is present but hipInit(0) failed: " + describe_hip_error(d.api, r) +
                  "; the HIP path needs a working AMD GPU (check rocm-smi and HIP_VISIBLE_DEVICES); the CPU "
                  "engine works without one";
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

HipApi load_hip_driver(const char* library_name) {
  std::string lib = library_name != nullptr ? library_name : "libamdhip64.so";
  void* handle = nullptr;
  if (library_name == nullptr) {
    // The HIP runtime the process already has (a ROCm build of torch loads its own copy): its
    // streams and allocations are only valid there. Else the one on the library path.
    for (const char* name : {"libamdhip64.so", "libamdhip64.so.7", "libamdhip64.so.6", "libamdhip64.so.5"}) {
      handle = dlopen(name, RTLD_NOW | RTLD_LOCAL | RTLD_NOLOAD);
      if (handle != nullptr) {
        lib = name;
        break;
      }
    }
    for (const char* name : {"libamdhip64.so", "libamdhip64.so.7", "libamdhip64.so.6", "libamdhip64.so.5"}) {
      if (handle != nullptr) break;
      handle = dlopen(name, RTLD_NOW | RTLD_LOCAL);
      if (handle != nullptr) lib = name;
    }
    if (handle == nullptr) dlerror();
  }
  dlerror();
  if (handle == nullptr) handle = dlopen(lib.c_str(), RTLD_NOW | RTLD_LOCAL);
  if (handle == nullptr) {
    throw Error(Status::kDriverError, "no HIP runtime (" + lib + "): " + dl_error_text() +
                                          "; the HIP path needs ROCm's libamdhip64.so on the library path "
                                          "(LD_LIBRARY_PATH=/opt/rocm/lib); the CPU engine works without one");
  }
  // The handle is never closed: the table's pointers live as long as the process.
  HipApi api;
  api.origin = lib;
  auto resolve = [&](const char* name) -> void* {
    dlerror();
    void* fn = dlsym(handle, name);
    if (fn == nullptr) {
      throw Error(Status::kDriverError, "the HIP runtime (" + lib + ") lacks " + name + ": dlsym(\"" + name +
                                            "\"): " + dl_error_text() + "; luminav needs ROCm 5.x or newer");
    }
    return fn;
  };
#define LUMINAV_HIP_RESOLVE(member, ret, params) api.member = reinterpret_cast<decltype(api.member)>(resolve(#member));
  LUMINAV_HIP_SYMBOLS(LUMINAV_HIP_RESOLVE)
#undef LUMINAV_HIP_RESOLVE
  int version = 0;
  if (api.hipDriverGetVersion(&version) == hipSuccess) api.runtime_version = version;
  return api;
}

const HipApi& hip_driver() {
  if (const HipApi* fake = g_override.load(std::memory_order_acquire)) return *fake;
  const LoadedHip& d = process_hip();
  if (!d.ok) throw Error(Status::kDriverError, d.error);
  return d.api;
}

bool hip_driver_available() noexcept {
  if (g_override.load(std::memory_order_acquire) != nullptr) return true;
  try {
    return process_hip().ok;
  } catch (...) {
    return false;
  }
}

ScopedHipOverride::ScopedHipOverride(const HipApi* fake) : previous_(g_override.exchange(fake, std::memory_order_acq_rel)) {}
ScopedHipOverride::~ScopedHipOverride() { g_override.store(previous_, std::memory_order_release); }

std::string describe_hip_error(const HipApi& api, hipError_t result) {
  const char* name = api.hipGetErrorName != nullptr ? api.hipGetErrorName(result) : nullptr;
  const char* text = api.hipGetErrorString != nullptr ? api.hipGetErrorString(result) : nullptr;
  std::string out = name != nullptr ? std::string(name) : std::string("HIP error");
  out += " (" + std::to_string(result) + ")";
  if (text != nullptr) out += ": " + std::string(text);
  return out;
}

void check_hip(const HipApi& api, hipError_t result, const char* symbol, const std::string& context) {
  if (result == hipSuccess) return;
  std::string msg = std::string(symbol) + " failed: " + describe_hip_error(api, result);
  if (!context.empty()) msg += " [while " + context + "]";
  throw Error(Status::kDriverError, msg);
}

}  // namespace luminav
