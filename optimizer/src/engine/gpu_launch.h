// The GPU launch layer (private): variant keys, device tables and kernel launches of one launch
// group, exactly as docs/internals.md and python/luminamoon/optimizer/gpu_backend.py lay them
// out. Used by the engine's CUDA device and by the "aot" Python backend (through the bindings).
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "luminav/aot.h"
#include "luminav/engine.h"

namespace luminav {
namespace gpu {

// Launch shapes of gpu_backend.py (ELEMENTWISE_BLOCK/WARPS, REDUCE_RBLOCK/WARPS,
// COMMIT_TBLOCK/WARPS); the variant keys carry them, so a bundle built with other values is
// reported as missing a variant rather than launched with the wrong layout.
constexpr int kBlock = 1024;
constexpr int kBlockWarps = 4;
constexpr int kReduceRBlock = 8192;
constexpr int kReduceWarps = 8;
constexpr int kCommitTBlock = 1024;
constexpr int kCommitWarps = 4;
constexpr int kTableCols = 12;

// The keys one launch group runs (gpu_backend.variants_for): pass1/reduce/pass2 when pass 1 is
// needed, else single_pass; commit always. Unused keys are empty.
struct VariantKeys {
  std::string pass1, reduce, pass2, single_pass, commit;
};
VariantKeys variant_keys(const GroupConfig& cfg);
// The commit variant with CHECK_FLAG = 1 (the engine's applied-step counter uses it).
std::string commit_key(bool check_flag);

// Host images of a group's device tables: int64 [n, 12] and int32 [nblocks].
struct HostTables {
  std::vector<std::int64_t> table;
  std::vector<std::int32_t> block_map;
  std::int64_t nblocks = 0;
};
// `rows` hold device addresses; throws kInvalidArgument for more than 2^31-1 blocks.
HostTables build_tables(const TensorRow* rows, std::size_t n);

// "fp32" / "bf16" / "fp16", as `luminamoon aot build --dtypes` spells them.
const char* aot_dtype_word(DType d);

// The kernels of one launch group, loaded on one device. Construction resolves every variant
// the group needs, so a missing one is reported before anything is launched: Error(kNotFound)
// "variant <key> for sm_<arch> is not in bundle <dir>; rebuild with `luminamoon aot build
// --arch <arch> --dtypes p:g:s`".
class GroupKernels {
 public:
  GroupKernels(std::shared_ptr<AotRuntime> runtime, int device, const GroupConfig& cfg);

  const GroupConfig& config() const { return cfg_; }
  // Each takes device addresses; all launches go on `stream`.
  void pass1(CUdeviceptr table, CUdeviceptr block_map, std::int64_t nblocks, CUdeviceptr partial_sum,
             CUdeviceptr partial_bad, CUstream stream) const;
  void reduce(CUdeviceptr table, CUdeviceptr partial_sum, CUdeviceptr partial_bad, CUdeviceptr stats,
              CUdeviceptr found_inf, std::int32_t ntensors, CUstream stream) const;
  // pass2 (when pass 1 is needed) or single_pass.
  void update(CUdeviceptr table, CUdeviceptr block_map, std::int64_t nblocks, CUdeviceptr stats,
              CUdeviceptr found_inf, CUdeviceptr lr, CUstream stream) const;
  void commit(CUdeviceptr table, CUdeviceptr found_inf, std::int32_t ntensors, CUstream stream) const;

 private:
  const LoadedKernel& resolve(const std::string& key) const;

  std::shared_ptr<AotRuntime> rt_;
  int device_;
  GroupConfig cfg_;
  const LoadedKernel* pass1_ = nullptr;
  const LoadedKernel* reduce_ = nullptr;
  const LoadedKernel* update_ = nullptr;
  const LoadedKernel* commit_ = nullptr;
};

// Loads a bundle once per folder (shared by every optimizer and backend of the process).
std::shared_ptr<AotRuntime> runtime_for_bundle(const std::string& dir);

}  // namespace gpu
}  // namespace luminav
