// src/engine/group.cpp: the launch groups of Python's "cpu" and "aot" backends (see group.h)
#include "engine/group.h"

#include <map>
#include <mutex>
#include <string>
#include <utility>

#include "engine/cpu_kernels.h"
#include "luminav/error.h"

namespace luminav {

namespace {

template <class T>
T* ptr(std::uintptr_t a) {
  return reinterpret_cast<T*>(a);
}

[[noreturn]] void invalid(const std::string& msg) { throw Error(Status::kInvalidArgument, msg); }

// A row's q8 fields: a block row that divides the tensor and both scale addresses in a q8 group,
// all three 0 in another.
void check_q8_fields(const std::string& who, const TensorRow& t, bool q8) {
  if (!q8) {
    if (t.scale_m || t.scale_v || t.row_len) {
      invalid(who + ": scale addresses or a row_len (" + std::to_string(t.row_len) +
              ") given, but the group's state dtype is not q8; pass 0, 0, 0 or state_dtype q8 (3)");
    }
    return;
  }
  if (t.row_len <= 0 || t.numel % t.row_len != 0) {
    invalid(who + ": q8 row_len must be > 0 and divide numel " + std::to_string(t.numel) + ", got " +
            std::to_string(t.row_len) + "; pass the elements of one row of the parameter (numel / shape[0])");
  }
  if (t.numel > 0 && (!t.scale_m || !t.scale_v)) {
    invalid(who + ": a q8 scale address (exp_avg_scale/exp_avg_sq_scale) is 0");
  }
}

}  // namespace

GroupConfig make_config(int param_dtype, int grad_dtype, int state_dtype, const Hyper& hyper, std::uint64_t seed) {
  GroupConfig cfg;
  cfg.param_dtype = dtype_from_int(param_dtype, "param_dtype");
  cfg.grad_dtype = dtype_from_int(grad_dtype, "grad_dtype");
  cfg.state_dtype = state_dtype_from_int(state_dtype);
  Hyper& h = cfg.hyper;
  h = hyper;
  h.lr = 0.0;
  h.state_dtype = cfg.state_dtype;
  validate_hyper(h);
  cfg.seed = seed;
  return cfg;
}

std::vector<TensorRow> make_rows(const std::vector<RowTuple>& rows, bool bounded, bool q8) {
  std::vector<TensorRow> out;
  out.reserve(rows.size());
  for (std::size_t j = 0; j < rows.size(); ++j) {
    const RowTuple& r = rows[j];
    TensorRow t;
    t.param = ptr<void>(std::get<0>(r));
    t.grad = ptr<const void>(std::get<1>(r));
    t.exp_avg = ptr<void>(std::get<2>(r));
    t.exp_avg_sq = ptr<void>(std::get<3>(r));
    t.p_init = ptr<void>(std::get<4>(r));
    t.step = ptr<std::int64_t>(std::get<5>(r));
    t.numel = std::get<6>(r);
    t.elem_offset = std::get<7>(r);
    t.param_index = std::get<8>(r);
    t.global_numel = std::get<9>(r);
    t.scale_m = ptr<float>(std::get<10>(r));
    t.scale_v = ptr<float>(std::get<11>(r));
    t.row_len = std::get<12>(r);
    const std::string who = "row " + std::to_string(j);
    if (t.numel < 0) invalid(who + ": numel must be >= 0, got " + std::to_string(t.numel));
    if (!t.step) invalid(who + ": the step counter address is 0");
    if (t.numel > 0 && (!t.param || !t.grad || !t.exp_avg || !t.exp_avg_sq)) {
      invalid(who + ": a param/grad/exp_avg/exp_avg_sq address is 0");
    }
    if (bounded && t.numel > 0 && !t.p_init) invalid(who + ": bound_mode is not none but the p_init address is 0");
    if (t.global_numel < t.elem_offset + t.numel) {
      invalid(who + ": global_numel " + std::to_string(t.global_numel) + " < elem_offset + numel = " +
              std::to_string(t.elem_offset + t.numel));
    }
    check_q8_fields(who, t, q8);
    out.push_back(t);
  }
  return out;
}

std::shared_ptr<cpu::ThreadPool> pool_for(int num_threads) {
  if (num_threads < 0) invalid("num_threads must be >= 0, got " + std::to_string(num_threads));
  static std::mutex mutex;
  static auto* pools = new std::map<int, std::shared_ptr<cpu::ThreadPool>>();  // never destroyed: safe at exit
  std::lock_guard<std::mutex> lock(mutex);
  auto& p = (*pools)[num_threads];
  if (!p) p = cpu::make_thread_pool(num_threads);
  return p;
}

// ---------------------------------------------------------------------------------------------
// CpuGroup

CpuGroup::CpuGroup(const GroupConfig& cfg, const std::vector<RowTuple>& rows, int num_threads)
    : cfg_(cfg),
      rows_(make_rows(rows, cfg.hyper.bound_mode != BoundMode::kNone, cfg.state_dtype == DType::kQ8)),
      pool_(pool_for(num_threads)) {}

void CpuGroup::pass1(std::uintptr_t stats, std::uintptr_t found_inf) {
  cpu::pass1(cfg_, rows_.data(), rows_.size(), ptr<float>(stats), ptr<std::int32_t>(found_inf), *pool_,
             &cache_);
}

void CpuGroup::pass2(double lr, std::uintptr_t stats, std::uintptr_t found_inf) {
  validate_lr(lr);
  cpu::pass2(cfg_, rows_.data(), rows_.size(), static_cast<float>(lr), ptr<const float>(stats),
             ptr<const std::int32_t>(found_inf), *pool_, &cache_);
}

void CpuGroup::commit(std::uintptr_t found_inf) {
  cpu::commit(cfg_, rows_.data(), rows_.size(), ptr<const std::int32_t>(found_inf));
}

std::int64_t CpuGroup::first_nonfinite() { return cpu::first_nonfinite(cfg_, rows_.data(), rows_.size(), *pool_); }

void CpuGroup::set_grads(const std::vector<std::uintptr_t>& grads) {
  check_grads(grads);
  for (std::size_t j = 0; j < grads.size(); ++j) rows_[j].grad = reinterpret_cast<const void*>(grads[j]);
}

void CpuGroup::check_grads(const std::vector<std::uintptr_t>& grads) const {
  if (grads.size() != rows_.size()) {
    throw Error(Status::kInvalidArgument, "set_grads: " + std::to_string(grads.size()) + " addresses for " +
                                              std::to_string(rows_.size()) + " rows; give one per row");
  }
  for (std::size_t j = 0; j < grads.size(); ++j) {
    if (grads[j] == 0 && rows_[j].numel > 0) {
      throw Error(Status::kInvalidArgument, "set_grads: row " + std::to_string(j) + ": the grad address is 0");
    }
  }
}

void cpu_step(const std::vector<CpuStepItem>& items, std::uintptr_t skip_flag, std::uintptr_t skipped) {
  for (std::size_t i = 0; i < items.size(); ++i) {
    if (!items[i].group) invalid("cpu_step: item " + std::to_string(i) + " has no group");
    if (!items[i].found_inf) invalid("cpu_step: item " + std::to_string(i) + ": the flag address is 0");
    validate_lr(items[i].lr);
    if (items[i].grads) items[i].group->check_grads(*items[i].grads);
  }
  for (const CpuStepItem& it : items) {
    if (it.grads) it.group->set_grads(*it.grads);
  }
  // every flag starts clear (a scratch flag may hold an earlier step's value)
  for (const CpuStepItem& it : items) *ptr<std::int32_t>(it.found_inf) = 0;
  for (const CpuStepItem& it : items) {
    if (it.group->config().needs_pass1()) it.group->pass1(it.stats, it.found_inf);
  }
  for (const CpuStepItem& it : items) {
    it.group->pass2(it.lr, it.stats, it.found_inf);
    it.group->commit(it.found_inf);
  }
  if (skip_flag) {
    auto* flag = ptr<std::int32_t>(skip_flag);
    if (skipped) *ptr<std::int64_t>(skipped) += *flag;
  }
  for (const CpuStepItem& it : items) *ptr<std::int32_t>(it.found_inf) = 0;
}

// ---------------------------------------------------------------------------------------------
// AotGroup

namespace {

void require_address(const char* who, CUdeviceptr address, const char* name, const char* why) {
  if (address == 0) invalid(std::string(who) + ": the " + name + " address is 0" + why);
}

}  // namespace

void check_group_buffers(const char* who, bool has_pass1, CUdeviceptr table, CUdeviceptr block_map, std::int64_t nblocks,
                         CUdeviceptr partial_sum, CUdeviceptr partial_bad, CUdeviceptr stats, CUdeviceptr lr,
                         std::int32_t ntensors, CUdeviceptr found_inf, CUdeviceptr reduce_flag) {
  if (nblocks < 0 || nblocks > 0x7FFFFFFF) {
    invalid(std::string(who) + ": nblocks must be in [0, 2^31-1] (a grid's x), got " + std::to_string(nblocks));
  }
  if (ntensors < 0) invalid(std::string(who) + ": ntensors must be >= 0, got " + std::to_string(ntensors));
  require_address(who, found_inf, "found_inf", "");
  require_address(who, reduce_flag, "reduce_flag", "");
  if (ntensors > 0) require_address(who, table, "table", " but ntensors > 0");
  if (nblocks > 0) {
    require_address(who, block_map, "block_map", " but nblocks > 0");
    require_address(who, lr, "lr", " but nblocks > 0");
  }
  if (has_pass1) {
    const char* why = " but the group runs pass 1";
    if (nblocks > 0) require_address(who, partial_sum, "partial_sum", why);
    if (nblocks > 0) require_address(who, partial_bad, "partial_bad", why);
    if (ntensors > 0) require_address(who, stats, "stats", why);
  }
}

AotGroup::AotGroup(const std::string& bundle_dir, int device, const GroupConfig& cfg)
    : kernels_(gpu::runtime_for_bundle(bundle_dir), device, cfg) {}

void AotGroup::bind(CUdeviceptr table, CUdeviceptr block_map, std::int64_t nblocks, CUdeviceptr partial_sum,
                    CUdeviceptr partial_bad, CUdeviceptr stats, CUdeviceptr lr, std::int32_t ntensors,
                    CUdeviceptr found_inf, CUdeviceptr reduce_flag) {
  check_group_buffers("AotGroup", has_pass1(), table, block_map, nblocks, partial_sum, partial_bad, stats, lr, ntensors,
                      found_inf, reduce_flag);
  const gpu::GroupBuffers b =
      gpu::group_buffers(table, block_map, nblocks, partial_sum, partial_bad, stats, lr, ntensors);
  launches_ = std::make_unique<gpu::BoundGroupLaunches>(kernels_, b, found_inf, reduce_flag);
}

void AotGroup::set_flags(CUdeviceptr found_inf, CUdeviceptr reduce_flag) {
  gpu::BoundGroupLaunches& l = launches("set_flags", false);
  require_address("AotGroup", found_inf, "found_inf", "");
  require_address("AotGroup", reduce_flag, "reduce_flag", "");
  l.set_flags(found_inf, reduce_flag);
}

void AotGroup::set_lr(CUdeviceptr lr) {
  gpu::BoundGroupLaunches& l = launches("set_lr", false);
  require_address("AotGroup", lr, "lr", "");
  l.set_lr(lr);
}

void AotGroup::pass1(CUstream stream) { run("pass1", true, &gpu::BoundGroupLaunches::pass1, stream); }
void AotGroup::reduce(CUstream stream) { run("reduce", true, &gpu::BoundGroupLaunches::reduce, stream); }
void AotGroup::update(CUstream stream) { run("update", false, &gpu::BoundGroupLaunches::update, stream); }
void AotGroup::commit(CUstream stream) { run("commit", false, &gpu::BoundGroupLaunches::commit, stream); }

gpu::BoundGroupLaunches& AotGroup::launches(const char* what, bool pass1_kernel) {
  if (!launches_) {
    throw Error(Status::kStateError, std::string("AotGroup.") + what + ": no buffers are bound; call bind() first");
  }
  if (pass1_kernel && !launches_->has_pass1()) {
    throw Error(Status::kStateError, std::string("AotGroup.") + what +
                                         ": this group runs no pass 1 (clip == 0 and nonfinite != 'skip'); it "
                                         "launches update and commit only");
  }
  return *launches_;
}

void AotGroup::run(const char* what, bool pass1_kernel, void (gpu::BoundGroupLaunches::*launch)(CUstream),
                   CUstream stream) {
  gpu::BoundGroupLaunches& l = launches(what, pass1_kernel);
  ScopedContext ctx(l.driver(), l.context());  // the one driver call besides the launch
  (l.*launch)(stream);
}

}  // namespace luminav
