// src/engine/engine.cpp: the optimizer object: param groups, state allocated or borrowed, the
// launch groups of a step and the order of its work
//
// The per-element work is in cpu_kernels.cpp (CPU, through cpu_device.cpp) and the AOT
// bundle's kernels (CUDA or HIP, gpu_device.cpp); state export and import are in state_io.cpp.
#include <algorithm>
#include <cstddef>
#include <cstring>
#include <limits>
#include <map>
#include <string>
#include <tuple>
#include <vector>

#include "engine/cpu_quant.h"
#include "engine/device.h"
#include "engine/engine.h"
#include "engine/engine_impl.h"

namespace luminav {

namespace engine_detail {

std::string nonfinite_message(const LaunchGroup& group, std::size_t row) {
  return "nonfinite='raise': the gradient of parameter " + std::to_string(group.rows[row].param_index) +
         " (param group " + std::to_string(group.user_group) +
         ") has a non-finite element; the step changed nothing. Fix the gradient, or use "
         "nonfinite='skip' to skip such steps";
}

}  // namespace engine_detail

using engine_detail::Device;
using engine_detail::LaunchGroup;

namespace {

// `bytes` of `value` at device address `dst` (through host chunks of at most 1 MiB).
void fill_bytes(Device& d, void* dst, std::uint8_t value, std::size_t bytes) {
  const std::vector<std::uint8_t> chunk(std::min<std::size_t>(bytes, std::size_t{1} << 20), value);
  for (std::size_t off = 0; off < bytes; off += chunk.size()) {
    d.from_host(static_cast<std::uint8_t*>(dst) + off, chunk.data(), std::min(chunk.size(), bytes - off));
  }
}

[[noreturn]] void refuse(const std::string& msg) { throw Error(Status::kInvalidArgument, msg); }

// A parameter's q8 fields against its group's state dtype: all zero unless q8; under q8 a block
// row that divides numel, each moment's codes and scales lent together, and scale_numel equal to
// the blocks the scales hold. Returns the q8 blocks of each moment (0 unless q8).
std::int64_t check_q8_desc(std::size_t k, const ParamDesc& d, DType state_dtype) {
  const std::string who = "parameter " + std::to_string(k);
  if (state_dtype != DType::kQ8) {
    if (d.exp_avg_scale || d.exp_avg_sq_scale || d.scale_numel || d.row_len) {
      refuse(who + ": q8 scales, scale_numel or row_len given, but its group's state_dtype is " +
             dtype_name(state_dtype) + "; leave them 0/null, or add the parameter to a group of state_dtype q8 (3)");
    }
    return 0;
  }
  if (d.row_len < 0) refuse(who + ": row_len must be >= 0 (0: one row of numel), got " + std::to_string(d.row_len));
  const std::int64_t row_len = d.row_len > 0 ? d.row_len : std::max<std::int64_t>(d.numel, 1);
  if (d.numel % row_len != 0) {
    refuse(who + ": row_len " + std::to_string(row_len) + " does not divide numel " + std::to_string(d.numel) +
           "; pass the elements of one row (numel / shape[0]), or 0 for one row");
  }
  const std::int64_t blocks = cpu::quant::num_blocks(d.numel, row_len);
  const char* names[2][2] = {{"exp_avg", "exp_avg_scale"}, {"exp_avg_sq", "exp_avg_sq_scale"}};
  const bool codes[2] = {d.exp_avg != nullptr, d.exp_avg_sq != nullptr};
  const bool scales[2] = {d.exp_avg_scale != nullptr, d.exp_avg_sq_scale != nullptr};
  for (int i = 0; i < 2; ++i) {
    if (codes[i] != scales[i]) {
      refuse(who + ": q8 " + names[i][codes[i] ? 1 : 0] + " is null but " + names[i][codes[i] ? 0 : 1] +
             " is lent; lend a moment's codes and scales together, or neither (the optimizer allocates both)");
    }
  }
  if (scales[0] || scales[1]) {
    if (d.scale_numel != blocks) {
      refuse(who + ": the lent q8 scales must hold " + std::to_string(blocks) + " float32 values each (numel " +
             std::to_string(d.numel) + " in rows of " + std::to_string(row_len) + ", ceil(row_len / 256) blocks a row), " +
             "scale_numel is " + std::to_string(d.scale_numel) + "; lend buffers of that size and set scale_numel");
    }
  } else if (d.scale_numel != 0) {
    refuse(who + ": scale_numel is " + std::to_string(d.scale_numel) + " but no q8 scales are lent; leave it 0");
  }
  return blocks;
}

}  // namespace

Engine::Impl::~Impl() {
  if (!device) return;
  for (auto& p : params) {
    if (p.own_m) device->release(p.m);
    if (p.own_v) device->release(p.v);
    if (p.own_p0) device->release(p.p0);
    if (p.own_sm) device->release(p.sm);
    if (p.own_sv) device->release(p.sv);
  }
  if (steps) device->release(steps);
}

Engine::Impl::Param& Engine::Impl::param(std::size_t k) {
  if (k >= params.size()) {
    throw Error(Status::kInvalidArgument, "parameter index " + std::to_string(k) + " is out of range: the optimizer has " +
                                              std::to_string(params.size()) + " parameters");
  }
  return params[k];
}

Engine::Impl::Group& Engine::Impl::group(std::size_t g) {
  if (g >= groups.size()) {
    throw Error(Status::kInvalidArgument, "param group " + std::to_string(g) + " is out of range: the optimizer has " +
                                              std::to_string(groups.size()) + " groups");
  }
  return groups[g];
}

void Engine::Impl::reserve_steps(std::size_t n) {
  if (n <= steps_capacity) return;
  const std::size_t cap = std::max<std::size_t>(n, steps_capacity * 2 + 8);
  std::vector<std::int64_t> host(steps_capacity, 0);
  if (steps) device->to_host(host.data(), steps, steps_capacity * sizeof(std::int64_t));
  host.resize(cap, 0);
  auto* fresh = static_cast<std::int64_t*>(device->alloc(cap * sizeof(std::int64_t)));
  device->from_host(fresh, host.data(), cap * sizeof(std::int64_t));
  if (steps) device->release(steps);
  steps = fresh;
  steps_capacity = cap;
  dirty = true;
}

void Engine::Impl::rebuild() {
  launch.clear();
  for (std::size_t gi = 0; gi < groups.size(); ++gi) {
    const Group& g = groups[gi];
    // Launch groups inside a param group, by (param dtype, grad dtype), in parameter order.
    std::map<std::pair<int, int>, std::size_t> index;
    for (std::size_t k : g.params) {
      const Param& p = params[k];
      if (!p.desc.grad) continue;  // like torch.optim: a parameter without a gradient is left alone
      const auto key = std::make_pair(static_cast<int>(p.desc.dtype), static_cast<int>(p.desc.grad_dtype));
      auto it = index.find(key);
      if (it == index.end()) {
        LaunchGroup lg;
        lg.user_group = gi;
        lg.cfg.param_dtype = p.desc.dtype;
        lg.cfg.grad_dtype = p.desc.grad_dtype;
        lg.cfg.state_dtype = g.hyper.state_dtype;
        lg.cfg.hyper = g.hyper;
        it = index.emplace(key, launch.size()).first;
        launch.push_back(std::move(lg));
      }
      TensorRow row;
      row.param = p.desc.data;
      row.grad = p.desc.grad;
      row.exp_avg = p.m;
      row.exp_avg_sq = p.v;
      row.p_init = g.hyper.bound_mode == BoundMode::kNone ? nullptr : p.p0;
      row.step = steps + k;
      row.numel = p.desc.numel;
      row.elem_offset = 0;
      row.param_index = static_cast<std::int64_t>(k);
      row.global_numel = p.desc.numel;
      row.scale_m = p.sm;
      row.scale_v = p.sv;
      row.row_len = p.row_len;
      launch[it->second].rows.push_back(row);
    }
  }
  dirty = false;
}

Engine::Engine(const EngineOptions& options) : impl_(std::make_unique<Impl>()) {
  impl_->options = options;
  impl_->seed = options.seed;
  if (options.device == DeviceType::kCpu) {
    if (options.num_threads < 0) {
      throw Error(Status::kInvalidArgument,
                  "num_threads must be >= 0 (0 = one per hardware thread), got " + std::to_string(options.num_threads));
    }
    impl_->device = engine_detail::make_cpu_device(options.num_threads);
  } else if (options.device == DeviceType::kCuda) {
    if (options.device_index < 0) {
      throw Error(Status::kInvalidArgument, "device_index must be >= 0, got " + std::to_string(options.device_index));
    }
    if (options.bundle_dir.empty()) {
      throw Error(Status::kInvalidArgument,
                  "the CUDA device needs an AOT bundle: set bundle_dir to a folder built with "
                  "`luminamoon aot build --arch <major><minor>`");
    }
    impl_->device = engine_detail::make_cuda_device(options.device_index, options.bundle_dir, options.cuda_graph);
  } else if (options.device == DeviceType::kHip) {
    if (options.device_index < 0) {
      throw Error(Status::kInvalidArgument, "device_index must be >= 0, got " + std::to_string(options.device_index));
    }
    if (options.bundle_dir.empty()) {
      throw Error(Status::kInvalidArgument,
                  "the HIP device needs an AOT bundle: set bundle_dir to a folder built with "
                  "`luminamoon aot build --arch <gfx arch>`, e.g. --arch gfx942");
    }
    impl_->device = engine_detail::make_hip_device(options.device_index, options.bundle_dir, options.arch);
  } else {
    throw Error(Status::kInvalidArgument, "device must be 0 (cpu), 1 (cuda) or 2 (hip), got " +
                                              std::to_string(static_cast<int>(options.device)));
  }
}

Engine::~Engine() = default;

std::size_t Engine::add_group(const Hyper& hyper) {
  validate_hyper(hyper);
  impl_->groups.push_back(Impl::Group{hyper, {}});
  impl_->dirty = true;
  return impl_->groups.size() - 1;
}

std::size_t Engine::add_param(std::size_t group, const ParamDesc& desc) {
  Impl& s = *impl_;
  Impl::Group& g = s.group(group);
  const std::size_t k = s.params.size();
  // Validate everything before allocating anything.
  (void)dtype_from_int(static_cast<int>(desc.dtype), "param dtype");
  (void)dtype_from_int(static_cast<int>(desc.grad_dtype), "grad dtype");
  if (desc.numel < 0) {
    throw Error(Status::kInvalidArgument, "numel of parameter " + std::to_string(k) + " must be >= 0, got " +
                                              std::to_string(desc.numel));
  }
  // Every byte count (numel times an element size) must fit a ptrdiff_t: a larger numel would
  // wrap the counts the engine allocates and copies (numel = 2^62 makes numel * 4 zero).
  const DType widest = std::max({desc.dtype, desc.grad_dtype, g.hyper.state_dtype},
                                [](DType a, DType b) { return dtype_size(a) < dtype_size(b); });
  const std::int64_t max_numel =
      std::numeric_limits<std::ptrdiff_t>::max() / static_cast<std::int64_t>(dtype_size(widest));
  if (desc.numel > max_numel) {
    throw Error(Status::kInvalidArgument, "numel of parameter " + std::to_string(k) + " is " +
                                              std::to_string(desc.numel) + ": its " + dtype_name(widest) +
                                              " storage, " + std::to_string(dtype_size(widest)) +
                                              " bytes per element, needs more than 2^63-1 bytes; numel must be <= " +
                                              std::to_string(max_numel));
  }
  if (desc.numel > 0 && !desc.data) {
    throw Error(Status::kInvalidArgument, "parameter " + std::to_string(k) + " has numel " + std::to_string(desc.numel) +
                                              " but a null data pointer; pass its storage");
  }
  const std::int64_t q8_blocks = check_q8_desc(k, desc, g.hyper.state_dtype);
  Impl::Param p;
  p.group = group;
  p.desc = desc;
  if (g.hyper.state_dtype == DType::kQ8) p.row_len = desc.row_len > 0 ? desc.row_len : std::max<std::int64_t>(desc.numel, 1);
  const std::size_t state_bytes = static_cast<std::size_t>(desc.numel) * dtype_size(g.hyper.state_dtype);
  const std::size_t param_bytes = static_cast<std::size_t>(desc.numel) * dtype_size(desc.dtype);
  const bool bounded = g.hyper.bound_mode != BoundMode::kNone;
  s.reserve_steps(k + 1);
  struct Guard {  // frees what this call allocated if a later allocation throws
    Device* d;
    Impl::Param* p;
    bool armed = true;
    ~Guard() {
      if (!armed) return;
      if (p->own_m) d->release(p->m);
      if (p->own_v) d->release(p->v);
      if (p->own_p0) d->release(p->p0);
      if (p->own_sm) d->release(p->sm);
      if (p->own_sv) d->release(p->sv);
    }
  } guard{s.device.get(), &p};
  if (desc.numel > 0) {
    if (desc.exp_avg) {
      p.m = desc.exp_avg;
    } else {
      p.m = s.device->alloc(state_bytes);
      p.own_m = true;
      // q8: a fresh m holds its zero code (128); alloc zero-fills, which is v's zero code
      if (g.hyper.state_dtype == DType::kQ8) fill_bytes(*s.device, p.m, cpu::quant::kZeroCodeM, state_bytes);
    }
    if (desc.exp_avg_sq) {
      p.v = desc.exp_avg_sq;
    } else {
      p.v = s.device->alloc(state_bytes);
      p.own_v = true;
    }
    if (g.hyper.state_dtype == DType::kQ8) {
      const std::size_t scale_bytes = static_cast<std::size_t>(q8_blocks) * sizeof(float);
      p.sm = desc.exp_avg_scale ? desc.exp_avg_scale : static_cast<float*>(s.device->alloc(scale_bytes));
      p.own_sm = desc.exp_avg_scale == nullptr;
      p.sv = desc.exp_avg_sq_scale ? desc.exp_avg_sq_scale : static_cast<float*>(s.device->alloc(scale_bytes));
      p.own_sv = desc.exp_avg_sq_scale == nullptr;
    }
    if (bounded) {
      if (desc.p_init) {
        p.p0 = desc.p_init;
      } else {
        p.p0 = s.device->alloc(param_bytes);
        p.own_p0 = true;
      }
    }
  }
  s.params.push_back(p);
  guard.armed = false;
  g.params.push_back(k);
  s.dirty = true;
  return k;
}

void Engine::set_grad(std::size_t k, const void* grad) {
  Impl::Param& p = impl_->param(k);
  if ((p.desc.grad == nullptr) != (grad == nullptr)) impl_->dirty = true;
  if (p.desc.grad != grad) {
    p.desc.grad = grad;
    impl_->dirty = true;
  }
}

void Engine::set_lr(std::size_t group, double lr) {
  Impl::Group& g = impl_->group(group);
  validate_lr(lr);
  g.hyper.lr = lr;
}

double Engine::lr(std::size_t group) const { return impl_->group(group).hyper.lr; }

void Engine::step(void* stream) {
  Impl& s = *impl_;
  if (s.dirty) s.rebuild();
  for (auto& lg : s.launch) {
    lg.cfg.seed = s.seed;
    lg.lr = static_cast<float>(s.groups[lg.user_group].hyper.lr);
  }
  // Kernels and tables first: a bundle or device that cannot run the step refuses it before
  // anything is enqueued.
  s.device->prepare(s.launch);
  // A refused step (nonfinite='raise') changes nothing: the check runs before any write.
  bool raise_policy = false;
  for (auto& lg : s.launch) raise_policy = raise_policy || lg.cfg.hyper.nonfinite == NonFinite::kRaise;
  if (raise_policy) s.device->check_nonfinite(s.launch, stream);
  // p_init: a copy of p taken before its first update. Taking it at a step that is then skipped
  // is harmless (p is unchanged then).
  std::vector<std::size_t> fresh;
  for (std::size_t k = 0; k < s.params.size(); ++k) {
    Impl::Param& p = s.params[k];
    if (p.p0 && !p.p0_ready && p.desc.grad && p.desc.numel > 0) fresh.push_back(k);
  }
  for (std::size_t k : fresh) {
    Impl::Param& p = s.params[k];
    s.device->copy(p.p0, p.desc.data, static_cast<std::size_t>(p.desc.numel) * dtype_size(p.desc.dtype), stream);
  }
  s.device->step(s.launch, stream);
  for (std::size_t k : fresh) s.params[k].p0_ready = true;
}

std::size_t Engine::num_groups() const { return impl_->groups.size(); }
std::size_t Engine::num_params() const { return impl_->params.size(); }

std::int64_t Engine::param_step(std::size_t k) const {
  impl_->param(k);
  std::int64_t v = 0;
  impl_->device->to_host(&v, impl_->steps + k, sizeof(v));
  return v;
}

std::int64_t Engine::skipped_steps() const { return impl_->device->skipped(); }
std::uint64_t Engine::seed() const { return impl_->seed; }
DeviceType Engine::device() const { return impl_->device->type(); }
int Engine::num_threads() const { return impl_->device->num_threads(); }

}  // namespace luminav
