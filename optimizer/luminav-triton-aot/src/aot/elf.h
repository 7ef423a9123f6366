// src/aot/elf.h: the cubin (CUDA ELF) reader of the bundle rule book, as strict as Python's
//
// parse_cubin checks that every header, offset, size and index of a cubin is in bounds and every
// table well formed (docs/bundle-format.md, "Cubins": rules E1-E30, in that order), so that
// nothing malformed ever reaches the CUDA driver, and reads what the bundle checks need: the SM
// arch from e_flags, the symbol table, and per kernel the .nv.info attributes whose
// EIATTR_KPARAM_INFO records are its parameters (what cuFuncGetParamInfo reports) and
// EIATTR_REQNTID its block size; for the cubins of sm_100 and later also the Mercury copy of each
// kernel (.nv.capmerc.text.<kernel>, the .nv.merc.* sections and their own symbol table), which
// the driver can finalize instead of the SASS. python/luminamoon/aot/cubin.py is the same reader,
// check for check; the shared corpus under tests/data/bundles holds cubins both must refuse with
// the same code.
#pragma once

#include <array>
#include <cstddef>
#include <cstdint>
#include <map>
#include <optional>
#include <stdexcept>
#include <string>
#include <utility>
#include <vector>

#include "aot/bundle_rules.h"

namespace luminav {
namespace elf {

constexpr std::uint16_t kEmCuda = 190;
constexpr std::uint32_t kShtProgbits = 1, kShtSymtab = 2, kShtStrtab = 3, kShtRela = 4, kShtNote = 7, kShtNobits = 8,
                        kShtRel = 9, kShtCudaInfo = 0x70000000, kShtCudaCallgraph = 0x70000001,
                        kShtCudaRelocinfo = 0x7000000b, kShtCudaCompat = 0x70000086;
// The Mercury copy of the code (sm_100 and later): each carries kShfCudaMercury.
constexpr std::uint32_t kShtCudaMercGlobalInit = 0x70000008, kShtCudaMercReservedShared = 0x70000015,
                        kShtCudaCapmerc = 0x70000016, kShtCudaMercConstantPic = 0x7000007d,
                        kShtCudaMercRela = 0x70000082, kShtCudaMercInfo = 0x70000083,
                        kShtCudaMercSymtab = 0x70000085, kShtCudaMercCallgraph = 0x7000008a;
constexpr std::uint64_t kShfAlloc = 0x2, kShfExecinstr = 0x4, kShfInfoLink = 0x40, kShfCudaMercury = 0x10000000;
constexpr unsigned kSttObject = 1, kSttFunc = 2, kSttSection = 3, kStbGlobal = 1;
constexpr unsigned kStoCudaEntry = 0x10;  // st_other of a kernel's entry symbol

struct Section {
  std::uint32_t index = 0;
  std::string name;
  std::uint32_t type = 0;
  std::uint64_t flags = 0, offset = 0, size = 0;
  std::uint32_t link = 0, info = 0;
  std::uint64_t align = 0, entsize = 0;
};

struct Symbol {
  std::string name;
  std::uint64_t value = 0, size = 0;
  unsigned type = 0, bind = 0, other = 0;
  std::uint16_t shndx = 0;
};

struct KernelParam {
  std::uint32_t ordinal = 0, offset = 0, size = 0;
};

// The .nv.info attributes of one function (a section whose sh_info is its code).
struct FunctionInfo {
  std::vector<KernelParam> params;                // EIATTR_KPARAM_INFO, as found
  std::optional<std::uint32_t> cbank_param_size;  // EIATTR_CBANK_PARAM_SIZE
  struct ParamCbank {
    std::uint32_t symbol = 0, offset = 0, size = 0;
  };
  std::optional<ParamCbank> param_cbank;                      // EIATTR_PARAM_CBANK
  std::optional<std::array<std::uint32_t, 3>> reqntid;      // EIATTR_REQNTID
  std::optional<std::array<std::uint32_t, 3>> max_threads;  // EIATTR_MAX_THREADS
  std::size_t param_cbank_count = 0;                         // how many EIATTR_PARAM_CBANK records
  // (attribute, symbol) of each EIATTR_FRAME_SIZE, MIN_STACK_SIZE, MAX_STACK_SIZE, REGCOUNT
  std::vector<std::pair<unsigned, std::uint32_t>> symbol_values;
};

struct CubinInfo {
  std::uint64_t size = 0;
  int abi_version = 0;
  std::uint32_t e_flags = 0;
  int arch = 0;  // SM arch, e.g. 90
  std::vector<Section> sections;
  std::vector<Symbol> symbols;
  // code section index -> the .nv.info sections whose sh_info names it
  std::map<std::uint32_t, std::vector<FunctionInfo>> function_info;
  // the Mercury copy (sm_100 and later): .nv.merc.symtab, and capmerc section index -> the
  // .nv.merc.nv.info sections whose sh_info names it
  std::vector<Symbol> merc_symbols;
  std::map<std::uint32_t, std::vector<FunctionInfo>> merc_function_info;

  // Kernel entry symbols named `name`: global functions marked as CUDA entries
  // (kStoCudaEntry), defined in a code section named .text.<name> (the driver finds a kernel's
  // code by that name).
  std::vector<const Symbol*> entry_symbols(const std::string& name) const;
  // The same in the Mercury symbol table: the kernel's entry in its Mercury code (a
  // .nv.capmerc.text section); none in a cubin without a Mercury copy.
  std::vector<const Symbol*> merc_entry_symbols(const std::string& name) const;
};

// A broken rule: kTruncated, kElfHeader or kElfSection, and what was wrong.
class ElfError : public std::runtime_error {
 public:
  ElfError(BundleRule rule, const std::string& what) : std::runtime_error(what), rule_(rule) {}
  BundleRule rule() const noexcept { return rule_; }

 private:
  BundleRule rule_;
};

// The SM arch in e_flags: the low byte for ELF ABI version 7 (0x5a = 90), the second byte for
// version 8 (the ptxas of CUDA 12.8 and later).
int arch_from_flags(int abi_version, std::uint32_t e_flags);

// Checks `data` against rules E1-E30 and reads what the bundle checks need; throws ElfError at
// the first rule broken, in the rule book's order. Reads nothing outside [data, data + size).
CubinInfo parse_cubin(const unsigned char* data, std::size_t size);

}  // namespace elf
}  // namespace luminav
