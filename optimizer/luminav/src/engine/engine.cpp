// The optimizer object: param groups, state allocation or borrowing, launch groups, step,
// state export/import. The per-element work is in cpu_kernels.cpp (CPU) and the AOT bundle's
// kernels (CUDA, cuda_device.cpp).
#include <algorithm>
#include <cstring>
#include <map>
#include <string>
#include <tuple>
#include <vector>

#include "engine/device.h"
#include "engine/thread_pool.h"
#include "engine/engine.h"

namespace luminav {

namespace engine_detail {

std::string nonfinite_message(const LaunchGroup& group, std::size_t row) {
  return "nonfinite='raise': the gradient of parameter " + std::to_string(group.rows[row].param_index) +
         " (param group " + std::to_string(group.user_group) +
         ") has a non-finite element; the step changed nothing. Fix the gradient, or use "
         "nonfinite='skip' to skip such steps";
}

namespace {

class CpuDevice final : public Device {
 public:
  explicit CpuDevice(int num_threads) : pool_(cpu::make_thread_pool(num_threads)) {}
  DeviceType type() const override { return DeviceType::kCpu; }
  int num_threads() const override { return pool_->size(); }
  void* alloc(std::size_t bytes) override {
    void* p = ::operator new(bytes);
    std::memset(p, 0, bytes);
    return p;
  }
  void release(void* p) noexcept override { ::operator delete(p); }
  void to_host(void* dst, const void* src, std::size_t bytes) override { std::memcpy(dst, src, bytes); }
  void from_host(void* dst, const void* src, std::size_t bytes) override { std::memcpy(dst, src, bytes); }
  void copy(void* dst, const void* src, std::size_t bytes, void*) override { std::memcpy(dst, src, bytes); }

  void check_nonfinite(std::vector<LaunchGroup>& groups, void*) override {
    for (auto& g : groups) {
      if (g.cfg.hyper.nonfinite != NonFinite::kRaise) continue;
      const std::int64_t bad = cpu::first_nonfinite(g.cfg, g.rows.data(), g.rows.size(), *pool_);
      if (bad >= 0) throw Error(Status::kNonFinite, nonfinite_message(g, static_cast<std::size_t>(bad)));
    }
  }

  void step(std::vector<LaunchGroup>& groups, void*) override {
    std::int32_t found_inf = 0;
    std::vector<std::vector<float>> stats(groups.size());
    for (std::size_t i = 0; i < groups.size(); ++i) {
      auto& g = groups[i];
      if (!g.cfg.needs_pass1()) continue;
      stats[i].assign(g.rows.size(), 0.0f);
      cpu::pass1(g.cfg, g.rows.data(), g.rows.size(), stats[i].data(), &found_inf, *pool_);
    }
    for (std::size_t i = 0; i < groups.size(); ++i) {
      auto& g = groups[i];
      cpu::pass2(g.cfg, g.rows.data(), g.rows.size(), g.lr, stats[i].empty() ? nullptr : stats[i].data(),
                 &found_inf, *pool_);
    }
    for (auto& g : groups) cpu::commit(g.cfg, g.rows.data(), g.rows.size(), &found_inf);
    skipped_ += found_inf;
  }
  std::int64_t skipped() override { return skipped_; }
  void set_skipped(std::int64_t value) override { skipped_ = value; }

 private:
  std::shared_ptr<cpu::ThreadPool> pool_;
  std::int64_t skipped_ = 0;
};

}  // namespace

std::unique_ptr<Device> make_cpu_device(int num_threads) { return std::make_unique<CpuDevice>(num_threads); }

}  // namespace engine_detail

using engine_detail::Device;
using engine_detail::LaunchGroup;

namespace {
constexpr char kStateMagic[8] = {'L', 'V', 'S', 'T', 'A', 'T', 'E', '1'};
constexpr std::uint32_t kStateFormatVersion = 1;

struct Writer {
  std::vector<std::uint8_t> out;
  template <class T>
  void put(const T& v) {
    const auto* b = reinterpret_cast<const std::uint8_t*>(&v);
    out.insert(out.end(), b, b + sizeof(T));
  }
  std::uint8_t* grow(std::size_t n) {
    out.resize(out.size() + n);
    return out.data() + out.size() - n;
  }
};

struct Reader {
  const std::uint8_t* data;
  std::size_t size;
  std::size_t pos = 0;
  void need(std::size_t n, const char* what) {
    if (size - pos < n) {
      throw Error(Status::kInvalidArgument, std::string("optimizer state is truncated: ") + what + " needs " +
                                                std::to_string(n) + " bytes at offset " + std::to_string(pos) +
                                                ", the buffer has " + std::to_string(size) + " in all");
    }
  }
  template <class T>
  T get(const char* what) {
    need(sizeof(T), what);
    T v;
    std::memcpy(&v, data + pos, sizeof(T));
    pos += sizeof(T);
    return v;
  }
  const std::uint8_t* bytes(std::size_t n, const char* what) {
    need(n, what);
    const std::uint8_t* p = data + pos;
    pos += n;
    return p;
  }
};
}  // namespace

struct Engine::Impl {
  struct Param {
    std::size_t group = 0;
    ParamDesc desc;
    void* m = nullptr;
    void* v = nullptr;
    void* p0 = nullptr;
    bool own_m = false, own_v = false, own_p0 = false;
    bool p0_ready = false;
  };
  struct Group {
    Hyper hyper;
    std::vector<std::size_t> params;
  };

  EngineOptions options;
  std::unique_ptr<Device> device;
  std::uint64_t seed = 0;
  std::vector<Group> groups;
  std::vector<Param> params;
  std::int64_t* steps = nullptr;  // device array of int64 counters, one per parameter
  std::size_t steps_capacity = 0;
  std::vector<LaunchGroup> launch;
  bool dirty = true;

  ~Impl() {
    if (!device) return;
    for (auto& p : params) {
      if (p.own_m) device->release(p.m);
      if (p.own_v) device->release(p.v);
      if (p.own_p0) device->release(p.p0);
    }
    if (steps) device->release(steps);
  }

  Param& param(std::size_t k) {
    if (k >= params.size()) {
      throw Error(Status::kInvalidArgument, "parameter index " + std::to_string(k) + " is out of range: the optimizer has " +
                                                std::to_string(params.size()) + " parameters");
    }
    return params[k];
  }
  Group& group(std::size_t g) {
    if (g >= groups.size()) {
      throw Error(Status::kInvalidArgument, "param group " + std::to_string(g) + " is out of range: the optimizer has " +
                                                std::to_string(groups.size()) + " groups");
    }
    return groups[g];
  }

  // Grows the step-counter array, keeping its values.
  void reserve_steps(std::size_t n) {
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

  void rebuild() {
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
        launch[it->second].rows.push_back(row);
      }
    }
    dirty = false;
  }
};

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
  } else {
    throw Error(Status::kInvalidArgument,
                "device must be 0 (cpu) or 1 (cuda), got " + std::to_string(static_cast<int>(options.device)));
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
  if (desc.numel > 0 && !desc.data) {
    throw Error(Status::kInvalidArgument, "parameter " + std::to_string(k) + " has numel " + std::to_string(desc.numel) +
                                              " but a null data pointer; pass its storage");
  }
  Impl::Param p;
  p.group = group;
  p.desc = desc;
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
    }
  } guard{s.device.get(), &p};
  if (desc.numel > 0) {
    if (desc.exp_avg) {
      p.m = desc.exp_avg;
    } else {
      p.m = s.device->alloc(state_bytes);
      p.own_m = true;
    }
    if (desc.exp_avg_sq) {
      p.v = desc.exp_avg_sq;
    } else {
      p.v = s.device->alloc(state_bytes);
      p.own_v = true;
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

std::vector<std::uint8_t> Engine::export_state() const {
  const Impl& s = *impl_;
  Writer w;
  w.out.insert(w.out.end(), kStateMagic, kStateMagic + 8);
  w.put(kStateFormatVersion);
  w.put(s.seed);
  w.put(s.device->skipped());
  w.put(static_cast<std::uint64_t>(s.groups.size()));
  w.put(static_cast<std::uint64_t>(s.params.size()));
  std::vector<std::int64_t> steps(s.params.size(), 0);
  if (!steps.empty()) s.device->to_host(steps.data(), s.steps, steps.size() * sizeof(std::int64_t));
  for (std::size_t k = 0; k < s.params.size(); ++k) {
    const Impl::Param& p = s.params[k];
    const DType sd = s.groups[p.group].hyper.state_dtype;
    w.put(static_cast<std::uint64_t>(p.group));
    w.put(p.desc.numel);
    w.put(static_cast<std::int32_t>(p.desc.dtype));
    w.put(static_cast<std::int32_t>(sd));
    const std::int32_t has_p0 = (p.p0 && p.p0_ready) ? 1 : 0;
    w.put(has_p0);
    w.put(steps[k]);
    const std::size_t sb = static_cast<std::size_t>(p.desc.numel) * dtype_size(sd);
    const std::size_t pb = static_cast<std::size_t>(p.desc.numel) * dtype_size(p.desc.dtype);
    if (sb) {
      s.device->to_host(w.grow(sb), p.m, sb);
      s.device->to_host(w.grow(sb), p.v, sb);
    }
    if (has_p0 && pb) s.device->to_host(w.grow(pb), p.p0, pb);
  }
  return w.out;
}

void Engine::import_state(const std::uint8_t* data, std::size_t size) {
  Impl& s = *impl_;
  if (!data) throw Error(Status::kInvalidArgument, "optimizer state buffer is null");
  Reader r{data, size};
  const std::uint8_t* magic = r.bytes(8, "the magic");
  if (std::memcmp(magic, kStateMagic, 8) != 0) {
    throw Error(Status::kInvalidArgument, "not a luminav optimizer state: the first 8 bytes are not \"LVSTATE1\"");
  }
  const auto version = r.get<std::uint32_t>("format_version");
  if (version != kStateFormatVersion) {
    throw Error(Status::kInvalidArgument, "optimizer state format_version " + std::to_string(version) +
                                              " is not supported; this library reads version " +
                                              std::to_string(kStateFormatVersion));
  }
  const auto seed = r.get<std::uint64_t>("seed");
  const auto skipped = r.get<std::int64_t>("skipped");
  const auto ngroups = r.get<std::uint64_t>("group count");
  const auto nparams = r.get<std::uint64_t>("parameter count");
  if (ngroups != s.groups.size() || nparams != s.params.size()) {
    throw Error(Status::kInvalidArgument, "optimizer state holds " + std::to_string(ngroups) + " groups and " +
                                              std::to_string(nparams) + " parameters, this optimizer has " +
                                              std::to_string(s.groups.size()) + " and " +
                                              std::to_string(s.params.size()) +
                                              "; add the same groups and parameters before importing");
  }
  if (skipped < 0) throw Error(Status::kInvalidArgument, "optimizer state has a negative skipped count " + std::to_string(skipped));
  struct Entry {
    std::int64_t step;
    const std::uint8_t *m, *v, *p0;
  };
  std::vector<Entry> entries(s.params.size());
  for (std::size_t k = 0; k < s.params.size(); ++k) {
    const Impl::Param& p = s.params[k];
    const std::string who = "parameter " + std::to_string(k);
    const auto group = r.get<std::uint64_t>("group");
    const auto numel = r.get<std::int64_t>("numel");
    const auto pd = r.get<std::int32_t>("param dtype");
    const auto sd = r.get<std::int32_t>("state dtype");
    const auto has_p0 = r.get<std::int32_t>("p_init flag");
    const auto step = r.get<std::int64_t>("step");
    const DType want_sd = s.groups[p.group].hyper.state_dtype;
    if (group != p.group || numel != p.desc.numel || pd != static_cast<int>(p.desc.dtype) ||
        sd != static_cast<int>(want_sd)) {
      throw Error(Status::kInvalidArgument,
                  "optimizer state does not fit " + who + ": the state has group " + std::to_string(group) + ", numel " +
                      std::to_string(numel) + ", param dtype " + std::to_string(pd) + ", state dtype " +
                      std::to_string(sd) + "; the optimizer has group " + std::to_string(p.group) + ", numel " +
                      std::to_string(p.desc.numel) + ", param dtype " + std::to_string(static_cast<int>(p.desc.dtype)) +
                      ", state dtype " + std::to_string(static_cast<int>(want_sd)));
    }
    if (step < 0) throw Error(Status::kInvalidArgument, who + " has a negative step " + std::to_string(step) + " in the state");
    if (has_p0 != 0 && has_p0 != 1) throw Error(Status::kInvalidArgument, who + ": bad p_init flag " + std::to_string(has_p0));
    if (has_p0 && !p.p0) {
      throw Error(Status::kInvalidArgument, who + ": the state has p_init but the param group's bound_mode is none");
    }
    if (p.p0 && !has_p0 && step > 0 && p.desc.numel > 0) {
      throw Error(Status::kInvalidArgument, who + " is bounded and has taken " + std::to_string(step) +
                                                " steps, but the state has no p_init for it");
    }
    const std::size_t sb = static_cast<std::size_t>(numel) * dtype_size(want_sd);
    const std::size_t pb = static_cast<std::size_t>(numel) * dtype_size(p.desc.dtype);
    Entry e{step, nullptr, nullptr, nullptr};
    if (sb) {
      e.m = r.bytes(sb, "exp_avg");
      e.v = r.bytes(sb, "exp_avg_sq");
    }
    if (has_p0 && pb) e.p0 = r.bytes(pb, "p_init");
    entries[k] = e;
  }
  if (r.pos != size) {
    throw Error(Status::kInvalidArgument, "optimizer state has " + std::to_string(size - r.pos) +
                                              " trailing bytes after the last parameter");
  }
  // Everything checked: now apply.
  std::vector<std::int64_t> steps(s.params.size());
  for (std::size_t k = 0; k < s.params.size(); ++k) {
    Impl::Param& p = s.params[k];
    const Entry& e = entries[k];
    steps[k] = e.step;
    const std::size_t sb = static_cast<std::size_t>(p.desc.numel) * dtype_size(s.groups[p.group].hyper.state_dtype);
    if (sb) {
      s.device->from_host(p.m, e.m, sb);
      s.device->from_host(p.v, e.v, sb);
    }
    if (e.p0) s.device->from_host(p.p0, e.p0, static_cast<std::size_t>(p.desc.numel) * dtype_size(p.desc.dtype));
    p.p0_ready = e.p0 != nullptr;
  }
  if (!steps.empty()) s.device->from_host(s.steps, steps.data(), steps.size() * sizeof(std::int64_t));
  s.device->set_skipped(skipped);
  s.seed = seed;
}

}  // namespace luminav
