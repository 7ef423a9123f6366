// tests/test_elf.cpp: the strict cubin reader (src/aot/elf.cpp, elf_records.cpp)
//
// Real cubins of Triton 3.6 (the shared corpus's base/: sm_80, sm_90 and sm_100) and the test
// fakes parse, with their arch, entry symbol, parameter layout and block size (and the sm_100
// one's Mercury copy); every cut of a real cubin and every corruption
// of its header, section table, symbols and .nv.info is either accepted or refused with an
// ElfError of the rule book's ELF codes, never read out of bounds (run under ASan/UBSan too).
#include <gtest/gtest.h>

#include <cstring>
#include <string>
#include <vector>

#include "aot/elf.h"
#include "fakes/fake_bundle.h"

using luminav::BundleRule;
using luminav::elf::CubinInfo;
using luminav::elf::ElfError;
using luminav::elf::parse_cubin;
using namespace luminav_test;

namespace {

const std::string kBase = std::string(LUMINAV_TEST_CORPUS_DIR) + "/base/";

std::vector<unsigned char> base_cubin(const std::string& name = "commit.f0.T1024.w4.sm90.cubin") {
  return read_bytes(kBase + name);
}

// The rule an image breaks, or -1 when it is accepted.
int rule_of(const std::vector<unsigned char>& b) {
  try {
    (void)parse_cubin(b.data(), b.size());
  } catch (const ElfError& e) {
    const BundleRule r = e.rule();
    EXPECT_TRUE(r == BundleRule::kTruncated || r == BundleRule::kElfHeader || r == BundleRule::kElfSection);
    return static_cast<int>(r);
  }
  return -1;
}

std::uint64_t le(const std::vector<unsigned char>& b, std::size_t off, int n) {
  std::uint64_t v = 0;
  for (int i = 0; i < n; ++i) v |= std::uint64_t{b[off + static_cast<std::size_t>(i)]} << (8 * i);
  return v;
}

void put(std::vector<unsigned char>& b, std::size_t off, std::uint64_t v, int n) {
  for (int i = 0; i < n; ++i) b[off + static_cast<std::size_t>(i)] = static_cast<unsigned char>(v >> (8 * i));
}

}  // namespace

TEST(Elf, ReadsARealCubin) {
  const auto b = base_cubin();
  ASSERT_FALSE(b.empty()) << "no corpus cubin at " << kBase;
  const CubinInfo info = parse_cubin(b.data(), b.size());
  EXPECT_EQ(info.arch, 90);
  EXPECT_EQ(info.abi_version, 7);
  const auto entry = info.entry_symbols("_lumina_tdclm_commit_kernel");
  ASSERT_EQ(entry.size(), 1u);
  EXPECT_TRUE(info.entry_symbols("_lumina_tdclm_pass2_kernel").empty());
  const auto& fi = info.function_info.at(entry[0]->shndx);
  ASSERT_EQ(fi.size(), 1u);
  // table *i64, found_inf *i32, ntensors i32, then the two scratch pointers
  std::vector<std::pair<std::uint32_t, std::uint32_t>> got;
  for (std::uint32_t ord = 0; ord < fi[0].params.size(); ++ord) {
    for (const auto& p : fi[0].params) {
      if (p.ordinal == ord) got.emplace_back(p.offset, p.size);
    }
  }
  EXPECT_EQ(got, (std::vector<std::pair<std::uint32_t, std::uint32_t>>{{0, 8}, {8, 8}, {16, 4}, {24, 8}, {32, 8}}));
  ASSERT_TRUE(fi[0].cbank_param_size.has_value());
  EXPECT_EQ(*fi[0].cbank_param_size, 40u);
  ASSERT_TRUE(fi[0].reqntid.has_value());
  EXPECT_EQ((*fi[0].reqntid)[0], 128u);  // 4 warps
  const auto sm80 = base_cubin("commit.f1.T1024.w4.sm80.cubin");
  EXPECT_EQ(parse_cubin(sm80.data(), sm80.size()).arch, 80);
}

TEST(Elf, ReadsTheFakes) {
  FakeCubin c;
  c.payload = "code";
  c.entry = "k";
  c.arch = 86;
  c.param_sizes = {8, 4, 2, 1, 8};
  c.threads = 64;
  const auto b = make_fake_cubin(c);
  const CubinInfo info = parse_cubin(b.data(), b.size());
  EXPECT_EQ(info.arch, 86);
  ASSERT_EQ(info.entry_symbols("k").size(), 1u);
  EXPECT_EQ(info.function_info.at(info.entry_symbols("k")[0]->shndx)[0].params.size(), 5u);
  const auto plain = make_fake_cubin("no kernel");
  EXPECT_TRUE(parse_cubin(plain.data(), plain.size()).entry_symbols("k").empty());
}

TEST(Elf, ArchFromEFlags) {
  EXPECT_EQ(luminav::elf::arch_from_flags(7, 0x5a0d5a), 90);
  EXPECT_EQ(luminav::elf::arch_from_flags(7, 0x500550), 80);
  EXPECT_EQ(luminav::elf::arch_from_flags(8, 0x5a04), 90);
}

TEST(Elf, EveryCutOfARealCubinIsRefused) {
  const auto b = base_cubin();
  for (std::size_t n = 0; n < b.size(); ++n) {
    const std::vector<unsigned char> cut(b.begin(), b.begin() + static_cast<long>(n));
    ASSERT_NE(rule_of(cut), -1) << n;
  }
}

TEST(Elf, HeaderFieldsOutOfRangeAreRefusedByTheirRule) {
  const auto good = base_cubin();
  struct Case {
    std::size_t off;
    int width;
    std::uint64_t value;
    BundleRule rule;
  };
  const std::uint64_t shnum = le(good, 0x3c, 2);
  for (const Case c : {Case{0x00, 1, 0, BundleRule::kElfHeader}, Case{0x04, 1, 1, BundleRule::kElfHeader},
                       Case{0x06, 1, 2, BundleRule::kElfHeader}, Case{0x08, 1, 6, BundleRule::kElfHeader},
                       Case{0x12, 2, 62, BundleRule::kElfHeader}, Case{0x10, 2, 1, BundleRule::kElfHeader},
                       Case{0x34, 2, 52, BundleRule::kElfHeader}, Case{0x3a, 2, 40, BundleRule::kElfHeader},
                       Case{0x3c, 2, 0, BundleRule::kElfHeader}, Case{0x3c, 2, 0xff00, BundleRule::kElfHeader},
                       Case{0x3e, 2, shnum, BundleRule::kElfHeader}, Case{0x3e, 2, 0, BundleRule::kElfHeader},
                       Case{0x36, 2, 64, BundleRule::kElfHeader},
                       Case{0x28, 8, ~std::uint64_t{0}, BundleRule::kTruncated},
                       Case{0x20, 8, ~std::uint64_t{0} - 4, BundleRule::kTruncated}}) {
    auto b = good;
    put(b, c.off, c.value, c.width);
    EXPECT_EQ(rule_of(b), static_cast<int>(c.rule)) << "offset " << c.off << " = " << c.value;
  }
}

// Every byte of the header and the section header table set to 0x00, 0xff and +1, and every
// byte of the symbol table and .nv.info sections flipped: accepted or refused, never a crash.
TEST(Elf, CorruptedStructureIsNeverReadOutOfBounds) {
  const auto good = base_cubin();
  const CubinInfo info = parse_cubin(good.data(), good.size());
  const std::uint64_t shoff = le(good, 0x28, 8), shnum = le(good, 0x3c, 2);
  std::vector<std::pair<std::uint64_t, std::uint64_t>> regions = {{0, 64}, {shoff, shoff + 64 * shnum}};
  for (const auto& s : info.sections) {
    if (s.type == luminav::elf::kShtSymtab || s.type == luminav::elf::kShtCudaInfo ||
        s.type == luminav::elf::kShtCudaCallgraph || s.type == luminav::elf::kShtRela) {
      regions.emplace_back(s.offset, s.offset + s.size);
    }
  }
  int refused = 0, accepted = 0;
  for (const auto& [lo, hi] : regions) {
    for (std::uint64_t off = lo; off < hi; ++off) {
      for (const int how : {0, 1, 2}) {
        auto b = good;
        b[off] = how == 0 ? 0x00 : how == 1 ? 0xff : static_cast<unsigned char>(b[off] + 1);
        (rule_of(b) == -1 ? accepted : refused)++;
      }
    }
  }
  EXPECT_GT(refused, 1000);
  EXPECT_GT(accepted, 0);  // padding and values the rules do not constrain
}

namespace {

const char kBlackwell[] = "commit.f0.T1024.w4.sm100.cubin";

std::vector<std::pair<std::uint32_t, std::uint32_t>> layout(const luminav::elf::FunctionInfo& fi) {
  std::vector<std::pair<std::uint32_t, std::uint32_t>> got;
  for (std::uint32_t ord = 0; ord < fi.params.size(); ++ord) {
    for (const auto& p : fi.params) {
      if (p.ordinal == ord) got.emplace_back(p.offset, p.size);
    }
  }
  return got;
}

}  // namespace

// sm_100 (ELF ABI version 8): ptxas's two notes, .nv.compat, and the Mercury copy of the kernel
// (.nv.capmerc.text, .nv.merc.*, with views of the SASS's data sections sharing their bytes).
TEST(Elf, ReadsABlackwellCubin) {
  const auto b = base_cubin(kBlackwell);
  ASSERT_FALSE(b.empty()) << "no corpus cubin at " << kBase;
  const CubinInfo info = parse_cubin(b.data(), b.size());
  EXPECT_EQ(info.arch, 100);
  EXPECT_EQ(info.abi_version, 8);
  const auto entry = info.entry_symbols("_lumina_tdclm_commit_kernel");
  ASSERT_EQ(entry.size(), 1u);
  const auto merc = info.merc_entry_symbols("_lumina_tdclm_commit_kernel");
  ASSERT_EQ(merc.size(), 1u);
  EXPECT_EQ(info.sections[merc[0]->shndx].type, luminav::elf::kShtCudaCapmerc);
  const auto& fi = info.function_info.at(entry[0]->shndx);
  const auto& mfi = info.merc_function_info.at(merc[0]->shndx);
  ASSERT_EQ(fi.size(), 1u);
  ASSERT_EQ(mfi.size(), 1u);
  EXPECT_EQ(layout(fi[0]), (std::vector<std::pair<std::uint32_t, std::uint32_t>>{{0, 8}, {8, 8}, {16, 4}, {24, 8}, {32, 8}}));
  EXPECT_EQ(layout(mfi[0]), layout(fi[0]));
  ASSERT_TRUE(mfi[0].reqntid.has_value());
  EXPECT_EQ((*mfi[0].reqntid)[0], 128u);
  int notes = 0, views = 0;
  for (const auto& s : info.sections) {
    notes += s.type == luminav::elf::kShtNote;
    views += s.type == luminav::elf::kShtProgbits && (s.flags & luminav::elf::kShfCudaMercury) &&
             s.name == ".nv.merc.nv_debug_ptx_txt";
  }
  EXPECT_EQ(notes, 2);
  EXPECT_EQ(views, 1);
}

TEST(Elf, EveryCutOfABlackwellCubinIsRefused) {
  const auto b = base_cubin(kBlackwell);
  for (std::size_t n = 0; n < b.size(); ++n) {
    const std::vector<unsigned char> cut(b.begin(), b.begin() + static_cast<long>(n));
    ASSERT_NE(rule_of(cut), -1) << n;
  }
}

// Every byte of the header, the section header table, both symbol tables, the notes, .nv.compat,
// every .nv.info, relocation and call graph section set to 0x00, 0xff and +1: accepted or
// refused, never a crash (under ASan/UBSan in make cpp-asan-test).
TEST(Elf, CorruptedBlackwellStructureIsNeverReadOutOfBounds) {
  const auto good = base_cubin(kBlackwell);
  const CubinInfo info = parse_cubin(good.data(), good.size());
  const std::uint64_t shoff = le(good, 0x28, 8), shnum = le(good, 0x3c, 2);
  std::vector<std::pair<std::uint64_t, std::uint64_t>> regions = {{0, 64}, {shoff, shoff + 64 * shnum}};
  using namespace luminav::elf;
  for (const auto& s : info.sections) {
    if (s.type == kShtSymtab || s.type == kShtCudaMercSymtab || s.type == kShtNote || s.type == kShtCudaCompat ||
        s.type == kShtCudaInfo || s.type == kShtCudaMercInfo || s.type == kShtCudaCallgraph || s.type == kShtRela ||
        s.type == kShtCudaMercRela) {
      regions.emplace_back(s.offset, s.offset + s.size);
    }
  }
  int refused = 0, accepted = 0;
  for (const auto& [lo, hi] : regions) {
    for (std::uint64_t off = lo; off < hi; ++off) {
      for (const int how : {0, 1, 2}) {
        auto b = good;
        b[off] = how == 0 ? 0x00 : how == 1 ? 0xff : static_cast<unsigned char>(b[off] + 1);
        (rule_of(b) == -1 ? accepted : refused)++;
      }
    }
  }
  EXPECT_GT(refused, 1000);
  EXPECT_GT(accepted, 0);
}
