// src/aot/runtime.h: loads a bundle's kernels once per device and launches them (AotRuntime),
// or launches one with its arguments bound once (KernelLaunch)
//
// Every launch goes through the CUDA driver table (luminav/cuda_driver.h) and packs its
// kernelParams with the Triton ABI packer (aot/triton_abi.h).
#pragma once

#include <cstddef>
#include <cstdint>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include "aot/manifest.h"
#include "luminav/cuda_driver.h"

namespace luminav {

// A grid of programs (Triton's grid; the block is num_warps·warp_size threads).
struct LaunchGrid {
  unsigned x = 1, y = 1, z = 1;
};

// A variant loaded on one device. Owned by its AotRuntime; valid until the runtime goes.
struct LoadedKernel {
  const KernelMetadata* meta = nullptr;
  int device = -1;  // ordinal
  CUcontext context = nullptr;  // the device's primary context
  CUmodule module = nullptr;
  CUfunction function = nullptr;
  int device_cc_major = 0, device_cc_minor = 0;  // the device's compute capability
  int num_regs = -1;              // registers per thread as the driver reports, -1 unknown
  int params_checked = -1;        // parameter count the driver reported, -1 when it cannot say
};

// Compute capability and name-free facts of one device.
struct DeviceInfo {
  int ordinal = -1;
  int cc_major = 0, cc_minor = 0;
  int multiprocessors = 0;
  int shared_optin = 0;  // max dynamic shared memory per block after opt-in, bytes
};

// Makes a context current for a scope when it is not already (one cuCtxGetCurrent; a push only
// when another context, or none, is current), and restores the caller's at scope end.
// Throws Error(kDriverError) when the query or the push fails.
class ScopedContext {
 public:
  ScopedContext(const CudaDriverApi& api, CUcontext ctx);
  ~ScopedContext();
  ScopedContext(const ScopedContext&) = delete;
  ScopedContext& operator=(const ScopedContext&) = delete;
  // True when the constructor pushed `ctx` (it was not current).
  bool pushed() const { return pushed_; }

 private:
  const CudaDriverApi& api_;
  bool pushed_ = false;
};

class KernelLaunch;

// The module cache and launcher the engine's GPU path uses. Thread-safe.
//   AotRuntime rt(AotManifest::load(dir));
//   const LoadedKernel& k = rt.get("pass2.p1g1s0.sr1.b2.c1.f1.B1024.w4", device);
//   rt.launch(k, {nblocks, 1, 1}, {&table, &block_map, ...}, stream);
// Modules are loaded lazily per (variant, device) into the device's primary context (retained
// once, released at destruction), which is pushed around loads and launches when it is not
// already current; the caller's current context is restored. A cubin is read and verified
// (KernelMetadata::image) when its kernel is first loaded, before the driver sees it. Driver
// calls go through cuda_driver() as it is when the runtime is constructed. A hot path that
// launches the same kernels with the same arguments every step binds them once (KernelLaunch).
class AotRuntime {
 public:
  explicit AotRuntime(AotManifest manifest);
  explicit AotRuntime(std::shared_ptr<const AotManifest> manifest);
  ~AotRuntime();
  AotRuntime(const AotRuntime&) = delete;
  AotRuntime& operator=(const AotRuntime&) = delete;

  const AotManifest& manifest() const { return *manifest_; }
  const CudaDriverApi& driver() const { return *api_; }

  // Compute capability etc. of a device (cached). Throws kNotFound for an ordinal that does not
  // exist, naming the device count.
  DeviceInfo device_info(int device_ordinal);

  // The variant of `key` that device `device_ordinal` can run (AotManifest::require with the
  // device's compute capability), loaded. Takes a lock and a map lookup: callers on a hot path
  // keep the returned reference (valid for the runtime's lifetime). Throws kNotFound (no variant for this device), or
  // kBundleError / kDriverError from load().
  const LoadedKernel& get(const std::string& key, int device_ordinal);

  // Loads one entry of manifest() on a device (cached). Refuses, before any launch: a cubin that
  // fails its check (KernelMetadata::image: unreadable, truncated, not matching sha256), a
  // cubin the device cannot run (kBundleError naming both archs), num_ctas != 1, a module the
  // driver rejects, a missing entry symbol, a parameter count or size (cuFuncGetParamInfo,
  // where the driver has it) that disagrees with the manifest, more threads or shared memory
  // than the function/device allows.
  const LoadedKernel& load(const KernelMetadata& meta, int device_ordinal);

  // Launches on `stream` (a stream of the device's primary context, or null for its default
  // stream): grid as given, block num_warps·warp_size threads, shared_mem bytes of dynamic
  // shared memory, kernelParams as pack_triton_abi_args lays them out. `user_arg_ptrs` holds
  // one pointer per signature entry, each at a value of that type's size (8-byte CUdeviceptr
  // for pointers). Scratch buffers, when a kernel needs them, are allocated on the first launch
  // of a (kernel, grid, stream) and reused afterwards (warm up before graph capture). A grid
  // with a zero dimension launches nothing. Throws kInvalidArgument for a wrong argument count,
  // a null argument pointer or a grid beyond the driver's limits; kDriverError when the launch
  // fails. Allocates nothing on the host for kernels of up to kInlineKernelParams parameters.
  void launch(const LoadedKernel& kernel, LaunchGrid grid, const std::vector<void*>& user_arg_ptrs,
              CUstream stream);
  // The same with `count` argument pointers at `user_arg_ptrs`.
  void launch(const LoadedKernel& kernel, LaunchGrid grid, void* const* user_arg_ptrs, std::size_t count,
              CUstream stream);

  // Every (variant, device) loaded so far.
  std::size_t loaded_count() const;

  // kernelParams entries (user arguments + trailing scratch pointers) launch() packs on the
  // stack; a kernel with more takes one host allocation per launch.
  static constexpr std::size_t kInlineKernelParams = 32;

 private:
  friend class KernelLaunch;
  struct DeviceState;
  struct ScratchKey {
    const LoadedKernel* kernel;
    unsigned x, y, z;
    CUstream stream;
    bool operator<(const ScratchKey& o) const;
  };
  struct Scratch {
    CUdeviceptr global_base = 0, profile_base = 0;   // as allocated
    CUdeviceptr global = 0, profile = 0;             // aligned addresses passed to the kernel
  };
  DeviceState& device_state_locked(int device_ordinal);
  const LoadedKernel& load_locked(const KernelMetadata& meta, DeviceState& ds);
  const Scratch* scratch_for(const LoadedKernel& kernel, LaunchGrid grid, CUstream stream);
  // The checks launch() makes before packing; returns false for an empty grid.
  static bool check_launch(const LoadedKernel& kernel, LaunchGrid grid, void* const* user_arg_ptrs,
                           std::size_t count);
  // cuLaunchKernel with the kernel's block and shared memory; throws kDriverError naming the
  // kernel and the grid when it fails.
  void enqueue(const LoadedKernel& kernel, LaunchGrid grid, void** params, CUstream stream) const;

  std::shared_ptr<const AotManifest> manifest_;
  const CudaDriverApi* api_;
  mutable std::mutex mutex_;
  std::map<int, std::unique_ptr<DeviceState>> devices_;
  std::map<std::pair<const KernelMetadata*, int>, std::unique_ptr<LoadedKernel>> loaded_;
  std::map<std::pair<std::string, int>, const LoadedKernel*> by_key_;
  std::map<ScratchKey, std::unique_ptr<Scratch>> scratch_;
  int device_count_ = -1;
};

// One launch of a loaded kernel with its grid and arguments bound once: the argument values are
// copied into storage the object owns and kernelParams is packed once, so launch() makes one
// driver call (cuLaunchKernel) and takes no lock, looks nothing up and allocates nothing
// (except for a kernel that needs scratch memory, whose buffers come from the runtime as for
// AotRuntime::launch). For a hot path that launches the same kernels step after step:
//   KernelLaunch commit(rt, rt.get(key, device), {1, 1, 1}, {&table, &found_inf, &ntensors});
//   { ScopedContext ctx(rt.driver(), commit.kernel().context); commit.launch(stream); }
// Movable, not copyable; the runtime must outlive it.
class KernelLaunch {
 public:
  KernelLaunch() = default;
  // `user_arg_ptrs` as for AotRuntime::launch; each value (the size its signature type has) is
  // copied. Throws as AotRuntime::launch's checks do.
  KernelLaunch(AotRuntime& runtime, const LoadedKernel& kernel, LaunchGrid grid,
               const std::vector<const void*>& user_arg_ptrs);
  KernelLaunch(AotRuntime& runtime, const LoadedKernel& kernel, LaunchGrid grid, const void* const* user_arg_ptrs,
               std::size_t count);

  bool bound() const { return kernel_ != nullptr; }
  const LoadedKernel& kernel() const;
  LaunchGrid grid() const { return grid_; }

  // Replaces the value of user argument `index`. Throws Error(kInvalidArgument) for an index
  // past the signature or a value of another size than the argument's type.
  template <typename T>
  void set(std::size_t index, const T& value) {
    set_bytes(index, &value, sizeof(T));
  }
  // The current value of user argument `index`, as bound or set (sizeof(T) must match).
  template <typename T>
  T get(std::size_t index) const {
    T value;
    get_bytes(index, &value, sizeof(T));
    return value;
  }

  // Enqueues the launch on `stream`. The kernel's context (kernel().context) must be current on
  // the calling thread (a ScopedContext around a batch of launches); launch() does not check.
  // A grid with a zero dimension launches nothing. Throws kDriverError when the launch fails,
  // kInvalidArgument when nothing is bound.
  void launch(CUstream stream);

 private:
  void set_bytes(std::size_t index, const void* value, std::size_t size);
  void get_bytes(std::size_t index, void* value, std::size_t size) const;

  AotRuntime* runtime_ = nullptr;
  const LoadedKernel* kernel_ = nullptr;
  LaunchGrid grid_;
  bool needs_scratch_ = false;
  std::vector<std::uint64_t> values_;  // one 8-byte slot per user argument
  std::vector<void*> params_;          // kernelParams: into values_, then the trailing scratch slots
  std::vector<CUdeviceptr> scratch_;   // the trailing scratch pointers' values (global, profile)
};

}  // namespace luminav
