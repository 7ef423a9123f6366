// src/aot/elf.cpp: the strict cubin reader (rules E1-E30 of docs/bundle-format.md), check for
// check the same as python/luminamoon/aot/cubin.py
// (its record readers, of .nv.info, notes and .nv.compat, are in elf_records.cpp)
#include "aot/elf.h"

#include <algorithm>
#include <cstdio>
#include <cstring>
#include <limits>
#include <tuple>

#include "aot/elf_internal.h"

namespace luminav {
namespace elf {

using namespace detail;

namespace {

constexpr std::uint64_t kEhdr = 64, kShdr = 64, kPhdr = 56, kSym = 24, kRela = 24, kRel = 16;
constexpr std::uint16_t kEtExec = 2;
constexpr std::uint32_t kShtNull = 0;
constexpr std::uint64_t kShfNoteBits = 0x01000000 | 0x02000000;  // the OS bits ptxas sets on its two notes
// write, alloc, execinstr, info-link, the one CUDA bit ptxas sets on some code (0x100000), the
// Mercury bit and the notes' bits
constexpr std::uint64_t kAllowedFlags = 0x1 | 0x2 | 0x4 | 0x40 | 0x100000 | kShfCudaMercury | kShfNoteBits;
constexpr std::uint32_t kPtLoad = 1, kPtPhdr = 6;
constexpr std::uint32_t kShnLoreserve = 0xff00;
constexpr std::uint32_t kCallgraphMarkers = 0xfffffff0;

bool mercury_type(std::uint32_t t) {
  return t == kShtCudaMercGlobalInit || t == kShtCudaMercReservedShared || t == kShtCudaCapmerc ||
         t == kShtCudaMercConstantPic || t == kShtCudaMercRela || t == kShtCudaMercInfo || t == kShtCudaMercSymtab ||
         t == kShtCudaMercCallgraph;
}

// The data sections the Mercury copy may share with the SASS's (the same file bytes, viewed twice).
bool mercury_view_type(std::uint32_t t) {
  return t == kShtProgbits || t == kShtCudaMercConstantPic || t == kShtCudaMercGlobalInit;
}

bool pow2_or_zero(std::uint64_t v) { return (v & (v - 1)) == 0; }

// off + len as Python's integers would give it, saturated (only for messages and comparisons
// with sizes below 2^63).
std::uint64_t end_of(std::uint64_t off, std::uint64_t len) {
  return off > std::numeric_limits<std::uint64_t>::max() - len ? std::numeric_limits<std::uint64_t>::max() : off + len;
}

struct RawSection {
  std::uint32_t name, type;
  std::uint64_t flags, addr, offset, size;
  std::uint32_t link, info;
  std::uint64_t align, entsize;
};

}  // namespace

int arch_from_flags(int abi_version, std::uint32_t e_flags) {
  return static_cast<int>(abi_version == 7 ? (e_flags & 0xff) : ((e_flags >> 8) & 0xff));
}

std::vector<const Symbol*> CubinInfo::entry_symbols(const std::string& name) const {
  std::vector<const Symbol*> out;
  for (const Symbol& s : symbols) {
    if (s.name != name || s.type != kSttFunc || s.bind != kStbGlobal || !(s.other & kStoCudaEntry)) continue;
    if (s.shndx == 0 || s.shndx >= sections.size()) continue;
    // the driver finds a kernel's code by its section's name: cuModuleGetFunction fails with
    // CUDA_ERROR_NOT_FOUND when it is not .text.<entry>
    const Section& code = sections[s.shndx];
    if (code.type == kShtProgbits && (code.flags & kShfExecinstr) && code.name == ".text." + name) out.push_back(&s);
  }
  return out;
}

std::vector<const Symbol*> CubinInfo::merc_entry_symbols(const std::string& name) const {
  std::vector<const Symbol*> out;
  for (const Symbol& s : merc_symbols) {
    if (s.name != name || s.type != kSttFunc || s.bind != kStbGlobal || !(s.other & kStoCudaEntry)) continue;
    if (s.shndx == 0 || s.shndx >= sections.size()) continue;
    if (sections[s.shndx].type == kShtCudaCapmerc) out.push_back(&s);
  }
  return out;
}

CubinInfo parse_cubin(const unsigned char* d, std::size_t size) {
  const std::uint64_t n = size;
  auto truncated = [n](const std::string& what) {
    fail(BundleRule::kTruncated, what + " but the file has " + std::to_string(n) + " bytes: truncated");
  };
  // E1-E12: the ELF header
  if (n < kEhdr) {
    fail(BundleRule::kTruncated, std::to_string(n) + " bytes is too short for an ELF64 header (64 bytes): truncated");
  }
  if (!(d[0] == 0x7f && d[1] == 'E' && d[2] == 'L' && d[3] == 'F')) {
    char buf[64];
    std::snprintf(buf, sizeof buf, "%02x %02x %02x %02x", d[0], d[1], d[2], d[3]);
    header(std::string("does not start with the ELF magic 7f 45 4c 46 (found ") + buf + ")");
  }
  if (d[4] != 2 || d[5] != 1) {
    header("not a little-endian ELF64 file (class " + std::to_string(d[4]) + ", data " + std::to_string(d[5]) + ")");
  }
  if (d[6] != 1) header("ELF identification version " + std::to_string(d[6]) + ", not 1");
  const auto e_type = static_cast<std::uint16_t>(le(d + 16, 2));
  const auto e_machine = static_cast<std::uint16_t>(le(d + 18, 2));
  const std::uint64_t e_phoff = le(d + 32, 8), e_shoff = le(d + 40, 8);
  const auto e_flags = static_cast<std::uint32_t>(le(d + 48, 4));
  const auto e_ehsize = le(d + 52, 2), e_phentsize = le(d + 54, 2), e_phnum = le(d + 56, 2);
  const auto e_shentsize = le(d + 58, 2), e_shnum = le(d + 60, 2), e_shstrndx = le(d + 62, 2);
  if (e_machine != kEmCuda) header("ELF machine is " + std::to_string(e_machine) + ", not CUDA (190)");
  const int abi = d[8];
  if (abi != 7 && abi != 8) {
    header("ELF ABI version " + std::to_string(abi) + ", not one whose e_flags layout this reader knows (7, 8)");
  }
  if (e_type != kEtExec) header("ELF type " + std::to_string(e_type) + ", not an executable (2)");
  if (e_ehsize != kEhdr) header("ELF header size " + std::to_string(e_ehsize) + ", not 64");
  if (e_shentsize != kShdr) header("section header size " + std::to_string(e_shentsize) + ", not 64");
  if (e_shnum == 0 || e_shnum >= kShnLoreserve) {
    header("section count " + std::to_string(e_shnum) + " (extended numbering is not used by cubins)");
  }
  if (e_shstrndx == 0 || e_shstrndx >= e_shnum) {
    header("section name table index " + std::to_string(e_shstrndx) + " out of range 1.." +
           std::to_string(e_shnum - 1));
  }
  if (e_phnum && (e_phentsize != kPhdr || e_phnum == 0xffff)) {
    header("program header table of " + std::to_string(e_phnum) + " entries of " + std::to_string(e_phentsize) +
           " bytes (entries are 56 bytes)");
  }
  // E13-E16: everything the headers point at lies inside the file
  if (end_of(e_shoff, e_shnum * kShdr) > n) {
    truncated("the section header table ends at byte " + std::to_string(end_of(e_shoff, e_shnum * kShdr)));
  }
  if (e_phnum && end_of(e_phoff, e_phnum * kPhdr) > n) {
    truncated("the program header table ends at byte " + std::to_string(end_of(e_phoff, e_phnum * kPhdr)));
  }
  std::vector<RawSection> raw(e_shnum);
  for (std::uint64_t i = 0; i < e_shnum; ++i) {
    const unsigned char* h = d + e_shoff + i * kShdr;
    raw[i] = RawSection{static_cast<std::uint32_t>(le(h, 4)),      static_cast<std::uint32_t>(le(h + 4, 4)),
                        le(h + 8, 8),
                        le(h + 16, 8),
                        le(h + 24, 8),
                        le(h + 32, 8),
                        static_cast<std::uint32_t>(le(h + 40, 4)), static_cast<std::uint32_t>(le(h + 44, 4)),
                        le(h + 48, 8),
                        le(h + 56, 8)};
  }
  for (std::uint64_t i = 0; i < e_shnum; ++i) {
    const RawSection& s = raw[i];
    if (s.type != kShtNobits && s.type != kShtNull && end_of(s.offset, s.size) > n) {
      truncated("section " + std::to_string(i) + " ends at byte " + std::to_string(end_of(s.offset, s.size)));
    }
  }
  for (std::uint64_t i = 0; i < e_phnum; ++i) {
    const unsigned char* h = d + e_phoff + i * kPhdr;
    const std::uint64_t p_offset = le(h + 8, 8), p_filesz = le(h + 32, 8);
    if (end_of(p_offset, p_filesz) > n) {
      truncated("segment " + std::to_string(i) + " ends at byte " + std::to_string(end_of(p_offset, p_filesz)));
    }
  }
  std::vector<std::pair<std::uint64_t, std::uint64_t>> loads;  // file ranges of the LOAD segments
  for (std::uint64_t i = 0; i < e_phnum; ++i) {
    const unsigned char* h = d + e_phoff + i * kPhdr;
    const auto p_type = static_cast<std::uint32_t>(le(h, 4)), p_flags = static_cast<std::uint32_t>(le(h + 4, 4));
    const std::uint64_t p_offset = le(h + 8, 8), p_vaddr = le(h + 16, 8), p_paddr = le(h + 24, 8);
    const std::uint64_t p_filesz = le(h + 32, 8), p_memsz = le(h + 40, 8), p_align = le(h + 48, 8);
    if ((p_type != kPtLoad && p_type != kPtPhdr) || (p_flags & ~0x7u) || p_vaddr || p_paddr || p_filesz > p_memsz ||
        !pow2_or_zero(p_align)) {
      section("segment " + std::to_string(i) + ": type " + std::to_string(p_type) + ", flags " + hex(p_flags) +
              ", addresses " + hex(p_vaddr) + "/" + hex(p_paddr) + ", file size " + std::to_string(p_filesz) +
              ", memory size " + std::to_string(p_memsz) + ", alignment " + std::to_string(p_align) +
              " (a cubin's segments are LOAD or PHDR at address 0)");
    }
    if (p_type == kPtLoad) loads.emplace_back(p_offset, p_offset + p_filesz);
  }
  // E17-E20: the section table
  for (std::uint64_t k = 0; k < kShdr; ++k) {
    if (d[e_shoff + k] != 0) section("section 0 is not the null section (all zero)");
  }
  for (std::uint64_t i = 1; i < e_shnum; ++i) {
    const RawSection& s = raw[i];
    const std::string sec = "section " + std::to_string(i);
    // The section types ptxas writes for a Triton kernel; the driver parses more CUDA types
    // (prototypes, resolved relocations, metadata...), each its own way: a section retyped to
    // one of them is refused, not parsed.
    const bool known = s.type == kShtNull || s.type == kShtProgbits || s.type == kShtSymtab ||
                       s.type == kShtStrtab || s.type == kShtRela || s.type == kShtNote || s.type == kShtNobits ||
                       s.type == kShtRel || s.type == kShtCudaInfo || s.type == kShtCudaCallgraph ||
                       s.type == kShtCudaRelocinfo || s.type == kShtCudaCompat || mercury_type(s.type);
    if (!known) section(sec + " has type " + hex(s.type));
    if (s.flags & ~kAllowedFlags) section(sec + " has flags " + hex(s.flags));
    if ((s.flags & kShfNoteBits) && s.type != kShtNote) {
      section(sec + " (type " + hex(s.type) + ") has flags " + hex(s.flags) +
              " (bits 0x1000000 and 0x2000000 are the notes')");
    }
    if (mercury_type(s.type) != ((s.flags & kShfCudaMercury) != 0) &&
        !(s.type == kShtProgbits && !(s.flags & kShfExecinstr))) {
      section(sec + " (type " + hex(s.type) + ") has flags " + hex(s.flags) +
              " (the Mercury bit 0x10000000 marks the Mercury types and Mercury data only)");
    }
    if (s.addr != 0) section(sec + " has address " + hex(s.addr) + " (a cubin's sections are at 0)");
    if (!pow2_or_zero(s.align)) section(sec + " has alignment " + std::to_string(s.align));
    const std::uint64_t want_ent = (s.type == kShtSymtab || s.type == kShtCudaMercSymtab)  ? kSym
                                   : (s.type == kShtRela || s.type == kShtCudaMercRela) ? kRela
                                   : s.type == kShtRel                                  ? kRel
                                   : s.type == kShtCudaRelocinfo                        ? 8
                                                                                        : 0;
    if (want_ent && (s.entsize != want_ent || s.size % want_ent)) {
      section(sec + " (type " + std::to_string(s.type) + ") has entries of " + std::to_string(s.entsize) +
              " bytes and size " + std::to_string(s.size) + " (entries are " + std::to_string(want_ent) + " bytes)");
    }
    // sections without table entries: 8 for the call graphs (pairs of 4-byte words), 0 for every other
    const std::uint64_t written_ent = (s.type == kShtCudaCallgraph || s.type == kShtCudaMercCallgraph) ? 8 : 0;
    if (!want_ent && s.entsize != written_ent) {
      section(sec + " (type " + hex(s.type) + ") has sh_entsize " + hex(s.entsize) + " (ptxas writes " +
              std::to_string(written_ent) + " for a section of this type)");
    }
    if (s.link >= e_shnum) section(sec + " links section " + std::to_string(s.link) + ", out of range");
    // the linked section's type; a value no section type has when there is no link
    const std::uint32_t link_type = s.link ? raw[s.link].type : 0xffffffffu;
    if ((s.type == kShtSymtab || s.type == kShtCudaMercSymtab) && link_type != kShtStrtab) {
      section("symbol table " + std::to_string(i) + " links section " + std::to_string(s.link) +
              ", not a string table");
    }
    const bool needs_symtab = s.type == kShtRel || s.type == kShtRela || s.type == kShtCudaInfo ||
                              s.type == kShtCudaCallgraph || (s.type == kShtProgbits && (s.flags & kShfExecinstr));
    if (needs_symtab && s.link && link_type != kShtSymtab) {
      section(sec + " links section " + std::to_string(s.link) + ", not the symbol table");
    }
    const bool needs_merc_symtab = s.type == kShtCudaMercRela || s.type == kShtCudaMercInfo ||
                                   s.type == kShtCudaMercCallgraph || s.type == kShtCudaCapmerc;
    if (needs_merc_symtab && s.link && link_type != kShtCudaMercSymtab) {
      section(sec + " links section " + std::to_string(s.link) + ", not the Mercury symbol table");
    }
    if (s.type == kShtNote && s.link && link_type != kShtNote) {
      section("note " + std::to_string(i) + " links section " + std::to_string(s.link) + ", not a note");
    }
    if (s.type == kShtStrtab && (s.size == 0 || d[s.offset] != 0 || d[s.offset + s.size - 1] != 0)) {
      section("string table " + std::to_string(i) + " does not start and end with a NUL byte");
    }
  }
  const RawSection& shstr = raw[e_shstrndx];
  if (shstr.type != kShtStrtab) {
    section("section name table " + std::to_string(e_shstrndx) + " has type " + hex(shstr.type) +
            ", not a string table");
  }
  for (std::uint64_t i = 0; i < e_shnum; ++i) {
    if (raw[i].name >= shstr.size) {
      section("section " + std::to_string(i) + "'s name at " + std::to_string(raw[i].name) +
              " is outside the name table (" + std::to_string(shstr.size) + " bytes)");
    }
  }
  // E21: no two extents of the file overlap, but for a Mercury view of a data section: the same
  // bytes, a Mercury view type, the flags of the section it views plus the Mercury bit (each
  // section viewed once at most)
  struct Extent {
    std::uint64_t off, size;
    int merc;
    std::string what;
    std::int64_t index;  // the section's, -1 for the headers
  };
  std::vector<Extent> extents = {{0, kEhdr, 0, "the ELF header", -1},
                                 {e_shoff, e_shnum * kShdr, 0, "the section header table", -1}};
  if (e_phnum) extents.push_back({e_phoff, e_phnum * kPhdr, 0, "the program header table", -1});
  for (std::uint64_t i = 0; i < e_shnum; ++i) {
    if (raw[i].type != kShtNobits && raw[i].type != kShtNull && raw[i].size > 0) {
      extents.push_back({raw[i].offset, raw[i].size, (raw[i].flags & kShfCudaMercury) ? 1 : 0,
                         "section " + std::to_string(i), static_cast<std::int64_t>(i)});
    }
  }
  std::stable_sort(extents.begin(), extents.end(), [](const Extent& a, const Extent& b) {
    return std::tie(a.off, a.size, a.merc) < std::tie(b.off, b.size, b.merc);
  });
  for (std::size_t k = 0; k + 1 < extents.size(); ++k) {
    const Extent& a = extents[k];
    const Extent& b = extents[k + 1];
    if (a.off + a.size <= b.off) continue;
    if (a.index >= 0 && a.off == b.off && a.size == b.size && a.merc == 0 && b.merc == 1) {
      const RawSection& sa = raw[static_cast<std::size_t>(a.index)];
      const RawSection& sb = raw[static_cast<std::size_t>(b.index)];
      if (sa.type == kShtProgbits && !(sa.flags & kShfExecinstr) && mercury_view_type(sb.type) &&
          sb.flags == (sa.flags | kShfCudaMercury)) {
        continue;
      }
    }
    section(a.what + " and " + b.what + " overlap");
  }
  // ... and every allocated section with file bytes lies inside a LOAD segment's file bytes
  if (e_phnum) {
    for (std::uint64_t i = 0; i < e_shnum; ++i) {
      const RawSection& s = raw[i];
      if (!(s.flags & kShfAlloc) || s.type == kShtNobits || s.type == kShtNull || s.size == 0) continue;
      const bool inside = std::any_of(loads.begin(), loads.end(), [&](const auto& l) {
        return l.first <= s.offset && end_of(s.offset, s.size) <= l.second;
      });
      if (!inside) section("section " + std::to_string(i) + " is allocated but in no loadable segment");
    }
  }
  // E22-E23: the symbol tables and the sh_info fields
  std::vector<std::uint32_t> symtabs, merc_symtabs;
  for (std::uint32_t i = 0; i < e_shnum; ++i) {
    if (raw[i].type == kShtSymtab) symtabs.push_back(i);
    if (raw[i].type == kShtCudaMercSymtab) merc_symtabs.push_back(i);
  }
  if (symtabs.size() > 1) section(std::to_string(symtabs.size()) + " symbol tables");
  if (merc_symtabs.size() > 1) section(std::to_string(merc_symtabs.size()) + " Mercury symbol tables");
  const std::uint64_t nsyms = symtabs.empty() ? 0 : raw[symtabs[0]].size / kSym;
  const std::uint64_t merc_nsyms = merc_symtabs.empty() ? 0 : raw[merc_symtabs[0]].size / kSym;
  for (std::uint64_t i = 1; i < e_shnum; ++i) {
    const RawSection& s = raw[i];
    bool ok;
    if (s.type == kShtSymtab) {
      ok = s.info <= nsyms;
    } else if (s.type == kShtCudaMercSymtab) {
      ok = s.info <= merc_nsyms;
    } else if (s.type == kShtRel || s.type == kShtRela || s.type == kShtCudaMercRela || (s.flags & kShfInfoLink)) {
      ok = s.info >= 1 && s.info < e_shnum;
    } else if (s.type == kShtProgbits && (s.flags & kShfExecinstr)) {
      // the function's symbol in the low 24 bits; ptxas puts the register count of an sm_80
      // kernel in the high byte (0x28000009: 40 registers, symbol 9)
      ok = (s.info & 0xffffffu) < std::max<std::uint64_t>(nsyms, 1);
    } else if (s.type == kShtCudaCapmerc) {
      ok = s.info < merc_nsyms;  // its function's Mercury symbol
    } else {
      ok = s.info == 0;
    }
    if (!ok) {
      section("section " + std::to_string(i) + " (type " + hex(s.type) + ") has sh_info " + std::to_string(s.info));
    }
  }
  auto name_at = [d](const RawSection& table, std::uint64_t off) {
    const char* start = reinterpret_cast<const char*>(d + table.offset + off);
    const std::size_t room = static_cast<std::size_t>(table.size - off);  // the table ends with a NUL
    return std::string(start, ::strnlen(start, room));
  };
  CubinInfo info;
  info.size = n;
  info.abi_version = abi;
  info.e_flags = e_flags;
  info.arch = arch_from_flags(abi, e_flags);
  for (std::uint32_t i = 0; i < e_shnum; ++i) {
    const RawSection& s = raw[i];
    info.sections.push_back(
        Section{i, name_at(shstr, s.name), s.type, s.flags, s.offset, s.size, s.link, s.info, s.align, s.entsize});
  }
  // E24: symbols, then the Mercury symbols. A capmerc section's sh_info names the function whose
  // Mercury code it holds, at its start; that function's size is the size of the code the driver
  // finalizes from it (the offsets of its relocations and attributes lie below it).
  std::map<std::uint64_t, std::uint64_t> merc_code_size;
  if (!merc_symtabs.empty()) {
    const RawSection& mst = raw[merc_symtabs[0]];
    for (std::uint64_t i = 1; i < e_shnum; ++i) {
      if (raw[i].type != kShtCudaCapmerc) continue;
      const unsigned char* e = d + mst.offset + std::uint64_t{raw[i].info} * kSym;
      if ((e[4] & 0xf) != kSttFunc || le(e + 6, 2) != i || le(e + 8, 8) != 0) {
        section("Mercury code section " + std::to_string(i) + " names symbol " + std::to_string(raw[i].info) +
                ", not a function at its start");
      }
      merc_code_size[i] = le(e + 16, 8);
    }
  }
  auto room_of = [&](std::uint64_t shndx) {
    auto it = merc_code_size.find(shndx);
    return it == merc_code_size.end() ? raw[shndx].size : it->second;
  };
  auto read_symbols = [&](std::uint32_t table_index, std::uint64_t count, const std::string& what) {
    std::vector<Symbol> out;
    const RawSection& st = raw[table_index];
    const RawSection& strtab = raw[st.link];
    for (std::uint64_t j = 0; j < count; ++j) {
      const unsigned char* e = d + st.offset + j * kSym;
      const std::uint64_t st_name = le(e, 4), st_value = le(e + 8, 8), st_size = le(e + 16, 8);
      const unsigned st_info = e[4], st_other = e[5];
      const auto st_shndx = static_cast<std::uint16_t>(le(e + 6, 2));
      if (st_name >= strtab.size) {
        section(what + " " + std::to_string(j) + "'s name at " + std::to_string(st_name) +
                " is outside its string table (" + std::to_string(strtab.size) + " bytes)");
      }
      if (st_shndx >= e_shnum && st_shndx < kShnLoreserve) {
        section(what + " " + std::to_string(j) + " is in section " + std::to_string(st_shndx) + ", out of range");
      }
      const unsigned stype = st_info & 0xf;
      if (stype == kSttSection && (st_value != 0 || st_size != 0)) {
        section("section " + what + " " + std::to_string(j) + " has value " + hex(st_value) + " and size " +
                std::to_string(st_size) + " (0 and 0)");
      }
      // value + size > room, without wrapping around (Python's integers do not)
      if ((stype == kSttFunc || stype == kSttObject) && st_shndx > 0 && st_shndx < e_shnum &&
          (st_size > room_of(st_shndx) || st_value > room_of(st_shndx) - st_size)) {
        section(what + " " + std::to_string(j) + " ends at " + std::to_string(end_of(st_value, st_size)) +
                ", past its section (" + std::to_string(room_of(st_shndx)) + " bytes)");
      }
      out.push_back(Symbol{name_at(strtab, st_name), st_value, st_size, stype, st_info >> 4, st_other, st_shndx});
    }
    return out;
  };
  if (!symtabs.empty()) info.symbols = read_symbols(symtabs[0], nsyms, "symbol");
  if (!merc_symtabs.empty()) info.merc_symbols = read_symbols(merc_symtabs[0], merc_nsyms, "Mercury symbol");
  auto mercury = [&](std::uint64_t i) { return (raw[i].flags & kShfCudaMercury) != 0; };
  // E25: relocations (a Mercury one relocates Mercury code or data, by Mercury symbols)
  for (std::uint64_t i = 1; i < e_shnum; ++i) {
    const RawSection& s = raw[i];
    if (s.type != kShtRel && s.type != kShtRela && s.type != kShtCudaMercRela) continue;
    if (mercury(i) != mercury(s.info)) {
      section("relocation section " + std::to_string(i) + " and the section it relocates (" + std::to_string(s.info) +
              ") are not both of the Mercury copy or both not");
    }
    const std::uint64_t ent = s.type == kShtRel ? kRel : kRela;
    const std::uint64_t n_ok = s.type == kShtCudaMercRela ? merc_nsyms : nsyms;
    const std::uint64_t target_size = room_of(s.info);
    for (std::uint64_t k = 0; k < s.size / ent; ++k) {
      const std::uint64_t r_offset = le(d + s.offset + k * ent, 8), r_info = le(d + s.offset + k * ent + 8, 8);
      if ((r_info >> 32) >= n_ok) {
        section("relocation " + std::to_string(k) + " of section " + std::to_string(i) + " names symbol " +
                std::to_string(r_info >> 32) + " of " + std::to_string(n_ok));
      }
      if (r_offset >= target_size) {
        section("relocation " + std::to_string(k) + " of section " + std::to_string(i) + " is at " +
                std::to_string(r_offset) + ", past section " + std::to_string(s.info) + " (" +
                std::to_string(target_size) + " bytes)");
      }
    }
  }
  // E26: .nv.info records (a Mercury one describes Mercury code, by Mercury symbols)
  std::vector<FunctionInfo> module_info, merc_module_info;  // the module-wide (not info-link) ones
  for (std::uint32_t i = 1; i < e_shnum; ++i) {
    const RawSection& s = raw[i];
    if (s.type != kShtCudaInfo && s.type != kShtCudaMercInfo) continue;
    const bool merc = s.type == kShtCudaMercInfo;
    std::optional<std::uint64_t> code_size;
    if (s.flags & kShfInfoLink) {
      const RawSection& target = raw[s.info];
      if (merc && target.type != kShtCudaCapmerc) {
        section(".nv.info section " + std::to_string(i) + " describes section " + std::to_string(s.info) +
                ", which holds no Mercury code");
      }
      if (!merc && (target.type != kShtProgbits || !(target.flags & kShfExecinstr))) {
        section(".nv.info section " + std::to_string(i) + " describes section " + std::to_string(s.info) +
                ", which holds no code");
      }
      code_size = merc ? merc_code_size.at(s.info) : target.size;
    }
    FunctionInfo fi = NvInfoReader(d + s.offset, s.size, i, merc ? merc_nsyms : nsyms, code_size,
                                   (s.flags & kShfInfoLink) != 0)
                          .read();
    if (s.flags & kShfInfoLink) {
      (merc ? info.merc_function_info : info.function_info)[s.info].push_back(std::move(fi));
    } else {
      (merc ? merc_module_info : module_info).push_back(std::move(fi));
    }
  }
  // E27: the call graphs
  for (std::uint64_t i = 1; i < e_shnum; ++i) {
    const RawSection& s = raw[i];
    if (s.type != kShtCudaCallgraph && s.type != kShtCudaMercCallgraph) continue;
    const std::uint64_t n_ok = s.type == kShtCudaMercCallgraph ? merc_nsyms : nsyms;
    if (s.size % 8) {
      section("call graph section " + std::to_string(i) + " is " + std::to_string(s.size) +
              " bytes, not pairs of 4-byte words");
    }
    for (std::uint64_t k = 0; k < s.size / 4; ++k) {
      const std::uint64_t w = le(d + s.offset + 4 * k, 4);
      if (w >= n_ok && w < kCallgraphMarkers) {
        section("call graph section " + std::to_string(i) + " names symbol " + std::to_string(w) + " of " +
                std::to_string(n_ok));
      }
    }
  }
  // E28: notes
  for (std::uint32_t i = 1; i < e_shnum; ++i) {
    if (raw[i].type == kShtNote) check_notes(d + raw[i].offset, raw[i].size, i);
  }
  // E29: .nv.compat records
  for (std::uint32_t i = 1; i < e_shnum; ++i) {
    if (raw[i].type == kShtCudaCompat) check_compat(d + raw[i].offset, raw[i].size, i);
  }
  // E30: each kernel (a global function marked as an entry, defined in code; in the Mercury
  // symbol table, in Mercury code): the module-wide .nv.info records of it at least once each, and each
  // .nv.info describing its code one EIATTR_PARAM_CBANK, naming a .nv.constant0 section. The
  // driver reads them at the first launch: a kernel without them breaks the CUDA context.
  static const std::pair<unsigned, const char*> kKernelModuleAttrs[] = {
      {kFrameSize, "EIATTR_FRAME_SIZE"}, {kMinStackSize, "EIATTR_MIN_STACK_SIZE"}, {kRegcount, "EIATTR_REGCOUNT"}};
  const std::string kParamBankPrefix = ".nv.constant0.";
  for (const bool merc : {false, true}) {
    const std::vector<Symbol>& syms = merc ? info.merc_symbols : info.symbols;
    const std::vector<FunctionInfo>& modules = merc ? merc_module_info : module_info;
    const auto& per_function = merc ? info.merc_function_info : info.function_info;
    const std::string what = merc ? "Mercury kernel" : "kernel";
    for (std::uint32_t j = 0; j < syms.size(); ++j) {
      const Symbol& s = syms[j];
      if (!(s.type == kSttFunc && s.bind == kStbGlobal && (s.other & kStoCudaEntry) && s.shndx > 0 &&
            s.shndx < e_shnum)) {
        continue;
      }
      const RawSection& code = raw[s.shndx];
      if (merc ? code.type != kShtCudaCapmerc : (code.type != kShtProgbits || !(code.flags & kShfExecinstr))) continue;
      for (const auto& a : kKernelModuleAttrs) {
        std::size_t count = 0;
        for (const FunctionInfo& fi : modules) {
          for (const auto& sv : fi.symbol_values) count += sv.first == a.first && sv.second == j;
        }
        // ptxas of CUDA 12.4 and older (Triton 3.0-3.3) writes MIN_STACK_SIZE twice: at least one
        if (count == 0) {
          section(what + " '" + s.name + "' (symbol " + std::to_string(j) + ") has no " + a.second +
                  " record (attribute " + hex(a.first) + ") in the module-wide .nv.info");
        }
      }
      if (merc) continue;
      auto fis = per_function.find(s.shndx);
      if (fis == per_function.end()) continue;
      for (const FunctionInfo& fi : fis->second) {
        if (fi.param_cbank_count != 1) {
          section(what + " '" + s.name + "' has " + std::to_string(fi.param_cbank_count) +
                  " EIATTR_PARAM_CBANK records (attribute 0xa) in the .nv.info of its code, not 1");
        }
        const Symbol& bank = syms[fi.param_cbank->symbol];
        if (bank.type != kSttSection || bank.shndx == 0 || bank.shndx >= e_shnum ||
            info.sections[bank.shndx].name.compare(0, kParamBankPrefix.size(), kParamBankPrefix) != 0) {
          section(what + " '" + s.name + "'s EIATTR_PARAM_CBANK names symbol " + std::to_string(fi.param_cbank->symbol) +
                  ", not the section symbol of a " + kParamBankPrefix + "* section");
        }
      }
    }
  }
  return info;
}

}  // namespace elf
}  // namespace luminav