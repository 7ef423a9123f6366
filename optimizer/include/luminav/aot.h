// luminav: Triton kernels compiled ahead of time — the bundle manifest, and the runtime that
// loads the cubins per device and launches them through the CUDA driver (cuda_driver.h).
//
// A bundle is a folder: manifest.json + one .cubin per compiled kernel variant and arch (the
// format is described in docs/triton-abi.md; the Python builder luminamoon.aot writes it).
#pragma once

#include <cstddef>
#include <cstdint>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include "luminav/cuda_driver.h"

namespace luminav {

constexpr const char* kAotBundleFormat = "luminamoon-aot-bundle";
constexpr int kAotBundleFormatVersion = 1;  // the newest format_version this loader reads

// SHA-256 (OpenSSL EVP) as 64 lowercase hex digits.
std::string sha256_hex(const void* data, std::size_t size);

// One argument type of a kernel signature, parsed from a Triton type word ("*fp32", "i64"...).
struct ArgType {
  std::string word;       // as written in the manifest
  bool pointer = false;   // "*<word>" or "*k<word>": passed as an 8-byte CUdeviceptr
  std::string element;    // the word without "*"/"*k"
  std::size_t size = 0;   // bytes of the value cuLaunchKernel reads for it

  // Throws Error(kBundleError) naming the word for one Triton does not pass as a plain value
  // (tensor descriptors, unknown words).
  static ArgType parse(const std::string& word);
};

// One compiled kernel variant for one arch: an entry of manifest.json plus its verified cubin.
struct KernelMetadata {
  std::string key;     // variant key, arch-independent (docs/internals.md)
  std::string kernel;  // pass1 | reduce | pass2 | single_pass | commit
  std::string name;    // the Triton function's name
  std::string entry;   // the .entry symbol in the cubin
  std::string cubin;   // file name relative to the bundle folder
  std::string sha256;  // of the cubin, 64 lowercase hex digits
  std::string backend = "cuda";
  int arch = 0;        // e.g. 90 for sm_90, 100 for sm_100
  int warp_size = 32;
  std::string triton_version;
  int num_warps = 0;
  int num_ctas = 1;
  int num_stages = 0;
  std::int64_t shared_mem = 0;  // bytes of dynamic shared memory
  std::vector<std::string> arg_names;
  std::vector<std::string> signature;
  std::vector<ArgType> arg_types;  // parsed from signature, same order
  std::map<std::string, std::int64_t> constexprs;  // ints and bools (as 0/1)
  int num_params = 0;  // .param entries of the .entry = signature.size() + trailing
  int num_trailing_scratch_ptrs = 0;
  std::int64_t global_scratch_size = 0;
  std::int64_t global_scratch_align = 1;
  std::int64_t profile_scratch_size = 0;
  std::int64_t profile_scratch_align = 1;

  std::string cubin_path;             // absolute or as given: bundle dir / cubin
  std::vector<unsigned char> image;   // the cubin's bytes, checked against sha256 at load

  int arch_major() const { return arch / 10; }
  int arch_minor() const { return arch % 10; }
  // True when a device of compute capability major.minor can run this cubin: same major, and
  // a minor at least the cubin's.
  bool runs_on(int device_major, int device_minor) const {
    return device_major == arch_major() && device_minor >= arch_minor();
  }
  int block_threads() const { return num_warps * warp_size; }
  // Bytes of global (or profile) scratch a launch of this grid needs: grid_x·grid_y·grid_z·
  // num_ctas·size; 0 when the size is 0. Throws Error(kInvalidArgument) on overflow.
  std::size_t global_scratch_bytes(unsigned grid_x, unsigned grid_y, unsigned grid_z) const;
  std::size_t profile_scratch_bytes(unsigned grid_x, unsigned grid_y, unsigned grid_z) const;
};

// A bundle's manifest with every cubin read and verified. Loading refuses, with
// Error(kBundleError) naming file, field, expected and found: a missing/unknown format, a
// format_version newer than kAotBundleFormatVersion (or missing), a missing or mistyped field,
// an unknown type word, negative sizes, a bad alignment, num_params != len(signature) +
// num_trailing_scratch_ptrs, a trailing count outside 0..2, a scratch size without its trailing
// pointer, a duplicate (key, arch), a cubin file missing, empty, truncated, or not matching sha256.
class AotManifest {
 public:
  AotManifest() = default;
  // Reads <dir>/manifest.json and every cubin it names.
  static AotManifest load(const std::string& dir);
  // Parses manifest text; cubin files are read relative to `dir`. `manifest_path` only names
  // the file in messages.
  static AotManifest parse(const std::string& json_text, const std::string& dir, const std::string& manifest_path);

  const std::string& dir() const { return dir_; }
  const std::string& manifest_path() const { return manifest_path_; }
  int format_version() const { return format_version_; }
  const std::string& created_by() const { return created_by_; }
  const std::string& triton_version() const { return triton_version_; }
  const std::vector<KernelMetadata>& kernels() const { return kernels_; }
  bool empty() const { return kernels_.empty(); }

  // The variant of `key` for a device of compute capability arch_major.arch_minor: the entry of
  // the same major with the highest minor <= arch_minor. Null when none.
  const KernelMetadata* find(const std::string& key, int arch_major, int arch_minor) const noexcept;
  // As find, but throws Error(kNotFound) listing the archs the bundle has for the key (or that
  // it has no such key) and the fix: `luminamoon aot build --arch <major><minor>`.
  const KernelMetadata& require(const std::string& key, int arch_major, int arch_minor) const;
  // The archs (e.g. 80, 90) the bundle has for `key`, ascending.
  std::vector<int> archs_for(const std::string& key) const;
  // Every distinct variant key, sorted.
  std::vector<std::string> keys() const;

 private:
  std::string dir_;
  std::string manifest_path_;
  int format_version_ = 0;
  std::string created_by_;
  std::string triton_version_;
  std::vector<KernelMetadata> kernels_;
};

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

// The module cache and launcher the engine's GPU path uses. Thread-safe.
//   AotRuntime rt(AotManifest::load(dir));
//   const LoadedKernel& k = rt.get("pass2.p1g1s0.sr1.b2.c1.f1.B2048.w8", device);
//   rt.launch(k, {nblocks, 1, 1}, {&table, &block_map, ...}, stream);
// Modules are loaded lazily per (variant, device) into the device's primary context (retained
// once, released at destruction), which is pushed around loads and launches when it is not
// already current; the caller's current context is restored. Driver calls go through
// cuda_driver() as it is when the runtime is constructed.
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

  // Loads one entry of manifest() on a device (cached). Refuses, before any launch: a cubin the
  // device cannot run (kBundleError naming both archs), num_ctas != 1, a module the driver
  // rejects, a missing entry symbol, a parameter count or size (cuFuncGetParamInfo, where the
  // driver has it) that disagrees with the manifest, more threads or shared memory than the
  // function/device allows.
  const LoadedKernel& load(const KernelMetadata& meta, int device_ordinal);

  // Launches on `stream` (a stream of the device's primary context, or null for its default
  // stream): grid as given, block num_warps·warp_size threads, shared_mem bytes of dynamic
  // shared memory, kernelParams from pack_triton_abi_args. `user_arg_ptrs` holds one pointer per
  // signature entry, each at a value of that type's size (8-byte CUdeviceptr for pointers).
  // Scratch buffers, when a kernel needs them, are allocated on the first launch of a
  // (kernel, grid, stream) and reused afterwards (warm up before graph capture). A grid with a
  // zero dimension launches nothing. Throws kInvalidArgument for a wrong argument count, a null
  // argument pointer or a grid beyond the driver's limits; kDriverError when the launch fails.
  void launch(const LoadedKernel& kernel, LaunchGrid grid, const std::vector<void*>& user_arg_ptrs,
              CUstream stream);

  // Every (variant, device) loaded so far.
  std::size_t loaded_count() const;

 private:
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

  std::shared_ptr<const AotManifest> manifest_;
  const CudaDriverApi* api_;
  mutable std::mutex mutex_;
  std::map<int, std::unique_ptr<DeviceState>> devices_;
  std::map<std::pair<const KernelMetadata*, int>, std::unique_ptr<LoadedKernel>> loaded_;
  std::map<std::pair<std::string, int>, const LoadedKernel*> by_key_;
  std::map<ScratchKey, std::unique_ptr<Scratch>> scratch_;
  int device_count_ = -1;
};

}  // namespace luminav
