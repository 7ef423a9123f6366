// src/aot/hip_runtime.cpp: the HIP module cache and launcher (hip_runtime.h)
#include "aot/hip_runtime.h"

#include <tuple>

#include "aot/bundle_rules.h"
#include "aot/triton_abi.h"
#include "luminav/error.h"

namespace luminav {

namespace {

std::string grid_text(LaunchGrid g) {
  return "(" + std::to_string(g.x) + ", " + std::to_string(g.y) + ", " + std::to_string(g.z) + ")";
}

std::string kernel_text(const KernelMetadata& m) {
  return "kernel \"" + printable(m.entry) + "\" (key \"" + printable(m.key) + "\", " + m.gfx + ", " +
         printable(m.cubin_path, 4096) + ")";
}

CUdeviceptr to_dptr(void* p) { return static_cast<CUdeviceptr>(reinterpret_cast<std::uintptr_t>(p)); }

}  // namespace

std::string hip_base_arch(const std::string& gcn_arch_name) { return gcn_arch_name.substr(0, gcn_arch_name.find(':')); }

ScopedHipDevice::ScopedHipDevice(const HipApi& api, int device) : api_(api) {
  int current = -1;
  check_hip(api, api.hipGetDevice(&current), "hipGetDevice");
  if (current != device) {
    check_hip(api, api.hipSetDevice(device), "hipSetDevice", "making HIP device " + std::to_string(device) + " current");
    previous_ = current;
  }
}

ScopedHipDevice::~ScopedHipDevice() {
  if (previous_ >= 0) (void)api_.hipSetDevice(previous_);
}

HipRuntime::HipRuntime(std::shared_ptr<const AotManifest> manifest, const std::string& device_arch)
    : manifest_(std::move(manifest)), api_(&hip_driver()), arch_(hip_base_arch(device_arch)) {
  if (!manifest_) throw Error(Status::kInvalidArgument, "HipRuntime: no manifest");
}

HipRuntime::~HipRuntime() {
  for (auto& s : scratch_) {
    if (s.second->global_base) (void)api_->hipFree(s.second->global_base);
    if (s.second->profile_base) (void)api_->hipFree(s.second->profile_base);
  }
  for (auto& k : loaded_) (void)api_->hipModuleUnload(k.second->module);
}

const HipLoadedKernel& HipRuntime::get(const std::string& key, int device) {
  return load(manifest_->require_hip(key, arch_), device);
}

const HipLoadedKernel& HipRuntime::load(const KernelMetadata& meta, int device) {
  std::lock_guard<std::mutex> lock(mutex_);
  auto it = loaded_.find({&meta, device});
  if (it != loaded_.end()) return *it->second;
  if (!meta.hip()) {
    throw Error(Status::kInvalidArgument, kernel_text(meta) + " is a " + meta.backend + " entry, not a HIP one");
  }
  if (meta.gfx != arch_) {
    throw BundleError(BundleRule::kDevice, meta.cubin_path, "kernels[" + std::to_string(meta.index) + "].target.arch",
                      arch_, meta.gfx,
                      kernel_text(meta) + " was compiled for " + meta.gfx + ", the device is " + arch_ +
                          "; fix: luminamoon aot build --arch " + arch_);
  }
  if (meta.num_ctas != 1) {
    throw BundleError(BundleRule::kDevice, meta.cubin_path, "kernels[" + std::to_string(meta.index) + "].num_ctas",
                      "1", std::to_string(meta.num_ctas), kernel_text(meta) + ": num_ctas must be 1 on HIP");
  }
  const std::vector<unsigned char>& image = meta.image();  // the rule book, before HIP sees it
  ScopedHipDevice on(*api_, device);
  auto k = std::make_unique<HipLoadedKernel>();
  k->meta = &meta;
  k->device = device;
  check_hip(*api_, api_->hipModuleLoadData(&k->module, image.data()), "hipModuleLoadData",
            "loading " + kernel_text(meta) + " on HIP device " + std::to_string(device));
  const hipError_t r = api_->hipModuleGetFunction(&k->function, k->module, meta.entry.c_str());
  if (r != hipSuccess) {
    (void)api_->hipModuleUnload(k->module);
    check_hip(*api_, r, "hipModuleGetFunction", "finding " + kernel_text(meta));
  }
  int max_threads = 0;
  if (api_->hipDeviceGetAttribute(&max_threads, hipDeviceAttributeMaxThreadsPerBlock, device) == hipSuccess &&
      max_threads > 0 && meta.block_threads() > max_threads) {
    (void)api_->hipModuleUnload(k->module);
    throw BundleError(BundleRule::kDevice, meta.cubin_path, "kernels[" + std::to_string(meta.index) + "].num_warps",
                      "at most " + std::to_string(max_threads) + " threads", std::to_string(meta.block_threads()),
                      kernel_text(meta) + ": a block of " + std::to_string(meta.block_threads()) +
                          " threads, the device allows " + std::to_string(max_threads));
  }
  const HipLoadedKernel& out = *k;
  loaded_.emplace(std::make_pair(&meta, device), std::move(k));
  return out;
}

std::size_t HipRuntime::loaded_count() const {
  std::lock_guard<std::mutex> lock(mutex_);
  return loaded_.size();
}

const HipRuntime::Scratch* HipRuntime::scratch_for(const HipLoadedKernel& kernel, LaunchGrid grid, hipStream_t stream) {
  const KernelMetadata& m = *kernel.meta;
  if (m.global_scratch_size <= 0 && m.profile_scratch_size <= 0) return nullptr;
  std::lock_guard<std::mutex> lock(mutex_);
  auto key = std::make_tuple(&kernel, grid.x, grid.y, grid.z, stream);
  auto it = scratch_.find(key);
  if (it != scratch_.end()) return it->second.get();
  auto s = std::make_unique<Scratch>();
  ScopedHipDevice on(*api_, kernel.device);
  auto alloc = [&](std::size_t bytes, std::int64_t align, void** base, CUdeviceptr* aligned, const char* what) {
    if (bytes == 0) return;
    check_hip(*api_, api_->hipMalloc(base, bytes + static_cast<std::size_t>(align)), "hipMalloc",
              std::string(what) + " of " + kernel_text(m));
    const CUdeviceptr a = static_cast<CUdeviceptr>(align);
    *aligned = (to_dptr(*base) + a - 1) / a * a;
  };
  try {
    alloc(m.global_scratch_bytes(grid.x, grid.y, grid.z), m.global_scratch_align, &s->global_base, &s->global,
          "global scratch");
    alloc(m.profile_scratch_bytes(grid.x, grid.y, grid.z), m.profile_scratch_align, &s->profile_base, &s->profile,
          "profile scratch");
  } catch (...) {
    if (s->global_base) (void)api_->hipFree(s->global_base);
    throw;
  }
  const Scratch* out = s.get();
  scratch_.emplace(key, std::move(s));
  return out;
}

void HipRuntime::launch(const HipLoadedKernel& kernel, LaunchGrid grid, void* const* user_arg_ptrs, std::size_t count,
                        hipStream_t stream) {
  const KernelMetadata& m = *kernel.meta;
  if (count != m.arg_types.size()) {
    throw Error(Status::kInvalidArgument, kernel_text(m) + " takes " + std::to_string(m.arg_types.size()) +
                                              " arguments (its signature), got " + std::to_string(count));
  }
  check_user_arg_ptrs(user_arg_ptrs, count);
  if (grid.x == 0 || grid.y == 0 || grid.z == 0) return;
  const Scratch* s = scratch_for(kernel, grid, stream);
  void* params[AotRuntime::kInlineKernelParams + 2];
  std::vector<void*> heap;
  void** out = params;
  std::size_t capacity = sizeof params / sizeof params[0];
  if (count + 2 > capacity) {
    heap.resize(count + 2);
    out = heap.data();
    capacity = heap.size();
  }
  (void)pack_triton_abi_args(user_arg_ptrs, count, m.num_trailing_scratch_ptrs,
                             s && s->global_base ? &s->global : nullptr, s && s->profile_base ? &s->profile : nullptr,
                             out, capacity);
  const unsigned block = static_cast<unsigned>(m.block_threads());
  const hipError_t r = api_->hipModuleLaunchKernel(kernel.function, grid.x, grid.y, grid.z, block, 1, 1,
                                                   static_cast<unsigned>(m.shared_mem), stream, out, nullptr);
  check_hip(*api_, r, "hipModuleLaunchKernel",
            "launching " + kernel_text(m) + " with grid " + grid_text(grid) + ", block (" + std::to_string(block) +
                ", 1, 1), " + std::to_string(m.shared_mem) + " bytes of shared memory");
}

}  // namespace luminav
