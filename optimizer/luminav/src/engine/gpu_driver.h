// src/engine/gpu_driver.h: the vendor interface of the engine's GPU device: the driver calls a
// step makes (memory, async memsets and copies, stream sync, capture and graphs where the
// vendor has them) and the kernels of a launch group, for CUDA (cuda_gpu_driver.cpp, over the
// CUDA driver table and AotRuntime) and HIP (hip_gpu_driver.cpp, over the HIP table and
// HipRuntime)
//
// One interface, two vendors, as PyTorch's c10/cuda and c10/hip: gpu_device.cpp is the one GPU
// device (tables, flags, lr, the order of a step's launches) and calls only this. Device
// addresses are CUdeviceptr (a 64-bit integer) for both vendors; streams are the vendor's
// handle as a void* (CUstream, hipStream_t). Every call that fails throws Error(kDriverError)
// naming the vendor's symbol and error ("cuMemAlloc failed: CUDA_ERROR_OUT_OF_MEMORY ...",
// "hipMalloc failed: hipErrorOutOfMemory ...").
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>

#include "engine/engine.h"
#include "engine/group_launch.h"

namespace luminav {
namespace engine_detail {

// The kernels of one launch group, loaded on the device (construction by GpuDriver::load_group
// resolves and verifies every variant the group runs), then bound once to the group's buffers.
// The launches run with the device entered (GpuScope).
class GpuGroupLaunches {
 public:
  virtual ~GpuGroupLaunches() = default;
  // Binds every launch's arguments: the group's buffers (commit advances b.commit_rows rows),
  // `found_inf` (read by pass 2 and commit) and `reduce_flag` (raised by reduce).
  virtual void bind(const gpu::GroupBuffers& b, CUdeviceptr found_inf, CUdeviceptr reduce_flag) = 0;
  virtual bool has_pass1() const = 0;
  // Replace those arguments of the bound launches (a compare where they did not change).
  virtual void set_flags(CUdeviceptr found_inf, CUdeviceptr reduce_flag) = 0;
  virtual void set_seed(std::uint64_t seed) = 0;
  virtual void pass1(void* stream) = 0;
  virtual void reduce(void* stream) = 0;
  virtual void update(void* stream) = 0;  // pass 2, or the single pass
  virtual void commit(void* stream) = 0;
};

class GpuDriver {
 public:
  virtual ~GpuDriver() = default;
  virtual DeviceType type() const = 0;
  // "device 0" (CUDA) or "HIP device 0": how messages name the device.
  virtual std::string device_name() const = 0;

  // Makes the device current on this thread (CUDA: its primary context, pushed only when
  // another is current; HIP: hipSetDevice only when another device is current). Returns what
  // leave() must undo. Use GpuScope.
  virtual bool enter() = 0;
  virtual void leave(bool entered) noexcept = 0;

  // Device memory, not zeroed.
  virtual CUdeviceptr malloc(std::size_t bytes) = 0;
  virtual void free(CUdeviceptr p) noexcept = 0;
  // Async on `stream` (null: the default stream). `what` names the memory in an error.
  virtual void memset8_async(CUdeviceptr p, unsigned char value, std::size_t bytes, void* stream,
                             const char* what) = 0;
  virtual void memset32_async(CUdeviceptr p, std::uint32_t value, std::size_t words, void* stream,
                              const char* what) = 0;
  virtual void copy_async(CUdeviceptr dst, CUdeviceptr src, std::size_t bytes, void* stream) = 0;
  // Synchronous copies (the caller has synchronised what must be).
  virtual void copy_to_device(CUdeviceptr dst, const void* src, std::size_t bytes, const char* what) = 0;
  virtual void copy_to_host(void* dst, CUdeviceptr src, std::size_t bytes) = 0;
  // Waits for all work of the device / of one stream.
  virtual void synchronize(const char* what) = 0;
  virtual void synchronize_quietly() noexcept = 0;
  virtual void stream_synchronize(void* stream, const char* what) = 0;
  // False only when the vendor says the stream is not being captured into a graph.
  virtual bool may_be_capturing(void* stream) = 0;

  // Loads (and verifies) the kernels a group of `cfg` runs. Throws kNotFound (a variant the
  // bundle lacks for this device, with the `luminamoon aot build` line that adds it),
  // kBundleError (a code object the rule book refuses), kDriverError (a module the vendor
  // rejects, a kernel it does not find).
  virtual std::unique_ptr<GpuGroupLaunches> load_group(const GroupConfig& cfg) = 0;

  // Graph replay of a step. graphs_available(): the vendor's table has every call below (CUDA
  // with the capture and graph entries; HIP: never, its steps are eager).
  virtual bool graphs_available() const { return false; }
  // Starts capturing on a private stream (made once, owned by the driver) and returns it; null
  // where the vendor refuses.
  virtual void* begin_capture() { return nullptr; }
  // Ends the capture begun on `stream`; when `keep`, instantiates it. Returns the executable
  // graph, or null where any part was refused (or !keep).
  virtual void* end_capture(void* stream, bool keep) {
    (void)stream;
    (void)keep;
    return nullptr;
  }
  virtual void graph_launch(void* exec, void* stream);
  virtual void graph_destroy(void* exec) noexcept { (void)exec; }
};

// GpuDriver::enter for a scope.
class GpuScope {
 public:
  explicit GpuScope(GpuDriver& d) : d_(d), entered_(d.enter()) {}
  ~GpuScope() { d_.leave(entered_); }
  GpuScope(const GpuScope&) = delete;
  GpuScope& operator=(const GpuScope&) = delete;

 private:
  GpuDriver& d_;
  bool entered_;
};

// CUDA device `device_index` with the bundle's cubins. Throws kDriverError (no CUDA driver),
// kNotFound (no such device), kBundleError / kNotFound (bundle).
std::unique_ptr<GpuDriver> make_cuda_gpu_driver(int device_index, const std::string& bundle_dir);
// HIP device `device_index` of arch `arch` ("gfx942", or ROCm's gcnArchName
// "gfx942:sramecc+:xnack-") with the bundle's code objects. Throws kDriverError (no HIP
// runtime), kNotFound (no such device), kInvalidArgument (no arch), kBundleError (bundle).
std::unique_ptr<GpuDriver> make_hip_gpu_driver(int device_index, const std::string& bundle_dir,
                                               const std::string& arch);

}  // namespace engine_detail
}  // namespace luminav
