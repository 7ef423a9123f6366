// src/engine/engine.h: the engine's vocabulary (dtypes, hyperparameters, launch-group rows and
// constants) and the optimizer object, Engine
//
// A full TDCLM step (docs/tdclm.md) over tensors described by raw pointers, on CPU threads or,
// through an AOT bundle, on a CUDA or HIP (AMD) device. The launch layout follows docs/internals.md exactly;
// the CPU path (engine/cpu_kernels.h) uses the same per-element operations in the same order.
//
// This is the library's internal C++ interface (exceptions: luminav::Error). Programs use the
// C API (luminav.h) or the RAII C++ API over it (luminav.hpp).
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "luminav/error.h"

namespace luminav {

// Storage dtypes; the values are the kernels' dtype codes (docs/internals.md). kQ8 (code 3, the
// kernels' S_DTYPE of q8 moments, kernels/layout.py S_DTYPE_Q8) is a state dtype only: uint8
// codes with a float32 scale a block of 256 (docs/tdclm.md "Quantized moments (q8)").
enum class DType : int { kFloat32 = 0, kBFloat16 = 1, kFloat16 = 2, kQ8 = 3 };
enum class BoundMode : int { kNone = 0, kAbs = 1, kRel = 2 };
enum class NonFinite : int { kSkip = 0, kRaise = 1, kPropagate = 2 };
enum class DeviceType : int { kCpu = 0, kCuda = 1, kHip = 2 };

// Every value of each enum, in code order (the contract constants of the bindings list them);
// kDTypes: the element dtypes (kQ8 is a state dtype only).
constexpr DType kDTypes[] = {DType::kFloat32, DType::kBFloat16, DType::kFloat16};
constexpr BoundMode kBoundModes[] = {BoundMode::kNone, BoundMode::kAbs, BoundMode::kRel};
constexpr NonFinite kNonFinites[] = {NonFinite::kSkip, NonFinite::kRaise, NonFinite::kPropagate};

const char* dtype_name(DType d) noexcept;            // "float32", "bfloat16", "float16", "q8"
const char* dtype_word(DType d) noexcept;            // "fp32", "bf16", "fp16", "q8" (Triton; `aot build --dtypes`)
std::size_t dtype_size(DType d) noexcept;            // 4, 2, 2, 1 (q8: a code; its scales apart)
const char* bound_mode_name(BoundMode m) noexcept;   // "none", "abs", "rel" (Python's bound_mode)
const char* nonfinite_name(NonFinite n) noexcept;    // "skip", "raise", "propagate" (Python's nonfinite)
DType dtype_from_int(int code, const char* what);    // 0-2; throws kInvalidArgument naming `what`
DType state_dtype_from_int(int code);                // 0, 1 or 3 (q8); throws kInvalidArgument
BoundMode bound_mode_from_int(int code);
NonFinite nonfinite_from_int(int code);
NonFinite nonfinite_from_name(const std::string& name);  // Python's "skip", "raise", "propagate"

// Hyperparameters of one param group (docs/tdclm.md table). lr may change every step.
struct Hyper {
  double lr = 1e-3;
  double beta1 = 0.9;
  double beta2 = 0.999;
  double eps = 1e-8;
  double weight_decay = 0.01;
  double clip = 4.0;
  BoundMode bound_mode = BoundMode::kNone;
  double bound = 1.0;
  bool maximize = false;
  NonFinite nonfinite = NonFinite::kSkip;
  bool stochastic_rounding = true;
  DType state_dtype = DType::kFloat32;
};

// Throws Error(kInvalidArgument) naming the first invalid field, its value and the valid range.
void validate_hyper(const Hyper& h);
void validate_lr(double lr);

// One row of a launch group's table (docs/internals.md "Device tables"), as host values.
struct TensorRow {
  void* param = nullptr;
  const void* grad = nullptr;
  void* exp_avg = nullptr;
  void* exp_avg_sq = nullptr;
  void* p_init = nullptr;      // null when bound_mode is none
  std::int64_t* step = nullptr;  // int64 applied-step counter
  std::int64_t numel = 0;        // local element count
  std::int64_t elem_offset = 0;  // global flat index of the first local element
  std::int64_t param_index = 0;  // k
  std::int64_t global_numel = 0; // n of the RMS
  // q8 moments (state dtype kQ8; null/0 otherwise): exp_avg and exp_avg_sq hold uint8 codes,
  // these the float32 block scales of m and v (row-major [numel / row_len, ceil(row_len / 256)])
  // and row_len the elements of a block row (K: the table's columns 18-20).
  float* scale_m = nullptr;
  float* scale_v = nullptr;
  std::int64_t row_len = 0;
};

// The constants of a launch group that the passes read (lr is passed per call).
struct GroupConfig {
  DType param_dtype = DType::kFloat32;
  DType grad_dtype = DType::kFloat32;
  DType state_dtype = DType::kFloat32;
  Hyper hyper;
  std::uint64_t seed = 0;

  bool needs_pass1() const { return hyper.clip > 0 || hyper.nonfinite == NonFinite::kSkip; }
  bool check_flag() const { return hyper.nonfinite == NonFinite::kSkip; }
  // SR normalised as internals.md says: off when neither params nor states are bf16.
  bool sr() const {
    return hyper.stochastic_rounding &&
           (param_dtype == DType::kBFloat16 || state_dtype == DType::kBFloat16);
  }
};

// ---------------------------------------------------------------------------------------------
// The optimizer object: param groups of tensors the caller owns, state it allocates or borrows.

struct EngineOptions {
  DeviceType device = DeviceType::kCpu;
  int device_index = 0;
  int num_threads = 0;        // CPU worker threads; 0 = hardware_concurrency
  std::uint64_t seed = 0;     // base seed of the rounding streams
  std::string bundle_dir;     // CUDA and HIP: the AOT bundle (manifest.json + cubins / hsaco)
  std::string arch;           // HIP: the device's arch, "gfx942" or gcnArchName "gfx942:sramecc+:xnack-"
  // CUDA: from the second step of a layout on, replay the step's launches as one CUDA graph
  // (one cuGraphLaunch per step). Off here, or with the environment variable
  // LUMINAV_CUDA_GRAPH=0, every step launches its kernels one by one.
  bool cuda_graph = true;
};

struct ParamDesc {
  void* data = nullptr;          // the parameter's storage (borrowed; outlives the engine)
  DType dtype = DType::kFloat32;
  const void* grad = nullptr;    // its gradient (borrowed); may be changed with set_grad
  DType grad_dtype = DType::kFloat32;
  std::int64_t numel = 0;
  void* exp_avg = nullptr;       // optional borrowed m (state_dtype, numel); null: allocated
  void* exp_avg_sq = nullptr;    // optional borrowed v
  void* p_init = nullptr;        // optional borrowed p0 (param dtype); used when bounded
  // q8 moments (the group's state_dtype kQ8): exp_avg and exp_avg_sq hold numel uint8 codes
  // (lent: filled with the zero codes, 128 for m and 0 for v), these their float32 block scales
  // (lent with the codes, zeroed: scale_numel floats each, numel / row_len * ceil(row_len / 256)),
  // row_len the elements of a block row (0: numel, one row). All zero for other state dtypes.
  float* exp_avg_scale = nullptr;
  float* exp_avg_sq_scale = nullptr;
  std::int64_t scale_numel = 0;
  std::int64_t row_len = 0;
};

class Engine {
 public:
  explicit Engine(const EngineOptions& options);
  ~Engine();
  Engine(const Engine&) = delete;
  Engine& operator=(const Engine&) = delete;

  std::size_t add_group(const Hyper& hyper);
  // Returns k, the parameter's index in the optimizer.
  std::size_t add_param(std::size_t group, const ParamDesc& desc);
  void set_grad(std::size_t k, const void* grad);
  void set_lr(std::size_t group, double lr);
  double lr(std::size_t group) const;

  // One step over every group (global skip across groups). `stream` is the CUDA stream
  // (CUstream) for the CUDA device, ignored on CPU.
  void step(void* stream = nullptr);

  std::size_t num_groups() const;
  std::size_t num_params() const;
  std::int64_t param_step(std::size_t k) const;  // may synchronise on CUDA
  std::int64_t skipped_steps() const;            // may synchronise on CUDA
  std::uint64_t seed() const;
  DeviceType device() const;
  int num_threads() const;

  // Bytes, self-describing and checked on import (dtypes, counts, sizes). Importing a state
  // that does not fit changes nothing and throws.
  std::vector<std::uint8_t> export_state() const;
  void import_state(const std::uint8_t* data, std::size_t size);

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

}  // namespace luminav
