// The engine on a CUDA device: the AOT bundle's kernels launched on the caller's stream.
//
// Per launch group, built at the first step after the group's rows change (cuMemAlloc +
// cuMemcpyHtoD): the table, the block map, partial sums/flags, stats, and the group's lr as a
// device float32 written with cuMemsetD32Async only when its bits change. Device-wide: the
// step's found_inf, a scratch flag for the pass 1 of groups that do not skip (their non-finite
// gradients must not skip anyone else's step), and an applied-step counter advanced by the
// bundle's commit kernel (CHECK_FLAG = 1) so that the skipped-step count needs no host sync:
// skipped = (steps that had a skipping group) - applied. After the first step, step() allocates
// nothing and never synchronises (except nonfinite='raise', which must read the flag on the
// host), so it can be captured in a CUDA graph.
#include <cstring>
#include <memory>
#include <string>
#include <vector>

#include "engine/device.h"
#include "engine/gpu_launch.h"
#include "luminav/aot.h"
#include "luminav/cuda_driver.h"

namespace luminav {
namespace engine_detail {

namespace {

// Makes the device's primary context current for the scope, restoring the previous one.
class ContextScope {
 public:
  ContextScope(const CudaDriverApi& api, CUcontext ctx) : api_(api) {
    check(api_, api_.cuCtxGetCurrent(&previous_), "cuCtxGetCurrent");
    if (previous_ != ctx) {
      check(api_, api_.cuCtxPushCurrent(ctx), "cuCtxPushCurrent");
      pushed_ = true;
    }
  }
  ~ContextScope() {
    if (pushed_) {
      CUcontext popped = nullptr;
      api_.cuCtxPopCurrent(&popped);
    }
  }
  ContextScope(const ContextScope&) = delete;
  ContextScope& operator=(const ContextScope&) = delete;

 private:
  const CudaDriverApi& api_;
  CUcontext previous_ = nullptr;
  bool pushed_ = false;
};

CUdeviceptr dptr(const void* p) { return static_cast<CUdeviceptr>(reinterpret_cast<std::uintptr_t>(p)); }

struct GroupCache {
  Device* device = nullptr;  // frees `buffers` when the group's rows are rebuilt
  std::vector<CUdeviceptr> buffers;
  ~GroupCache() {
    for (CUdeviceptr p : buffers) device->release(reinterpret_cast<void*>(static_cast<std::uintptr_t>(p)));
  }
  std::unique_ptr<gpu::GroupKernels> kernels;
  CUdeviceptr table = 0, block_map = 0, partial_sum = 0, partial_bad = 0, stats = 0, lr = 0;
  std::int64_t nblocks = 0;
  std::uint32_t lr_bits = 0;
  bool lr_written = false;
  std::vector<std::int32_t> host_block_map;  // for naming the offending tensor under 'raise'
};

class CudaDevice final : public Device {
 public:
  CudaDevice(int device_index, const std::string& bundle_dir)
      : api_(cuda_driver()), rt_(gpu::runtime_for_bundle(bundle_dir)), index_(device_index) {
    const DeviceInfo info = rt_->device_info(device_index);  // throws kNotFound for a bad ordinal
    (void)info;
    CUdevice dev = 0;
    check(api_, api_.cuDeviceGet(&dev, device_index), "cuDeviceGet", "device " + std::to_string(device_index));
    check(api_, api_.cuDevicePrimaryCtxRetain(&ctx_, dev), "cuDevicePrimaryCtxRetain");
    dev_ = dev;
    try {
      found_inf_ = static_cast<CUdeviceptr>(reinterpret_cast<std::uintptr_t>(alloc(16)));
      scratch_flag_ = found_inf_ + 4;
      applied_ = found_inf_ + 8;
    } catch (...) {
      api_.cuDevicePrimaryCtxRelease(dev_);
      throw;
    }
  }
  ~CudaDevice() override {
    {
      ContextScope scope(api_, ctx_);
      api_.cuCtxSynchronize();
      for (CUdeviceptr p : owned_) api_.cuMemFree(p);
      api_.cuMemFree(found_inf_);
    }
    api_.cuDevicePrimaryCtxRelease(dev_);
  }

  DeviceType type() const override { return DeviceType::kCuda; }

  void* alloc(std::size_t bytes) override {
    ContextScope scope(api_, ctx_);
    CUdeviceptr p = 0;
    check(api_, api_.cuMemAlloc(&p, bytes), "cuMemAlloc", std::to_string(bytes) + " bytes on device " + std::to_string(index_));
    CUresult r = api_.cuMemsetD8Async(p, 0, bytes, nullptr);
    if (r == CUDA_SUCCESS) r = api_.cuCtxSynchronize();
    if (r != CUDA_SUCCESS) {
      api_.cuMemFree(p);
      check(api_, r, "cuMemsetD8Async", "zeroing a new allocation");
    }
    return reinterpret_cast<void*>(static_cast<std::uintptr_t>(p));
  }
  void release(void* p) noexcept override {
    if (!p) return;
    try {
      ContextScope scope(api_, ctx_);
      api_.cuCtxSynchronize();
      api_.cuMemFree(dptr(p));
    } catch (...) {
    }
  }
  void to_host(void* dst, const void* src, std::size_t bytes) override {
    ContextScope scope(api_, ctx_);
    check(api_, api_.cuCtxSynchronize(), "cuCtxSynchronize", "before reading device memory");
    check(api_, api_.cuMemcpyDtoH(dst, dptr(src), bytes), "cuMemcpyDtoH");
  }
  void from_host(void* dst, const void* src, std::size_t bytes) override {
    ContextScope scope(api_, ctx_);
    check(api_, api_.cuCtxSynchronize(), "cuCtxSynchronize", "before writing device memory");
    check(api_, api_.cuMemcpyHtoD(dptr(dst), src, bytes), "cuMemcpyHtoD");
    check(api_, api_.cuCtxSynchronize(), "cuCtxSynchronize", "after writing device memory");
  }
  void copy(void* dst, const void* src, std::size_t bytes, void* stream) override {
    ContextScope scope(api_, ctx_);
    check(api_, api_.cuMemcpyDtoDAsync(dptr(dst), dptr(src), bytes, static_cast<CUstream>(stream)), "cuMemcpyDtoDAsync");
  }

  void check_nonfinite(std::vector<LaunchGroup>& groups, void* stream_ptr) override {
    ContextScope scope(api_, ctx_);
    const auto stream = static_cast<CUstream>(stream_ptr);
    for (auto& g : groups) {
      if (g.cfg.hyper.nonfinite != NonFinite::kRaise || g.rows.empty()) continue;
      // Pass 1 without the sum (NEED_SUM = 0 when clip == 0) and the reduce, into the scratch
      // flag; then the partial flags on the host name the first offending tensor.
      GroupConfig probe = g.cfg;
      probe.hyper.nonfinite = NonFinite::kSkip;  // the variants a checking group runs
      GroupCache& c = cache(g);
      gpu::GroupKernels kernels(rt_, index_, probe);
      kernels.pass1(c.table, c.block_map, c.nblocks, c.partial_sum, c.partial_bad, stream);
      check(api_, api_.cuStreamSynchronize(stream), "cuStreamSynchronize", "nonfinite='raise' reads the flag on the host");
      std::vector<std::int32_t> bad(static_cast<std::size_t>(c.nblocks));
      if (!bad.empty()) check(api_, api_.cuMemcpyDtoH(bad.data(), c.partial_bad, bad.size() * 4), "cuMemcpyDtoH");
      for (std::size_t b = 0; b < bad.size(); ++b) {
        if (bad[b]) throw Error(Status::kNonFinite, nonfinite_message(g, static_cast<std::size_t>(c.host_block_map[b])));
      }
    }
  }

  void step(std::vector<LaunchGroup>& groups, void* stream_ptr) override {
    ContextScope scope(api_, ctx_);
    const auto stream = static_cast<CUstream>(stream_ptr);
    bool any_check = false;
    for (auto& g : groups) {
      cache(g);  // first step after a change: tables and kernels (allocates, loads)
      any_check = any_check || g.cfg.check_flag();
    }
    if (any_check && !applied_kernel_) {
      applied_kernel_ = &rt_->get(gpu::commit_key(true), index_);
      applied_row_.assign(gpu::kTableCols, 0);
      applied_row_[5] = static_cast<std::int64_t>(applied_);
      applied_table_ = static_cast<CUdeviceptr>(reinterpret_cast<std::uintptr_t>(alloc(gpu::kTableCols * 8)));
      owned_.push_back(applied_table_);
      check(api_, api_.cuMemcpyHtoD(applied_table_, applied_row_.data(), gpu::kTableCols * 8), "cuMemcpyHtoD");
    }
    check(api_, api_.cuMemsetD32Async(found_inf_, 0, 2, stream), "cuMemsetD32Async", "found_inf");
    for (auto& g : groups) {
      GroupCache& c = cache(g);
      std::uint32_t bits;
      std::memcpy(&bits, &g.lr, 4);
      if (!c.lr_written || bits != c.lr_bits) {
        check(api_, api_.cuMemsetD32Async(c.lr, bits, 1, stream), "cuMemsetD32Async", "lr");
        c.lr_bits = bits;
        c.lr_written = true;
      }
    }
    for (auto& g : groups) {
      if (!g.cfg.needs_pass1()) continue;
      GroupCache& c = cache(g);
      const CUdeviceptr flag = g.cfg.check_flag() ? found_inf_ : scratch_flag_;
      c.kernels->pass1(c.table, c.block_map, c.nblocks, c.partial_sum, c.partial_bad, stream);
      c.kernels->reduce(c.table, c.partial_sum, c.partial_bad, c.stats, flag, static_cast<std::int32_t>(g.rows.size()), stream);
    }
    for (auto& g : groups) {
      GroupCache& c = cache(g);
      c.kernels->update(c.table, c.block_map, c.nblocks, c.stats, found_inf_, c.lr, stream);
    }
    for (auto& g : groups) {
      GroupCache& c = cache(g);
      c.kernels->commit(c.table, found_inf_, static_cast<std::int32_t>(g.rows.size()), stream);
    }
    if (any_check) {
      std::int32_t one = 1;
      CUdeviceptr flag = found_inf_;
      rt_->launch(*applied_kernel_, {1, 1, 1}, {&applied_table_, &flag, &one}, stream);
      ++checked_steps_;
    }
  }

  std::int64_t skipped() override {
    std::int64_t applied = 0;
    to_host(&applied, reinterpret_cast<void*>(static_cast<std::uintptr_t>(applied_)), 8);
    return checked_steps_ - applied;
  }
  void set_skipped(std::int64_t value) override {
    const std::int64_t zero = 0;
    from_host(reinterpret_cast<void*>(static_cast<std::uintptr_t>(applied_)), &zero, 8);
    checked_steps_ = value;
  }

 private:
  GroupCache& cache(LaunchGroup& g) {
    if (g.cache) return *static_cast<GroupCache*>(g.cache.get());
    auto c = std::make_shared<GroupCache>();
    c->device = this;
    c->kernels = std::make_unique<gpu::GroupKernels>(rt_, index_, g.cfg);
    const gpu::HostTables t = gpu::build_tables(g.rows.data(), g.rows.size());
    c->nblocks = t.nblocks;
    c->host_block_map = t.block_map;
    auto grab = [&](std::size_t bytes) {
      CUdeviceptr p = dptr(alloc(bytes < 16 ? 16 : bytes));
      c->buffers.push_back(p);
      return p;
    };
    const std::size_t n = g.rows.size();
    const std::size_t nb = static_cast<std::size_t>(t.nblocks);
    c->table = grab(t.table.size() * 8);
    c->block_map = grab(nb * 4);
    c->partial_sum = grab(nb * 4);
    c->partial_bad = grab(nb * 4);
    c->stats = grab(n * 4);
    c->lr = grab(4);
    if (!t.table.empty()) check(api_, api_.cuMemcpyHtoD(c->table, t.table.data(), t.table.size() * 8), "cuMemcpyHtoD", "table");
    if (nb) check(api_, api_.cuMemcpyHtoD(c->block_map, t.block_map.data(), nb * 4), "cuMemcpyHtoD", "block_map");
    g.cache = c;
    return *c;
  }

  const CudaDriverApi& api_;
  std::shared_ptr<AotRuntime> rt_;
  int index_;
  CUdevice dev_ = 0;
  CUcontext ctx_ = nullptr;
  CUdeviceptr found_inf_ = 0, scratch_flag_ = 0, applied_ = 0;
  const LoadedKernel* applied_kernel_ = nullptr;
  std::vector<std::int64_t> applied_row_;
  CUdeviceptr applied_table_ = 0;
  std::int64_t checked_steps_ = 0;
  std::vector<CUdeviceptr> owned_;
};

}  // namespace

std::unique_ptr<Device> make_cuda_device(int device_index, const std::string& bundle_dir) {
  (void)cuda_driver();  // throws kDriverError with the dlerror when there is no driver
  return std::make_unique<CudaDevice>(device_index, bundle_dir);
}

}  // namespace engine_detail
}  // namespace luminav
