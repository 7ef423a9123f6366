// src/engine/group_args.h: the argument lists of a launch group's kernels (docs/internals.md
// "Kernels"), written once for both launch paths: the CUDA one (BoundGroupLaunches,
// group_launch.cpp) and the HIP one (HipGroupLaunches, hip_group.cpp)
#pragma once

#include <array>
#include <cstddef>
#include <cstdint>

#include "aot/runtime.h"
#include "engine/group_launch.h"

namespace luminav {
namespace gpu {

// The argument lists of docs/internals.md "Kernels", each written once: a struct of the values
// in order, and the pointers to them that a launch takes. BoundGroupLaunches binds them once.
struct Pass1Args {
  CUdeviceptr table, block_map, partial_sum, partial_bad;
  std::int64_t seed;
  float sign, beta1, beta2, eps;
};
constexpr std::size_t kPass1Seed = 4;
inline std::array<void*, 9> pointers(Pass1Args& a) {
  return {&a.table, &a.block_map, &a.partial_sum, &a.partial_bad, &a.seed, &a.sign, &a.beta1, &a.beta2, &a.eps};
}
inline Pass1Args pass1_args(CUdeviceptr table, CUdeviceptr block_map, CUdeviceptr partial_sum, CUdeviceptr partial_bad,
                     const GroupScalars& s) {
  return {table, block_map, partial_sum, partial_bad, s.seed, s.sign, s.beta1, s.beta2, s.eps};
}

struct ReduceArgs {
  CUdeviceptr table, partial_sum, partial_bad, stats, found_inf;
  std::int32_t ntensors;
};
constexpr std::size_t kReduceFoundInf = 4;
inline std::array<void*, 6> pointers(ReduceArgs& a) {
  return {&a.table, &a.partial_sum, &a.partial_bad, &a.stats, &a.found_inf, &a.ntensors};
}

struct UpdateArgs {
  CUdeviceptr table, block_map, stats, found_inf, lr;
  std::int64_t seed;
  float sign, beta1, beta2, eps, weight_decay, clip, bound;
};
constexpr std::size_t kUpdateFoundInf = 3;
constexpr std::size_t kUpdateLr = 4;
constexpr std::size_t kUpdateSeed = 5;
inline std::array<void*, 13> pointers(UpdateArgs& a) {
  return {&a.table, &a.block_map, &a.stats, &a.found_inf, &a.lr, &a.seed, &a.sign, &a.beta1, &a.beta2, &a.eps,
          &a.weight_decay, &a.clip, &a.bound};
}
inline UpdateArgs update_args(CUdeviceptr table, CUdeviceptr block_map, CUdeviceptr stats, CUdeviceptr found_inf,
                       CUdeviceptr lr, const GroupScalars& s) {
  // single_pass reads neither stats nor found_inf; any valid address will do.
  if (!stats) stats = table;
  if (!found_inf) found_inf = table;
  return {table, block_map, stats, found_inf, lr, s.seed, s.sign, s.beta1, s.beta2, s.eps, s.weight_decay, s.clip,
          s.bound};
}

struct CommitArgs {
  CUdeviceptr table, found_inf;
  std::int32_t ntensors;
};
constexpr std::size_t kCommitFoundInf = 1;
inline std::array<void*, 3> pointers(CommitArgs& a) { return {&a.table, &a.found_inf, &a.ntensors}; }
inline CommitArgs commit_args(CUdeviceptr table, CUdeviceptr found_inf, std::int32_t ntensors) {
  if (!found_inf) found_inf = table;  // commit without CHECK_FLAG does not read it
  return {table, found_inf, ntensors};
}

inline LaunchGrid blocks_grid(std::int64_t nblocks) { return {static_cast<unsigned>(nblocks), 1, 1}; }

}  // namespace gpu
}  // namespace luminav
