// src/aot/elf_internal.h: what the cubin reader (elf.cpp) and its record readers
// (elf_records.cpp) share: the .nv.info formats and attribute ids, the little-endian reads,
// the refusals, and the readers of the .nv.info, note and .nv.compat sections
#pragma once

#include <cstdint>
#include <cstdio>
#include <optional>
#include <string>

#include "aot/bundle_rules.h"
#include "aot/elf.h"

namespace luminav {
namespace elf {
namespace detail {

constexpr unsigned kEifmtNval = 1, kEifmtBval = 2, kEifmtHval = 3, kEifmtSval = 4;
constexpr unsigned kMaxThreads = 0x05, kParamCbank = 0x0a, kReqntid = 0x10, kFrameSize = 0x11,
                   kMinStackSize = 0x12, kKparamInfo = 0x17, kCbankParamSize = 0x19, kExitInstrOffsets = 0x1c,
                   kS2rctaidInstrOffsets = 0x1d, kMaxStackSize = 0x23, kLdCachemodInstrOffsets = 0x25,
                   kAtomSysInstrOffsets = 0x27, kCoopGroupInstrOffsets = 0x28, kRegcount = 0x2f, kExterns = 0x0f,
                   kAtomf16EmulInstrOffsets = 0x2d, kIntWarpWideInstrOffsets = 0x31, kMbarrierInstrOffsets = 0x39,
                   kSyscallOffsets = 0x46, kSwWarMembarSysInstrOffsets = 0x47, kStackCanaryTrapOffsets = 0x57,
                   kLocalCtaAsyncStoreOffsets = 0x59;

inline std::uint64_t le(const unsigned char* p, int n) {
  std::uint64_t v = 0;
  for (int i = 0; i < n; ++i) v |= static_cast<std::uint64_t>(p[i]) << (8 * i);
  return v;
}

inline std::string hex(std::uint64_t v) {
  char buf[24];
  std::snprintf(buf, sizeof buf, "%#llx", static_cast<unsigned long long>(v));
  return v == 0 ? "0x0" : buf;
}

[[noreturn]] inline void fail(BundleRule rule, const std::string& what) { throw ElfError(rule, what); }
[[noreturn]] inline void header(const std::string& what) { fail(BundleRule::kElfHeader, what); }
[[noreturn]] inline void section(const std::string& what) { fail(BundleRule::kElfSection, what); }

// The records of one .nv.info section (rule E26); `per_function` when it is an info-link one
// (its sh_info names the code it describes, `code_size` bytes).
class NvInfoReader {
 public:
  NvInfoReader(const unsigned char* blob, std::uint64_t size, std::uint32_t index, std::uint64_t nsyms,
               std::optional<std::uint64_t> code_size, bool per_function)
      : blob_(blob), size_(size), index_(index), nsyms_(nsyms), code_size_(code_size), per_function_(per_function) {}

  FunctionInfo read();

 private:
  [[noreturn]] void bad(const std::string& what) const {
    section(".nv.info section " + std::to_string(index_) + ": " + what);
  }
  const unsigned char* blob_;
  std::uint64_t size_;
  std::uint32_t index_;
  std::uint64_t nsyms_;
  std::optional<std::uint64_t> code_size_;
  bool per_function_;
};

// E28: the records of a note section (elf_records.cpp).
void check_notes(const unsigned char* blob, std::uint64_t size, std::uint32_t index);
// E29: the records of a .nv.compat section (elf_records.cpp).
void check_compat(const unsigned char* blob, std::uint64_t size, std::uint32_t index);

}  // namespace detail
}  // namespace elf
}  // namespace luminav
