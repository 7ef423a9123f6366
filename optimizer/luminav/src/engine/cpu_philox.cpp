// src/engine/cpu_philox.cpp: Philox4x32-10 for many groups at once in vector lanes, the random
// words of the rounding streams a tile at a time (cpu_philox.h)
//
// Rounding stream format 2 (docs/tdclm.md "Random streams"): element i takes half i & 1 of word
// (i >> 1) & 3 of Philox(key, counter = (lo32(j), hi32(j), stream, 0)), j = i >> 3, one counter
// ("group") per eight elements. Each form holds one group per 64-bit vector lane: a counter word
// lives in the lane's low 32 bits, so a round's two 32x32->64 products are one unsigned
// even-lane multiply each (pmuludq / vpmuludq) and the carry of j across 2^32 is a 64-bit add.
// The lanes' high halves carry garbage that nothing reads (the multiplies ignore it, the output
// masks it). A group's four words stored in order are its eight 16-bit words in element order
// (little-endian), so the output is the lanes transposed to groups (unpacks and lane permutes),
// stored as 16-bit words. Only integer operations: the bits are the scalar form's by
// construction, and test_cpu_philox.cpp checks them against it.
//
// A run [first, first + count) is cut into vectors of groups: the vector holding an unaligned
// start and the one holding a partial end go through a small buffer, the whole vectors between
// are written in place, two registers in flight so the multiplies' latency overlaps.

#include "engine/cpu_philox.h"

#include <algorithm>
#include <cstring>

#include "engine/cpu_numerics.h"

#if defined(__x86_64__) && (defined(__GNUC__) || defined(__clang__))
#define LV_PHILOX_X86 1
#include <immintrin.h>
#else
#define LV_PHILOX_X86 0
#endif

// The rounds and the registers in flight are unrolled whatever the build's -O level, so the
// counter words stay in registers.
#if defined(__clang__)
#define LV_PRAGMA(x) _Pragma(#x)
#define LV_UNROLL(n) LV_PRAGMA(unroll n)
#elif defined(__GNUC__)
#define LV_PRAGMA(x) _Pragma(#x)
#define LV_UNROLL(n) LV_PRAGMA(GCC unroll n)
#else
#define LV_UNROLL(n)
#endif

namespace luminav {
namespace cpu {

using namespace numerics;

void random_words_scalar(std::uint64_t key, std::int64_t first, std::int64_t count,
                         std::uint32_t stream, std::uint16_t* out) noexcept {
  random_words_impl(key, first, count, stream, out);
}

#if LV_PHILOX_X86
namespace {

// The round keys: round r adds (r kPhiloxKeyA, r kPhiloxKeyB) to the key, modulo 2^32.
struct Keys {
  std::uint32_t k0[10], k1[10];
};

Keys round_keys(std::uint64_t key) noexcept {
  Keys k{};
  std::uint32_t k0 = static_cast<std::uint32_t>(key), k1 = static_cast<std::uint32_t>(key >> 32);
  for (int r = 0; r < 10; ++r) {
    k.k0[r] = k0;
    k.k1[r] = k1;
    k0 += kPhiloxKeyA;
    k1 += kPhiloxKeyB;
  }
  return k;
}

// Writes the words of `nv` vectors of groups starting at group j (8 GV nv elements) to out.
using VectorsFn = void (*)(const Keys&, std::uint64_t j, std::uint32_t stream, std::int64_t nv,
                           std::uint16_t* out);

// The run [first, first + count) in vectors of GV groups (see the file comment).
template <int GV>
void words_by_vectors(VectorsFn run, std::uint64_t key, std::int64_t first, std::int64_t count,
                      std::uint32_t stream, std::uint16_t* out) noexcept {
  if (count <= 0) return;
  constexpr std::int64_t kSpan = 8 * GV;  // elements per vector of groups
  const Keys keys = round_keys(key);
  const std::int64_t end = first + count;
  std::int64_t e0 = first & ~std::int64_t{7};  // first element of the first group
  alignas(64) std::uint16_t buf[kSpan];
  if (e0 < first || e0 + kSpan > end) {  // an unaligned start, or a run shorter than a vector
    run(keys, static_cast<std::uint64_t>(e0) >> 3, stream, 1, buf);
    const std::int64_t stop = std::min(e0 + kSpan, end);
    std::memcpy(out, buf + (first - e0), sizeof(std::uint16_t) * static_cast<std::size_t>(stop - first));
    e0 += kSpan;
  }
  if (e0 >= end) return;
  const std::int64_t whole = (end - e0) / kSpan;
  if (whole > 0) {
    run(keys, static_cast<std::uint64_t>(e0) >> 3, stream, whole, out + (e0 - first));
    e0 += whole * kSpan;
  }
  if (e0 < end) {
    run(keys, static_cast<std::uint64_t>(e0) >> 3, stream, 1, buf);
    std::memcpy(out + (e0 - first), buf, sizeof(std::uint16_t) * static_cast<std::size_t>(end - e0));
  }
}

// ------------------------------------------------------------------------------ SSE2: 2 groups

#define LV_SSE2_INLINE inline __attribute__((always_inline))

template <int NV>
LV_SSE2_INLINE void groups_sse2(const Keys& k, std::uint64_t j, std::uint32_t stream, std::uint16_t* out) {
  const __m128i ma = _mm_set1_epi64x(kPhiloxRoundA), mb = _mm_set1_epi64x(kPhiloxRoundB);
  __m128i c0[NV], c1[NV], c2[NV], c3[NV];
  LV_UNROLL(4)
  for (int v = 0; v < NV; ++v) {
    const std::uint64_t jv = j + 2u * static_cast<std::uint64_t>(v);
    c0[v] = _mm_set_epi64x(static_cast<long long>(jv + 1), static_cast<long long>(jv));
    c1[v] = _mm_srli_epi64(c0[v], 32);
    c2[v] = _mm_set1_epi64x(stream);
    c3[v] = _mm_setzero_si128();
  }
  LV_UNROLL(10)
  for (int r = 0; r < 10; ++r) {
    const __m128i k0 = _mm_set1_epi64x(k.k0[r]), k1 = _mm_set1_epi64x(k.k1[r]);
    LV_UNROLL(4)
    for (int v = 0; v < NV; ++v) {
      const __m128i pa = _mm_mul_epu32(c0[v], ma), pb = _mm_mul_epu32(c2[v], mb);
      c0[v] = _mm_xor_si128(_mm_xor_si128(_mm_srli_epi64(pb, 32), c1[v]), k0);
      c2[v] = _mm_xor_si128(_mm_xor_si128(_mm_srli_epi64(pa, 32), c3[v]), k1);
      c1[v] = pb;
      c3[v] = pa;
    }
  }
  LV_UNROLL(4)
  for (int v = 0; v < NV; ++v) {
    // lane l's low words (c0, c1, c2, c3) side by side: group 2v + l's eight words in order
    const __m128i lo01 = _mm_unpacklo_epi32(c0[v], c1[v]), hi01 = _mm_unpackhi_epi32(c0[v], c1[v]);
    const __m128i lo23 = _mm_unpacklo_epi32(c2[v], c3[v]), hi23 = _mm_unpackhi_epi32(c2[v], c3[v]);
    __m128i* o = reinterpret_cast<__m128i*>(out + 16 * v);
    _mm_storeu_si128(o + 0, _mm_unpacklo_epi64(lo01, lo23));  // group 2v
    _mm_storeu_si128(o + 1, _mm_unpacklo_epi64(hi01, hi23));  // group 2v + 1
  }
}

void vectors_sse2(const Keys& k, std::uint64_t j, std::uint32_t stream, std::int64_t nv, std::uint16_t* out) {
  for (; nv >= 4; nv -= 4, j += 8, out += 64) groups_sse2<4>(k, j, stream, out);
  for (; nv > 0; --nv, j += 2, out += 16) groups_sse2<1>(k, j, stream, out);
}

void random_words_sse2(std::uint64_t key, std::int64_t first, std::int64_t count, std::uint32_t stream,
                       std::uint16_t* out) noexcept {
  words_by_vectors<2>(vectors_sse2, key, first, count, stream, out);
}

// ------------------------------------------------------------------------------ AVX2: 4 groups

#define LV_AVX2_INLINE inline __attribute__((always_inline, target("avx2")))

template <int NV>
LV_AVX2_INLINE void groups_avx2(const Keys& k, std::uint64_t j, std::uint32_t stream, std::uint16_t* out) {
  const __m256i ma = _mm256_set1_epi64x(kPhiloxRoundA), mb = _mm256_set1_epi64x(kPhiloxRoundB);
  const __m256i iota = _mm256_set_epi64x(3, 2, 1, 0);
  __m256i c0[NV], c1[NV], c2[NV], c3[NV];
  LV_UNROLL(4)
  for (int v = 0; v < NV; ++v) {
    const std::uint64_t jv = j + 4u * static_cast<std::uint64_t>(v);
    c0[v] = _mm256_add_epi64(_mm256_set1_epi64x(static_cast<long long>(jv)), iota);
    c1[v] = _mm256_srli_epi64(c0[v], 32);
    c2[v] = _mm256_set1_epi64x(stream);
    c3[v] = _mm256_setzero_si256();
  }
  LV_UNROLL(10)
  for (int r = 0; r < 10; ++r) {
    const __m256i k0 = _mm256_set1_epi64x(k.k0[r]), k1 = _mm256_set1_epi64x(k.k1[r]);
    LV_UNROLL(4)
    for (int v = 0; v < NV; ++v) {
      const __m256i pa = _mm256_mul_epu32(c0[v], ma), pb = _mm256_mul_epu32(c2[v], mb);
      c0[v] = _mm256_xor_si256(_mm256_xor_si256(_mm256_srli_epi64(pb, 32), c1[v]), k0);
      c2[v] = _mm256_xor_si256(_mm256_xor_si256(_mm256_srli_epi64(pa, 32), c3[v]), k1);
      c1[v] = pb;
      c3[v] = pa;
    }
  }
  LV_UNROLL(4)
  for (int v = 0; v < NV; ++v) {
    // per 128-bit lane l: a = group 2l's words in order, b = group 2l + 1's
    const __m256i lo01 = _mm256_unpacklo_epi32(c0[v], c1[v]), hi01 = _mm256_unpackhi_epi32(c0[v], c1[v]);
    const __m256i lo23 = _mm256_unpacklo_epi32(c2[v], c3[v]), hi23 = _mm256_unpackhi_epi32(c2[v], c3[v]);
    const __m256i a = _mm256_unpacklo_epi64(lo01, lo23), b = _mm256_unpacklo_epi64(hi01, hi23);
    __m256i* o = reinterpret_cast<__m256i*>(out + 32 * v);
    _mm256_storeu_si256(o + 0, _mm256_permute2x128_si256(a, b, 0x20));  // groups 4v, 4v + 1
    _mm256_storeu_si256(o + 1, _mm256_permute2x128_si256(a, b, 0x31));  // groups 4v + 2, 4v + 3
  }
}

__attribute__((target("avx2"))) void vectors_avx2(const Keys& k, std::uint64_t j, std::uint32_t stream,
                                                  std::int64_t nv, std::uint16_t* out) {
  for (; nv >= 2; nv -= 2, j += 8, out += 64) groups_avx2<2>(k, j, stream, out);
  if (nv > 0) groups_avx2<1>(k, j, stream, out);
}

void random_words_avx2(std::uint64_t key, std::int64_t first, std::int64_t count, std::uint32_t stream,
                       std::uint16_t* out) noexcept {
  words_by_vectors<4>(vectors_avx2, key, first, count, stream, out);
}

// --------------------------------------------------------------------------- AVX-512F: 8 groups

// GCC 12's AVX-512 intrinsics pass _mm512_undefined_epi32() as the unused merge operand, which
// -Wmaybe-uninitialized reports once they are inlined (GCC bug 105593, fixed in GCC 13).
#if defined(__GNUC__) && !defined(__clang__)
#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"
#pragma GCC diagnostic ignored "-Wuninitialized"
#endif

#define LV_AVX512_INLINE inline __attribute__((always_inline, target(LV_AVX512_TARGET)))

template <int NV>
LV_AVX512_INLINE void groups_avx512(const Keys& k, std::uint64_t j, std::uint32_t stream, std::uint16_t* out) {
  const __m512i ma = _mm512_set1_epi64(kPhiloxRoundA), mb = _mm512_set1_epi64(kPhiloxRoundB);
  const __m512i iota = _mm512_set_epi64(7, 6, 5, 4, 3, 2, 1, 0);
  __m512i c0[NV], c1[NV], c2[NV], c3[NV];
  LV_UNROLL(4)
  for (int v = 0; v < NV; ++v) {
    const std::uint64_t jv = j + 8u * static_cast<std::uint64_t>(v);
    c0[v] = _mm512_add_epi64(_mm512_set1_epi64(static_cast<long long>(jv)), iota);
    c1[v] = _mm512_srli_epi64(c0[v], 32);
    c2[v] = _mm512_set1_epi64(stream);
    c3[v] = _mm512_setzero_si512();
  }
  LV_UNROLL(10)
  for (int r = 0; r < 10; ++r) {
    const __m512i k0 = _mm512_set1_epi64(k.k0[r]), k1 = _mm512_set1_epi64(k.k1[r]);
    LV_UNROLL(4)
    for (int v = 0; v < NV; ++v) {
      const __m512i pa = _mm512_mul_epu32(c0[v], ma), pb = _mm512_mul_epu32(c2[v], mb);
      c0[v] = _mm512_xor_si512(_mm512_xor_si512(_mm512_srli_epi64(pb, 32), c1[v]), k0);
      c2[v] = _mm512_xor_si512(_mm512_xor_si512(_mm512_srli_epi64(pa, 32), c3[v]), k1);
      c1[v] = pb;
      c3[v] = pa;
    }
  }
  // 64-bit lanes of the two stores: 128-bit lanes a0 b0 a1 b1, then a2 b2 a3 b3
  const __m512i first = _mm512_set_epi64(11, 10, 3, 2, 9, 8, 1, 0);
  const __m512i second = _mm512_set_epi64(15, 14, 7, 6, 13, 12, 5, 4);
  LV_UNROLL(4)
  for (int v = 0; v < NV; ++v) {
    // per 128-bit lane l: a = group 2l's words in order, b = group 2l + 1's
    const __m512i lo01 = _mm512_unpacklo_epi32(c0[v], c1[v]), hi01 = _mm512_unpackhi_epi32(c0[v], c1[v]);
    const __m512i lo23 = _mm512_unpacklo_epi32(c2[v], c3[v]), hi23 = _mm512_unpackhi_epi32(c2[v], c3[v]);
    const __m512i a = _mm512_unpacklo_epi64(lo01, lo23), b = _mm512_unpacklo_epi64(hi01, hi23);
    std::uint16_t* o = out + 64 * v;
    _mm512_storeu_si512(o + 0, _mm512_permutex2var_epi64(a, first, b));    // groups 8v .. 8v + 3
    _mm512_storeu_si512(o + 32, _mm512_permutex2var_epi64(a, second, b));  // groups 8v + 4 .. 8v + 7
  }
}

__attribute__((target(LV_AVX512_TARGET))) void vectors_avx512(const Keys& k, std::uint64_t j, std::uint32_t stream,
                                                       std::int64_t nv, std::uint16_t* out) {
  // four vectors at a time (independent multiply chains), then the tail one by one
  for (; nv >= 4; nv -= 4, j += 32, out += 256) groups_avx512<4>(k, j, stream, out);
  for (; nv > 0; --nv, j += 8, out += 64) groups_avx512<1>(k, j, stream, out);
}

void random_words_avx512(std::uint64_t key, std::int64_t first, std::int64_t count, std::uint32_t stream,
                         std::uint16_t* out) noexcept {
  words_by_vectors<8>(vectors_avx512, key, first, count, stream, out);
}

#if defined(__GNUC__) && !defined(__clang__)
#pragma GCC diagnostic pop
#endif

}  // namespace
#endif  // LV_PHILOX_X86

RandomWordsFn random_words_fn(CpuIsa isa) noexcept {
#if LV_PHILOX_X86
  switch (isa) {
    case CpuIsa::kAvx512: return random_words_avx512;
    case CpuIsa::kAvx2: return random_words_avx2;
    case CpuIsa::kBaseline: break;
  }
  return random_words_sse2;
#else
  (void)isa;
  return random_words_scalar;
#endif
}

}  // namespace cpu
}  // namespace luminav
