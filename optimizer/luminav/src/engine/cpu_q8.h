// src/engine/cpu_q8.h: the CPU engine's passes over a launch group of q8 tensors (cpu_q8.cpp);
// cpu::pass1 and cpu::pass2 (cpu_kernels.h) hand such a group to them
#pragma once

#include <cstddef>
#include <cstdint>

#include "engine/cpu_kernels.h"
#include "engine/cpu_quant.h"
#include "engine/cpu_tiles.h"

namespace luminav {
namespace cpu {
namespace q8 {

// Elements of a work item's q8 blocks: a tensor's items are runs of this many q8 blocks in (row,
// block) order (its last one shorter), so every block is decoded and encoded whole by one thread.
constexpr std::int64_t kItemBlocks = kChunk / quant::kBlock;

// Pass 1 (cpu::pass1's contract): m and v decoded (scale * C[code]), steps 1-4 in float32 as for
// float32 moments, stats[j] = S_j, *found_inf = 1 where a gradient element is not finite.
// `isa`: the vector width to run (cpu_isa() or narrower; the tests run each this CPU has).
void pass1(const GroupConfig& cfg, const TensorRow* rows, std::size_t n, const tiles::TensorConsts* consts,
           float* stats, std::int32_t* found_inf, ThreadPool& pool, CpuIsa isa);
// Pass 2's steps 1-8 (tau of each row given; cpu::pass2 decides the skip): m' and v' unrounded,
// then each block's new scale and codes (streams 3 and 4).
void pass2(const GroupConfig& cfg, const TensorRow* rows, std::size_t n, const tiles::TensorConsts* consts,
           const float* taus, float lr, ThreadPool& pool, CpuIsa isa);

// The store rule's search and a block's encoding compiled at `isa`'s width, as the passes run
// them (tests/test_cpu_quant.cpp compares every width with the binary search): lo[i] =
// bracket_m(y[i]) (m) or bracket_v(y[i]); codes of quant::encode_block (m: C_m, else C_v).
void bracket_many(CpuIsa isa, bool m, const float* y, std::int64_t n, std::int32_t* lo);
void encode_block_at(CpuIsa isa, bool m, float scale, const float* x, int n, const std::uint16_t* words,
                     std::uint8_t* codes);

}  // namespace q8
}  // namespace cpu
}  // namespace luminav
