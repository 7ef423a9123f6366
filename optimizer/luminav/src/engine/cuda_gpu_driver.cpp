// src/engine/cuda_gpu_driver.cpp: the GPU device's CUDA driver (engine/gpu_driver.h): the CUDA
// driver table (luminav/cuda_driver.h) in the device's primary context, and the bundle's cubins
// through AotRuntime with their arguments bound once (gpu::BoundGroupLaunches)
#include <memory>
#include <string>

#include "aot/runtime.h"
#include "engine/gpu_driver.h"
#include "engine/group_launch.h"
#include "luminav/cuda_driver.h"

namespace luminav {
namespace engine_detail {

namespace {

CUstream cu(void* stream) { return static_cast<CUstream>(stream); }

class CudaGroupLaunches final : public GpuGroupLaunches {
 public:
  CudaGroupLaunches(std::shared_ptr<AotRuntime> rt, int device, const GroupConfig& cfg)
      : kernels_(std::move(rt), device, cfg) {}
  void bind(const gpu::GroupBuffers& b, CUdeviceptr found_inf, CUdeviceptr reduce_flag) override {
    bound_ = std::make_unique<gpu::BoundGroupLaunches>(kernels_, b, found_inf, reduce_flag);
  }
  bool has_pass1() const override { return bound_->has_pass1(); }
  void set_flags(CUdeviceptr found_inf, CUdeviceptr reduce_flag) override { bound_->set_flags(found_inf, reduce_flag); }
  void set_seed(std::uint64_t seed) override { bound_->set_seed(seed); }
  void pass1(void* stream) override { bound_->pass1(cu(stream)); }
  void reduce(void* stream) override { bound_->reduce(cu(stream)); }
  void update(void* stream) override { bound_->update(cu(stream)); }
  void commit(void* stream) override { bound_->commit(cu(stream)); }

 private:
  gpu::GroupKernels kernels_;
  std::unique_ptr<gpu::BoundGroupLaunches> bound_;  // points into kernels_: destroyed first
};

class CudaGpuDriver final : public GpuDriver {
 public:
  CudaGpuDriver(int device_index, const std::string& bundle_dir)
      : api_(cuda_driver()), rt_(gpu::runtime_for_bundle(bundle_dir)), index_(device_index) {
    graphs_ = api_.cuStreamCreate && api_.cuStreamDestroy && api_.cuStreamBeginCapture && api_.cuStreamEndCapture &&
              api_.cuStreamIsCapturing && api_.cuGraphInstantiateWithFlags && api_.cuGraphLaunch &&
              api_.cuGraphDestroy && api_.cuGraphExecDestroy;
    (void)rt_->device_info(device_index);  // throws kNotFound for a bad ordinal
    CUdevice dev = 0;
    check(api_, api_.cuDeviceGet(&dev, device_index), "cuDeviceGet", "device " + std::to_string(device_index));
    check(api_, api_.cuDevicePrimaryCtxRetain(&ctx_, dev), "cuDevicePrimaryCtxRetain");
    dev_ = dev;
  }
  ~CudaGpuDriver() override {
    if (capture_stream_) {
      try {
        ScopedContext scope(api_, ctx_);
        api_.cuStreamDestroy(capture_stream_);
      } catch (...) {
      }
    }
    api_.cuDevicePrimaryCtxRelease(dev_);
  }

  DeviceType type() const override { return DeviceType::kCuda; }
  std::string device_name() const override { return "device " + std::to_string(index_); }

  bool enter() override {
    CUcontext current = nullptr;
    check(api_, api_.cuCtxGetCurrent(&current), "cuCtxGetCurrent", "");
    if (current == ctx_) return false;
    check(api_, api_.cuCtxPushCurrent(ctx_), "cuCtxPushCurrent", "making the device's primary context current");
    return true;
  }
  void leave(bool entered) noexcept override {
    if (!entered) return;
    CUcontext popped = nullptr;
    api_.cuCtxPopCurrent(&popped);  // a failure here cannot be reported
  }

  CUdeviceptr malloc(std::size_t bytes) override {
    CUdeviceptr p = 0;
    check(api_, api_.cuMemAlloc(&p, bytes), "cuMemAlloc", std::to_string(bytes) + " bytes on " + device_name());
    return p;
  }
  void free(CUdeviceptr p) noexcept override { api_.cuMemFree(p); }
  void memset8_async(CUdeviceptr p, unsigned char value, std::size_t bytes, void* stream, const char* what) override {
    check(api_, api_.cuMemsetD8Async(p, value, bytes, cu(stream)), "cuMemsetD8Async", what);
  }
  void memset32_async(CUdeviceptr p, std::uint32_t value, std::size_t words, void* stream, const char* what) override {
    check(api_, api_.cuMemsetD32Async(p, value, words, cu(stream)), "cuMemsetD32Async", what);
  }
  void copy_async(CUdeviceptr dst, CUdeviceptr src, std::size_t bytes, void* stream) override {
    check(api_, api_.cuMemcpyDtoDAsync(dst, src, bytes, cu(stream)), "cuMemcpyDtoDAsync");
  }
  void copy_to_device(CUdeviceptr dst, const void* src, std::size_t bytes, const char* what) override {
    check(api_, api_.cuMemcpyHtoD(dst, src, bytes), "cuMemcpyHtoD", what);
  }
  void copy_to_host(void* dst, CUdeviceptr src, std::size_t bytes) override {
    check(api_, api_.cuMemcpyDtoH(dst, src, bytes), "cuMemcpyDtoH");
  }
  void synchronize(const char* what) override { check(api_, api_.cuCtxSynchronize(), "cuCtxSynchronize", what); }
  void synchronize_quietly() noexcept override { api_.cuCtxSynchronize(); }
  void stream_synchronize(void* stream, const char* what) override {
    check(api_, api_.cuStreamSynchronize(cu(stream)), "cuStreamSynchronize", what);
  }
  bool may_be_capturing(void* stream) override {
    if (api_.cuStreamIsCapturing == nullptr) return true;
    CUstreamCaptureStatus status = CU_STREAM_CAPTURE_STATUS_NONE;
    return api_.cuStreamIsCapturing(cu(stream), &status) != CUDA_SUCCESS || status != CU_STREAM_CAPTURE_STATUS_NONE;
  }

  std::unique_ptr<GpuGroupLaunches> load_group(const GroupConfig& cfg) override {
    return std::make_unique<CudaGroupLaunches>(rt_, index_, cfg);
  }

  bool graphs_available() const override { return graphs_; }
  void* begin_capture() override {
    if (!capture_stream_ && api_.cuStreamCreate(&capture_stream_, CU_STREAM_NON_BLOCKING) != CUDA_SUCCESS) {
      capture_stream_ = nullptr;
      return nullptr;
    }
    // Relaxed: a first launch of a kernel with scratch memory may allocate it while captured.
    if (api_.cuStreamBeginCapture(capture_stream_, CU_STREAM_CAPTURE_MODE_RELAXED) != CUDA_SUCCESS) return nullptr;
    return capture_stream_;
  }
  void* end_capture(void* stream, bool keep) override {
    CUgraph graph = nullptr;
    CUresult r = api_.cuStreamEndCapture(cu(stream), &graph);
    CUgraphExec exec = nullptr;
    if (keep && r == CUDA_SUCCESS && graph != nullptr) r = api_.cuGraphInstantiateWithFlags(&exec, graph, 0);
    if (graph != nullptr) api_.cuGraphDestroy(graph);
    if (!keep || r != CUDA_SUCCESS || exec == nullptr) {
      if (exec != nullptr) api_.cuGraphExecDestroy(exec);
      return nullptr;
    }
    return exec;
  }
  void graph_launch(void* exec, void* stream) override {
    check(api_, api_.cuGraphLaunch(static_cast<CUgraphExec>(exec), cu(stream)), "cuGraphLaunch", "the step's graph");
  }
  void graph_destroy(void* exec) noexcept override {
    if (exec) api_.cuGraphExecDestroy(static_cast<CUgraphExec>(exec));
  }

 private:
  const CudaDriverApi& api_;
  std::shared_ptr<AotRuntime> rt_;
  int index_;
  CUdevice dev_ = 0;
  CUcontext ctx_ = nullptr;
  bool graphs_ = false;
  CUstream capture_stream_ = nullptr;  // private, only ever captured
};

}  // namespace

std::unique_ptr<GpuDriver> make_cuda_gpu_driver(int device_index, const std::string& bundle_dir) {
  (void)cuda_driver();  // throws kDriverError with the dlerror when there is no driver
  return std::make_unique<CudaGpuDriver>(device_index, bundle_dir);
}

}  // namespace engine_detail
}  // namespace luminav
