// src/engine/cpu_philox.h: the rounding streams' random words a tile at a time, with Philox4x32-10
// computed for many groups at once in vector lanes (cpu_philox.cpp), one form per vector width
#pragma once

#include <cstdint>

#include "engine/cpu_kernels.h"

namespace luminav {
namespace cpu {

// R16(i, stream) for elements [first, first + count) of a tensor, as random_words (rounding
// stream format 2, docs/tdclm.md), as 16-bit words: the same words from every form. (A group's
// four Philox words, stored in order, are its eight R16 in element order.)
using RandomWordsFn = void (*)(std::uint64_t key, std::int64_t first, std::int64_t count,
                               std::uint32_t stream, std::uint16_t* out);

// The form for `isa`: Philox of 2 (baseline SSE2), 4 (AVX2) or 8 (AVX-512F) groups per vector
// register, two or more registers in flight; the scalar form off x86-64. Never null; `isa` must be
// one this CPU runs (cpu_isa() or narrower).
RandomWordsFn random_words_fn(CpuIsa isa) noexcept;

// The scalar form (one group at a time): the other forms' reference.
void random_words_scalar(std::uint64_t key, std::int64_t first, std::int64_t count,
                         std::uint32_t stream, std::uint16_t* out) noexcept;

}  // namespace cpu
}  // namespace luminav
