// src/c_api.cpp: the C API (luminav.h) over the engine (engine/engine.h)
//
// Exceptions become status codes in one place, `guarded`; handles are validated through a
// registry of live tokens.
#include "luminav/luminav.h"

#include <cstddef>
#include <cstdio>
#include <cstring>
#include <map>
#include <memory>
#include <mutex>
#include <new>
#include <string>

#include "aot/hip_driver.h"
#include "engine/engine.h"
#include "luminav/cuda_driver.h"
#include "luminav/error.h"
#include "luminav_version.h"

namespace {

using luminav::Error;
using luminav::Status;

thread_local std::string g_last_error;

// The one place where exceptions turn into status codes.
template <class Fn>
lv_status guarded(Fn&& fn) noexcept {
  try {
    fn();
    return LV_STATUS_OK;
  } catch (const Error& e) {
    g_last_error = e.what();
    return static_cast<lv_status>(static_cast<int>(e.status()));
  } catch (const std::bad_alloc&) {
    g_last_error = "out of host memory";
    return LV_STATUS_INTERNAL;
  } catch (const std::exception& e) {
    g_last_error = std::string("internal error: ") + e.what();
    return LV_STATUS_INTERNAL;
  } catch (...) {
    g_last_error = "internal error: unknown exception";
    return LV_STATUS_INTERNAL;
  }
}

[[noreturn]] void invalid(const std::string& msg) { throw Error(Status::kInvalidArgument, msg); }

template <class T>
void require_ptr(const T* p, const char* name) {
  if (!p) invalid(std::string(name) + " must not be null");
}

template <class T>
void check_struct_size(const T* s, const char* name) {
  if (s->struct_size < sizeof(T)) {
    invalid(std::string(name) + "->struct_size is " + std::to_string(s->struct_size) + ", expected " +
            std::to_string(sizeof(T)) + "; initialise it with its lv_*_init function");
  }
}

// A live optimizer: the engine and the lock that serialises calls on it.
struct Live {
  std::mutex mutex;
  std::unique_ptr<luminav::Engine> engine;
};

// Handles are tokens (id << 8 | 0xA5), never addresses: a stale token is recognised without
// touching freed memory, and ids are never reused.
constexpr std::uintptr_t kTokenTag = 0xA5;

std::mutex g_registry_mutex;
std::map<std::uintptr_t, std::shared_ptr<Live>>& registry() {
  static auto* r = new std::map<std::uintptr_t, std::shared_ptr<Live>>();  // never destroyed: safe at exit
  return *r;
}
std::uintptr_t g_next_id = 1;

std::shared_ptr<Live> lookup(const lv_optimizer* opt) {
  if (!opt) invalid("optimizer handle must not be null");
  const auto token = reinterpret_cast<std::uintptr_t>(opt);
  std::lock_guard<std::mutex> lock(g_registry_mutex);
  auto it = registry().find(token);
  if (it == registry().end()) {
    char buf[64];
    std::snprintf(buf, sizeof(buf), "%p", static_cast<const void*>(opt));
    throw Error(Status::kStateError, std::string("optimizer handle ") + buf +
                                         " is not live: it was destroyed or never created by lv_optimizer_create");
  }
  return it->second;
}

// Runs fn(engine) with the optimizer's lock held.
template <class Fn>
lv_status with_engine(const lv_optimizer* opt, Fn&& fn) noexcept {
  return guarded([&] {
    std::shared_ptr<Live> live = lookup(opt);
    std::lock_guard<std::mutex> lock(live->mutex);
    fn(*live->engine);
  });
}

luminav::Hyper to_hyper(const lv_hyperparams* h) {
  require_ptr(h, "hyper");
  check_struct_size(h, "hyper");
  luminav::Hyper out;
  out.lr = h->lr;
  out.beta1 = h->beta1;
  out.beta2 = h->beta2;
  out.eps = h->eps;
  out.weight_decay = h->weight_decay;
  out.clip = h->clip;
  out.bound_mode = luminav::bound_mode_from_int(h->bound_mode);
  out.bound = h->bound;
  if (h->maximize != 0 && h->maximize != 1) invalid("maximize must be 0 or 1, got " + std::to_string(h->maximize));
  out.maximize = h->maximize != 0;
  out.nonfinite = luminav::nonfinite_from_int(h->nonfinite);
  if (h->stochastic_rounding != 0 && h->stochastic_rounding != 1) {
    invalid("stochastic_rounding must be 0 or 1, got " + std::to_string(h->stochastic_rounding));
  }
  out.stochastic_rounding = h->stochastic_rounding != 0;
  out.state_dtype = luminav::state_dtype_from_int(h->state_dtype);
  luminav::validate_hyper(out);
  return out;
}

}  // namespace

extern "C" {

uint32_t lv_api_version(void) { return LV_API_VERSION; }

const char* lv_version_string(void) { return LUMINAV_VERSION_STRING; }

const char* lv_last_error(void) { return g_last_error.c_str(); }

const char* lv_status_string(lv_status status) {
  switch (status) {
    case LV_STATUS_OK: return "LV_STATUS_OK";
    case LV_STATUS_INVALID_ARGUMENT: return "LV_STATUS_INVALID_ARGUMENT";
    case LV_STATUS_BUNDLE_ERROR: return "LV_STATUS_BUNDLE_ERROR";
    case LV_STATUS_DRIVER_ERROR: return "LV_STATUS_DRIVER_ERROR";
    case LV_STATUS_NOT_FOUND: return "LV_STATUS_NOT_FOUND";
    case LV_STATUS_STATE_ERROR: return "LV_STATUS_STATE_ERROR";
    case LV_STATUS_NON_FINITE: return "LV_STATUS_NON_FINITE";
    case LV_STATUS_INTERNAL: return "LV_STATUS_INTERNAL";
  }
  return "LV_STATUS_UNKNOWN";
}

int lv_cuda_driver_available(void) { return luminav::cuda_driver_available() ? 1 : 0; }

int lv_hip_runtime_available(void) { return luminav::hip_driver_available() ? 1 : 0; }

lv_status lv_optimizer_options_init(lv_optimizer_options* options) {
  return guarded([&] {
    require_ptr(options, "options");
    std::memset(options, 0, sizeof(*options));
    options->struct_size = sizeof(*options);
    options->device = LV_DEVICE_CPU;
  });
}

lv_status lv_hyperparams_init(lv_hyperparams* hyper) {
  return guarded([&] {
    require_ptr(hyper, "hyper");
    const luminav::Hyper d;
    std::memset(hyper, 0, sizeof(*hyper));
    hyper->struct_size = sizeof(*hyper);
    hyper->lr = d.lr;
    hyper->beta1 = d.beta1;
    hyper->beta2 = d.beta2;
    hyper->eps = d.eps;
    hyper->weight_decay = d.weight_decay;
    hyper->clip = d.clip;
    hyper->bound_mode = static_cast<int32_t>(d.bound_mode);
    hyper->bound = d.bound;
    hyper->maximize = d.maximize ? 1 : 0;
    hyper->nonfinite = static_cast<int32_t>(d.nonfinite);
    hyper->stochastic_rounding = d.stochastic_rounding ? 1 : 0;
    hyper->state_dtype = static_cast<int32_t>(d.state_dtype);
  });
}

lv_status lv_param_desc_init(lv_param_desc* desc) {
  return guarded([&] {
    require_ptr(desc, "desc");
    std::memset(desc, 0, sizeof(*desc));
    desc->struct_size = sizeof(*desc);
  });
}

lv_status lv_optimizer_create(const lv_optimizer_options* options, lv_optimizer** out) {
  return guarded([&] {
    require_ptr(options, "options");
    require_ptr(out, "out");
    // The first release's options ended at bundle_dir; `arch` is read only where struct_size
    // covers it.
    constexpr std::size_t kOptionsV1 = offsetof(lv_optimizer_options, arch);
    if (options->struct_size < kOptionsV1) check_struct_size(options, "options");
    const bool has_arch = options->struct_size >= sizeof(lv_optimizer_options);
    luminav::EngineOptions eo;
    if (options->device != LV_DEVICE_CPU && options->device != LV_DEVICE_CUDA && options->device != LV_DEVICE_HIP) {
      invalid("device must be LV_DEVICE_CPU (0), LV_DEVICE_CUDA (1) or LV_DEVICE_HIP (2), got " +
              std::to_string(options->device));
    }
    if (options->device == LV_DEVICE_HIP && !has_arch) {
      invalid("options->struct_size is " + std::to_string(options->struct_size) + ", which has no arch field; " +
              "LV_DEVICE_HIP needs it: initialise options with lv_optimizer_options_init");
    }
    if (has_arch && options->arch) eo.arch = options->arch;
    eo.device = static_cast<luminav::DeviceType>(options->device);
    eo.device_index = options->device_index;
    eo.num_threads = options->num_threads;
    eo.seed = options->seed;
    if (options->bundle_dir) eo.bundle_dir = options->bundle_dir;
    auto live = std::make_shared<Live>();
    live->engine = std::make_unique<luminav::Engine>(eo);
    std::lock_guard<std::mutex> lock(g_registry_mutex);
    const std::uintptr_t token = (g_next_id++ << 8) | kTokenTag;
    registry().emplace(token, std::move(live));
    *out = reinterpret_cast<lv_optimizer*>(token);
  });
}

lv_status lv_optimizer_destroy(lv_optimizer* opt) {
  return guarded([&] {
    std::shared_ptr<Live> live = lookup(opt);
    {
      std::lock_guard<std::mutex> lock(g_registry_mutex);
      registry().erase(reinterpret_cast<std::uintptr_t>(opt));
    }
    // Wait for a call in flight on another thread, then free with the lock released.
    std::unique_ptr<luminav::Engine> engine;
    {
      std::lock_guard<std::mutex> lock(live->mutex);
      engine = std::move(live->engine);
    }
  });
}

lv_status lv_optimizer_add_group(lv_optimizer* opt, const lv_hyperparams* hyper, size_t* out_group) {
  return with_engine(opt, [&](luminav::Engine& e) {
    const luminav::Hyper h = to_hyper(hyper);
    const std::size_t g = e.add_group(h);
    if (out_group) *out_group = g;
  });
}

lv_status lv_optimizer_add_param(lv_optimizer* opt, size_t group, const lv_param_desc* desc, size_t* out_index) {
  return with_engine(opt, [&](luminav::Engine& e) {
    require_ptr(desc, "desc");
    // The first release's desc ended at p_init; the q8 fields are read only where struct_size
    // covers them.
    constexpr std::size_t kDescV1 = offsetof(lv_param_desc, exp_avg_scale);
    if (desc->struct_size < kDescV1) check_struct_size(desc, "desc");
    const bool has_q8 = desc->struct_size >= sizeof(lv_param_desc);
    luminav::ParamDesc d;
    d.data = desc->data;
    d.dtype = luminav::dtype_from_int(desc->dtype, "desc->dtype");
    d.grad = desc->grad;
    d.grad_dtype = luminav::dtype_from_int(desc->grad_dtype, "desc->grad_dtype");
    d.numel = desc->numel;
    d.exp_avg = desc->exp_avg;
    d.exp_avg_sq = desc->exp_avg_sq;
    d.p_init = desc->p_init;
    if (has_q8) {
      d.exp_avg_scale = static_cast<float*>(desc->exp_avg_scale);
      d.exp_avg_sq_scale = static_cast<float*>(desc->exp_avg_sq_scale);
      d.scale_numel = desc->scale_numel;
      d.row_len = desc->row_len;
    }
    const std::size_t k = e.add_param(group, d);
    if (out_index) *out_index = k;
  });
}

lv_status lv_optimizer_set_grad(lv_optimizer* opt, size_t index, const void* grad) {
  return with_engine(opt, [&](luminav::Engine& e) { e.set_grad(index, grad); });
}

lv_status lv_optimizer_set_lr(lv_optimizer* opt, size_t group, double lr) {
  return with_engine(opt, [&](luminav::Engine& e) { e.set_lr(group, lr); });
}

lv_status lv_optimizer_get_lr(const lv_optimizer* opt, size_t group, double* out_lr) {
  return with_engine(opt, [&](luminav::Engine& e) {
    require_ptr(out_lr, "out_lr");
    *out_lr = e.lr(group);
  });
}

lv_status lv_optimizer_step(lv_optimizer* opt, void* stream) {
  return with_engine(opt, [&](luminav::Engine& e) { e.step(stream); });
}

lv_status lv_optimizer_get_param_step(const lv_optimizer* opt, size_t index, int64_t* out_step) {
  return with_engine(opt, [&](luminav::Engine& e) {
    require_ptr(out_step, "out_step");
    *out_step = e.param_step(index);
  });
}

lv_status lv_optimizer_get_skipped_steps(const lv_optimizer* opt, int64_t* out_skipped) {
  return with_engine(opt, [&](luminav::Engine& e) {
    require_ptr(out_skipped, "out_skipped");
    *out_skipped = e.skipped_steps();
  });
}

lv_status lv_optimizer_get_seed(const lv_optimizer* opt, uint64_t* out_seed) {
  return with_engine(opt, [&](luminav::Engine& e) {
    require_ptr(out_seed, "out_seed");
    *out_seed = e.seed();
  });
}

lv_status lv_optimizer_get_num_params(const lv_optimizer* opt, size_t* out_count) {
  return with_engine(opt, [&](luminav::Engine& e) {
    require_ptr(out_count, "out_count");
    *out_count = e.num_params();
  });
}

lv_status lv_optimizer_export_state(const lv_optimizer* opt, void* buffer, size_t capacity, size_t* out_size) {
  return with_engine(opt, [&](luminav::Engine& e) {
    require_ptr(out_size, "out_size");
    if (capacity > 0 && !buffer) invalid("buffer must not be null when capacity > 0");
    const std::vector<std::uint8_t> bytes = e.export_state();
    *out_size = bytes.size();
    if (capacity == 0) return;  // size query
    if (capacity < bytes.size()) {
      invalid("export buffer too small: capacity " + std::to_string(capacity) + " bytes, the state needs " +
              std::to_string(bytes.size()) + "; call with capacity 0 first to get the size");
    }
    std::memcpy(buffer, bytes.data(), bytes.size());
  });
}

lv_status lv_optimizer_import_state(lv_optimizer* opt, const void* buffer, size_t size) {
  return with_engine(opt, [&](luminav::Engine& e) {
    require_ptr(buffer, "buffer");
    e.import_state(static_cast<const std::uint8_t*>(buffer), size);
  });
}

}  // extern "C"
