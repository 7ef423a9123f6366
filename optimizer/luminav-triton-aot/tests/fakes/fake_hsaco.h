// tests/fakes/fake_hsaco.h: minimal AMD code objects written by the tests (an AMDGPU ELF64 with a
// NT_AMDGPU_METADATA note packed by msgpack-cxx), and HIP manifest entries for them
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "fakes/fake_bundle.h"

namespace luminav_test {

struct FakeHsacoArg {
  std::string value_kind;  // "global_buffer", "by_value", "hidden_..."
  std::uint64_t size = 8;
};

// What a fake code object holds: the ELF header (EM_AMDGPU, OS ABI 64, e_flags machine `mach`),
// a .note section with one NT_AMDGPU_METADATA note (unless `note` is false) whose
// amdhsa.kernels[0] has `name`, `symbol` (default "<name>.kd"), `wavefront_size` (when > 0) and
// `args`, a .dynsym naming `name` and the descriptor symbol (unless `descriptor_symbol` is
// false), and a .text of `payload`. `metadata`, when not empty, replaces the note's msgpack.
struct FakeHsaco {
  std::string name = "k";
  std::string symbol;  // "" : name + ".kd"
  unsigned mach = 0x4c;  // gfx942
  int wavefront_size = 64;
  int max_flat_workgroup_size = 0;  // 0: absent
  std::vector<FakeHsacoArg> args;
  std::string payload = "code";
  bool note = true;
  bool descriptor_symbol = true;
  std::string metadata;  // raw note descriptor bytes
};
std::vector<unsigned char> make_fake_hsaco(const FakeHsaco& spec);

// The arguments of a Triton kernel of that signature (type words) and trailing pointers, plus
// `hidden` hidden_* arguments after them, as the code object lists them.
std::vector<FakeHsacoArg> hsaco_args(const std::vector<std::string>& signature, int trailing, int hidden = 0);

// Writes <key>.<gfx>.hsaco into `dir` for the key's kernel (make_fake_hsaco with its name, arch,
// arguments and two hidden ones) and returns its format_version 3 manifest entry.
json add_hip_variant(const TempDir& dir, const std::string& key, const std::string& gfx = "gfx942",
                     const VariantOptions& options = VariantOptions{});

// manifest_with, at format_version 3.
json manifest_v3_with(const std::vector<json>& kernels);

}  // namespace luminav_test
