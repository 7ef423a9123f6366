// Test fixtures of the AOT layer: bundles written into a temporary folder (a manifest and
// minimal but well-formed ELF64 "cubins"), and a fake CUDA driver table that records what the
// runtime asks of it. The fake stands in for the driver only on machines without a GPU and
// only to reach error paths and observe launches; nothing in it computes a kernel.
#pragma once

#include <gtest/gtest.h>
#include <stdlib.h>
#include <unistd.h>

#include <cstdint>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <map>
#include <mutex>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "aot/runtime.h"
#include "luminav/cuda_driver.h"
#include "luminav/error.h"

namespace luminav_test {

using nlohmann::json;

// A minimal ELF64 little-endian image: header, one PROGBITS section holding `payload`, and the
// section header table (null + that section) at the end.
inline std::vector<unsigned char> make_fake_cubin(const std::string& payload) {
  const std::size_t shoff = 64 + payload.size();
  std::vector<unsigned char> b(shoff + 128, 0);  // header, payload, 2 section headers
  auto put = [&b](std::size_t off, std::uint64_t v, int n) {
    for (int i = 0; i < n; ++i) b[off + static_cast<std::size_t>(i)] = static_cast<unsigned char>(v >> (8 * i));
  };
  b[0] = 0x7f;
  b[1] = 'E';
  b[2] = 'L';
  b[3] = 'F';
  b[4] = 2;  // ELFCLASS64
  b[5] = 1;  // little-endian
  b[6] = 1;  // EV_CURRENT
  put(0x10, 2, 2);      // ET_EXEC
  put(0x12, 190, 2);    // EM_CUDA
  put(0x28, shoff, 8);  // e_shoff
  put(0x34, 64, 2);     // e_ehsize
  put(0x3A, 64, 2);     // e_shentsize
  put(0x3C, 2, 2);      // e_shnum
  for (std::size_t i = 0; i < payload.size(); ++i) b[64 + i] = static_cast<unsigned char>(payload[i]);
  const std::size_t sh1 = shoff + 64;  // section 0 is the null section
  put(sh1 + 4, 1, 4);                  // sh_type PROGBITS
  put(sh1 + 0x18, 64, 8);              // sh_offset
  put(sh1 + 0x20, payload.size(), 8);  // sh_size
  return b;
}

// A temporary folder removed at scope end.
class TempDir {
 public:
  TempDir() {
    std::string tmpl = (std::filesystem::temp_directory_path() / "luminav-aot-XXXXXX").string();
    if (mkdtemp(tmpl.data()) == nullptr) throw std::runtime_error("mkdtemp failed");
    path_ = tmpl;
  }
  ~TempDir() {
    std::error_code ec;
    std::filesystem::remove_all(path_, ec);
  }
  TempDir(const TempDir&) = delete;
  TempDir& operator=(const TempDir&) = delete;
  const std::string& path() const { return path_; }
  std::string file(const std::string& name) const { return path_ + "/" + name; }

 private:
  std::string path_;
};

inline void write_bytes(const std::string& path, const std::vector<unsigned char>& bytes) {
  std::ofstream f(path, std::ios::binary | std::ios::trunc);
  f.write(reinterpret_cast<const char*>(bytes.data()), static_cast<std::streamsize>(bytes.size()));
}

inline std::string read_text(const std::string& path) {
  std::ifstream f(path, std::ios::binary);
  return std::string((std::istreambuf_iterator<char>(f)), std::istreambuf_iterator<char>());
}

inline void write_text(const std::string& path, const std::string& text) {
  std::ofstream f(path, std::ios::binary | std::ios::trunc);
  f << text;
}

// The pass-2 kernel's user arguments (docs/internals.md), in order.
inline std::vector<std::string> pass2_arg_names() {
  return {"table", "block_map", "stats", "found_inf", "lr", "seed", "sign", "beta1", "beta2", "eps",
          "weight_decay", "clip", "bound"};
}
inline std::vector<std::string> pass2_signature() {
  return {"*i64", "*i32", "*fp32", "*i32", "*fp32", "i64", "fp32", "fp32", "fp32", "fp32", "fp32", "fp32", "fp32"};
}

// A kernel of docs/internals.md: its kind, Triton name (also the cubin's .entry) and user
// arguments (names and type words).
struct KernelSpec {
  std::string kernel, name;
  std::vector<std::string> arg_names, signature;
};

inline KernelSpec kernel_spec(const std::string& kernel) {
  if (kernel == "pass1") {
    return {kernel, "_lumina_tdclm_pass1_kernel",
            {"table", "block_map", "partial_sum", "partial_bad", "seed", "sign", "beta1", "beta2", "eps"},
            {"*i64", "*i32", "*fp32", "*i32", "i64", "fp32", "fp32", "fp32", "fp32"}};
  }
  if (kernel == "reduce") {
    return {kernel, "_lumina_tdclm_reduce_kernel",
            {"table", "partial_sum", "partial_bad", "stats", "found_inf", "ntensors"},
            {"*i64", "*fp32", "*i32", "*fp32", "*i32", "i32"}};
  }
  if (kernel == "single_pass") return {kernel, "_lumina_adamw_single_pass_kernel", pass2_arg_names(), pass2_signature()};
  if (kernel == "commit") {
    return {kernel, "_lumina_tdclm_commit_kernel", {"table", "found_inf", "ntensors"}, {"*i64", "*i32", "i32"}};
  }
  return {"pass2", "_lumina_tdclm_pass2_kernel", pass2_arg_names(), pass2_signature()};
}

// Writes a cubin into `dir` and returns a manifest entry for it (Triton 3.5+ ABI: 2 trailing
// scratch pointers), for the kernel `spec` (pass 2 unless given).
inline json add_variant(const TempDir& dir, const std::string& key, int arch, const std::string& payload = "",
                        const KernelSpec& spec = kernel_spec("pass2")) {
  const std::string cubin_name = key + ".sm" + std::to_string(arch) + ".cubin";
  const auto bytes = make_fake_cubin(payload.empty() ? "cubin of " + cubin_name : payload);
  write_bytes(dir.file(cubin_name), bytes);
  const auto& names = spec.arg_names;
  const auto& sig = spec.signature;
  json e = {
      {"key", key},
      {"kernel", spec.kernel},
      {"name", spec.name},
      {"entry", spec.name},
      {"cubin", cubin_name},
      {"sha256", luminav::sha256_hex(bytes.data(), bytes.size())},
      {"target", {{"backend", "cuda"}, {"arch", arch}, {"warp_size", 32}}},
      {"triton_version", "3.6.0"},
      {"num_warps", 8},
      {"num_ctas", 1},
      {"num_stages", 3},
      {"shared_mem", 0},
      {"arg_names", names},
      {"signature", sig},
      {"constexprs", {{"P_DTYPE", 1}, {"G_DTYPE", 1}, {"S_DTYPE", 0}, {"SR", 1}, {"BOUND_MODE", 2},
                      {"USE_CLIP", 1}, {"CHECK_FLAG", 1}, {"BLOCK", 2048}}},
      {"num_params", static_cast<int>(sig.size()) + 2},
      {"num_trailing_scratch_ptrs", 2},
      {"global_scratch_size", 0},
      {"global_scratch_align", 1},
      {"profile_scratch_size", 0},
      {"profile_scratch_align", 1},
  };
  return e;
}

inline json manifest_with(const std::vector<json>& kernels) {
  return json{{"format", "luminamoon-aot-bundle"},
              {"format_version", 2},
              {"table_cols", 18},  // the engine's (gpu_launch.h kTableCols)
              {"created_by", "luminamoon 0.1.0"},
              {"triton_version", "3.6.0"},
              {"kernels", kernels}};
}

inline void write_manifest(const TempDir& dir, const json& manifest) {
  write_text(dir.file("manifest.json"), manifest.dump(2));
}

constexpr const char* kPass2Key = "pass2.p1g1s0.sr1.b2.c1.f1.B2048.w8";

// ---------------------------------------------------------------------------------------------
// The fake driver. Its functions are plain C-style functions (the table holds raw function
// pointers), so they share one global state; FakeDriverFixture resets it for every test.

struct LaunchRecord {
  luminav::CUfunction function;
  unsigned grid[3];
  unsigned block[3];
  unsigned shared;
  luminav::CUstream stream;
  std::vector<void*> params;                  // kernelParams as passed (the first n_expected)
  std::vector<luminav::CUdeviceptr> trailing;  // the values the trailing entries point at
  luminav::CUcontext current;                  // context current during the launch
};

struct FakeState {
  std::mutex mu;
  int device_count = 1;
  int cc_major = 9, cc_minor = 0;
  int shared_optin = 232448;  // an H100/H200's opt-in limit
  luminav::CUresult module_load_result = luminav::CUDA_SUCCESS;
  luminav::CUresult launch_result = luminav::CUDA_SUCCESS;
  std::vector<std::string> entries = {"_lumina_tdclm_pass2_kernel"};
  std::vector<std::size_t> param_sizes;  // cuFuncGetParamInfo answers; empty: 15 as pass 2 has
  bool use_param_sizes = false;
  int max_threads = 1024;
  int module_loads = 0, module_unloads = 0;
  int retains = 0, releases = 0;
  std::vector<const void*> loaded_images;
  std::vector<std::pair<int, int>> func_set_attributes;
  std::vector<std::size_t> allocations;
  std::vector<luminav::CUdeviceptr> freed;
  luminav::CUdeviceptr next_address = 0x7f0000000100ull;  // 256-aligned, not 512-aligned
  std::vector<luminav::CUcontext> ctx_stack;  // top = current
  int ctx_queries = 0, ctx_pushes = 0;         // cuCtxGetCurrent, cuCtxPushCurrent calls
  std::vector<LaunchRecord> launches;
  std::size_t n_user_args = 13;  // how many kernelParams entries are user arguments
  int n_trailing = 2;
};

inline FakeState& fake() {
  static FakeState s;
  return s;
}

inline luminav::CUcontext fake_primary_ctx(int device) {
  static char ctxs[16];
  return reinterpret_cast<luminav::CUcontext>(&ctxs[device]);
}
inline luminav::CUcontext fake_user_ctx() {
  static char c;
  return reinterpret_cast<luminav::CUcontext>(&c);
}

namespace fake_fn {
using namespace luminav;
inline CUresult get_error_name(CUresult r, const char** s) {
  switch (r) {
    case CUDA_ERROR_INVALID_VALUE: *s = "CUDA_ERROR_INVALID_VALUE"; return CUDA_SUCCESS;
    case CUDA_ERROR_OUT_OF_MEMORY: *s = "CUDA_ERROR_OUT_OF_MEMORY"; return CUDA_SUCCESS;
    case CUDA_ERROR_INVALID_IMAGE: *s = "CUDA_ERROR_INVALID_IMAGE"; return CUDA_SUCCESS;
    case CUDA_ERROR_NOT_FOUND: *s = "CUDA_ERROR_NOT_FOUND"; return CUDA_SUCCESS;
    case CUDA_ERROR_LAUNCH_FAILED: *s = "CUDA_ERROR_LAUNCH_FAILED"; return CUDA_SUCCESS;
    default: *s = nullptr; return CUDA_ERROR_INVALID_VALUE;
  }
}
inline CUresult get_error_string(CUresult r, const char** s) {
  switch (r) {
    case CUDA_ERROR_INVALID_VALUE: *s = "invalid argument"; return CUDA_SUCCESS;
    case CUDA_ERROR_OUT_OF_MEMORY: *s = "out of memory"; return CUDA_SUCCESS;
    case CUDA_ERROR_INVALID_IMAGE: *s = "device kernel image is invalid"; return CUDA_SUCCESS;
    case CUDA_ERROR_NOT_FOUND: *s = "named symbol not found"; return CUDA_SUCCESS;
    case CUDA_ERROR_LAUNCH_FAILED: *s = "unspecified launch failure"; return CUDA_SUCCESS;
    default: *s = nullptr; return CUDA_ERROR_INVALID_VALUE;
  }
}
inline CUresult init(unsigned int) { return CUDA_SUCCESS; }
inline CUresult driver_get_version(int* v) { *v = 12040; return CUDA_SUCCESS; }
inline CUresult device_get_count(int* n) { *n = fake().device_count; return CUDA_SUCCESS; }
inline CUresult device_get(CUdevice* d, int ordinal) {
  if (ordinal < 0 || ordinal >= fake().device_count) return CUDA_ERROR_INVALID_DEVICE;
  *d = ordinal;
  return CUDA_SUCCESS;
}
inline CUresult device_get_attribute(int* v, CUdevice_attribute a, CUdevice) {
  switch (a) {
    case CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MAJOR: *v = fake().cc_major; return CUDA_SUCCESS;
    case CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MINOR: *v = fake().cc_minor; return CUDA_SUCCESS;
    case CU_DEVICE_ATTRIBUTE_MULTIPROCESSOR_COUNT: *v = 132; return CUDA_SUCCESS;
    case CU_DEVICE_ATTRIBUTE_MAX_SHARED_MEMORY_PER_BLOCK_OPTIN: *v = fake().shared_optin; return CUDA_SUCCESS;
    default: return CUDA_ERROR_INVALID_VALUE;
  }
}
inline CUresult primary_retain(CUcontext* c, CUdevice d) {
  std::lock_guard<std::mutex> l(fake().mu);
  ++fake().retains;
  *c = fake_primary_ctx(d);
  return CUDA_SUCCESS;
}
inline CUresult primary_release(CUdevice) {
  std::lock_guard<std::mutex> l(fake().mu);
  ++fake().releases;
  return CUDA_SUCCESS;
}
inline CUresult ctx_get_current(CUcontext* c) {
  std::lock_guard<std::mutex> l(fake().mu);
  ++fake().ctx_queries;
  *c = fake().ctx_stack.empty() ? nullptr : fake().ctx_stack.back();
  return CUDA_SUCCESS;
}
inline CUresult ctx_push(CUcontext c) {
  std::lock_guard<std::mutex> l(fake().mu);
  ++fake().ctx_pushes;
  fake().ctx_stack.push_back(c);
  return CUDA_SUCCESS;
}
inline CUresult ctx_pop(CUcontext* c) {
  std::lock_guard<std::mutex> l(fake().mu);
  if (fake().ctx_stack.empty()) return CUDA_ERROR_INVALID_VALUE;
  if (c != nullptr) *c = fake().ctx_stack.back();
  fake().ctx_stack.pop_back();
  return CUDA_SUCCESS;
}
inline CUresult module_load_data(CUmodule* m, const void* image) {
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
inline CUresult module_unload(CUmodule) {
  std::lock_guard<std::mutex> l(fake().mu);
  ++fake().module_unloads;
  return CUDA_SUCCESS;
}
// The function of entries[i] is fake_function(i).
inline CUfunction fake_function(std::size_t i) {
  static char fn[32];
  return reinterpret_cast<CUfunction>(&fn[i % 32]);
}
inline CUresult module_get_function(CUfunction* f, CUmodule, const char* name) {
  for (std::size_t i = 0; i < fake().entries.size(); ++i) {
    if (fake().entries[i] == name) {
      *f = fake_function(i);
      return CUDA_SUCCESS;
    }
  }
  return CUDA_ERROR_NOT_FOUND;
}
inline CUresult func_get_param_info(CUfunction, size_t index, size_t* offset, size_t* size) {
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
inline CUresult func_get_attribute(int* v, CUfunction_attribute a, CUfunction) {
  switch (a) {
    case CU_FUNC_ATTRIBUTE_MAX_THREADS_PER_BLOCK: *v = fake().max_threads; return CUDA_SUCCESS;
    case CU_FUNC_ATTRIBUTE_NUM_REGS: *v = 40; return CUDA_SUCCESS;
    case CU_FUNC_ATTRIBUTE_SHARED_SIZE_BYTES: *v = 0; return CUDA_SUCCESS;
    default: return CUDA_ERROR_INVALID_VALUE;
  }
}
inline CUresult func_set_attribute(CUfunction, CUfunction_attribute a, int v) {
  std::lock_guard<std::mutex> l(fake().mu);
  fake().func_set_attributes.push_back({a, v});
  return CUDA_SUCCESS;
}
inline CUresult launch_kernel(CUfunction f, unsigned gx, unsigned gy, unsigned gz, unsigned bx, unsigned by,
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
inline CUresult mem_alloc(CUdeviceptr* p, size_t bytes) {
  std::lock_guard<std::mutex> l(fake().mu);
  fake().allocations.push_back(bytes);
  *p = fake().next_address;
  fake().next_address += (bytes + 0xFFFF) / 0x10000 * 0x10000 + 0x100;
  return CUDA_SUCCESS;
}
inline CUresult mem_free(CUdeviceptr p) {
  std::lock_guard<std::mutex> l(fake().mu);
  fake().freed.push_back(p);
  return CUDA_SUCCESS;
}
}  // namespace fake_fn

// The table: every entry the AOT runtime calls; the rest stay null.
inline luminav::CudaDriverApi make_fake_driver() {
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

// Resets the fake's state, installs the table for the test's duration.
class FakeDriverFixture : public ::testing::Test {
 protected:
  void SetUp() override {
    FakeState& s = fake();
    std::lock_guard<std::mutex> l(s.mu);
    s.device_count = 1;
    s.cc_major = 9;
    s.cc_minor = 0;
    s.shared_optin = 232448;
    s.module_load_result = luminav::CUDA_SUCCESS;
    s.launch_result = luminav::CUDA_SUCCESS;
    s.entries = {"_lumina_tdclm_pass2_kernel"};
    s.param_sizes.clear();
    s.use_param_sizes = false;
    s.max_threads = 1024;
    s.module_loads = s.module_unloads = s.retains = s.releases = 0;
    s.loaded_images.clear();
    s.func_set_attributes.clear();
    s.allocations.clear();
    s.freed.clear();
    s.next_address = 0x7f0000000100ull;
    s.ctx_stack.clear();
    s.ctx_queries = s.ctx_pushes = 0;
    s.launches.clear();
    s.n_user_args = 13;
    s.n_trailing = 2;
  }

  luminav::CudaDriverApi api_ = make_fake_driver();
  luminav::ScopedDriverOverride override_{&api_};
};

// Expects `fn` to throw luminav::Error with `status` and a message holding every substring.
template <typename Fn>
void expect_error(Fn&& fn, luminav::Status status, const std::vector<std::string>& substrings) {
  try {
    fn();
  } catch (const luminav::Error& e) {
    EXPECT_EQ(static_cast<int>(e.status()), static_cast<int>(status)) << e.what();
    const std::string msg = e.what();
    for (const std::string& s : substrings) {
      EXPECT_NE(msg.find(s), std::string::npos) << "message lacks \"" << s << "\":\n  " << msg;
    }
    return;
  } catch (const std::exception& e) {
    ADD_FAILURE() << "threw a non-luminav exception: " << e.what();
    return;
  }
  ADD_FAILURE() << "did not throw";
}

}  // namespace luminav_test
