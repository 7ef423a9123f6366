// src/engine/group_launch.h: one launch group on the GPU: its variant keys, its device tables
// (C++'s one table writer, build_tables) and its kernels' launches, bound once per layout
//
// Exactly as docs/internals.md and python/luminamoon/kernels/ (layout.py, catalog.py) lay them out. Used
// by the engine's CUDA device and by the "aot" Python backend (AotGroup, engine/group.h).
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "aot/runtime.h"
#include "engine/engine.h"

namespace luminav {
namespace gpu {

// Launch shapes of kernels/catalog.py (ELEMENTWISE_BLOCK/WARPS, REDUCE_RBLOCK/WARPS,
// COMMIT_TBLOCK/WARPS); the variant keys carry them, so a bundle built with other values is
// reported as missing a variant rather than launched with the wrong layout.
constexpr int kBlock = 1024;
constexpr int kBlockWarps = 4;
constexpr int kReduceRBlock = 16384;
constexpr int kReduceWarps = 16;
constexpr int kCommitTBlock = 1024;
constexpr int kCommitWarps = 4;

// The device table (docs/internals.md "Device tables"; kernels/layout.py TABLE_COLS and COL_*): an
// int64 row per tensor. Columns 0-10 and 18-20 are written by build_tables, 11 is reserved, 12-17 are
// the step-constant cache (two slots of 3), zero on the host and written by the update kernels;
// 18-20 (q8 moments, zero otherwise): the addresses of m's and v's float32 block scales and the
// elements of a block row.
constexpr int kTableCols = 21;
constexpr int kColParam = 0, kColGrad = 1, kColExpAvg = 2, kColExpAvgSq = 3, kColPInit = 4, kColStep = 5;
constexpr int kColNumel = 6, kColBlockStart = 7, kColElemOffset = 8, kColParamIndex = 9, kColGlobalNumel = 10;
constexpr int kColCache = 12;
constexpr int kColExpAvgScale = 18, kColExpAvgSqScale = 19, kColRowLen = 20;
// Elements of a q8 block (kernels/layout.py Q8_BLOCK): a program of a q8 tensor owns kBlock /
// kQ8Block whole q8 blocks.
constexpr int kQ8Block = 256;
static_assert(kBlock % kQ8Block == 0, "a program owns whole q8 blocks");

// Every pointer a bundle kernel is handed must be a multiple of this many bytes: the kernels are
// compiled with 16-byte divisibility hints on their pointers (kernels/layout.py ALIGN_BYTES).
constexpr std::size_t kAlignBytes = 16;

// The keys one launch group runs (kernels/catalog.py variants_for): pass1/reduce/pass2 when pass 1
// is needed, else single_pass; commit always. Unused keys are empty. Each key is the manifest
// layer's (derive_variant_key, aot/manifest.h) of the kernel's constexprs.
struct VariantKeys {
  std::string pass1, reduce, pass2, single_pass, commit;
};
VariantKeys variant_keys(const GroupConfig& cfg);
// The commit variant with CHECK_FLAG = 1 (the engine's applied-step counter uses it).
std::string commit_key(bool check_flag);

// Host images of a group's device tables: int64 [n, kTableCols] and int32 [nblocks].
struct HostTables {
  std::vector<std::int64_t> table;
  std::vector<std::int32_t> block_map;
  std::int64_t nblocks = 0;
};
// `rows` hold device addresses; a row with row_len > 0 is a q8 tensor's (columns 18-20, and
// programs of whole q8 blocks). Throws kInvalidArgument for more than 2^31-1 blocks.
HostTables build_tables(const TensorRow* rows, std::size_t n);

// The scalar arguments of a group's pass 1 and update kernels (internals.md), rounded once.
struct GroupScalars {
  std::int64_t seed = 0;  // the uint64 seed's bit pattern
  float sign = 1, beta1 = 0, beta2 = 0, eps = 0, weight_decay = 0, clip = 0, bound = 0;
};
GroupScalars group_scalars(const GroupConfig& cfg);

// The kernels of one launch group, loaded on one device. Construction resolves every variant
// the group needs, so a missing one is reported before anything is launched: Error(kNotFound)
// "variant <key> for sm_<arch> is not in bundle <dir>; rebuild with `luminamoon aot build
// --arch <arch> --dtypes p:g:s`". A bad cubin is refused there too (kBundleError).
class GroupKernels {
 public:
  GroupKernels(std::shared_ptr<AotRuntime> runtime, int device, const GroupConfig& cfg);

  const GroupConfig& config() const { return cfg_; }

 private:
  friend class BoundGroupLaunches;
  const LoadedKernel& resolve(const std::string& key) const;

  std::shared_ptr<AotRuntime> rt_;
  int device_;
  GroupConfig cfg_;
  GroupScalars scalars_;
  const LoadedKernel* pass1_ = nullptr;
  const LoadedKernel* reduce_ = nullptr;
  const LoadedKernel* update_ = nullptr;
  const LoadedKernel* commit_ = nullptr;
};

// The device buffers of one launch group as its launches bind them.
struct GroupBuffers {
  CUdeviceptr table = 0, block_map = 0, partial_sum = 0, partial_bad = 0, stats = 0, lr = 0;
  std::int64_t nblocks = 0;      // programs of pass 1 and pass 2
  std::int32_t ntensors = 0;     // tensors of the group: the reduce grid
  std::int32_t commit_rows = 0;  // table rows whose STEP counter commit advances (>= ntensors)
};

// The buffers of a group whose commit advances exactly its own rows (the launch groups Python's
// aot backend drives: AotGroup, HipAotGroup).
inline GroupBuffers group_buffers(CUdeviceptr table, CUdeviceptr block_map, std::int64_t nblocks,
                                  CUdeviceptr partial_sum, CUdeviceptr partial_bad, CUdeviceptr stats,
                                  CUdeviceptr lr, std::int32_t ntensors) {
  GroupBuffers b;
  b.table = table;
  b.block_map = block_map;
  b.partial_sum = partial_sum;
  b.partial_bad = partial_bad;
  b.stats = stats;
  b.lr = lr;
  b.nblocks = nblocks;
  b.ntensors = ntensors;
  b.commit_rows = ntensors;
  return b;
}

// Every launch of one group over fixed buffers, its arguments bound once (KernelLaunch): a step
// only stores the flag addresses (and the seed when it changed) and launches. The kernels'
// context must be current around the launches (one ScopedContext per step).
class BoundGroupLaunches {
 public:
  // `found_inf`: the flag pass 2 and commit read; `reduce_flag`: the flag the reduce raises
  // (found_inf for a group that skips, a scratch flag otherwise).
  BoundGroupLaunches(const GroupKernels& kernels, const GroupBuffers& buffers, CUdeviceptr found_inf,
                     CUdeviceptr reduce_flag);

  bool has_pass1() const { return pass1_.bound(); }
  // Each replaces the bound value where it changed (a compare otherwise): `found_inf` in pass 2
  // and commit, `reduce_flag` in reduce; the lr address of pass 2; the seed of pass 1 and 2.
  void set_flags(CUdeviceptr found_inf, CUdeviceptr reduce_flag);
  void set_lr(CUdeviceptr lr);
  void set_seed(std::uint64_t seed);

  // The context the launches must run in (the device's primary context), and the driver table
  // they go through: a caller makes it current around a batch (ScopedContext).
  CUcontext context() const { return update_.kernel().context; }
  const CudaDriverApi& driver() const { return rt_->driver(); }

  void pass1(CUstream stream) { pass1_.launch(stream); }
  void reduce(CUstream stream) { reduce_.launch(stream); }
  void update(CUstream stream) { update_.launch(stream); }
  void commit(CUstream stream) { commit_.launch(stream); }

 private:
  std::shared_ptr<AotRuntime> rt_;  // keeps the runtime the launches point into alive
  CUdeviceptr found_inf_ = 0, reduce_flag_ = 0, lr_ = 0;
  std::uint64_t seed_ = 0;
  KernelLaunch pass1_, reduce_, update_, commit_;
};

// Loads a bundle once per folder (shared by every optimizer and backend of the process).
std::shared_ptr<AotRuntime> runtime_for_bundle(const std::string& dir);

}  // namespace gpu
}  // namespace luminav
