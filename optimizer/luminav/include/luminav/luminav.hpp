// include/luminav/luminav.hpp: the C++ API, a header-only RAII layer over the C API (luminav.h)
//
// It throws luminav::Error (luminav/error.h) carrying the C status and lv_last_error().
//
//   luminav::Optimizer opt(luminav::OptimizerOptions{}.threads(4).with_seed(7));
//   auto g = opt.add_group(luminav::Hyperparams{}.with_lr(1e-2).with_clip(4.0));
//   auto k = opt.add_param(g, luminav::ParamRef::f32(w.data(), grad.data(), w.size()));
//   opt.step();
//   std::vector<uint8_t> ckpt = opt.export_state();
#pragma once

#include <cstdint>
#include <string>
#include <utility>
#include <vector>

#include "luminav/error.h"
#include "luminav/luminav.h"

namespace luminav {

// Throws luminav::Error for a non-OK status, with the thread's last error message.
inline void throw_if_error(lv_status status) {
  if (status != LV_STATUS_OK) throw Error(static_cast<Status>(static_cast<int>(status)), lv_last_error());
}

// Refuses a library built for another API version (checked once, when the first Optimizer is made).
inline void check_api_version() {
  const std::uint32_t lib = lv_api_version();
  if (lib != LV_API_VERSION) {
    throw Error(Status::kStateError, "libluminav has API version " + std::to_string(lib) +
                                         " but this program was compiled against luminav.h version " +
                                         std::to_string(LV_API_VERSION) + "; rebuild it against the installed headers");
  }
}

struct Hyperparams {
  lv_hyperparams c;
  Hyperparams() { throw_if_error(lv_hyperparams_init(&c)); }
  Hyperparams& with_lr(double v) { c.lr = v; return *this; }
  Hyperparams& with_betas(double b1, double b2) { c.beta1 = b1; c.beta2 = b2; return *this; }
  Hyperparams& with_eps(double v) { c.eps = v; return *this; }
  Hyperparams& with_weight_decay(double v) { c.weight_decay = v; return *this; }
  Hyperparams& with_clip(double v) { c.clip = v; return *this; }
  Hyperparams& with_bound(lv_bound_mode mode, double size) { c.bound_mode = mode; c.bound = size; return *this; }
  Hyperparams& with_maximize(bool v) { c.maximize = v ? 1 : 0; return *this; }
  Hyperparams& with_nonfinite(lv_nonfinite v) { c.nonfinite = v; return *this; }
  Hyperparams& with_stochastic_rounding(bool v) { c.stochastic_rounding = v ? 1 : 0; return *this; }
  Hyperparams& with_state_dtype(lv_dtype v) { c.state_dtype = v; return *this; }
};

struct OptimizerOptions {
  lv_optimizer_options c;
  std::string bundle;  // kept alive for lv_optimizer_create
  std::string arch;    // kept alive for lv_optimizer_create (HIP)
  OptimizerOptions() { throw_if_error(lv_optimizer_options_init(&c)); }
  OptimizerOptions& threads(int n) { c.num_threads = n; return *this; }
  OptimizerOptions& with_seed(std::uint64_t s) { c.seed = s; return *this; }
  OptimizerOptions& cuda(int device_index, std::string bundle_dir) {
    c.device = LV_DEVICE_CUDA;
    c.device_index = device_index;
    bundle = std::move(bundle_dir);
    return *this;
  }
  // An AMD device: `arch` as lv_optimizer_options.arch ("gfx942" or the gcnArchName).
  OptimizerOptions& hip(int device_index, std::string bundle_dir, std::string device_arch) {
    c.device = LV_DEVICE_HIP;
    c.device_index = device_index;
    bundle = std::move(bundle_dir);
    arch = std::move(device_arch);
    return *this;
  }
};

// A parameter as the C API sees it (pointers borrowed as lv_param_desc documents).
struct ParamRef {
  lv_param_desc c;
  ParamRef() { throw_if_error(lv_param_desc_init(&c)); }
  ParamRef(void* data, lv_dtype dtype, const void* grad, lv_dtype grad_dtype, std::int64_t numel) : ParamRef() {
    c.data = data;
    c.dtype = dtype;
    c.grad = grad;
    c.grad_dtype = grad_dtype;
    c.numel = numel;
  }
  static ParamRef f32(float* data, const float* grad, std::int64_t numel) {
    return ParamRef(data, LV_DTYPE_FLOAT32, grad, LV_DTYPE_FLOAT32, numel);
  }
  ParamRef& with_state(void* exp_avg, void* exp_avg_sq, void* p_init = nullptr) {
    c.exp_avg = exp_avg;
    c.exp_avg_sq = exp_avg_sq;
    c.p_init = p_init;
    return *this;
  }
  // q8 moments (a group of state_dtype LV_DTYPE_Q8): the elements of a block row (0: numel).
  ParamRef& with_row_len(std::int64_t row_len) {
    c.row_len = row_len;
    return *this;
  }
  // q8 moments lent by the caller: uint8 codes (set to 128 and 0) and float32 block scales
  // (zeroed), scale_numel of each (numel / row_len * ceil(row_len / 256)).
  ParamRef& with_q8_state(std::uint8_t* exp_avg, float* exp_avg_scale, std::uint8_t* exp_avg_sq,
                          float* exp_avg_sq_scale, std::int64_t scale_numel) {
    c.exp_avg = exp_avg;
    c.exp_avg_scale = exp_avg_scale;
    c.exp_avg_sq = exp_avg_sq;
    c.exp_avg_sq_scale = exp_avg_sq_scale;
    c.scale_numel = scale_numel;
    return *this;
  }
};

class Optimizer {
 public:
  explicit Optimizer(const OptimizerOptions& options = OptimizerOptions()) {
    static const bool version_ok = (check_api_version(), true);
    (void)version_ok;
    lv_optimizer_options o = options.c;
    o.bundle_dir = options.bundle.empty() ? options.c.bundle_dir : options.bundle.c_str();
    o.arch = options.arch.empty() ? options.c.arch : options.arch.c_str();
    throw_if_error(lv_optimizer_create(&o, &handle_));
  }
  ~Optimizer() {
    if (handle_) lv_optimizer_destroy(handle_);
  }
  Optimizer(const Optimizer&) = delete;
  Optimizer& operator=(const Optimizer&) = delete;
  Optimizer(Optimizer&& o) noexcept : handle_(std::exchange(o.handle_, nullptr)) {}
  Optimizer& operator=(Optimizer&& o) noexcept {
    if (this != &o) {
      if (handle_) lv_optimizer_destroy(handle_);
      handle_ = std::exchange(o.handle_, nullptr);
    }
    return *this;
  }

  lv_optimizer* handle() const noexcept { return handle_; }

  std::size_t add_group(const Hyperparams& h) {
    std::size_t g = 0;
    throw_if_error(lv_optimizer_add_group(handle_, &h.c, &g));
    return g;
  }
  std::size_t add_param(std::size_t group, const ParamRef& p) {
    std::size_t k = 0;
    throw_if_error(lv_optimizer_add_param(handle_, group, &p.c, &k));
    return k;
  }
  void set_grad(std::size_t k, const void* grad) { throw_if_error(lv_optimizer_set_grad(handle_, k, grad)); }
  void set_lr(std::size_t group, double lr) { throw_if_error(lv_optimizer_set_lr(handle_, group, lr)); }
  double lr(std::size_t group) const {
    double v = 0;
    throw_if_error(lv_optimizer_get_lr(handle_, group, &v));
    return v;
  }
  void step(void* stream = nullptr) { throw_if_error(lv_optimizer_step(handle_, stream)); }
  std::int64_t param_step(std::size_t k) const {
    std::int64_t v = 0;
    throw_if_error(lv_optimizer_get_param_step(handle_, k, &v));
    return v;
  }
  std::int64_t skipped_steps() const {
    std::int64_t v = 0;
    throw_if_error(lv_optimizer_get_skipped_steps(handle_, &v));
    return v;
  }
  std::uint64_t seed() const {
    std::uint64_t v = 0;
    throw_if_error(lv_optimizer_get_seed(handle_, &v));
    return v;
  }
  std::size_t num_params() const {
    std::size_t v = 0;
    throw_if_error(lv_optimizer_get_num_params(handle_, &v));
    return v;
  }
  std::vector<std::uint8_t> export_state() const {
    std::size_t n = 0;
    throw_if_error(lv_optimizer_export_state(handle_, nullptr, 0, &n));
    std::vector<std::uint8_t> out(n);
    throw_if_error(lv_optimizer_export_state(handle_, out.data(), out.size(), &n));
    return out;
  }
  void import_state(const std::vector<std::uint8_t>& bytes) {
    throw_if_error(lv_optimizer_import_state(handle_, bytes.data(), bytes.size()));
  }

 private:
  lv_optimizer* handle_ = nullptr;
};

}  // namespace luminav
