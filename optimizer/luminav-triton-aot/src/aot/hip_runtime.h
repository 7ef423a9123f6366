// src/aot/hip_runtime.h: loads a bundle's HIP kernels once per device and launches them; the AMD
// twin of aot/runtime.h (AotRuntime), over the HIP table (aot/hip_driver.h)
//
// The same launch path as the CUDA runtime: the variant found by key and device arch, its code
// object read and verified by the rule book before HIP sees it (KernelMetadata::image), the
// kernel parameters packed by pack_triton_abi_args (the user arguments' addresses, then the
// trailing scratch pointers), and one hipModuleLaunchKernel(f, grid, 64·num_warps, 1, 1,
// shared_mem, stream, params, nullptr) per launch.
#pragma once

#include <cstddef>
#include <cstdint>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <tuple>
#include <vector>

#include "aot/hip_driver.h"
#include "aot/manifest.h"
#include "aot/runtime.h"  // LaunchGrid

namespace luminav {

// A HIP variant loaded on one device. Owned by its HipRuntime; valid until the runtime goes.
struct HipLoadedKernel {
  const KernelMetadata* meta = nullptr;
  int device = -1;
  hipModule_t module = nullptr;
  hipFunction_t function = nullptr;
};

// "gfx942" from a device arch as ROCm names it ("gfx942:sramecc+:xnack-", torch's gcnArchName).
std::string hip_base_arch(const std::string& gcn_arch_name);

// Makes `device` current for a scope when it is not (hipGetDevice, then hipSetDevice), and
// restores the caller's at scope end.
class ScopedHipDevice {
 public:
  ScopedHipDevice(const HipApi& api, int device);
  ~ScopedHipDevice();
  ScopedHipDevice(const ScopedHipDevice&) = delete;
  ScopedHipDevice& operator=(const ScopedHipDevice&) = delete;

 private:
  const HipApi& api_;
  int previous_ = -1;
};

// The module cache and launcher of HIP devices. Thread-safe. Every device it serves has the arch
// `device_arch` ("gfx942", or ROCm's full name with features); HIP calls go through hip_driver()
// as it is when the runtime is constructed.
class HipRuntime {
 public:
  HipRuntime(std::shared_ptr<const AotManifest> manifest, const std::string& device_arch);
  ~HipRuntime();
  HipRuntime(const HipRuntime&) = delete;
  HipRuntime& operator=(const HipRuntime&) = delete;

  const AotManifest& manifest() const { return *manifest_; }
  const HipApi& driver() const { return *api_; }
  const std::string& arch() const { return arch_; }

  // The variant of `key` for this runtime's arch (AotManifest::require_hip), loaded on `device`.
  // Throws kNotFound (no variant for the arch), kBundleError (a code object the rule book
  // refuses) or kDriverError (a module HIP rejects, a kernel it does not find).
  const HipLoadedKernel& get(const std::string& key, int device);
  // Loads one HIP entry of manifest() on a device (cached). A failure loads nothing: the module
  // of a kernel HIP does not find is unloaded again.
  const HipLoadedKernel& load(const KernelMetadata& meta, int device);

  // Launches on `stream` (null: the device's default stream): grid as given, block
  // 64·num_warps threads, shared_mem bytes of dynamic LDS, the parameters as
  // pack_triton_abi_args lays them out (scratch buffers, when the kernel needs them, allocated on
  // the first launch of a (kernel, grid, stream) and reused). A grid with a zero dimension
  // launches nothing. Throws kInvalidArgument for a wrong argument count or a null pointer,
  // kDriverError (naming the kernel, grid and block) when the launch fails.
  void launch(const HipLoadedKernel& kernel, LaunchGrid grid, void* const* user_arg_ptrs, std::size_t count,
              hipStream_t stream);
  void launch(const HipLoadedKernel& kernel, LaunchGrid grid, const std::vector<void*>& user_arg_ptrs,
              hipStream_t stream) {
    launch(kernel, grid, user_arg_ptrs.data(), user_arg_ptrs.size(), stream);
  }

  std::size_t loaded_count() const;

 private:
  struct Scratch {
    void* global_base = nullptr;
    void* profile_base = nullptr;
    CUdeviceptr global = 0, profile = 0;  // aligned addresses passed to the kernel
  };
  const Scratch* scratch_for(const HipLoadedKernel& kernel, LaunchGrid grid, hipStream_t stream);

  std::shared_ptr<const AotManifest> manifest_;
  const HipApi* api_;
  std::string arch_;
  mutable std::mutex mutex_;
  std::map<std::pair<const KernelMetadata*, int>, std::unique_ptr<HipLoadedKernel>> loaded_;
  std::map<std::tuple<const HipLoadedKernel*, unsigned, unsigned, unsigned, hipStream_t>, std::unique_ptr<Scratch>>
      scratch_;
};

}  // namespace luminav
