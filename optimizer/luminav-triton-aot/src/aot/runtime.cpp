// src/aot/runtime.cpp: loads a bundle's kernels once per device and launches them
//
// Modules are loaded lazily per (variant, device) into the device's primary context; every
// launch, one-off (AotRuntime::launch) or bound once (KernelLaunch), lays out its kernelParams
// with pack_triton_abi_args (aot/triton_abi.h).
#include "aot/runtime.h"

#include <cstring>
#include <limits>
#include <string>

#include "aot/bundle_rules.h"
#include "aot/triton_abi.h"
#include "luminav/error.h"

namespace luminav {

namespace {

std::string sm(int arch) { return "sm_" + std::to_string(arch); }

std::string describe_variant(const KernelMetadata& m) {
  return "\"" + printable(m.cubin_path, 4096) + "\" (key \"" + printable(m.key) + "\", " + sm(m.arch) + ")";
}

// A refusal at load on a device: a BundleError naming the entry's field (kernels[i].<field>).
[[noreturn]] void refuse(BundleRule rule, const KernelMetadata& m, const std::string& field,
                         const std::string& expected, const std::string& found, const std::string& message) {
  throw BundleError(rule, m.cubin_path, "kernels[" + std::to_string(m.index) + "]." + field, expected, found, message);
}

}  // namespace

ScopedContext::ScopedContext(const CudaDriverApi& api, CUcontext ctx) : api_(api) {
  CUcontext current = nullptr;
  check(api_, api_.cuCtxGetCurrent(&current), "cuCtxGetCurrent", "");
  if (current != ctx) {
    check(api_, api_.cuCtxPushCurrent(ctx), "cuCtxPushCurrent", "making the device's primary context current");
    pushed_ = true;
  }
}

ScopedContext::~ScopedContext() {
  if (pushed_) {
    CUcontext popped = nullptr;
    api_.cuCtxPopCurrent(&popped);  // a failure here cannot be reported from a destructor
  }
}

struct AotRuntime::DeviceState {
  DeviceInfo info;
  CUdevice device = 0;
  CUcontext primary = nullptr;
};

bool AotRuntime::ScratchKey::operator<(const ScratchKey& o) const {
  if (kernel != o.kernel) return kernel < o.kernel;
  if (x != o.x) return x < o.x;
  if (y != o.y) return y < o.y;
  if (z != o.z) return z < o.z;
  return stream < o.stream;
}

AotRuntime::AotRuntime(AotManifest manifest)
    : AotRuntime(std::make_shared<const AotManifest>(std::move(manifest))) {}

AotRuntime::AotRuntime(std::shared_ptr<const AotManifest> manifest)
    : manifest_(std::move(manifest)), api_(&cuda_driver()) {
  if (manifest_ == nullptr) throw Error(Status::kInvalidArgument, "AotRuntime needs a manifest, got null");
}

AotRuntime::~AotRuntime() {
  // Errors are ignored here: at process exit the driver may already be shutting down.
  const CudaDriverApi& api = *api_;
  for (auto& [key, scratch] : scratch_) {
    CUcontext popped = nullptr;
    if (api.cuCtxPushCurrent(key.kernel->context) != CUDA_SUCCESS) continue;
    if (scratch->global_base != 0) api.cuMemFree(scratch->global_base);
    if (scratch->profile_base != 0) api.cuMemFree(scratch->profile_base);
    api.cuCtxPopCurrent(&popped);
  }
  for (auto& [key, k] : loaded_) {
    CUcontext popped = nullptr;
    if (api.cuCtxPushCurrent(k->context) != CUDA_SUCCESS) continue;
    api.cuModuleUnload(k->module);
    api.cuCtxPopCurrent(&popped);
  }
  for (auto& [ordinal, ds] : devices_) {
    if (ds->primary != nullptr) api.cuDevicePrimaryCtxRelease(ds->device);
  }
}

AotRuntime::DeviceState& AotRuntime::device_state_locked(int device_ordinal) {
  auto it = devices_.find(device_ordinal);
  if (it != devices_.end()) return *it->second;
  const CudaDriverApi& api = *api_;
  if (device_count_ < 0) {
    int count = 0;
    check(api, api.cuDeviceGetCount(&count), "cuDeviceGetCount");
    device_count_ = count;
  }
  if (device_ordinal < 0 || device_ordinal >= device_count_) {
    throw Error(Status::kNotFound,
                "CUDA device " + std::to_string(device_ordinal) + " does not exist: the driver sees " +
                    std::to_string(device_count_) + " device(s)" +
                    (device_count_ > 0 ? " (ordinals 0.." + std::to_string(device_count_ - 1) + ")" : std::string()) +
                    "; pick one of those (and check CUDA_VISIBLE_DEVICES)");
  }
  auto ds = std::make_unique<DeviceState>();
  const std::string where = "querying CUDA device " + std::to_string(device_ordinal);
  check(api, api.cuDeviceGet(&ds->device, device_ordinal), "cuDeviceGet", where);
  DeviceInfo& info = ds->info;
  info.ordinal = device_ordinal;
  check(api, api.cuDeviceGetAttribute(&info.cc_major, CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MAJOR, ds->device),
        "cuDeviceGetAttribute", where);
  check(api, api.cuDeviceGetAttribute(&info.cc_minor, CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MINOR, ds->device),
        "cuDeviceGetAttribute", where);
  check(api, api.cuDeviceGetAttribute(&info.multiprocessors, CU_DEVICE_ATTRIBUTE_MULTIPROCESSOR_COUNT, ds->device),
        "cuDeviceGetAttribute", where);
  check(api,
        api.cuDeviceGetAttribute(&info.shared_optin, CU_DEVICE_ATTRIBUTE_MAX_SHARED_MEMORY_PER_BLOCK_OPTIN, ds->device),
        "cuDeviceGetAttribute", where);
  check(api, api.cuDevicePrimaryCtxRetain(&ds->primary, ds->device), "cuDevicePrimaryCtxRetain", where);
  DeviceState& ref = *ds;
  devices_.emplace(device_ordinal, std::move(ds));
  return ref;
}

DeviceInfo AotRuntime::device_info(int device_ordinal) {
  std::lock_guard<std::mutex> lock(mutex_);
  return device_state_locked(device_ordinal).info;
}

std::size_t AotRuntime::loaded_count() const {
  std::lock_guard<std::mutex> lock(mutex_);
  return loaded_.size();
}

const LoadedKernel& AotRuntime::get(const std::string& key, int device_ordinal) {
  std::lock_guard<std::mutex> lock(mutex_);
  auto hit = by_key_.find({key, device_ordinal});
  if (hit != by_key_.end()) return *hit->second;
  DeviceState& ds = device_state_locked(device_ordinal);
  const KernelMetadata& meta = manifest_->require(key, ds.info.cc_major, ds.info.cc_minor);
  const LoadedKernel& k = load_locked(meta, ds);
  by_key_.emplace(std::make_pair(key, device_ordinal), &k);
  return k;
}

const LoadedKernel& AotRuntime::load(const KernelMetadata& meta, int device_ordinal) {
  std::lock_guard<std::mutex> lock(mutex_);
  return load_locked(meta, device_state_locked(device_ordinal));
}

const LoadedKernel& AotRuntime::load_locked(const KernelMetadata& meta, DeviceState& ds) {
  const auto& all = manifest_->kernels();
  if (all.empty() || &meta < all.data() || &meta >= all.data() + all.size()) {
    throw Error(Status::kInvalidArgument,
                "AotRuntime::load: the kernel metadata for key \"" + meta.key +
                    "\" is not an entry of this runtime's manifest (" + manifest_->manifest_path() + ")");
  }
  const int ordinal = ds.info.ordinal;
  auto found = loaded_.find({&meta, ordinal});
  if (found != loaded_.end()) return *found->second;

  const CudaDriverApi& api = *api_;
  const std::string dev = "device " + std::to_string(ordinal) + " (compute capability " +
                          std::to_string(ds.info.cc_major) + "." + std::to_string(ds.info.cc_minor) + ")";
  const std::string what = describe_variant(meta);
  if (!meta.runs_on(ds.info.cc_major, ds.info.cc_minor)) {
    refuse(BundleRule::kDevice, meta, "target.arch", "an arch " + dev + " can run", std::to_string(meta.arch),
                what + ": field \"target.arch\": expected an arch " + dev + " can run (sm_" +
                    std::to_string(ds.info.cc_major) + "0..sm_" + std::to_string(ds.info.cc_major) +
                    std::to_string(ds.info.cc_minor) + "), found " + std::to_string(meta.arch) +
                    "; a cubin runs only on the same major and an equal or newer minor; fix: luminamoon aot build "
                    "--arch " + std::to_string(ds.info.cc_major) + std::to_string(ds.info.cc_minor));
  }
  if (meta.num_ctas != 1) {
    refuse(BundleRule::kDevice, meta, "num_ctas", "1", std::to_string(meta.num_ctas),
                what + ": field \"num_ctas\": expected 1 (luminav launches with cuLaunchKernel, without thread "
                       "block clusters), found " + std::to_string(meta.num_ctas) + "; rebuild with num_ctas=1");
  }
  if (meta.shared_mem > ds.info.shared_optin) {
    refuse(BundleRule::kDevice, meta, "shared_mem", "at most " + std::to_string(ds.info.shared_optin),
                std::to_string(meta.shared_mem),
                what + ": field \"shared_mem\": expected at most " + std::to_string(ds.info.shared_optin) +
                    " bytes (the most " + dev + " allows per block), found " + std::to_string(meta.shared_mem) +
                    "; rebuild the variant with a smaller block or fewer stages");
  }

  // The cubin is read and verified here, the first time its kernel is loaded.
  const std::vector<unsigned char>& image = meta.image();
  ScopedContext ctx(api, ds.primary);
  CUmodule module = nullptr;
  check(api, api.cuModuleLoadData(&module, image.data()), "cuModuleLoadData", "loading " + what + " on " + dev);
  // From here on a refusal must unload the module again.
  struct ModuleGuard {
    const CudaDriverApi& api;
    CUmodule module;
    bool keep = false;
    ~ModuleGuard() {
      if (!keep) api.cuModuleUnload(module);
    }
  } guard{api, module};

  auto loaded = std::make_unique<LoadedKernel>();
  loaded->meta = &meta;
  loaded->device = ordinal;
  loaded->context = ds.primary;
  loaded->module = module;
  loaded->device_cc_major = ds.info.cc_major;
  loaded->device_cc_minor = ds.info.cc_minor;
  const CUresult fr = api.cuModuleGetFunction(&loaded->function, module, meta.entry.c_str());
  if (fr != CUDA_SUCCESS || loaded->function == nullptr) {
    refuse(BundleRule::kNoEntrySymbol, meta, "entry", "a kernel named \"" + meta.entry + "\"", "none",
                                          what + ": field \"entry\": expected a kernel named \"" + meta.entry +
                                          "\" in the cubin, found none (cuModuleGetFunction: " +
                                          describe_cuda_error(api, fr) + "); rebuild the bundle");
  }
  CUfunction fn = loaded->function;

  // The ABI check: the function's own parameter list against the manifest's.
  if (api.cuFuncGetParamInfo != nullptr) {
    std::vector<std::size_t> sizes;
    CUresult last = CUDA_SUCCESS;
    for (std::size_t i = 0; i <= 4096; ++i) {
      std::size_t offset = 0, size = 0;
      last = api.cuFuncGetParamInfo(fn, i, &offset, &size);
      if (last != CUDA_SUCCESS) break;
      sizes.push_back(size);
    }
    // An index past the end gives CUDA_ERROR_INVALID_VALUE; any other answer means the driver
    // cannot tell, and the check is left out.
    if (last == CUDA_ERROR_INVALID_VALUE) {
      loaded->params_checked = static_cast<int>(sizes.size());
      if (static_cast<int>(sizes.size()) != meta.num_params) {
        refuse(BundleRule::kParamMismatch, meta, "num_params", std::to_string(sizes.size()) + " (cuFuncGetParamInfo)",
                    std::to_string(meta.num_params),
                    what + ": field \"num_params\": the manifest says " + std::to_string(meta.num_params) +
                        " (len(signature) " + std::to_string(meta.signature.size()) + " + num_trailing_scratch_ptrs " +
                        std::to_string(meta.num_trailing_scratch_ptrs) + "), the loaded function \"" + meta.entry +
                        "\" has " + std::to_string(sizes.size()) +
                        " parameters (cuFuncGetParamInfo): an ABI mismatch, refused before any launch; rebuild "
                        "the bundle with the Triton it names (" + meta.triton_version + ")");
      }
      for (std::size_t i = 0; i < sizes.size(); ++i) {
        const bool user = i < meta.arg_types.size();
        const std::size_t expected = user ? meta.arg_types[i].size : sizeof(CUdeviceptr);
        if (sizes[i] != expected) {
          const std::string name = user ? "\"" + meta.arg_names[i] + "\" (" + meta.signature[i] + ")"
                                        : "trailing scratch pointer " + std::to_string(i - meta.arg_types.size());
          refuse(BundleRule::kParamMismatch, meta, "signature", std::to_string(sizes[i]) + " bytes",
                      std::to_string(expected) + " bytes",
                      what + ": field \"signature\": parameter " + std::to_string(i) + " " + name + " is " +
                          std::to_string(expected) + " bytes by the manifest but " + std::to_string(sizes[i]) +
                          " bytes in the loaded function (cuFuncGetParamInfo): an ABI mismatch, refused before "
                          "any launch; rebuild the bundle");
        }
      }
    }
  }

  int max_threads = 0;
  if (api.cuFuncGetAttribute(&max_threads, CU_FUNC_ATTRIBUTE_MAX_THREADS_PER_BLOCK, fn) == CUDA_SUCCESS &&
      max_threads > 0 && meta.block_threads() > max_threads) {
    refuse(BundleRule::kDevice, meta, "num_warps", "at most " + std::to_string(max_threads / meta.warp_size),
                std::to_string(meta.num_warps),
                what + ": field \"num_warps\": expected at most " + std::to_string(max_threads / meta.warp_size) +
                    " (the function allows " + std::to_string(max_threads) + " threads per block on " + dev +
                    "), found " + std::to_string(meta.num_warps));
  }
  int regs = -1;
  if (api.cuFuncGetAttribute(&regs, CU_FUNC_ATTRIBUTE_NUM_REGS, fn) == CUDA_SUCCESS) loaded->num_regs = regs;

  // Above 48 KiB of dynamic shared memory a function must opt in.
  constexpr std::int64_t kDefaultSharedLimit = 48 * 1024;
  if (meta.shared_mem > kDefaultSharedLimit) {
    check(api,
          api.cuFuncSetAttribute(fn, CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES, static_cast<int>(meta.shared_mem)),
          "cuFuncSetAttribute", "allowing " + std::to_string(meta.shared_mem) + " bytes of dynamic shared memory for " +
                                    what + " on " + dev);
  }

  guard.keep = true;
  const LoadedKernel& ref = *loaded;
  loaded_.emplace(std::make_pair(&meta, ordinal), std::move(loaded));
  return ref;
}

const AotRuntime::Scratch* AotRuntime::scratch_for(const LoadedKernel& kernel, LaunchGrid grid, CUstream stream) {
  const KernelMetadata& meta = *kernel.meta;
  std::lock_guard<std::mutex> lock(mutex_);
  const ScratchKey key{&kernel, grid.x, grid.y, grid.z, stream};
  auto it = scratch_.find(key);
  if (it != scratch_.end()) return it->second.get();

  const CudaDriverApi& api = *api_;
  ScopedContext ctx(api, kernel.context);
  auto s = std::make_unique<Scratch>();
  // cuMemAlloc returns 256-byte aligned memory; a larger alignment is met by over-allocating.
  constexpr std::int64_t kDriverAlign = 256;
  auto alloc = [&](std::size_t bytes, std::int64_t align, CUdeviceptr& base, CUdeviceptr& aligned, const char* what) {
    if (bytes == 0) return;
    const std::size_t extra = align > kDriverAlign ? static_cast<std::size_t>(align - 1) : 0;
    const CUresult r = api.cuMemAlloc(&base, bytes + extra);
    if (r != CUDA_SUCCESS) {
      check(api, r, "cuMemAlloc",
            "allocating " + std::to_string(bytes + extra) + " bytes of " + what + " for " + describe_variant(meta) +
                ", grid (" + std::to_string(grid.x) + ", " + std::to_string(grid.y) + ", " + std::to_string(grid.z) +
                ") on device " + std::to_string(kernel.device) + ": the kernel's scratch requirement cannot be met");
    }
    const auto a = static_cast<CUdeviceptr>(align);
    aligned = (base + a - 1) / a * a;
  };
  try {
    alloc(meta.global_scratch_bytes(grid.x, grid.y, grid.z), meta.global_scratch_align, s->global_base, s->global,
          "global scratch");
    alloc(meta.profile_scratch_bytes(grid.x, grid.y, grid.z), meta.profile_scratch_align, s->profile_base, s->profile,
          "profile scratch");
  } catch (...) {
    if (s->global_base != 0) api.cuMemFree(s->global_base);
    if (s->profile_base != 0) api.cuMemFree(s->profile_base);
    throw;
  }
  const Scratch* ref = s.get();
  scratch_.emplace(key, std::move(s));
  return ref;
}

bool AotRuntime::check_launch(const LoadedKernel& kernel, LaunchGrid grid, void* const* user_arg_ptrs,
                              std::size_t count) {
  if (kernel.meta == nullptr || kernel.function == nullptr) {
    throw Error(Status::kInvalidArgument, "AotRuntime::launch: the kernel was not loaded by AotRuntime::get/load");
  }
  const KernelMetadata& meta = *kernel.meta;
  if (count != meta.signature.size()) {
    std::string names;
    for (std::size_t i = 0; i < meta.arg_names.size(); ++i) names += (i ? ", " : "") + meta.arg_names[i];
    throw Error(Status::kInvalidArgument, "launching \"" + meta.key + "\": expected " +
                                              std::to_string(meta.signature.size()) + " argument pointers (" + names +
                                              "), got " + std::to_string(count));
  }
  check_user_arg_ptrs(user_arg_ptrs, count);
  if (!meta.runs_on(kernel.device_cc_major, kernel.device_cc_minor)) {
    throw Error(Status::kBundleError, describe_variant(meta) + " cannot run on device " +
                                          std::to_string(kernel.device) + " (compute capability " +
                                          std::to_string(kernel.device_cc_major) + "." +
                                          std::to_string(kernel.device_cc_minor) + ")");
  }
  if (grid.x == 0 || grid.y == 0 || grid.z == 0) return false;  // nothing to run, as Triton's launcher
  constexpr unsigned kMaxGridX = 2147483647u, kMaxGridYZ = 65535u;
  if (grid.x > kMaxGridX || grid.y > kMaxGridYZ || grid.z > kMaxGridYZ) {
    throw Error(Status::kInvalidArgument,
                "launching \"" + meta.key + "\": grid (" + std::to_string(grid.x) + ", " + std::to_string(grid.y) +
                    ", " + std::to_string(grid.z) + ") exceeds the driver's limits (x <= 2^31-1, y and z <= 65535)");
  }
  return true;
}

void AotRuntime::enqueue(const LoadedKernel& kernel, LaunchGrid grid, void** params, CUstream stream) const {
  const KernelMetadata& meta = *kernel.meta;
  const CudaDriverApi& api = *api_;
  const CUresult r = api.cuLaunchKernel(kernel.function, grid.x, grid.y, grid.z,
                                        static_cast<unsigned>(meta.block_threads()), 1, 1,
                                        static_cast<unsigned>(meta.shared_mem), stream, params, nullptr);
  if (r != CUDA_SUCCESS) {
    check(api, r, "cuLaunchKernel",
          "launching \"" + meta.entry + "\" (key \"" + meta.key + "\", " + sm(meta.arch) + ") on device " +
              std::to_string(kernel.device) + ", grid (" + std::to_string(grid.x) + ", " + std::to_string(grid.y) +
              ", " + std::to_string(grid.z) + "), block " + std::to_string(meta.block_threads()) + ", shared " +
              std::to_string(meta.shared_mem) + " bytes");
  }
}

void AotRuntime::launch(const LoadedKernel& kernel, LaunchGrid grid, const std::vector<void*>& user_arg_ptrs,
                        CUstream stream) {
  launch(kernel, grid, user_arg_ptrs.data(), user_arg_ptrs.size(), stream);
}

void AotRuntime::launch(const LoadedKernel& kernel, LaunchGrid grid, void* const* user_arg_ptrs, std::size_t count,
                        CUstream stream) {
  if (!check_launch(kernel, grid, user_arg_ptrs, count)) return;
  const KernelMetadata& meta = *kernel.meta;
  const Scratch* scratch = nullptr;
  if (meta.global_scratch_size > 0 || meta.profile_scratch_size > 0) scratch = scratch_for(kernel, grid, stream);
  // kernelParams: the user arguments, then the trailing scratch pointers (each at its buffer's
  // address, or at TRITON_NULL_SCRATCH), on the stack for up to kInlineKernelParams entries.
  const std::size_t n = count + static_cast<std::size_t>(meta.num_trailing_scratch_ptrs);
  void* inline_params[kInlineKernelParams];
  std::vector<void*> heap_params;
  void** params = inline_params;
  if (n > kInlineKernelParams) {
    heap_params.resize(n);
    params = heap_params.data();
  }
  const CUdeviceptr* global = scratch != nullptr && scratch->global != 0 ? &scratch->global : nullptr;
  const CUdeviceptr* profile = scratch != nullptr && scratch->profile != 0 ? &scratch->profile : nullptr;
  pack_triton_abi_args(user_arg_ptrs, count, meta.num_trailing_scratch_ptrs, global, profile, params, n);
  ScopedContext ctx(*api_, kernel.context);
  enqueue(kernel, grid, params, stream);
}

// ---------------------------------------------------------------------------------------------
// KernelLaunch

KernelLaunch::KernelLaunch(AotRuntime& runtime, const LoadedKernel& kernel, LaunchGrid grid,
                           const std::vector<const void*>& user_arg_ptrs)
    : KernelLaunch(runtime, kernel, grid, user_arg_ptrs.data(), user_arg_ptrs.size()) {}

KernelLaunch::KernelLaunch(AotRuntime& runtime, const LoadedKernel& kernel, LaunchGrid grid,
                           const void* const* user_arg_ptrs, std::size_t count)
    : runtime_(&runtime), grid_(grid) {
  // The same checks as AotRuntime::launch, once.
  AotRuntime::check_launch(kernel, grid, const_cast<void* const*>(user_arg_ptrs), count);
  const KernelMetadata& meta = *kernel.meta;
  values_.assign(count, 0);
  for (std::size_t i = 0; i < count; ++i) {
    std::memcpy(&values_[i], user_arg_ptrs[i], meta.arg_types[i].size);
  }
  // kernelParams, packed once: into values_, then the trailing entries at scratch_ (zero until a
  // kernel that needs scratch memory gets its buffers at launch).
  const int trailing = meta.num_trailing_scratch_ptrs;
  scratch_.assign(2, TRITON_NULL_SCRATCH);
  std::vector<void*> value_ptrs(count);
  for (std::size_t i = 0; i < count; ++i) value_ptrs[i] = &values_[i];
  params_.resize(count + static_cast<std::size_t>(trailing));
  pack_triton_abi_args(value_ptrs.data(), count, trailing, trailing >= 1 ? &scratch_[0] : nullptr,
                       trailing >= 2 ? &scratch_[1] : nullptr, params_.data(), params_.size());
  needs_scratch_ = meta.global_scratch_size > 0 || meta.profile_scratch_size > 0;
  kernel_ = &kernel;
}

const LoadedKernel& KernelLaunch::kernel() const {
  if (kernel_ == nullptr) throw Error(Status::kInvalidArgument, "KernelLaunch: no kernel is bound");
  return *kernel_;
}

void KernelLaunch::set_bytes(std::size_t index, const void* value, std::size_t size) {
  const KernelMetadata& meta = *kernel().meta;
  if (index >= values_.size() || meta.arg_types[index].size != size) {
    throw Error(Status::kInvalidArgument,
                "KernelLaunch::set of \"" + meta.key + "\": argument " + std::to_string(index) +
                    (index < values_.size() ? " (\"" + meta.arg_names[index] + "\", " + meta.signature[index] + ") is " +
                                                  std::to_string(meta.arg_types[index].size) + " bytes, got a value of " +
                                                  std::to_string(size)
                                            : " does not exist: the kernel takes " + std::to_string(values_.size())));
  }
  values_[index] = 0;
  std::memcpy(&values_[index], value, size);
}

void KernelLaunch::get_bytes(std::size_t index, void* value, std::size_t size) const {
  const KernelMetadata& meta = *kernel().meta;
  if (index >= values_.size() || meta.arg_types[index].size != size) {
    throw Error(Status::kInvalidArgument, "KernelLaunch::get of \"" + meta.key + "\": argument " +
                                              std::to_string(index) + " does not exist or is not " +
                                              std::to_string(size) + " bytes");
  }
  std::memcpy(value, &values_[index], size);
}

void KernelLaunch::launch(CUstream stream) {
  const LoadedKernel& k = kernel();
  if (grid_.x == 0 || grid_.y == 0 || grid_.z == 0) return;
  if (needs_scratch_) {
    // Scratch buffers per (kernel, grid, stream), from the runtime's cache (a lock and a lookup).
    const AotRuntime::Scratch* s = runtime_->scratch_for(k, grid_, stream);
    scratch_[0] = s->global;
    scratch_[1] = s->profile;
  }
  runtime_->enqueue(k, grid_, params_.data(), stream);
}

}  // namespace luminav
