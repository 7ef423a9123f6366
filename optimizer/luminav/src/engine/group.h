// src/engine/group.h: the launch groups Python's native backends drive (CpuGroup for "cpu",
// AotGroup for "aot") and the conversions from Python's plain values (make_config, make_rows)
//
// python/bindings.cpp exposes these to python/luminamoon/optimizer/backends/cpu.py and aot.py; nothing here knows
// Python, so GoogleTest reaches all of it (tests/test_group.cpp). Tensor storage stays the
// caller's: rows and buffers are addresses of tensors Python owns.
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>
#include <tuple>
#include <vector>

#include "aot/hip_runtime.h"
#include "aot/runtime.h"
#include "engine/cpu_kernels.h"
#include "engine/engine.h"
#include "engine/group_launch.h"
#include "engine/thread_pool.h"

namespace luminav {

// One table row as Python hands it over: (param, grad, exp_avg, exp_avg_sq, p_init, step,
// numel, elem_offset, param_index, global_numel, scale_m, scale_v, row_len), addresses as ints;
// the last three are q8 moments' (the float32 block scales of m and v, the elements of a block
// row), 0, 0, 0 for other state dtypes.
using RowTuple = std::tuple<std::uintptr_t, std::uintptr_t, std::uintptr_t, std::uintptr_t, std::uintptr_t,
                            std::uintptr_t, std::int64_t, std::int64_t, std::int64_t, std::int64_t,
                            std::uintptr_t, std::uintptr_t, std::int64_t>;

// A launch group's constants: the dtype codes (ints, as Python hands them over), the
// hyperparameters (one record; its lr and state_dtype are set here: lr comes with each step) and
// the seed, validated as validate_hyper does. Throws Error(kInvalidArgument) naming the first bad
// value.
GroupConfig make_config(int param_dtype, int grad_dtype, int state_dtype, const Hyper& hyper, std::uint64_t seed);

// Rows from their tuples. Refuses, with Error(kInvalidArgument) naming the row: numel < 0, a
// step counter address 0, a param/grad/exp_avg/exp_avg_sq address 0 where numel > 0, a p_init
// address 0 where `bounded` and numel > 0, global_numel < elem_offset + numel; with `q8` (the
// group's state dtype is q8) a row_len <= 0 or not dividing numel, or a scale address 0 where
// numel > 0; without, any of the three q8 fields not 0.
std::vector<TensorRow> make_rows(const std::vector<RowTuple>& rows, bool bounded, bool q8 = false);

// The worker pool of `num_threads` threads (0: one per hardware thread), made on first use and
// shared by every group of the process. Throws Error(kInvalidArgument) for num_threads < 0.
std::shared_ptr<cpu::ThreadPool> pool_for(int num_threads);

// A launch group of the "cpu" backend: its config and rows, built once per table. Each pass
// reads and writes host memory at the rows' addresses (engine/cpu_kernels.h).
class CpuGroup {
 public:
  CpuGroup(const GroupConfig& cfg, const std::vector<RowTuple>& rows, int num_threads);

  void pass1(std::uintptr_t stats, std::uintptr_t found_inf);
  // Throws Error(kInvalidArgument) for an lr validate_lr refuses.
  void pass2(double lr, std::uintptr_t stats, std::uintptr_t found_inf);
  void commit(std::uintptr_t found_inf);
  // Index of the first row with a non-finite gradient element, or -1.
  std::int64_t first_nonfinite();
  // New gradient addresses, one per row (a step whose gradients are new tensors); the rest of
  // every row stays. Throws Error(kInvalidArgument) for another count, or an address 0 where
  // the row has elements.
  void set_grads(const std::vector<std::uintptr_t>& grads);
  // What set_grads refuses, checked without changing anything.
  void check_grads(const std::vector<std::uintptr_t>& grads) const;

  const GroupConfig& config() const { return cfg_; }
  std::size_t size() const { return rows_.size(); }
  int num_threads() const { return pool_->size(); }
  // "threads" or "openmp (<library>)": what runs the passes (engine/thread_pool.h)
  std::string thread_pool() const { return pool_->kind(); }

 private:
  GroupConfig cfg_;
  std::vector<TensorRow> rows_;
  std::shared_ptr<cpu::ThreadPool> pool_;
  cpu::DirectionCache cache_;  // pass 1's u for pass 2 (cpu_kernels.h)
};

// One group's part in cpu_step: its lr, its float32 stats (one per row), the int32 flag its
// passes read and raise (the step's skip flag for nonfinite "skip", else a scratch flag), and
// new gradient addresses for set_grads (null: the rows keep theirs).
struct CpuStepItem {
  CpuGroup* group;
  double lr;
  std::uintptr_t stats;
  std::uintptr_t found_inf;
  const std::vector<std::uintptr_t>* grads = nullptr;
};

// A whole step of CPU launch groups in one call: what Python's run_launch_groups does for them
// pass by pass (docs/internals.md, "One step"). Every lr and gradient list is checked before
// anything is read (the gradient addresses are taken once all are);
// then pass 1 of each group that needs it, pass 2 and the commit of each, and, where
// `skip_flag` is not 0, *skipped += *skip_flag (when `skipped` is not 0, an int64 counter) and
// *skip_flag = 0; the other flags are cleared too. A skipped step (the skip flag raised by some
// pass 1) changes no row of a group that checks the flag. Throws Error(kInvalidArgument) for a
// null group, an lr validate_lr refuses or gradients set_grads refuses, before any pass runs.
void cpu_step(const std::vector<CpuStepItem>& items, std::uintptr_t skip_flag, std::uintptr_t skipped);

// A launch group of the "aot" backend: its kernels loaded from a bundle on one CUDA device and
// launched on the bound launch path the engine uses (gpu::BoundGroupLaunches): bind() checks the
// buffers and packs every kernel's arguments once per layout; a launch then makes the kernels'
// context current where it is not (one cuCtxGetCurrent) and calls cuLaunchKernel. Python owns
// the buffers (torch tensors) and hands over their device addresses.
class AotGroup {
 public:
  // Loads (and verifies) every kernel the group runs; throws Error(kNotFound) for a variant the
  // bundle lacks, kBundleError for a bad bundle, kDriverError without a driver.
  AotGroup(const std::string& bundle_dir, int device, const GroupConfig& cfg);

  // Binds the launches to the group's buffers (GroupBuffers: commit advances the `ntensors`
  // table rows), `found_inf` (read by pass 2 and commit) and `reduce_flag` (raised by reduce).
  // A new binding replaces the previous one. Throws Error(kInvalidArgument) for a count out of
  // range or an address 0 that a launch would read.
  void bind(CUdeviceptr table, CUdeviceptr block_map, std::int64_t nblocks, CUdeviceptr partial_sum,
            CUdeviceptr partial_bad, CUdeviceptr stats, CUdeviceptr lr, std::int32_t ntensors, CUdeviceptr found_inf,
            CUdeviceptr reduce_flag);
  // Replace only those arguments (a compare where they did not change). Throw Error(kStateError)
  // before bind(), Error(kInvalidArgument) for an address 0.
  void set_flags(CUdeviceptr found_inf, CUdeviceptr reduce_flag);
  void set_lr(CUdeviceptr lr);

  // The launches, on `stream` (a stream of the device's primary context; 0: its default
  // stream). Throw Error(kStateError) before bind(), and for pass1/reduce of a group that runs
  // no pass 1 (clip == 0 and nonfinite != skip); kDriverError when a launch fails.
  void pass1(CUstream stream);
  void reduce(CUstream stream);
  // pass 2 where the group runs pass 1, else the single-pass kernel.
  void update(CUstream stream);
  void commit(CUstream stream);

  const GroupConfig& config() const { return kernels_.config(); }
  bool bound() const { return launches_ != nullptr; }
  bool has_pass1() const { return kernels_.config().needs_pass1(); }

 private:
  // The bound launches; throws as the launch methods say.
  gpu::BoundGroupLaunches& launches(const char* what, bool pass1_kernel);
  // One launch in the kernels' context.
  void run(const char* what, bool pass1_kernel, void (gpu::BoundGroupLaunches::*launch)(CUstream), CUstream stream);

  gpu::GroupKernels kernels_;
  std::unique_ptr<gpu::BoundGroupLaunches> launches_;
};

// AotGroup::bind's checks of a group's buffers (and HipAotGroup's): throws Error(kInvalidArgument)
// "<who>: ..." for a count out of range or an address 0 that a launch would read.
void check_group_buffers(const char* who, bool has_pass1, CUdeviceptr table, CUdeviceptr block_map, std::int64_t nblocks,
                         CUdeviceptr partial_sum, CUdeviceptr partial_bad, CUdeviceptr stats, CUdeviceptr lr,
                         std::int32_t ntensors, CUdeviceptr found_inf, CUdeviceptr reduce_flag);

// One HIP runtime per (bundle folder, base arch), shared by every HipAotGroup of the process and
// the engine's HIP device; the manifest is read on first use (throws as AotManifest::load).
std::shared_ptr<HipRuntime> hip_runtime_for_bundle(const std::string& dir, const std::string& arch);

// The same launch group on an AMD device (HIP): the bundle's HIP entries for `arch` ("gfx942",
// or ROCm's gcnArchName "gfx942:sramecc+:xnack-"), loaded on HIP device `device` through the HIP
// table (aot/hip_runtime.h), bound and launched exactly as AotGroup's: the same argument lists
// (engine/group_args.h), the same checks, the same errors; streams are hipStream_t.
class HipAotGroup {
 public:
  // Throws Error(kNotFound) for a variant the bundle lacks for `arch`, kBundleError for a bad
  // bundle (or tables of another column count), kDriverError without a HIP runtime.
  HipAotGroup(const std::string& bundle_dir, int device, const std::string& arch, const GroupConfig& cfg);
  ~HipAotGroup();

  void bind(CUdeviceptr table, CUdeviceptr block_map, std::int64_t nblocks, CUdeviceptr partial_sum,
            CUdeviceptr partial_bad, CUdeviceptr stats, CUdeviceptr lr, std::int32_t ntensors, CUdeviceptr found_inf,
            CUdeviceptr reduce_flag);
  // bind() with the buffers of a GroupBuffers, whose commit advances b.commit_rows table rows
  // (>= b.ntensors; the engine's applied-step counter is one more row). Throws as bind() does,
  // and kInternal for commit_rows < ntensors.
  void bind_buffers(const gpu::GroupBuffers& b, CUdeviceptr found_inf, CUdeviceptr reduce_flag);
  void set_flags(CUdeviceptr found_inf, CUdeviceptr reduce_flag);
  void set_lr(CUdeviceptr lr);
  // The seed of pass 1 and pass 2 (the group's config keeps its own).
  void set_seed(std::uint64_t seed);
  void pass1(hipStream_t stream);
  void reduce(hipStream_t stream);
  void update(hipStream_t stream);
  void commit(hipStream_t stream);

  const GroupConfig& config() const { return cfg_; }
  bool bound() const { return launches_ != nullptr; }
  bool has_pass1() const { return cfg_.needs_pass1(); }
  const HipRuntime& runtime() const { return *rt_; }

 private:
  struct Launches;
  Launches& launches(const char* what, bool pass1_kernel);

  std::shared_ptr<HipRuntime> rt_;
  int device_;
  GroupConfig cfg_;
  const HipLoadedKernel* pass1_ = nullptr;
  const HipLoadedKernel* reduce_ = nullptr;
  const HipLoadedKernel* update_ = nullptr;
  const HipLoadedKernel* commit_ = nullptr;
  std::unique_ptr<Launches> launches_;
};

}  // namespace luminav
