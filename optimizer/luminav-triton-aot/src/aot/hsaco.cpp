// src/aot/hsaco.cpp: the AMD code object reader (hsaco.h): rules H2 (a bounds-checked ELF64 walk)
// and H3 (the NT_AMDGPU_METADATA note, decoded by msgpack-cxx), check for check the same as
// python/luminamoon/aot/hsaco.py
#include "aot/hsaco.h"

#include <algorithm>
#include <cstring>
#include <exception>
#include <set>

#include <msgpack.hpp>

#include "aot/elf_internal.h"

namespace luminav {
namespace hsaco {

using elf::detail::fail;
using elf::detail::le;

namespace {

constexpr std::uint64_t kEhdr = 64, kShdr = 64, kPhdr = 56, kSym = 24;
constexpr unsigned char kElfOsabiAmdgpuHsa = 64;
constexpr std::uint32_t kShtDynsym = 11, kEtDyn = 3;

[[noreturn]] void truncated(const std::string& what) { fail(BundleRule::kTruncated, what); }
[[noreturn]] void header(const std::string& what) { fail(BundleRule::kElfHeader, "not an AMDGPU code object: " + what); }
[[noreturn]] void section(const std::string& what) { fail(BundleRule::kElfSection, what); }
[[noreturn]] void note(const std::string& what) { fail(BundleRule::kHsacoNote, what); }

std::uint64_t pad4(std::uint64_t v) { return (v + 3) / 4 * 4; }

struct Sec {
  std::uint32_t name, type;
  std::uint64_t offset, size;
  std::uint32_t link;
  std::uint64_t entsize;
};

// A string table that begins and ends with NUL.
bool is_strtab(const unsigned char* data, const Sec& s) {
  return s.type == elf::kShtStrtab && s.size > 0 && data[s.offset] == 0 && data[s.offset + s.size - 1] == 0;
}

std::string cstr(const unsigned char* data, const Sec& tab, std::uint64_t at, const std::string& what) {
  if (at >= tab.size) {
    section(what + " at " + std::to_string(at) + " lies outside its string table (" + std::to_string(tab.size) + " bytes)");
  }
  const char* p = reinterpret_cast<const char*>(data + tab.offset + at);
  return std::string(p, ::strnlen(p, static_cast<std::size_t>(tab.size - at)));
}

// Strict UTF-8 (no overlong forms, no surrogates, nothing above U+10FFFF), as Python decodes it.
bool valid_utf8(const char* s, std::size_t n) {
  const auto* p = reinterpret_cast<const unsigned char*>(s);
  for (std::size_t i = 0; i < n;) {
    const unsigned c = p[i];
    std::size_t len = c < 0x80 ? 1 : (c >> 5) == 6 ? 2 : (c >> 4) == 14 ? 3 : (c >> 3) == 30 ? 4 : 0;
    if (len == 0 || i + len > n) return false;
    std::uint32_t cp = len == 1 ? c : len == 2 ? (c & 0x1f) : len == 3 ? (c & 0x0f) : (c & 0x07);
    for (std::size_t j = 1; j < len; ++j) {
      if ((p[i + j] & 0xc0) != 0x80) return false;
      cp = (cp << 6) | (p[i + j] & 0x3f);
    }
    const std::uint32_t min[] = {0, 0, 0x80, 0x800, 0x10000};
    if (cp < min[len] || cp > 0x10ffff || (cp >= 0xd800 && cp <= 0xdfff)) return false;
    i += len;
  }
  return true;
}

// Every map key a string once in its map, every string valid UTF-8, arrays and maps nested at
// most kMaxMetadataDepth deep (the outermost is depth 1).
void check_shape(const msgpack::object& o, std::size_t depth) {
  if (o.type == msgpack::type::STR && !valid_utf8(o.via.str.ptr, o.via.str.size)) {
    note("the metadata note is not one msgpack value: a string that is not UTF-8");
  }
  if (o.type != msgpack::type::ARRAY && o.type != msgpack::type::MAP) return;
  if (depth > kMaxMetadataDepth) {
    note("the metadata note nests deeper than " + std::to_string(kMaxMetadataDepth));
  }
  if (o.type == msgpack::type::ARRAY) {
    for (std::uint32_t i = 0; i < o.via.array.size; ++i) check_shape(o.via.array.ptr[i], depth + 1);
    return;
  }
  std::set<std::string> keys;
  for (std::uint32_t i = 0; i < o.via.map.size; ++i) {
    const msgpack::object& k = o.via.map.ptr[i].key;
    if (k.type != msgpack::type::STR) note("the metadata note is not one msgpack value: a map key that is not a string");
    check_shape(k, depth + 1);
    if (!keys.insert(std::string(k.via.str.ptr, k.via.str.size)).second) {
      note("the metadata note is not one msgpack value: map key \"" + printable(std::string(k.via.str.ptr, k.via.str.size)) +
           "\" twice");
    }
    check_shape(o.via.map.ptr[i].val, depth + 1);
  }
}

const msgpack::object* find(const msgpack::object& map, const char* key) {
  for (std::uint32_t i = 0; i < map.via.map.size; ++i) {
    const msgpack::object& k = map.via.map.ptr[i].key;
    if (k.via.str.size == std::strlen(key) && std::memcmp(k.via.str.ptr, key, k.via.str.size) == 0) {
      return &map.via.map.ptr[i].val;
    }
  }
  return nullptr;
}

bool is_uint(const msgpack::object* v) { return v != nullptr && v->type == msgpack::type::POSITIVE_INTEGER; }
bool is_map(const msgpack::object* v) { return v != nullptr && v->type == msgpack::type::MAP; }
bool is_str(const msgpack::object* v) { return v != nullptr && v->type == msgpack::type::STR; }
std::string str(const msgpack::object& v) { return std::string(v.via.str.ptr, v.via.str.size); }

// H3's shape of the decoded note (the maps' keys are known to be strings).
std::vector<Kernel> read_kernels(const msgpack::object& root, std::string* target) {
  const msgpack::object* ks = is_map(&root) ? find(root, "amdhsa.kernels") : nullptr;
  if (ks == nullptr || ks->type != msgpack::type::ARRAY) note("the metadata note is not a map with an amdhsa.kernels array");
  if (const msgpack::object* t = find(root, "amdhsa.target"); is_str(t)) *target = str(*t);
  std::vector<Kernel> out;
  for (std::uint32_t i = 0; i < ks->via.array.size; ++i) {
    const msgpack::object& k = ks->via.array.ptr[i];
    const std::string where = "amdhsa.kernels[" + std::to_string(i) + "]";
    const msgpack::object* name = is_map(&k) ? find(k, ".name") : nullptr;
    if (!is_str(name)) note(where + " is not a map with a string .name");
    Kernel kernel;
    kernel.name = str(*name);
    if (const msgpack::object* args = find(k, ".args")) {
      if (args->type != msgpack::type::ARRAY) note(where + ".args is not an array");
      for (std::uint32_t j = 0; j < args->via.array.size; ++j) {
        const msgpack::object& a = args->via.array.ptr[j];
        const msgpack::object* kind = is_map(&a) ? find(a, ".value_kind") : nullptr;
        const msgpack::object* off = kind ? find(a, ".offset") : nullptr;
        const msgpack::object* size = kind ? find(a, ".size") : nullptr;
        if (!is_str(kind) || !is_uint(off) || !is_uint(size)) {
          note(where + ".args[" + std::to_string(j) + "] is not a map with a string .value_kind and integer .offset and .size");
        }
        kernel.args.push_back({str(*kind), off->via.u64, size->via.u64});
      }
    }
    for (const char* field : {".wavefront_size", ".max_flat_workgroup_size"}) {
      const msgpack::object* v = find(k, field);
      if (v == nullptr) continue;
      if (!is_uint(v)) note(where + "." + (field + 1) + " is not an integer");
      (field[1] == 'w' ? kernel.wavefront_size : kernel.max_flat_workgroup_size) = v->via.u64;
    }
    if (const msgpack::object* sym = find(k, ".symbol")) {
      if (!is_str(sym)) note(where + ".symbol is not a string");
      kernel.symbol = str(*sym);
    }
    out.push_back(std::move(kernel));
  }
  return out;
}

// The (owner, type, descriptor) of each note tiling section `index`.
struct Note {
  std::uint64_t namesz, type, desc, descsz;  // desc: file offset
  std::uint64_t name;
};
void walk_notes(const unsigned char* data, const Sec& s, std::size_t index, std::vector<Note>* out) {
  std::uint64_t p = s.offset;
  const std::uint64_t end = s.offset + s.size;
  while (p < end) {
    if (end - p < 12) section("section " + std::to_string(index) + ": a note header cut short");
    const std::uint64_t namesz = le(data + p, 4), descsz = le(data + p + 4, 4), type = le(data + p + 8, 4);
    const std::uint64_t desc = p + 12 + pad4(namesz), next = desc + pad4(descsz);
    if (next > end) {
      section("section " + std::to_string(index) + ": a note of " + std::to_string(namesz) + "+" +
              std::to_string(descsz) + " bytes reaches past its section");
    }
    out->push_back({namesz, type, desc, descsz, p + 12});
    p = next;
  }
}

}  // namespace

std::vector<KernelArg> Kernel::explicit_args() const {
  std::vector<KernelArg> out;
  std::copy_if(args.begin(), args.end(), std::back_inserter(out), [](const KernelArg& a) { return !a.hidden(); });
  return out;
}

std::vector<const Kernel*> HsacoInfo::kernels_named(const std::string& name) const {
  std::vector<const Kernel*> out;
  for (const Kernel& k : kernels) {
    if (k.name == name) out.push_back(&k);
  }
  return out;
}

const char* arch_name(unsigned mach) {
  switch (mach) {
    case 0x3f: return "gfx90a";
    case 0x4c: return "gfx942";
    case 0x4f: return "gfx950";
    default: return "";
  }
}

unsigned arch_mach(const std::string& name) {
  for (unsigned m : {0x3fu, 0x4cu, 0x4fu}) {
    if (name == arch_name(m)) return m;
  }
  return 0;
}

const char* known_archs() { return "gfx90a, gfx942, gfx950"; }

HsacoInfo parse_hsaco(const unsigned char* data, std::size_t size) {
  HsacoInfo info;
  info.size = size;
  // H2: the header
  if (size < kEhdr) truncated(std::to_string(size) + " bytes, shorter than an ELF64 header (64)");
  const std::uint64_t e_type = le(data + 16, 2), e_machine = le(data + 18, 2), e_version = le(data + 20, 4);
  const std::uint64_t phoff = le(data + 32, 8), shoff = le(data + 40, 8);
  info.e_flags = static_cast<std::uint32_t>(le(data + 48, 4));
  const std::uint64_t ehsize = le(data + 52, 2), phentsize = le(data + 54, 2), phnum = le(data + 56, 2);
  const std::uint64_t shentsize = le(data + 58, 2), shnum = le(data + 60, 2), shstrndx = le(data + 62, 2);
  const unsigned abi = data[8];
  auto want = [](bool ok, const char* expected, std::uint64_t found) {
    if (!ok) header(std::string("expected ") + expected + ", found " + std::to_string(found));
  };
  if (std::memcmp(data, "\x7f" "ELF", 4) != 0) header("expected the ELF magic");
  want(data[4] == 2, "ELFCLASS64 (2)", data[4]);
  want(data[5] == 1, "little-endian (1)", data[5]);
  want(data[6] == 1, "EI_VERSION 1", data[6]);
  want(data[7] == kElfOsabiAmdgpuHsa, "EI_OSABI 64 (AMDGPU HSA)", data[7]);
  want(abi >= 2 && abi <= 4, "EI_ABIVERSION 2, 3 or 4 (code object v4-v6)", abi);
  want(e_type == kEtDyn, "e_type ET_DYN (3)", e_type);
  want(e_machine == kEmAmdgpu, "e_machine EM_AMDGPU (224)", e_machine);
  want(e_version == 1, "e_version 1", e_version);
  want(ehsize == kEhdr, "e_ehsize 64", ehsize);
  want(shentsize == kShdr, "e_shentsize 64", shentsize);
  want(shnum >= 1 && shnum <= 0xfeff, "e_shnum 1..0xfeff", shnum);
  want(shstrndx >= 1 && shstrndx < shnum, "e_shstrndx 1..e_shnum-1", shstrndx);
  want(phnum == 0 || phentsize == kPhdr, "program headers of 56 bytes", phentsize);
  info.abi_version = static_cast<int>(abi);
  info.mach = info.e_flags & 0xff;
  info.arch = arch_name(info.mach);
  // H2: the tables inside the file
  if (shoff > size || kShdr * shnum > size - shoff) {
    truncated("the section header table (" + std::to_string(shnum) + " x 64 bytes at " + std::to_string(shoff) +
              ") ends past the file (" + std::to_string(size) + " bytes)");
  }
  if (phnum > 0 && (phoff > size || kPhdr * phnum > size - phoff)) {
    truncated("the program header table (" + std::to_string(phnum) + " x 56 bytes at " + std::to_string(phoff) +
              ") ends past the file (" + std::to_string(size) + " bytes)");
  }
  std::vector<Sec> secs;
  for (std::uint64_t i = 0; i < shnum; ++i) {
    const unsigned char* s = data + shoff + i * kShdr;
    const Sec sec{static_cast<std::uint32_t>(le(s, 4)), static_cast<std::uint32_t>(le(s + 4, 4)), le(s + 24, 8),
                  le(s + 32, 8), static_cast<std::uint32_t>(le(s + 40, 4)), le(s + 56, 8)};
    if (sec.type != elf::kShtNobits && (sec.offset > size || sec.size > size - sec.offset)) {
      truncated("section " + std::to_string(i) + " (" + std::to_string(sec.size) + " bytes at " +
                std::to_string(sec.offset) + ") ends past the file (" + std::to_string(size) + " bytes)");
    }
    secs.push_back(sec);
  }
  // H2: names, symbol tables, notes
  const Sec& names = secs[shstrndx];
  if (!is_strtab(data, names)) {
    section("the section name table (section " + std::to_string(shstrndx) +
            ") is not a string table that begins and ends with NUL");
  }
  for (std::size_t i = 0; i < secs.size(); ++i) (void)cstr(data, names, secs[i].name, "section " + std::to_string(i) + "'s name");
  const auto n_dynsym = std::count_if(secs.begin(), secs.end(), [](const Sec& s) { return s.type == kShtDynsym; });
  if (n_dynsym != 1) section(std::to_string(n_dynsym) + " .dynsym sections, expected one");
  for (std::size_t i = 0; i < secs.size(); ++i) {
    const Sec& s = secs[i];
    if (s.type != elf::kShtSymtab && s.type != kShtDynsym) continue;
    if (s.entsize != kSym || s.size % kSym != 0) {
      section("symbol table " + std::to_string(i) + ": entries of " + std::to_string(s.entsize) + " bytes over " +
              std::to_string(s.size) + " bytes, expected 24-byte entries tiling it");
    }
    if (s.link == 0 || s.link >= shnum || !is_strtab(data, secs[s.link])) {
      section("symbol table " + std::to_string(i) + " links section " + std::to_string(s.link) +
              ", not a string table that begins and ends with NUL");
    }
    for (std::uint64_t j = 0; j < s.size / kSym; ++j) {
      const unsigned char* e = data + s.offset + j * kSym;
      elf::Symbol sym;
      sym.name = cstr(data, secs[s.link], le(e, 4), "symbol " + std::to_string(j) + " of table " + std::to_string(i));
      sym.bind = e[4] >> 4;
      sym.type = e[4] & 0xf;
      sym.other = e[5];
      sym.shndx = static_cast<std::uint16_t>(le(e + 6, 2));
      if (s.type == kShtDynsym) info.dynsym.push_back(std::move(sym));
    }
  }
  std::vector<Note> notes;
  for (std::size_t i = 0; i < secs.size(); ++i) {
    if (secs[i].type == elf::kShtNote) walk_notes(data, secs[i], i, &notes);
  }
  // H3: the metadata note
  std::vector<const Note*> found;
  for (const Note& n : notes) {
    if (n.type == kNtAmdgpuMetadata && n.namesz == 7 && std::memcmp(data + n.name, "AMDGPU", 7) == 0) found.push_back(&n);
  }
  if (found.size() != 1) {
    note(std::to_string(found.size()) + " NT_AMDGPU_METADATA notes (owner AMDGPU, type 32), expected one");
  }
  const char* blob = reinterpret_cast<const char*>(data + found[0]->desc);
  const std::size_t blob_size = static_cast<std::size_t>(found[0]->descsz);
  msgpack::object_handle oh;
  try {
    std::size_t off = 0;
    // A container of n entries needs n bytes or more, so the input's size bounds every count;
    // the depth limit (above H3's 16, which check_shape applies) bounds the recursion.
    const msgpack::unpack_limit limit(blob_size, blob_size, blob_size, blob_size, blob_size, 64);
    oh = msgpack::unpack(blob, blob_size, off, nullptr, nullptr, limit);
    if (off != blob_size) note("the metadata note is not one msgpack value: " + std::to_string(blob_size - off) + " bytes after it");
  } catch (const elf::ElfError&) {
    throw;
  } catch (const std::bad_alloc&) {
    throw;
  } catch (const std::exception& e) {  // msgpack::unpack_error, insufficient_bytes, size_overflow
    note(std::string("the metadata note is not one msgpack value: ") + printable(e.what()));
  }
  check_shape(oh.get(), 1);
  info.kernels = read_kernels(oh.get(), &info.target);
  info.shnum = shnum;
  return info;
}

}  // namespace hsaco
}  // namespace luminav
