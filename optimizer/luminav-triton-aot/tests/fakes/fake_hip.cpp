// tests/fakes/fake_hip.cpp: the fake HIP runtime table (fake_hip.h)
#include "fakes/fake_hip.h"

#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <deque>

namespace luminav_test {

using namespace luminav;

namespace {

// The handles: a module is an index into `modules`, a function a pointer to its name.
struct Handles {
  std::deque<std::string> functions;
};
Handles& handles() {
  static Handles h;
  return h;
}

const char* error_name(hipError_t e) {
  switch (e) {
    case hipSuccess: return "hipSuccess";
    case hipErrorInvalidValue: return "hipErrorInvalidValue";
    case hipErrorOutOfMemory: return "hipErrorOutOfMemory";
    case hipErrorInvalidImage: return "hipErrorInvalidImage";
    case hipErrorNotFound: return "hipErrorNotFound";
    case hipErrorLaunchFailure: return "hipErrorLaunchFailure";
    default: return "hipErrorUnknown";
  }
}

const char* error_string(hipError_t e) {
  switch (e) {
    case hipErrorInvalidImage: return "device kernel image is invalid";
    case hipErrorNotFound: return "named symbol not found";
    case hipErrorLaunchFailure: return "unspecified launch failure";
    case hipErrorOutOfMemory: return "out of memory";
    default: return "an error";
  }
}

hipError_t init(unsigned) { return hipSuccess; }
hipError_t driver_version(int* v) { *v = 60200000; return hipSuccess; }
hipError_t device_count(int* n) { *n = fake_hip().device_count; return hipSuccess; }
hipError_t get_device(int* d) { *d = fake_hip().current_device; return hipSuccess; }
hipError_t set_device(int d) {
  FakeHipState& f = fake_hip();
  if (d < 0 || d >= f.device_count) return hipErrorInvalidValue;
  f.current_device = d;
  ++f.set_device_calls;
  return hipSuccess;
}
hipError_t attribute(int* v, hipDeviceAttribute_t a, int) {
  if (a != hipDeviceAttributeMaxThreadsPerBlock) return hipErrorInvalidValue;
  *v = fake_hip().max_threads;
  return hipSuccess;
}
hipError_t module_load(hipModule_t* m, const void* image) {
  FakeHipState& f = fake_hip();
  std::lock_guard<std::mutex> lock(f.mu);
  if (f.module_load_result != hipSuccess) return f.module_load_result;
  ++f.module_loads;
  f.loaded_images.push_back(image);
  *m = reinterpret_cast<hipModule_t>(static_cast<std::uintptr_t>(0x1000 + f.module_loads));
  return hipSuccess;
}
hipError_t module_unload(hipModule_t) {
  FakeHipState& f = fake_hip();
  std::lock_guard<std::mutex> lock(f.mu);
  ++f.module_unloads;
  return hipSuccess;
}
hipError_t get_function(hipFunction_t* fn, hipModule_t, const char* name) {
  FakeHipState& f = fake_hip();
  std::lock_guard<std::mutex> lock(f.mu);
  f.looked_up.push_back(name);
  if (f.missing_functions.count(name)) return hipErrorNotFound;
  handles().functions.push_back(name);
  *fn = reinterpret_cast<hipFunction_t>(&handles().functions.back());
  return hipSuccess;
}
hipError_t launch(hipFunction_t fn, unsigned gx, unsigned gy, unsigned gz, unsigned bx, unsigned by, unsigned bz,
                  unsigned shared, hipStream_t stream, void** params, void** extra) {
  FakeHipState& f = fake_hip();
  std::lock_guard<std::mutex> lock(f.mu);
  if (f.launch_result != hipSuccess) return f.launch_result;
  HipLaunchRecord r{};
  r.function = *reinterpret_cast<const std::string*>(fn);
  r.grid[0] = gx; r.grid[1] = gy; r.grid[2] = gz;
  r.block[0] = bx; r.block[1] = by; r.block[2] = bz;
  r.shared = shared;
  r.stream = stream;
  r.device = f.current_device;
  r.extra_null = extra == nullptr;
  auto it = f.param_counts.find(r.function);
  if (it != f.param_counts.end()) {
    r.params.assign(params, params + it->second.first);
    for (int i = 0; i < it->second.second; ++i) {
      unsigned long long v;
      std::memcpy(&v, params[it->second.first + static_cast<std::size_t>(i)], sizeof v);
      r.trailing.push_back(v);
    }
  }
  if (f.on_launch) f.on_launch(r, params);
  f.launches.push_back(std::move(r));
  return hipSuccess;
}
hipError_t malloc_(void** p, size_t bytes) {
  FakeHipState& f = fake_hip();
  std::lock_guard<std::mutex> lock(f.mu);
  if (f.malloc_result != hipSuccess) return f.malloc_result;
  f.allocations.push_back(bytes);
  if (f.host_memory) {
    *p = std::aligned_alloc(256, (bytes + 255) / 256 * 256);
    return *p ? hipSuccess : hipErrorOutOfMemory;
  }
  *p = reinterpret_cast<void*>(static_cast<std::uintptr_t>(f.next_address));
  f.next_address += (bytes + 0xfff) & ~0xfffull;
  return hipSuccess;
}
hipError_t free_(void* p) {
  FakeHipState& f = fake_hip();
  std::lock_guard<std::mutex> lock(f.mu);
  f.freed.push_back(p);
  if (f.host_memory) std::free(p);
  return hipSuccess;
}
hipError_t memcpy_(void* dst, const void* src, size_t bytes, hipMemcpyKind) {
  FakeHipState& f = fake_hip();
  if (f.memcpy_result != hipSuccess) return f.memcpy_result;
  if (f.host_memory && bytes) std::memcpy(dst, src, bytes);
  return hipSuccess;
}
hipError_t memcpy_async(void* dst, const void* src, size_t bytes, hipMemcpyKind kind, hipStream_t) {
  return memcpy_(dst, src, bytes, kind);
}
hipError_t memset_async(void* p, int value, size_t bytes, hipStream_t) {
  FakeHipState& f = fake_hip();
  ++f.memsets;
  if (f.host_memory && bytes) std::memset(p, value, bytes);
  return hipSuccess;
}
hipError_t memset_d32_async(void* p, int value, size_t words, hipStream_t) {
  FakeHipState& f = fake_hip();
  ++f.memsets;
  if (f.host_memory) {
    for (size_t i = 0; i < words; ++i) std::memcpy(static_cast<char*>(p) + 4 * i, &value, 4);
  }
  return hipSuccess;
}
hipError_t sync(hipStream_t) { return hipSuccess; }
hipError_t device_sync() {
  ++fake_hip().device_syncs;
  return hipSuccess;
}

}  // namespace

FakeHipState& fake_hip() {
  static FakeHipState s;
  return s;
}

void reset_fake_hip() {
  FakeHipState& f = fake_hip();
  std::lock_guard<std::mutex> lock(f.mu);
  static_cast<FakeHipValues&>(f) = FakeHipValues{};
}

HipApi make_fake_hip() {
  HipApi api;
  api.hipGetErrorName = error_name;
  api.hipGetErrorString = error_string;
  api.hipInit = init;
  api.hipDriverGetVersion = driver_version;
  api.hipGetDeviceCount = device_count;
  api.hipGetDevice = get_device;
  api.hipSetDevice = set_device;
  api.hipDeviceGetAttribute = attribute;
  api.hipModuleLoadData = module_load;
  api.hipModuleUnload = module_unload;
  api.hipModuleGetFunction = get_function;
  api.hipModuleLaunchKernel = launch;
  api.hipMalloc = malloc_;
  api.hipFree = free_;
  api.hipMemcpy = memcpy_;
  api.hipMemsetAsync = memset_async;
  api.hipMemsetD32Async = memset_d32_async;
  api.hipMemcpyAsync = memcpy_async;
  api.hipDeviceSynchronize = device_sync;
  api.hipStreamSynchronize = sync;
  api.origin = "fake HIP";
  return api;
}

}  // namespace luminav_test
