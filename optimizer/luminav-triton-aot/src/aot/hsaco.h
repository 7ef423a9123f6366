// src/aot/hsaco.h: the AMD code object (hsaco) reader of the bundle rule book
//
// parse_hsaco applies rules H2 and H3 of docs/bundle-format.md (the same checks, in the same order,
// as python/luminamoon/aot/hsaco.py) to an AMDGPU ELF64 code object as Triton's HIP backend writes
// it, every offset and size bounds-checked (a corrupt file is refused, never read past its end):
// the ELF header (EM_AMDGPU, ELFOSABI_AMDGPU_HSA, code object v4-v6), the section table, the
// string and symbol tables, the notes, and the one NT_AMDGPU_METADATA note (owner "AMDGPU", type
// 32), whose msgpack map is decoded with msgpack-cxx: amdhsa.kernels[i] with .name, .symbol,
// .wavefront_size, .max_flat_workgroup_size and .args (.value_kind, .offset, .size). The arch is
// the e_flags machine byte (0x3f gfx90a, 0x4c gfx942, 0x4f gfx950). The checks against a
// manifest entry (H4-H9) are in manifest_hsaco.cpp; the facts in docs/triton-abi.md, "AMD".
#pragma once

#include <cstddef>
#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "aot/elf.h"  // elf::ElfError

namespace luminav {
namespace hsaco {

constexpr std::uint16_t kEmAmdgpu = 224;
constexpr std::uint32_t kNtAmdgpuMetadata = 32;
constexpr std::size_t kMaxMetadataDepth = 16;  // nesting of msgpack arrays and maps

struct KernelArg {
  std::string value_kind;  // "global_buffer", "by_value", "hidden_..."
  std::uint64_t offset = 0, size = 0;
  bool hidden() const { return value_kind.rfind("hidden_", 0) == 0; }
};

struct Kernel {
  std::string name;                    // .name: the Triton function's name
  std::optional<std::string> symbol;   // .symbol: "<name>.kd" where present
  std::optional<std::uint64_t> wavefront_size;
  std::optional<std::uint64_t> max_flat_workgroup_size;
  std::vector<KernelArg> args;
  // The arguments a launch packs: those whose value_kind does not start with "hidden_", in order.
  std::vector<KernelArg> explicit_args() const;
};

struct HsacoInfo {
  std::uint64_t size = 0;
  std::uint32_t e_flags = 0;
  unsigned mach = 0;        // e_flags & 0xff
  std::string arch;         // "gfx942" etc., "" for a machine this reader does not know
  int abi_version = 0;      // EI_ABIVERSION: 2, 3, 4 (code object v4, v5, v6)
  std::uint64_t shnum = 0;  // sections
  std::string target;       // amdhsa.target where it is a string
  std::vector<Kernel> kernels;
  std::vector<elf::Symbol> dynsym;  // the .dynsym entries (name, type, bind, shndx)

  // The kernels of that .name (one, in a well-formed code object).
  std::vector<const Kernel*> kernels_named(const std::string& name) const;
};

// "gfx90a" for 0x3f, "gfx942" for 0x4c, "gfx950" for 0x4f; "" otherwise.
const char* arch_name(unsigned mach);
// The machine byte of an arch name; 0 for one this reader does not know.
unsigned arch_mach(const std::string& name);
// "gfx90a, gfx942, gfx950": the archs a bundle may name.
const char* known_archs();

// Rules H2 and H3 on `data`; throws elf::ElfError with kTruncated, kElfHeader, kElfSection or
// kHsacoNote naming what was wrong. Reads nothing outside [data, data + size).
HsacoInfo parse_hsaco(const unsigned char* data, std::size_t size);

}  // namespace hsaco
}  // namespace luminav
