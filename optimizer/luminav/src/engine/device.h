// src/engine/device.h: the engine's device interface: where its memory lives and how a step runs
// there (the role of ggml's ggml_backend_i)
//
// CpuDevice (cpu_device.cpp) runs the passes of cpu_kernels.cpp on a thread pool; GpuDevice
// (gpu_device.cpp) launches the AOT bundle's kernels with device tables laid out as
// docs/internals.md says, on CUDA or HIP through one vendor interface (gpu_driver.h).
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "engine/engine.h"

namespace luminav {
namespace engine_detail {

// One launch group of a step: tensors of one param group sharing param and grad dtypes.
struct LaunchGroup {
  std::size_t user_group = 0;
  GroupConfig cfg;
  float lr = 0.0f;                 // float32(lr) of this step
  std::vector<TensorRow> rows;     // addresses on the engine's device
  // Device-private cache (tables, stats buffers); dropped whenever `rows` are rebuilt.
  std::shared_ptr<void> cache;
};

class Device {
 public:
  virtual ~Device() = default;
  virtual DeviceType type() const = 0;
  virtual int num_threads() const { return 0; }
  // Zero-filled storage of `bytes` (> 0) on the device.
  virtual void* alloc(std::size_t bytes) = 0;
  virtual void release(void* p) noexcept = 0;
  // Synchronous copies between the host and the device (device to device for `copy`,
  // ordered on `stream`).
  virtual void to_host(void* dst, const void* src, std::size_t bytes) = 0;
  virtual void from_host(void* dst, const void* src, std::size_t bytes) = 0;
  virtual void copy(void* dst, const void* src, std::size_t bytes, void* stream) = 0;
  // Builds what a step of these groups needs on the device (tables, loaded and verified
  // kernels), so that a bad bundle or a failed allocation is refused before the step enqueues
  // anything. Called by Engine::step first; step() and check_nonfinite() build whatever is
  // still missing themselves.
  virtual void prepare(std::vector<LaunchGroup>& groups) { (void)groups; }
  // Throws Error(kNonFinite) naming the first parameter of a nonfinite='raise' group whose
  // gradient has a non-finite element; writes nothing the step reads (may synchronise).
  virtual void check_nonfinite(std::vector<LaunchGroup>& groups, void* stream) = 0;
  // One step over all groups: pass 1, pass 2, commit, skipped count.
  virtual void step(std::vector<LaunchGroup>& groups, void* stream) = 0;
  // The skipped-step counter (may synchronise).
  virtual std::int64_t skipped() = 0;
  virtual void set_skipped(std::int64_t value) = 0;
};

std::unique_ptr<Device> make_cpu_device(int num_threads);
// Throws kDriverError (no driver), kBundleError / kNotFound (bundle), kInvalidArgument (also
// for a LUMINAV_CUDA_GRAPH other than 0 or 1). `cuda_graph`: replay steps as CUDA graphs where
// the driver and LUMINAV_CUDA_GRAPH allow it.
std::unique_ptr<Device> make_cuda_device(int device_index, const std::string& bundle_dir, bool cuda_graph = true);
// The same GPU device on HIP device `device_index` of arch `arch` (gpu_driver.h); its steps are
// always eager. Throws kDriverError (no HIP runtime), kNotFound (device, variant),
// kBundleError, kInvalidArgument (no arch).
std::unique_ptr<Device> make_hip_device(int device_index, const std::string& bundle_dir, const std::string& arch);

// The message of a refused 'raise' step.
std::string nonfinite_message(const LaunchGroup& group, std::size_t row);

}  // namespace engine_detail
}  // namespace luminav
