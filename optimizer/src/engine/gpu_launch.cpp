// Variant keys, device tables and launches of one launch group (see gpu_launch.h).
#include "engine/gpu_launch.h"

#include <cstring>
#include <map>
#include <mutex>

namespace luminav {
namespace gpu {

namespace {
std::string dtypes_part(std::initializer_list<std::pair<char, int>> items) {
  std::string s;
  for (const auto& it : items) {
    s += it.first;
    s += std::to_string(it.second);
  }
  return s;
}
}  // namespace

VariantKeys variant_keys(const GroupConfig& cfg) {
  const int p = static_cast<int>(cfg.param_dtype);
  const int g = static_cast<int>(cfg.grad_dtype);
  const int s = static_cast<int>(cfg.state_dtype);
  const int sr = cfg.sr() ? 1 : 0;
  const int b = static_cast<int>(cfg.hyper.bound_mode);
  const int clip = cfg.hyper.clip > 0 ? 1 : 0;
  const int check = cfg.check_flag() ? 1 : 0;
  const std::string B = ".B" + std::to_string(kBlock);
  const std::string w = ".w" + std::to_string(kBlockWarps);
  VariantKeys k;
  if (cfg.needs_pass1()) {
    k.pass1 = "pass1." + dtypes_part({{'g', g}, {'s', s}}) + ".sr" + std::to_string(sr) + ".n" +
              std::to_string(clip) + B + w;
    k.reduce = "reduce" + B + ".R" + std::to_string(kReduceRBlock) + ".w" + std::to_string(kReduceWarps);
    k.pass2 = "pass2." + dtypes_part({{'p', p}, {'g', g}, {'s', s}}) + ".sr" + std::to_string(sr) + ".b" +
              std::to_string(b) + ".c" + std::to_string(clip) + ".f" + std::to_string(check) + B + w;
  } else {
    k.single_pass = "single_pass." + dtypes_part({{'p', p}, {'g', g}, {'s', s}}) + ".sr" + std::to_string(sr) +
                    ".b" + std::to_string(b) + B + w;
  }
  k.commit = commit_key(cfg.check_flag());
  return k;
}

std::string commit_key(bool check_flag) {
  return std::string("commit.f") + (check_flag ? "1" : "0") + ".T" + std::to_string(kCommitTBlock) + ".w" +
         std::to_string(kCommitWarps);
}

HostTables build_tables(const TensorRow* rows, std::size_t n) {
  HostTables t;
  t.table.assign(n * kTableCols, 0);
  std::int64_t start = 0;
  for (std::size_t j = 0; j < n; ++j) {
    const TensorRow& r = rows[j];
    std::int64_t* row = t.table.data() + j * kTableCols;
    row[0] = static_cast<std::int64_t>(reinterpret_cast<std::uintptr_t>(r.param));
    row[1] = static_cast<std::int64_t>(reinterpret_cast<std::uintptr_t>(r.grad));
    row[2] = static_cast<std::int64_t>(reinterpret_cast<std::uintptr_t>(r.exp_avg));
    row[3] = static_cast<std::int64_t>(reinterpret_cast<std::uintptr_t>(r.exp_avg_sq));
    row[4] = static_cast<std::int64_t>(reinterpret_cast<std::uintptr_t>(r.p_init));
    row[5] = static_cast<std::int64_t>(reinterpret_cast<std::uintptr_t>(r.step));
    row[6] = r.numel;
    row[7] = start;
    row[8] = r.elem_offset;
    row[9] = r.param_index;
    row[10] = r.global_numel;
    row[11] = 0;
    start += (r.numel + kBlock - 1) / kBlock;
  }
  if (start > 0x7FFFFFFF) {
    throw Error(Status::kInvalidArgument, "a launch group of " + std::to_string(start) +
                                              " blocks exceeds the grid limit 2^31-1; split the parameters over groups");
  }
  t.nblocks = start;
  t.block_map.resize(static_cast<std::size_t>(start));
  for (std::size_t j = 0; j < n; ++j) {
    const std::int64_t b0 = t.table[j * kTableCols + 7];
    const std::int64_t nb = (rows[j].numel + kBlock - 1) / kBlock;
    for (std::int64_t b = 0; b < nb; ++b) t.block_map[static_cast<std::size_t>(b0 + b)] = static_cast<std::int32_t>(j);
  }
  return t;
}

const char* aot_dtype_word(DType d) {
  switch (d) {
    case DType::kFloat32: return "fp32";
    case DType::kBFloat16: return "bf16";
    case DType::kFloat16: return "fp16";
  }
  return "?";
}

GroupKernels::GroupKernels(std::shared_ptr<AotRuntime> runtime, int device, const GroupConfig& cfg)
    : rt_(std::move(runtime)), device_(device), cfg_(cfg) {
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
                                       aot_dtype_word(cfg_.param_dtype) + ":" + aot_dtype_word(cfg_.grad_dtype) + ":" +
                                       aot_dtype_word(cfg_.state_dtype) + "`");
  }
  return rt_->load(*meta, device_);
}

namespace {
struct Scalars {
  std::int64_t seed;
  float sign, beta1, beta2, eps, weight_decay, clip, bound;
};
Scalars scalars(const GroupConfig& cfg) {
  Scalars s;
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
}  // namespace

void GroupKernels::pass1(CUdeviceptr table, CUdeviceptr block_map, std::int64_t nblocks, CUdeviceptr partial_sum,
                         CUdeviceptr partial_bad, CUstream stream) const {
  if (!pass1_) throw Error(Status::kInternal, "pass1 launched for a group that does not need it");
  Scalars s = scalars(cfg_);
  rt_->launch(*pass1_, {static_cast<unsigned>(nblocks), 1, 1},
              {&table, &block_map, &partial_sum, &partial_bad, &s.seed, &s.sign, &s.beta1, &s.beta2, &s.eps}, stream);
}

void GroupKernels::reduce(CUdeviceptr table, CUdeviceptr partial_sum, CUdeviceptr partial_bad, CUdeviceptr stats,
                          CUdeviceptr found_inf, std::int32_t ntensors, CUstream stream) const {
  if (!reduce_) throw Error(Status::kInternal, "reduce launched for a group that does not need it");
  rt_->launch(*reduce_, {static_cast<unsigned>(ntensors), 1, 1},
              {&table, &partial_sum, &partial_bad, &stats, &found_inf, &ntensors}, stream);
}

void GroupKernels::update(CUdeviceptr table, CUdeviceptr block_map, std::int64_t nblocks, CUdeviceptr stats,
                          CUdeviceptr found_inf, CUdeviceptr lr, CUstream stream) const {
  Scalars s = scalars(cfg_);
  // single_pass reads neither stats nor found_inf; any valid address will do.
  if (!stats) stats = table;
  if (!found_inf) found_inf = table;
  rt_->launch(*update_, {static_cast<unsigned>(nblocks), 1, 1},
              {&table, &block_map, &stats, &found_inf, &lr, &s.seed, &s.sign, &s.beta1, &s.beta2, &s.eps,
               &s.weight_decay, &s.clip, &s.bound},
              stream);
}

void GroupKernels::commit(CUdeviceptr table, CUdeviceptr found_inf, std::int32_t ntensors, CUstream stream) const {
  if (!found_inf) found_inf = table;
  rt_->launch(*commit_, {1, 1, 1}, {&table, &found_inf, &ntensors}, stream);
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
