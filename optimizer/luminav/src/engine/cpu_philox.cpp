// src/engine/cpu_philox.cpp: Philox4x32-10 for many groups at once in vector lanes, the random
// words of the rounding streams a tile at a time (cpu_philox.h)
//
// Rounding stream format 2 (docs/tdclm.md "Random streams"): element i takes half i & 1 of word
// (i >> 1) & 3 of Philox(key, counter = (lo32(j), hi32(j), stream, 0)), j = i >> 3, one counter
// ("group") per eight elements. Each form holds one group per 64-bit vector lane: a counter word
// lives in the lane's low 32 bits, so a round's two 32x32->64 products are one unsigned
// even-lane multiply each (pmuludq / vpmuludq) and the carry of j across 2^32 is a 64-bit add.
// The lanes' high halves carry garbage that nothing reads (the multiplies ignore it, the output
// masks it). The words are then spread to the element order (16 bits each, zero-extended) with
// unpacks and lane shuffles. Only integer operations: the bits are the scalar form's by
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
                         std::uint32_t stream, std::uint32_t* out) noexcept {
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
                           std::uint32_t* out);

// The run [first, first + count) in vectors of GV groups (see the file comment).
template <int GV>
void words_by_vectors(VectorsFn run, std::uint64_t key, std::int64_t first, std::int64_t count,
                      std::uint32_t stream, std::uint32_t* out) noexcept {
  if (count <= 0) return;
  constexpr std::int64_t kSpan = 8 * GV;  // elements per vector of groups
  const Keys keys = round_keys(key);
  const std::int64_t end = first + count;
  std::int64_t e0 = first & ~std::int64_t{7};  // first element of the first group
  alignas(64) std::uint32_t buf[kSpan];
  if (e0 < first || e0 + kSpan > end) {  // an unaligned start, or a run shorter than a vector
    run(keys, static_cast<std::uint64_t>(e0) >> 3, stream, 1, buf);
    const std::int64_t stop = std::min(e0 + kSpan, end);
    std::memcpy(out, buf + (first - e0), sizeof(std::uint32_t) * static_cast<std::size_t>(stop - first));
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
    std::memcpy(out + (e0 - first), buf, sizeof(std::uint32_t) * static_cast<std::size_t>(end - e0));
  }
}

// ------------------------------------------------------------------------------ SSE2: 2 groups

#define LV_SSE2_INLINE inline __attribute__((always_inline))

// Word w's two halves as two zero-extended 32-bit values, in the lane's 64 bits.
LV_SSE2_INLINE __m128i halves_sse2(__m128i w) {
  const __m128i lo = _mm_set1_epi64x(0xFFFF), hi = _mm_set1_epi64x(0xFFFF0000);
  return _mm_or_si128(_mm_and_si128(w, lo), _mm_slli_epi64(_mm_and_si128(w, hi), 16));
}

template <int NV>
LV_SSE2_INLINE void groups_sse2(const Keys& k, std::uint64_t j, std::uint32_t stream, std::uint32_t* out) {
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
    const __m128i p0 = halves_sse2(c0[v]), p1 = halves_sse2(c1[v]);
    const __m128i p2 = halves_sse2(c2[v]), p3 = halves_sse2(c3[v]);
    __m128i* o = reinterpret_cast<__m128i*>(out + 16 * v);
    _mm_storeu_si128(o + 0, _mm_unpacklo_epi64(p0, p1));  // group 2v: words 0, 1
    _mm_storeu_si128(o + 1, _mm_unpacklo_epi64(p2, p3));  // group 2v: words 2, 3
    _mm_storeu_si128(o + 2, _mm_unpackhi_epi64(p0, p1));  // group 2v + 1
    _mm_storeu_si128(o + 3, _mm_unpackhi_epi64(p2, p3));
  }
}

void vectors_sse2(const Keys& k, std::uint64_t j, std::uint32_t stream, std::int64_t nv, std::uint32_t* out) {
  for (; nv >= 4; nv -= 4, j += 8, out += 64) groups_sse2<4>(k, j, stream, out);
  for (; nv > 0; --nv, j += 2, out += 16) groups_sse2<1>(k, j, stream, out);
}

void random_words_sse2(std::uint64_t key, std::int64_t first, std::int64_t count, std::uint32_t stream,
                       std::uint32_t* out) noexcept {
  words_by_vectors<2>(vectors_sse2, key, first, count, stream, out);
}

// ------------------------------------------------------------------------------ AVX2: 4 groups

#define LV_AVX2_INLINE inline __attribute__((always_inline, target("avx2")))

LV_AVX2_INLINE __m256i halves_avx2(__m256i w) {
  const __m256i lo = _mm256_set1_epi64x(0xFFFF), hi = _mm256_set1_epi64x(0xFFFF0000);
  return _mm256_or_si256(_mm256_and_si256(w, lo), _mm256_slli_epi64(_mm256_and_si256(w, hi), 16));
}

template <int NV>
LV_AVX2_INLINE void groups_avx2(const Keys& k, std::uint64_t j, std::uint32_t stream, std::uint32_t* out) {
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
    const __m256i p0 = halves_avx2(c0[v]), p1 = halves_avx2(c1[v]);
    const __m256i p2 = halves_avx2(c2[v]), p3 = halves_avx2(c3[v]);
    // 128-bit lane l of a (c): words 0, 1 (2, 3) of group 2l; of b (d): of group 2l + 1
    const __m256i a = _mm256_unpacklo_epi64(p0, p1), b = _mm256_unpackhi_epi64(p0, p1);
    const __m256i c = _mm256_unpacklo_epi64(p2, p3), d = _mm256_unpackhi_epi64(p2, p3);
    __m256i* o = reinterpret_cast<__m256i*>(out + 32 * v);
    _mm256_storeu_si256(o + 0, _mm256_permute2x128_si256(a, c, 0x20));  // group 4v
    _mm256_storeu_si256(o + 1, _mm256_permute2x128_si256(b, d, 0x20));
    _mm256_storeu_si256(o + 2, _mm256_permute2x128_si256(a, c, 0x31));
    _mm256_storeu_si256(o + 3, _mm256_permute2x128_si256(b, d, 0x31));  // group 4v + 3
  }
}

__attribute__((target("avx2"))) void vectors_avx2(const Keys& k, std::uint64_t j, std::uint32_t stream,
                                                  std::int64_t nv, std::uint32_t* out) {
  for (; nv >= 2; nv -= 2, j += 8, out += 64) groups_avx2<2>(k, j, stream, out);
  if (nv > 0) groups_avx2<1>(k, j, stream, out);
}

void random_words_avx2(std::uint64_t key, std::int64_t first, std::int64_t count, std::uint32_t stream,
                       std::uint32_t* out) noexcept {
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

#define LV_AVX512_INLINE inline __attribute__((always_inline, target("avx512f")))

LV_AVX512_INLINE __m512i halves_avx512(__m512i w) {
  const __m512i lo = _mm512_set1_epi64(0xFFFF), hi = _mm512_set1_epi64(0xFFFF0000);
  return _mm512_or_si512(_mm512_and_si512(w, lo), _mm512_slli_epi64(_mm512_and_si512(w, hi), 16));
}

template <int NV>
LV_AVX512_INLINE void groups_avx512(const Keys& k, std::uint64_t j, std::uint32_t stream, std::uint32_t* out) {
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
  LV_UNROLL(4)
  for (int v = 0; v < NV; ++v) {
    const __m512i p0 = halves_avx512(c0[v]), p1 = halves_avx512(c1[v]);
    const __m512i p2 = halves_avx512(c2[v]), p3 = halves_avx512(c3[v]);
    // 128-bit lane l of a (c): words 0, 1 (2, 3) of group 2l; of b (d): of group 2l + 1
    const __m512i a = _mm512_unpacklo_epi64(p0, p1), b = _mm512_unpackhi_epi64(p0, p1);
    const __m512i c = _mm512_unpacklo_epi64(p2, p3), d = _mm512_unpackhi_epi64(p2, p3);
    const __m512i ac_lo = _mm512_shuffle_i64x2(a, c, _MM_SHUFFLE(1, 0, 1, 0));  // a0 a1 c0 c1
    const __m512i bd_lo = _mm512_shuffle_i64x2(b, d, _MM_SHUFFLE(1, 0, 1, 0));
    const __m512i ac_hi = _mm512_shuffle_i64x2(a, c, _MM_SHUFFLE(3, 2, 3, 2));  // a2 a3 c2 c3
    const __m512i bd_hi = _mm512_shuffle_i64x2(b, d, _MM_SHUFFLE(3, 2, 3, 2));
    std::uint32_t* o = out + 64 * v;
    _mm512_storeu_si512(o + 0, _mm512_shuffle_i64x2(ac_lo, bd_lo, _MM_SHUFFLE(2, 0, 2, 0)));   // groups 0, 1
    _mm512_storeu_si512(o + 16, _mm512_shuffle_i64x2(ac_lo, bd_lo, _MM_SHUFFLE(3, 1, 3, 1)));  // 2, 3
    _mm512_storeu_si512(o + 32, _mm512_shuffle_i64x2(ac_hi, bd_hi, _MM_SHUFFLE(2, 0, 2, 0)));  // 4, 5
    _mm512_storeu_si512(o + 48, _mm512_shuffle_i64x2(ac_hi, bd_hi, _MM_SHUFFLE(3, 1, 3, 1)));  // 6, 7
  }
}

__attribute__((target("avx512f"))) void vectors_avx512(const Keys& k, std::uint64_t j, std::uint32_t stream,
                                                       std::int64_t nv, std::uint32_t* out) {
  // four vectors at a time (independent multiply chains), then the tail one by one
  for (; nv >= 4; nv -= 4, j += 32, out += 256) groups_avx512<4>(k, j, stream, out);
  for (; nv > 0; --nv, j += 8, out += 64) groups_avx512<1>(k, j, stream, out);
}

void random_words_avx512(std::uint64_t key, std::int64_t first, std::int64_t count, std::uint32_t stream,
                         std::uint32_t* out) noexcept {
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
