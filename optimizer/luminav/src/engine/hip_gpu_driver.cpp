// src/engine/hip_gpu_driver.cpp: the GPU device's HIP driver (engine/gpu_driver.h): the HIP table
// (aot/hip_driver.h) on one AMD device, and the bundle's code objects through HipAotGroup
// (engine/group.h), the launch path Python's "aot" backend takes on a ROCm torch
//
// What HIP does not get here: graph replay (the HIP table has no capture or graph calls) and the
// capture query (may_be_capturing is always true, so each step zeroes its own flag pair); the
// GPU device's steps on HIP are eager, and one more memset per step than CUDA's.
#include <cstdint>
#include <cstring>
#include <memory>
#include <string>

#include "aot/hip_driver.h"
#include "aot/hip_runtime.h"
#include "engine/gpu_driver.h"
#include "engine/group.h"
#include "luminav/error.h"

namespace luminav {
namespace engine_detail {

namespace {

hipStream_t hs(void* stream) { return static_cast<hipStream_t>(stream); }
void* vp(CUdeviceptr p) { return reinterpret_cast<void*>(static_cast<std::uintptr_t>(p)); }

class HipGroupLaunches final : public GpuGroupLaunches {
 public:
  HipGroupLaunches(const std::string& bundle_dir, int device, const std::string& arch, const GroupConfig& cfg)
      : group_(bundle_dir, device, arch, cfg) {}
  void bind(const gpu::GroupBuffers& b, CUdeviceptr found_inf, CUdeviceptr reduce_flag) override {
    group_.bind_buffers(b, found_inf, reduce_flag);
  }
  bool has_pass1() const override { return group_.has_pass1(); }
  void set_flags(CUdeviceptr found_inf, CUdeviceptr reduce_flag) override { group_.set_flags(found_inf, reduce_flag); }
  void set_seed(std::uint64_t seed) override { group_.set_seed(seed); }
  void pass1(void* stream) override { group_.pass1(hs(stream)); }
  void reduce(void* stream) override { group_.reduce(hs(stream)); }
  void update(void* stream) override { group_.update(hs(stream)); }
  void commit(void* stream) override { group_.commit(hs(stream)); }

 private:
  HipAotGroup group_;
};

class HipGpuDriver final : public GpuDriver {
 public:
  HipGpuDriver(int device_index, const std::string& bundle_dir, const std::string& arch)
      : api_(hip_driver()), bundle_dir_(bundle_dir), arch_(arch), index_(device_index) {
    rt_ = hip_runtime_for_bundle(bundle_dir, arch);  // the manifest, read and checked now
    int count = 0;
    check_hip(api_, api_.hipGetDeviceCount(&count), "hipGetDeviceCount");
    if (device_index >= count) {
      throw Error(Status::kNotFound, "HIP device " + std::to_string(device_index) + " does not exist: the HIP runtime (" +
                                         api_.origin + ") sees " + std::to_string(count) +
                                         " device(s); set device_index to 0.." + std::to_string(count - 1));
    }
  }

  DeviceType type() const override { return DeviceType::kHip; }
  std::string device_name() const override { return "HIP device " + std::to_string(index_); }

  bool enter() override {
    int current = -1;
    check_hip(api_, api_.hipGetDevice(&current), "hipGetDevice");
    if (current == index_) return false;
    check_hip(api_, api_.hipSetDevice(index_), "hipSetDevice", "making " + device_name() + " current");
    previous_ = current;
    return true;
  }
  void leave(bool entered) noexcept override {
    if (entered && previous_ >= 0) (void)api_.hipSetDevice(previous_);
  }

  CUdeviceptr malloc(std::size_t bytes) override {
    void* p = nullptr;
    check_hip(api_, api_.hipMalloc(&p, bytes), "hipMalloc", std::to_string(bytes) + " bytes on " + device_name());
    return static_cast<CUdeviceptr>(reinterpret_cast<std::uintptr_t>(p));
  }
  void free(CUdeviceptr p) noexcept override { (void)api_.hipFree(vp(p)); }
  void memset8_async(CUdeviceptr p, unsigned char value, std::size_t bytes, void* stream, const char* what) override {
    check_hip(api_, api_.hipMemsetAsync(vp(p), value, bytes, hs(stream)), "hipMemsetAsync", what);
  }
  void memset32_async(CUdeviceptr p, std::uint32_t value, std::size_t words, void* stream, const char* what) override {
    int v;
    static_assert(sizeof v == sizeof value, "a 32-bit memset value");
    std::memcpy(&v, &value, 4);
    check_hip(api_, api_.hipMemsetD32Async(vp(p), v, words, hs(stream)), "hipMemsetD32Async", what);
  }
  void copy_async(CUdeviceptr dst, CUdeviceptr src, std::size_t bytes, void* stream) override {
    check_hip(api_, api_.hipMemcpyAsync(vp(dst), vp(src), bytes, hipMemcpyDeviceToDevice, hs(stream)),
              "hipMemcpyAsync");
  }
  void copy_to_device(CUdeviceptr dst, const void* src, std::size_t bytes, const char* what) override {
    check_hip(api_, api_.hipMemcpy(vp(dst), src, bytes, hipMemcpyHostToDevice), "hipMemcpy", what);
  }
  void copy_to_host(void* dst, CUdeviceptr src, std::size_t bytes) override {
    check_hip(api_, api_.hipMemcpy(dst, vp(src), bytes, hipMemcpyDeviceToHost), "hipMemcpy");
  }
  void synchronize(const char* what) override {
    check_hip(api_, api_.hipDeviceSynchronize(), "hipDeviceSynchronize", what);
  }
  void synchronize_quietly() noexcept override { (void)api_.hipDeviceSynchronize(); }
  void stream_synchronize(void* stream, const char* what) override {
    check_hip(api_, api_.hipStreamSynchronize(hs(stream)), "hipStreamSynchronize", what);
  }
  bool may_be_capturing(void* stream) override {
    (void)stream;
    return true;  // no hipStreamIsCapturing in the table: zero the step's flags every step
  }

  std::unique_ptr<GpuGroupLaunches> load_group(const GroupConfig& cfg) override {
    GpuScope scope(*this);
    return std::make_unique<HipGroupLaunches>(bundle_dir_, index_, arch_, cfg);
  }

 private:
  const HipApi& api_;
  std::shared_ptr<HipRuntime> rt_;  // the groups' runtime, kept loaded for the device's lifetime
  std::string bundle_dir_, arch_;
  int index_;
  int previous_ = -1;  // the device current before enter() changed it
};

}  // namespace

std::unique_ptr<GpuDriver> make_hip_gpu_driver(int device_index, const std::string& bundle_dir,
                                               const std::string& arch) {
  if (arch.empty()) {
    throw Error(Status::kInvalidArgument,
                "the HIP device needs its arch: set arch to the device's gcnArchName, e.g. \"gfx942\" or "
                "torch.cuda.get_device_properties(" +
                    std::to_string(device_index) + ").gcnArchName on a ROCm build of torch");
  }
  (void)hip_driver();  // throws kDriverError naming libamdhip64.so when there is no HIP runtime
  return std::make_unique<HipGpuDriver>(device_index, bundle_dir, arch);
}

}  // namespace engine_detail
}  // namespace luminav
