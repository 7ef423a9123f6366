// include/luminav/torch.hpp: the LuminaMoon engine for libtorch programs, header-only, over the
// C++ API (luminav.hpp)
//
//   #include <torch/torch.h>
//   #include "luminav/torch.hpp"
//
//   luminav::TorchOptimizer opt(model->parameters(), luminav::Hyperparams().with_lr(1e-3),
//                               luminav::OptimizerOptions().with_seed(42));
//   for (...) { opt.zero_grad(); torch::mse_loss(model->forward(x), y).backward(); opt.step(); }
//
// Several param groups: TorchOptimizer({{weights, Hyperparams()...}, {biases, Hyperparams()...}}).
//
// Parameters are torch::Tensors: contiguous, float32, bfloat16 or float16, all on one device (the
// CPU, or one CUDA device with OptimizerOptions().cuda(index, bundle_dir)). The optimizer borrows
// their storage for its lifetime (it keeps a reference to each tensor) and, at every step, takes
// each one's current .grad(): a parameter without one is not stepped, as in torch.optim. On CUDA
// the step runs on the current CUDA stream of the parameters' device (c10's device-generic stream
// API, so the same header builds against a CPU-only libtorch); step(stream) takes another.
//
// The step is the one luminamoon.LuminaMoon takes in Python with the same hyperparameters and seed
// (backend "cpu" on CPU, "aot" on CUDA): parameter k here is the k-th parameter over the groups in
// order, as Python numbers them. tests/test_torch_adapter.py holds the two to the bit.
//
// Errors are luminav::Error (luminav/error.h), naming the parameter, the value and the fix.
#pragma once

#include <c10/core/Device.h>
#include <c10/core/ScalarType.h>
#include <c10/core/Stream.h>
#include <c10/core/impl/VirtualGuardImpl.h>

#include <ATen/core/Tensor.h>

#include <cstddef>
#include <cstdint>
#include <string>
#include <utility>
#include <vector>

#include "luminav/luminav.hpp"

namespace luminav {

// One param group: its parameters and their hyperparameters.
struct TorchParamGroup {
  std::vector<at::Tensor> params;
  Hyperparams hyper;
};

// lv_dtype of a tensor's dtype; throws for any other.
inline lv_dtype torch_lv_dtype(c10::ScalarType t, const std::string& what) {
  switch (t) {
    case c10::ScalarType::Float: return LV_DTYPE_FLOAT32;
    case c10::ScalarType::BFloat16: return LV_DTYPE_BFLOAT16;
    case c10::ScalarType::Half: return LV_DTYPE_FLOAT16;
    default:
      throw Error(Status::kInvalidArgument, what + " has dtype " + std::string(c10::toString(t)) +
                                                 "; the engine steps float32, bfloat16 and float16 tensors: convert it "
                                                 "(.to(torch::kFloat32)) or keep it out of the optimizer");
  }
}

// The native handle (a CUstream) of the current stream of a CUDA device; null for the CPU.
inline void* torch_current_stream(const c10::Device& device) {
  if (!device.is_cuda()) return nullptr;
  c10::impl::VirtualGuardImpl guard(device.type());
  return guard.getStream(device).native_handle();
}

class TorchOptimizer {
 public:
  TorchOptimizer(std::vector<TorchParamGroup> groups, const OptimizerOptions& options = OptimizerOptions())
      : engine_(check_options(groups, options)) {
    for (std::size_t gi = 0; gi < groups.size(); ++gi) {
      const std::size_t g = engine_.add_group(groups[gi].hyper);
      const bool q8 = groups[gi].hyper.c.state_dtype == LV_DTYPE_Q8;
      for (std::size_t j = 0; j < groups[gi].params.size(); ++j) add(g, groups[gi].params[j], gi, j, q8);
    }
  }
  TorchOptimizer(std::vector<at::Tensor> params, const Hyperparams& hyper = Hyperparams(),
                 const OptimizerOptions& options = OptimizerOptions())
      : TorchOptimizer(std::vector<TorchParamGroup>{TorchParamGroup{std::move(params), hyper}}, options) {}

  TorchOptimizer(const TorchOptimizer&) = delete;
  TorchOptimizer& operator=(const TorchOptimizer&) = delete;

  // One step over every parameter that has a gradient, on the current CUDA stream (CUDA) or the
  // calling thread's workers (CPU).
  void step() { step(torch_current_stream(device_)); }
  // The same on `stream` (a CUstream / cudaStream_t of the parameters' device; ignored on CPU).
  void step(void* stream) {
    take_grads();
    engine_.step(stream);
  }

  // Drops every gradient (set_to_none, torch's default) or zeroes it in place.
  void zero_grad(bool set_to_none = true) {
    for (auto& p : params_) {
      at::Tensor& g = p.mutable_grad();
      if (!g.defined()) continue;
      if (set_to_none) {
        g.reset();
      } else {
        g.detach_();
        g.zero_();
      }
    }
  }

  void set_lr(std::size_t group, double lr) { engine_.set_lr(group, lr); }
  double lr(std::size_t group) const { return engine_.lr(group); }
  std::int64_t param_step(std::size_t k) const { return engine_.param_step(k); }
  std::int64_t skipped_steps() const { return engine_.skipped_steps(); }
  std::uint64_t seed() const { return engine_.seed(); }
  std::size_t num_params() const { return params_.size(); }
  const at::Tensor& param(std::size_t k) const { return params_.at(k); }
  const c10::Device& device() const { return device_; }
  std::vector<std::uint8_t> export_state() const { return engine_.export_state(); }
  void import_state(const std::vector<std::uint8_t>& bytes) { engine_.import_state(bytes); }
  // The C++ API optimizer underneath.
  Optimizer& engine() { return engine_; }

 private:
  // Runs before the engine is made: one device for every parameter, and options that match it.
  const OptimizerOptions& check_options(const std::vector<TorchParamGroup>& groups, const OptimizerOptions& options) {
    bool first = true;
    for (std::size_t gi = 0; gi < groups.size(); ++gi) {
      for (std::size_t j = 0; j < groups[gi].params.size(); ++j) {
        const at::Tensor& p = groups[gi].params[j];
        if (!p.defined()) throw Error(Status::kInvalidArgument, where(gi, j) + " is an undefined tensor");
        if (first) {
          device_ = p.device();
          first = false;
        } else if (p.device() != device_) {
          throw Error(Status::kInvalidArgument, where(gi, j) + " is on " + p.device().str() + " but the first is on " +
                                                    device_.str() + "; one optimizer steps the tensors of one device");
        }
      }
    }
    const bool cuda_options = options.c.device == LV_DEVICE_CUDA;
    if (device_.is_cuda()) {
      const int index = device_.has_index() ? device_.index() : 0;
      if (!cuda_options) {
        throw Error(Status::kInvalidArgument,
                    "the parameters are on " + device_.str() + " but the options are for the CPU; pass "
                    "luminav::OptimizerOptions().cuda(" + std::to_string(index) +
                    ", BUNDLE_DIR) with an AOT bundle (`luminamoon aot default` prints the one the wheel ships)");
      }
      if (options.c.device_index != index) {
        throw Error(Status::kInvalidArgument, "the parameters are on " + device_.str() + " but the options name CUDA device " +
                                                  std::to_string(options.c.device_index) + "; pass .cuda(" +
                                                  std::to_string(index) + ", BUNDLE_DIR)");
      }
    } else if (!device_.is_cpu()) {
      throw Error(Status::kInvalidArgument, "the parameters are on " + device_.str() + "; the engine steps CPU and CUDA tensors");
    } else if (cuda_options) {
      throw Error(Status::kInvalidArgument, "the options are for CUDA device " + std::to_string(options.c.device_index) +
                                                " but the parameters are on the CPU; leave out .cuda(...)");
    }
    return options;
  }

  static std::string where(std::size_t group, std::size_t j) {
    return "parameter " + std::to_string(j) + " of param group " + std::to_string(group);
  }

  // q8: every parameter of the group keeps q8 moments, in blocks of its rows as Python's
  // (a matrix of shape (d0, ...) as d0 rows of numel / d0 elements; 1-D: one row).
  void add(std::size_t g, const at::Tensor& p, std::size_t gi, std::size_t j, bool q8) {
    const std::string name = where(gi, j);
    if (!p.is_contiguous()) {
      throw Error(Status::kInvalidArgument, name + " is not contiguous (strides " + c10::str(p.strides()) +
                                                "); the engine updates flat storage: pass p.contiguous() as the parameter");
    }
    for (std::size_t k = 0; k < params_.size(); ++k) {
      if (params_[k].is_same(p)) throw Error(Status::kInvalidArgument, name + " is parameter " + std::to_string(k) + " again");
    }
    const lv_dtype dtype = torch_lv_dtype(p.scalar_type(), name);
    ParamRef ref(p.data_ptr(), dtype, nullptr, dtype, p.numel());
    if (q8 && p.dim() > 1 && p.size(0) > 0) ref.with_row_len(p.numel() / p.size(0));
    engine_.add_param(g, ref);
    params_.push_back(p);
    names_.push_back(name);
    data_ptrs_.push_back(p.data_ptr());
    grad_ptrs_.push_back(nullptr);
    held_grads_.emplace_back();
  }

  // Hands the engine each parameter's current gradient (only the addresses that changed).
  void take_grads() {
    for (std::size_t k = 0; k < params_.size(); ++k) {
      const at::Tensor& p = params_[k];
      if (p.data_ptr() != data_ptrs_[k]) {
        throw Error(Status::kStateError, names_[k] + " no longer lives where it did when the optimizer was made (its "
                                                     "storage was replaced, e.g. by set_data or a resize); make a new "
                                                     "TorchOptimizer for the new storage");
      }
      at::Tensor g = p.grad();
      const void* ptr = nullptr;
      if (g.defined()) {
        if (g.device() != p.device() || g.scalar_type() != p.scalar_type() || g.numel() != p.numel()) {
          throw Error(Status::kInvalidArgument, names_[k] + "'s gradient is " + std::string(c10::toString(g.scalar_type())) +
                                                    " of " + std::to_string(g.numel()) + " elements on " + g.device().str() +
                                                    "; it must match the parameter (" +
                                                    std::string(c10::toString(p.scalar_type())) + " of " +
                                                    std::to_string(p.numel()) + " elements on " + p.device().str() + ")");
        }
        if (g.is_sparse() || g.layout() != c10::kStrided) {
          throw Error(Status::kInvalidArgument, names_[k] + "'s gradient is sparse; the engine takes dense gradients");
        }
        if (!g.is_contiguous()) g = g.contiguous();  // kept until the next step
        ptr = g.data_ptr();
      }
      held_grads_[k] = g;
      if (ptr != grad_ptrs_[k]) {
        engine_.set_grad(k, ptr);
        grad_ptrs_[k] = ptr;
      }
    }
  }

  c10::Device device_{c10::kCPU};
  Optimizer engine_;
  std::vector<at::Tensor> params_;
  std::vector<std::string> names_;
  std::vector<const void*> data_ptrs_;
  std::vector<const void*> grad_ptrs_;
  std::vector<at::Tensor> held_grads_;  // the gradients the engine points at
};

}  // namespace luminav
