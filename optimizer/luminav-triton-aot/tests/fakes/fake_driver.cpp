// tests/fakes/fake_driver.cpp: the fake CUDA driver table (see fake_driver.h)
#include "fakes/fake_driver.h"

#include <cstring>

namespace luminav_test {

FakeState& fake() {
  static FakeState s;
  return s;
}

luminav::CUcontext fake_primary_ctx(int device) {
  static char ctxs[16];
  return reinterpret_cast<luminav::CUcontext>(&ctxs[device]);
}
luminav::CUcontext fake_user_ctx() {
  static char c;
  return reinterpret_cast<luminav::CUcontext>(&c);
}

void reset_fake() {
  FakeState& s = fake();
  std::lock_guard<std::mutex> l(s.mu);
  static_cast<FakeValues&>(s) = FakeValues{};
}

luminav::CUfunction fake_function(std::size_t i) {
  static char fn[32];
  return reinterpret_cast<luminav::CUfunction>(&fn[i % 32]);
}

// The table's entries (internal linkage: only make_fake_driver hands them out).
namespace {
namespace fake_fn {
using namespace luminav;

CUresult get_error_name(CUresult r, const char** s) {
  switch (r) {
    case CUDA_ERROR_INVALID_VALUE: *s = "CUDA_ERROR_INVALID_VALUE"; return CUDA_SUCCESS;
    case CUDA_ERROR_OUT_OF_MEMORY: *s = "CUDA_ERROR_OUT_OF_MEMORY"; return CUDA_SUCCESS;
    case CUDA_ERROR_INVALID_IMAGE: *s = "CUDA_ERROR_INVALID_IMAGE"; return CUDA_SUCCESS;
    case CUDA_ERROR_NOT_FOUND: *s = "CUDA_ERROR_NOT_FOUND"; return CUDA_SUCCESS;
    case CUDA_ERROR_LAUNCH_FAILED: *s = "CUDA_ERROR_LAUNCH_FAILED"; return CUDA_SUCCESS;
    default: *s = nullptr; return CUDA_ERROR_INVALID_VALUE;
  }
}
CUresult get_error_string(CUresult r, const char** s) {
  switch (r) {
    case CUDA_ERROR_INVALID_VALUE: *s = "invalid argument"; return CUDA_SUCCESS;
    case CUDA_ERROR_OUT_OF_MEMORY: *s = "out of memory"; return CUDA_SUCCESS;
    case CUDA_ERROR_INVALID_IMAGE: *s = "device kernel image is invalid"; return CUDA_SUCCESS;
    case CUDA_ERROR_NOT_FOUND: *s = "named symbol not found"; return CUDA_SUCCESS;
    case CUDA_ERROR_LAUNCH_FAILED: *s = "unspecified launch failure"; return CUDA_SUCCESS;
    default: *s = nullptr; return CUDA_ERROR_INVALID_VALUE;
  }
}
CUresult init(unsigned int) { return CUDA_SUCCESS; }
CUresult driver_get_version(int* v) { *v = 12040; return CUDA_SUCCESS; }
CUresult device_get_count(int* n) { *n = fake().device_count; return CUDA_SUCCESS; }
CUresult device_get(CUdevice* d, int ordinal) {
  if (ordinal < 0 || ordinal >= fake().device_count) return CUDA_ERROR_INVALID_DEVICE;
  *d = ordinal;
  return CUDA_SUCCESS;
}
CUresult device_get_attribute(int* v, CUdevice_attribute a, CUdevice) {
  switch (a) {
    case CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MAJOR: *v = fake().cc_major; return CUDA_SUCCESS;
    case CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MINOR: *v = fake().cc_minor; return CUDA_SUCCESS;
    case CU_DEVICE_ATTRIBUTE_MULTIPROCESSOR_COUNT: *v = 132; return CUDA_SUCCESS;
    case CU_DEVICE_ATTRIBUTE_MAX_SHARED_MEMORY_PER_BLOCK_OPTIN: *v = fake().shared_optin; return CUDA_SUCCESS;
    default: return CUDA_ERROR_INVALID_VALUE;
  }
}
CUresult primary_retain(CUcontext* c, CUdevice d) {
  std::lock_guard<std::mutex> l(fake().mu);
  ++fake().retains;
  *c = fake_primary_ctx(d);
  return CUDA_SUCCESS;
}
CUresult primary_release(CUdevice) {
  std::lock_guard<std::mutex> l(fake().mu);
  ++fake().releases;
  return CUDA_SUCCESS;
}
CUresult ctx_get_current(CUcontext* c) {
  std::lock_guard<std::mutex> l(fake().mu);
  ++fake().ctx_queries;
  *c = fake().ctx_stack.empty() ? nullptr : fake().ctx_stack.back();
  return CUDA_SUCCESS;
}
CUresult ctx_push(CUcontext c) {
  std::lock_guard<std::mutex> l(fake().mu);
  ++fake().ctx_pushes;
  fake().ctx_stack.push_back(c);
  return CUDA_SUCCESS;
}
CUresult ctx_pop(CUcontext* c) {
  std::lock_guard<std::mutex> l(fake().mu);
  if (fake().ctx_stack.empty()) return CUDA_ERROR_INVALID_VALUE;
  if (c != nullptr) *c = fake().ctx_stack.back();
  fake().ctx_stack.pop_back();
  return CUDA_SUCCESS;
}
CUresult module_load_data(CUmodule* m, const void* image) {
  std::lock_guard<std::mutex> l(fake().mu);
  if (fake().ctx_stack.empty()) return CUDA_ERROR_INVALID_VALUE;  // the driver needs a current context
  if (fake().module_load_result != CUDA_SUCCESS) return fake().module_load_result;
  if (std::memcmp(image, "\x7f" "ELF", 4) != 0) return CUDA_ERROR_INVALID_IMAGE;
  ++fake().module_loads;
  fake().loaded_images.push_back(image);
  static char modules[1];
  *m = reinterpret_cast<CUmodule>(&modules[0]);
  return CUDA_SUCCESS;
}
CUresult module_unload(CUmodule) {
  std::lock_guard<std::mutex> l(fake().mu);
  ++fake().module_unloads;
  return CUDA_SUCCESS;
}
CUresult module_get_function(CUfunction* f, CUmodule, const char* name) {
  for (std::size_t i = 0; i < fake().entries.size(); ++i) {
    if (fake().entries[i] == name) {
      *f = fake_function(i);
      return CUDA_SUCCESS;
    }
  }
  return CUDA_ERROR_NOT_FOUND;
}
CUresult func_get_param_info(CUfunction, size_t index, size_t* offset, size_t* size) {
  std::vector<std::size_t> sizes = fake().param_sizes;
  if (!fake().use_param_sizes) {
    // Pass 2's real list: 5 pointers, an i64, 7 fp32, then 2 trailing pointers.
    sizes = {8, 8, 8, 8, 8, 8, 4, 4, 4, 4, 4, 4, 4, 8, 8};
  }
  if (index >= sizes.size()) return CUDA_ERROR_INVALID_VALUE;
  std::size_t off = 0;
  for (std::size_t i = 0; i < index; ++i) off += sizes[i];
  *offset = off;
  *size = sizes[index];
  return CUDA_SUCCESS;
}
CUresult func_get_attribute(int* v, CUfunction_attribute a, CUfunction) {
  switch (a) {
    case CU_FUNC_ATTRIBUTE_MAX_THREADS_PER_BLOCK: *v = fake().max_threads; return CUDA_SUCCESS;
    case CU_FUNC_ATTRIBUTE_NUM_REGS: *v = 40; return CUDA_SUCCESS;
    case CU_FUNC_ATTRIBUTE_SHARED_SIZE_BYTES: *v = 0; return CUDA_SUCCESS;
    default: return CUDA_ERROR_INVALID_VALUE;
  }
}
CUresult func_set_attribute(CUfunction, CUfunction_attribute a, int v) {
  std::lock_guard<std::mutex> l(fake().mu);
  fake().func_set_attributes.push_back({a, v});
  return CUDA_SUCCESS;
}
CUresult launch_kernel(CUfunction f, unsigned gx, unsigned gy, unsigned gz, unsigned bx, unsigned by,
                              unsigned bz, unsigned shared, CUstream stream, void** params, void** extra) {
  std::lock_guard<std::mutex> l(fake().mu);
  if (extra != nullptr) return CUDA_ERROR_INVALID_VALUE;
  LaunchRecord r{f, {gx, gy, gz}, {bx, by, bz}, shared, stream, {}, {},
                 fake().ctx_stack.empty() ? nullptr : fake().ctx_stack.back()};
  const std::size_t n = fake().n_user_args + static_cast<std::size_t>(fake().n_trailing);
  r.params.assign(params, params + n);
  for (std::size_t i = fake().n_user_args; i < n; ++i) {
    r.trailing.push_back(*static_cast<const CUdeviceptr*>(params[i]));
  }
  fake().launches.push_back(r);
  return fake().launch_result;
}
CUresult mem_alloc(CUdeviceptr* p, size_t bytes) {
  std::lock_guard<std::mutex> l(fake().mu);
  fake().allocations.push_back(bytes);
  *p = fake().next_address;
  fake().next_address += (bytes + 0xFFFF) / 0x10000 * 0x10000 + 0x100;
  return CUDA_SUCCESS;
}
CUresult mem_free(CUdeviceptr p) {
  std::lock_guard<std::mutex> l(fake().mu);
  fake().freed.push_back(p);
  return CUDA_SUCCESS;
}
}  // namespace fake_fn
}  // namespace

luminav::CudaDriverApi make_fake_driver() {
  luminav::CudaDriverApi api;
  api.origin = "fake driver (tests)";
  api.cuGetErrorName = fake_fn::get_error_name;
  api.cuGetErrorString = fake_fn::get_error_string;
  api.cuInit = fake_fn::init;
  api.cuDriverGetVersion = fake_fn::driver_get_version;
  api.cuDeviceGet = fake_fn::device_get;
  api.cuDeviceGetCount = fake_fn::device_get_count;
  api.cuDeviceGetAttribute = fake_fn::device_get_attribute;
  api.cuDevicePrimaryCtxRetain = fake_fn::primary_retain;
  api.cuDevicePrimaryCtxRelease = fake_fn::primary_release;
  api.cuCtxGetCurrent = fake_fn::ctx_get_current;
  api.cuCtxPushCurrent = fake_fn::ctx_push;
  api.cuCtxPopCurrent = fake_fn::ctx_pop;
  api.cuModuleLoadData = fake_fn::module_load_data;
  api.cuModuleUnload = fake_fn::module_unload;
  api.cuModuleGetFunction = fake_fn::module_get_function;
  api.cuFuncGetParamInfo = fake_fn::func_get_param_info;
  api.cuFuncGetAttribute = fake_fn::func_get_attribute;
  api.cuFuncSetAttribute = fake_fn::func_set_attribute;
  api.cuLaunchKernel = fake_fn::launch_kernel;
  api.cuMemAlloc = fake_fn::mem_alloc;
  api.cuMemFree = fake_fn::mem_free;
  return api;
}

}  // namespace luminav_test
