// tests/test_cpu_philox.cpp: the vector forms of the rounding streams' words (src/engine/cpu_philox.cpp)
// against the scalar form, at every vector width this CPU runs
#include <gtest/gtest.h>

#include <cstdint>
#include <random>
#include <string>
#include <vector>

#include "engine/cpu_kernels.h"
#include "engine/cpu_philox.h"

namespace cpu = luminav::cpu;

namespace {

std::vector<cpu::CpuIsa> runnable_isas() {
  // every width up to the widest the engine finds on this CPU
  std::vector<cpu::CpuIsa> isas;
  for (int i = 0; i <= static_cast<int>(cpu::cpu_isa()); ++i) isas.push_back(static_cast<cpu::CpuIsa>(i));
  return isas;
}

constexpr std::uint16_t kSentinel = 0xBEEFu;

// Words of one run from both forms; the vector form must not write past the run.
void expect_same_words(cpu::CpuIsa isa, std::uint64_t key, std::int64_t first, std::int64_t count,
                       std::uint32_t stream) {
  std::vector<std::uint16_t> want(static_cast<std::size_t>(count) + 1, kSentinel);
  std::vector<std::uint16_t> got(static_cast<std::size_t>(count) + 1 + 16, kSentinel);
  cpu::random_words_scalar(key, first, count, stream, want.data());
  cpu::random_words_fn(isa)(key, first, count, stream, got.data());
  const std::string where = cpu::cpu_isa_name(isa) + " key " + std::to_string(key) + " first " +
                            std::to_string(first) + " count " + std::to_string(count) + " stream " +
                            std::to_string(stream);
  for (std::int64_t i = 0; i < count; ++i) {
    ASSERT_EQ(got[static_cast<std::size_t>(i)], want[static_cast<std::size_t>(i)]) << where << " index " << i;
  }
  for (std::size_t i = static_cast<std::size_t>(count); i < got.size(); ++i)
    ASSERT_EQ(got[i], kSentinel) << where << ": wrote past the run at " << i;
}

}  // namespace

TEST(CpuPhilox, EveryFormMatchesTheScalarFormOnShortAndUnalignedRuns) {
  std::mt19937_64 rng(20261201);
  for (cpu::CpuIsa isa : runnable_isas()) {
    for (int trial = 0; trial < 6; ++trial) {
      const std::uint64_t key = trial == 0 ? 0 : trial == 1 ? ~std::uint64_t{0} : rng();
      const std::uint32_t stream = trial < 3 ? static_cast<std::uint32_t>(trial) : static_cast<std::uint32_t>(rng());
      for (std::int64_t first = 0; first < 136; ++first)
        for (std::int64_t count : {0, 1, 2, 7, 8, 9, 15, 16, 17, 31, 63, 64, 65, 127, 128, 129, 200, 256, 300})
          expect_same_words(isa, key, first, count, stream);
    }
  }
}

TEST(CpuPhilox, EveryFormMatchesTheScalarFormAtLargeCounters) {
  // Group counters j = i >> 3 past 2^32 (a shard's offset puts them there), and runs whose
  // groups straddle lo32(j) wrapping to 0, where hi32(j) steps inside one vector.
  std::mt19937_64 rng(7);
  const std::int64_t wrap = std::int64_t{1} << 35;  // element of group 2^32
  const std::int64_t firsts[] = {wrap - 8 * 16 - 3, wrap - 8 * 5, wrap - 1, wrap, wrap + 5,
                                 (std::int64_t{1} << 40) + 123, (std::int64_t{1} << 59) - 77,
                                 3 * wrap - 8 * 7 - 1};
  for (cpu::CpuIsa isa : runnable_isas()) {
    for (std::int64_t first : firsts)
      for (std::int64_t count : {1, 9, 64, 129, 256, 1000})
        expect_same_words(isa, rng(), first, count, static_cast<std::uint32_t>(rng() % 3));
  }
}

TEST(CpuPhilox, EveryFormMatchesTheScalarFormOnRandomRuns) {
  std::mt19937_64 rng(99);
  for (cpu::CpuIsa isa : runnable_isas()) {
    for (int trial = 0; trial < 300; ++trial) {
      const std::int64_t first = static_cast<std::int64_t>(rng() % (std::uint64_t{1} << 45));
      const std::int64_t count = static_cast<std::int64_t>(rng() % 3000);
      expect_same_words(isa, rng(), first, count, static_cast<std::uint32_t>(rng()));
    }
  }
}

TEST(CpuPhilox, TheScalarFormIsTheEnginesRandomWords) {
  std::vector<std::uint32_t> a(777);
  std::vector<std::uint16_t> b(777);
  cpu::random_words(0x0123456789ABCDEFull, 13, 777, 2, a.data());
  cpu::random_words_scalar(0x0123456789ABCDEFull, 13, 777, 2, b.data());
  for (std::size_t i = 0; i < a.size(); ++i) {
    ASSERT_LT(a[i], 1u << 16) << "index " << i;
    ASSERT_EQ(a[i], b[i]) << "index " << i;
  }
}
