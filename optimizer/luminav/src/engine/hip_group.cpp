// src/engine/hip_group.cpp: HipAotGroup (engine/group.h), one launch group on an AMD device: the
// bundle's HIP variants loaded through aot/hip_runtime.h, launched with the argument lists of
// engine/group_args.h that AotGroup's CUDA launches use
#include <cstring>
#include <map>
#include <mutex>
#include <utility>

#include "engine/group.h"
#include "engine/group_args.h"
#include "luminav/error.h"

namespace luminav {

std::shared_ptr<HipRuntime> hip_runtime_for_bundle(const std::string& dir, const std::string& arch) {
  static std::mutex mutex;
  static auto* cache = new std::map<std::pair<std::string, std::string>, std::weak_ptr<HipRuntime>>();
  std::lock_guard<std::mutex> lock(mutex);
  auto& slot = (*cache)[{dir, hip_base_arch(arch)}];
  std::shared_ptr<HipRuntime> rt = slot.lock();
  if (!rt) {
    rt = std::make_shared<HipRuntime>(std::make_shared<const AotManifest>(AotManifest::load(dir)), arch);
    slot = rt;
  }
  return rt;
}

namespace {

void require(CUdeviceptr address, const char* name) {
  if (address == 0) throw Error(Status::kInvalidArgument, std::string("HipAotGroup: the ") + name + " address is 0");
}

}  // namespace

struct HipAotGroup::Launches {
  gpu::Pass1Args pass1;
  gpu::ReduceArgs reduce;
  gpu::UpdateArgs update;
  gpu::CommitArgs commit;
  LaunchGrid blocks, tensors;
};

HipAotGroup::HipAotGroup(const std::string& bundle_dir, int device, const std::string& arch, const GroupConfig& cfg)
    : rt_(hip_runtime_for_bundle(bundle_dir, arch)), device_(device), cfg_(cfg) {
  const AotManifest& man = rt_->manifest();
  if (man.table_cols() != gpu::kTableCols) {
    throw Error(Status::kBundleError, "bundle " + man.dir() + " holds kernels that read device tables of " +
                                          std::to_string(man.table_cols()) + " columns; this luminav writes " +
                                          std::to_string(gpu::kTableCols) +
                                          ". Rebuild the bundle with this release: luminamoon aot build --out " +
                                          man.dir());
  }
  const gpu::VariantKeys k = gpu::variant_keys(cfg);
  if (cfg.needs_pass1()) {
    pass1_ = &rt_->get(k.pass1, device);
    reduce_ = &rt_->get(k.reduce, device);
    update_ = &rt_->get(k.pass2, device);
  } else {
    update_ = &rt_->get(k.single_pass, device);
  }
  commit_ = &rt_->get(k.commit, device);
}

HipAotGroup::~HipAotGroup() = default;

void HipAotGroup::bind(CUdeviceptr table, CUdeviceptr block_map, std::int64_t nblocks, CUdeviceptr partial_sum,
                       CUdeviceptr partial_bad, CUdeviceptr stats, CUdeviceptr lr, std::int32_t ntensors,
                       CUdeviceptr found_inf, CUdeviceptr reduce_flag) {
  const gpu::GroupBuffers b =
      gpu::group_buffers(table, block_map, nblocks, partial_sum, partial_bad, stats, lr, ntensors);
  bind_buffers(b, found_inf, reduce_flag);
}

void HipAotGroup::bind_buffers(const gpu::GroupBuffers& b, CUdeviceptr found_inf, CUdeviceptr reduce_flag) {
  check_group_buffers("HipAotGroup", has_pass1(), b.table, b.block_map, b.nblocks, b.partial_sum, b.partial_bad,
                      b.stats, b.lr, b.ntensors, found_inf, reduce_flag);
  if (b.commit_rows < b.ntensors) {
    throw Error(Status::kInternal, "commit must advance every tensor's counter: " + std::to_string(b.commit_rows) +
                                       " rows for " + std::to_string(b.ntensors) + " tensors");
  }
  const gpu::GroupScalars s = gpu::group_scalars(cfg_);
  auto l = std::make_unique<Launches>();
  l->pass1 = gpu::pass1_args(b.table, b.block_map, b.partial_sum, b.partial_bad, s);
  l->reduce = gpu::ReduceArgs{b.table, b.partial_sum, b.partial_bad, b.stats, reduce_flag, b.ntensors};
  l->update = gpu::update_args(b.table, b.block_map, b.stats, found_inf, b.lr, s);
  l->commit = gpu::commit_args(b.table, found_inf, b.commit_rows);
  l->blocks = gpu::blocks_grid(b.nblocks);
  l->tensors = {static_cast<unsigned>(b.ntensors), 1, 1};
  launches_ = std::move(l);
}

void HipAotGroup::set_seed(std::uint64_t seed) {
  Launches& l = launches("set_seed", false);
  std::int64_t bits;
  std::memcpy(&bits, &seed, 8);
  l.pass1.seed = bits;
  l.update.seed = bits;
}

void HipAotGroup::set_flags(CUdeviceptr found_inf, CUdeviceptr reduce_flag) {
  Launches& l = launches("set_flags", false);
  require(found_inf, "found_inf");
  require(reduce_flag, "reduce_flag");
  l.update.found_inf = found_inf;
  l.commit.found_inf = found_inf;
  l.reduce.found_inf = reduce_flag;
}

void HipAotGroup::set_lr(CUdeviceptr lr) {
  Launches& l = launches("set_lr", false);
  require(lr, "lr");
  l.update.lr = lr;
}

void HipAotGroup::pass1(hipStream_t stream) {
  Launches& l = launches("pass1", true);
  auto p = gpu::pointers(l.pass1);
  rt_->launch(*pass1_, l.blocks, p.data(), p.size(), stream);
}

void HipAotGroup::reduce(hipStream_t stream) {
  Launches& l = launches("reduce", true);
  auto p = gpu::pointers(l.reduce);
  rt_->launch(*reduce_, l.tensors, p.data(), p.size(), stream);
}

void HipAotGroup::update(hipStream_t stream) {
  Launches& l = launches("update", false);
  auto p = gpu::pointers(l.update);
  rt_->launch(*update_, l.blocks, p.data(), p.size(), stream);
}

void HipAotGroup::commit(hipStream_t stream) {
  Launches& l = launches("commit", false);
  auto p = gpu::pointers(l.commit);
  rt_->launch(*commit_, {1, 1, 1}, p.data(), p.size(), stream);
}

HipAotGroup::Launches& HipAotGroup::launches(const char* what, bool pass1_kernel) {
  if (!launches_) {
    throw Error(Status::kStateError, std::string("HipAotGroup.") + what + ": no buffers are bound; call bind() first");
  }
  if (pass1_kernel && !has_pass1()) {
    throw Error(Status::kStateError, std::string("HipAotGroup.") + what +
                                         ": this group runs no pass 1 (clip == 0 and nonfinite != 'skip'); it "
                                         "launches update and commit only");
  }
  return *launches_;
}

}  // namespace luminav
