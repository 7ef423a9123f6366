// src/engine/hip_group.cpp: HipAotGroup (engine/group.h), one launch group on an AMD device: the
// bundle's HIP variants loaded through aot/hip_runtime.h, launched with the argument lists of
// engine/group_args.h that AotGroup's CUDA launches use
#include <map>
#include <mutex>
#include <utility>

#include "engine/group.h"
#include "engine/group_args.h"
#include "luminav/error.h"

namespace luminav {

namespace {

// One HIP runtime per (bundle folder, arch), shared by every group of the process.
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
  check_group_buffers("HipAotGroup", has_pass1(), table, block_map, nblocks, partial_sum, partial_bad, stats, lr,
                      ntensors, found_inf, reduce_flag);
  const gpu::GroupScalars s = gpu::group_scalars(cfg_);
  auto l = std::make_unique<Launches>();
  l->pass1 = gpu::pass1_args(table, block_map, partial_sum, partial_bad, s);
  l->reduce = gpu::ReduceArgs{table, partial_sum, partial_bad, stats, reduce_flag, ntensors};
  l->update = gpu::update_args(table, block_map, stats, found_inf, lr, s);
  l->commit = gpu::commit_args(table, found_inf, ntensors);
  l->blocks = gpu::blocks_grid(nblocks);
  l->tensors = {static_cast<unsigned>(ntensors), 1, 1};
  launches_ = std::move(l);
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
