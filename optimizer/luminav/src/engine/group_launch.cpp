// src/engine/group_launch.cpp: variant keys, device tables and bound launches of one launch group
// (see group_launch.h)
#include "engine/group_launch.h"

#include "aot/manifest.h"
#include "engine/group_args.h"

#include <array>
#include <cstring>
#include <map>
#include <mutex>

namespace luminav {
namespace gpu {

namespace {
std::int64_t address(const void* p) { return static_cast<std::int64_t>(reinterpret_cast<std::uintptr_t>(p)); }

// The programs of one tensor: ceil(numel / kBlock); a q8 tensor's (row_len > 0) each own whole
// q8 blocks, kBlock / 256 consecutive ones in (row, block) order: ceil(rows * nb / (kBlock / 256)).
std::int64_t programs(const TensorRow& r) {
  if (r.row_len > 0) {
    constexpr std::int64_t per = kBlock / kQ8Block;
    const std::int64_t nb = (r.row_len + kQ8Block - 1) / kQ8Block;
    return (r.numel / r.row_len * nb + per - 1) / per;
  }
  return (r.numel + kBlock - 1) / kBlock;
}
}  // namespace

// The constexprs of each kernel a group launches (the kernels' own names, as the catalog and the
// manifest spell them); the key itself is the manifest layer's (derive_variant_key).
VariantKeys variant_keys(const GroupConfig& cfg) {
  const std::int64_t p = static_cast<int>(cfg.param_dtype);
  const std::int64_t g = static_cast<int>(cfg.grad_dtype);
  const std::int64_t s = static_cast<int>(cfg.state_dtype);
  const std::int64_t sr = cfg.sr() ? 1 : 0;
  const std::int64_t b = static_cast<int>(cfg.hyper.bound_mode);
  const std::int64_t clip = cfg.hyper.clip > 0 ? 1 : 0;
  const std::int64_t check = cfg.check_flag() ? 1 : 0;
  VariantKeys k;
  if (cfg.needs_pass1()) {
    k.pass1 = derive_variant_key(
        "pass1", {{"G_DTYPE", g}, {"S_DTYPE", s}, {"SR", sr}, {"NEED_SUM", clip}, {"BLOCK", kBlock}}, kBlockWarps);
    k.reduce = derive_variant_key("reduce", {{"BLOCK", kBlock}, {"RBLOCK", kReduceRBlock}}, kReduceWarps);
    k.pass2 = derive_variant_key("pass2",
                                 {{"P_DTYPE", p}, {"G_DTYPE", g}, {"S_DTYPE", s}, {"SR", sr}, {"BOUND_MODE", b},
                                  {"USE_CLIP", clip}, {"CHECK_FLAG", check}, {"BLOCK", kBlock}},
                                 kBlockWarps);
  } else {
    k.single_pass = derive_variant_key(
        "single_pass",
        {{"P_DTYPE", p}, {"G_DTYPE", g}, {"S_DTYPE", s}, {"SR", sr}, {"BOUND_MODE", b}, {"BLOCK", kBlock}},
        kBlockWarps);
  }
  k.commit = commit_key(cfg.check_flag());
  return k;
}

std::string commit_key(bool check_flag) {
  return derive_variant_key("commit", {{"CHECK_FLAG", check_flag ? 1 : 0}, {"TBLOCK", kCommitTBlock}}, kCommitWarps);
}

HostTables build_tables(const TensorRow* rows, std::size_t n) {
  HostTables t;
  t.table.assign(n * kTableCols, 0);
  std::int64_t start = 0;
  for (std::size_t j = 0; j < n; ++j) {
    const TensorRow& r = rows[j];
    std::int64_t* row = t.table.data() + j * kTableCols;
    row[kColParam] = address(r.param);
    row[kColGrad] = address(r.grad);
    row[kColExpAvg] = address(r.exp_avg);
    row[kColExpAvgSq] = address(r.exp_avg_sq);
    row[kColPInit] = address(r.p_init);
    row[kColStep] = address(r.step);
    row[kColNumel] = r.numel;
    row[kColBlockStart] = start;
    row[kColElemOffset] = r.elem_offset;
    row[kColParamIndex] = r.param_index;
    row[kColGlobalNumel] = r.global_numel;
    // column 11 and the step-constant cache (kColCache..17) start at zero: no cached step
    row[kColExpAvgScale] = address(r.scale_m);
    row[kColExpAvgSqScale] = address(r.scale_v);
    row[kColRowLen] = r.row_len;
    start += programs(r);
  }
  if (start > 0x7FFFFFFF) {
    throw Error(Status::kInvalidArgument, "a launch group of " + std::to_string(start) +
                                              " blocks exceeds the grid limit 2^31-1; split the parameters over groups");
  }
  t.nblocks = start;
  t.block_map.resize(static_cast<std::size_t>(start));
  for (std::size_t j = 0; j < n; ++j) {
    const std::int64_t b0 = t.table[j * kTableCols + kColBlockStart];
    const std::int64_t nb = programs(rows[j]);
    for (std::int64_t b = 0; b < nb; ++b) t.block_map[static_cast<std::size_t>(b0 + b)] = static_cast<std::int32_t>(j);
  }
  return t;
}

GroupScalars group_scalars(const GroupConfig& cfg) {
  GroupScalars s;
  std::uint64_t seed = cfg.seed;
  std::memcpy(&s.seed, &seed, 8);  // the i64 argument carries the uint64 bit pattern
  s.sign = cfg.hyper.maximize ? -1.0f : 1.0f;
  s.beta1 = static_cast<float>(cfg.hyper.beta1);
  s.beta2 = static_cast<float>(cfg.hyper.beta2);
  s.eps = static_cast<float>(cfg.hyper.eps);
  s.weight_decay = static_cast<float>(cfg.hyper.weight_decay);
  s.clip = static_cast<float>(cfg.hyper.clip);
  s.bound = static_cast<float>(cfg.hyper.bound);
  return s;
}

GroupKernels::GroupKernels(std::shared_ptr<AotRuntime> runtime, int device, const GroupConfig& cfg)
    : rt_(std::move(runtime)), device_(device), cfg_(cfg), scalars_(group_scalars(cfg)) {
  const AotManifest& man = rt_->manifest();
  if (man.table_cols() != kTableCols) {
    throw Error(Status::kBundleError,
                "bundle " + man.dir() + " (format_version " + std::to_string(man.format_version()) + ", created by " +
                    man.created_by() + ") holds kernels that read device tables of " +
                    std::to_string(man.table_cols()) + " columns; this luminav writes " + std::to_string(kTableCols) +
                    ". Rebuild the bundle with this release: luminamoon aot build --out " + man.dir());
  }
  const VariantKeys k = variant_keys(cfg);
  if (cfg.needs_pass1()) {
    pass1_ = &resolve(k.pass1);
    reduce_ = &resolve(k.reduce);
    update_ = &resolve(k.pass2);
  } else {
    update_ = &resolve(k.single_pass);
  }
  commit_ = &resolve(k.commit);
}

const LoadedKernel& GroupKernels::resolve(const std::string& key) const {
  const DeviceInfo info = rt_->device_info(device_);
  const KernelMetadata* meta = rt_->manifest().find(key, info.cc_major, info.cc_minor);
  if (!meta) {
    const std::string arch = std::to_string(info.cc_major) + std::to_string(info.cc_minor);
    throw Error(Status::kNotFound, "variant " + key + " for sm_" + arch + " is not in bundle " + rt_->manifest().dir() +
                                       "; rebuild with `luminamoon aot build --arch " + arch + " --dtypes " +
                                       dtype_word(cfg_.param_dtype) + ":" + dtype_word(cfg_.grad_dtype) + ":" +
                                       dtype_word(cfg_.state_dtype) + "`");
  }
  return rt_->load(*meta, device_);
}

namespace {

template <typename Args>
KernelLaunch bind(AotRuntime& rt, const LoadedKernel& k, LaunchGrid grid, Args args) {
  auto p = pointers(args);
  return KernelLaunch(rt, k, grid, p.data(), p.size());
}

}  // namespace

BoundGroupLaunches::BoundGroupLaunches(const GroupKernels& k, const GroupBuffers& b, CUdeviceptr found_inf,
                                       CUdeviceptr reduce_flag)
    : rt_(k.rt_), found_inf_(found_inf), reduce_flag_(reduce_flag), lr_(b.lr), seed_(k.cfg_.seed) {
  if (b.commit_rows < b.ntensors) {
    throw Error(Status::kInternal, "commit must advance every tensor's counter: " + std::to_string(b.commit_rows) +
                                       " rows for " + std::to_string(b.ntensors) + " tensors");
  }
  AotRuntime& rt = *rt_;
  if (k.pass1_) {
    pass1_ = bind(rt, *k.pass1_, blocks_grid(b.nblocks),
                  pass1_args(b.table, b.block_map, b.partial_sum, b.partial_bad, k.scalars_));
    reduce_ = bind(rt, *k.reduce_, {static_cast<unsigned>(b.ntensors), 1, 1},
                   ReduceArgs{b.table, b.partial_sum, b.partial_bad, b.stats, reduce_flag, b.ntensors});
  }
  update_ = bind(rt, *k.update_, blocks_grid(b.nblocks),
                 update_args(b.table, b.block_map, b.stats, found_inf, b.lr, k.scalars_));
  commit_ = bind(rt, *k.commit_, {1, 1, 1}, commit_args(b.table, found_inf, b.commit_rows));
}

void BoundGroupLaunches::set_flags(CUdeviceptr found_inf, CUdeviceptr reduce_flag) {
  if (found_inf != found_inf_) {
    update_.set(kUpdateFoundInf, found_inf);
    commit_.set(kCommitFoundInf, found_inf);
    found_inf_ = found_inf;
  }
  if (reduce_flag != reduce_flag_) {
    if (reduce_.bound()) reduce_.set(kReduceFoundInf, reduce_flag);
    reduce_flag_ = reduce_flag;
  }
}

void BoundGroupLaunches::set_lr(CUdeviceptr lr) {
  if (lr == lr_) return;
  update_.set(kUpdateLr, lr);
  lr_ = lr;
}

void BoundGroupLaunches::set_seed(std::uint64_t seed) {
  if (seed == seed_) return;
  std::int64_t bits;
  std::memcpy(&bits, &seed, 8);
  if (pass1_.bound()) pass1_.set(kPass1Seed, bits);
  update_.set(kUpdateSeed, bits);
  seed_ = seed;
}

std::shared_ptr<AotRuntime> runtime_for_bundle(const std::string& dir) {
  static std::mutex mutex;
  static auto* cache = new std::map<std::string, std::weak_ptr<AotRuntime>>();
  std::lock_guard<std::mutex> lock(mutex);
  auto& slot = (*cache)[dir];
  std::shared_ptr<AotRuntime> rt = slot.lock();
  if (!rt) {
    rt = std::make_shared<AotRuntime>(AotManifest::load(dir));
    slot = rt;
  }
  return rt;
}

}  // namespace gpu
}  // namespace luminav
