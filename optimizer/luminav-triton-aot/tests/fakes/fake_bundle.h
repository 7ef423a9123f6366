// tests/fakes/fake_bundle.h: bundles written by the tests themselves: a temporary folder, minimal
// but well-formed ELF64 "cubins", manifest entries for the kernels of docs/internals.md
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

namespace luminav_test {

using nlohmann::json;

// What a fake cubin holds: a CUDA ELF64 executable the rule book's ELF reader accepts (aot/elf.h),
// with (when `entry` is set) a symbol table holding the global function `entry` over a .text
// section of `payload`, and its .nv.info: one EIATTR_KPARAM_INFO record per parameter (laid out
// as the CUDA ABI lays them: each aligned to its size), EIATTR_CBANK_PARAM_SIZE, and
// EIATTR_REQNTID {threads, 1, 1} when `threads` > 0. The arch is in e_flags (ELF ABI 7).
struct FakeCubin {
  std::string payload;                     // the .text bytes
  std::string entry;                       // "" : no symbol table, no kernel
  int arch = 90;
  std::vector<std::uint32_t> param_sizes;  // in order: user arguments, then trailing pointers
  std::uint32_t threads = 0;
};
std::vector<unsigned char> make_fake_cubin(const FakeCubin& spec);
// A well-formed image of `payload` with no kernel: it passes the ELF checks and fails any later
// one (its hash, then its entry symbol).
std::vector<unsigned char> make_fake_cubin(const std::string& payload);

// A temporary folder removed at scope end.
class TempDir {
 public:
  TempDir();
  ~TempDir();
  TempDir(const TempDir&) = delete;
  TempDir& operator=(const TempDir&) = delete;
  const std::string& path() const { return path_; }
  std::string file(const std::string& name) const { return path_ + "/" + name; }

 private:
  std::string path_;
};

void write_bytes(const std::string& path, const std::vector<unsigned char>& bytes);
std::vector<unsigned char> read_bytes(const std::string& path);
std::string read_text(const std::string& path);
void write_text(const std::string& path, const std::string& text);

// The pass-2 kernel's user arguments (docs/internals.md), in order.
std::vector<std::string> pass2_arg_names();
std::vector<std::string> pass2_signature();

// A kernel of docs/internals.md: its kind, Triton name (also the cubin's .entry) and user
// arguments (names and type words).
struct KernelSpec {
  std::string kernel, name;
  std::vector<std::string> arg_names, signature;
};
// The spec of "pass1", "reduce", "single_pass", "commit"; anything else gives pass 2's.
KernelSpec kernel_spec(const std::string& kernel);

// The constexprs and num_warps a variant key encodes (docs/internals.md "Variant keys"), as
// add_variant writes them: "pass2.p1g1s0.sr1.b2.c1.f1.B2048.w8" -> {P_DTYPE 1, G_DTYPE 1,
// S_DTYPE 0, SR 1, BOUND_MODE 2, USE_CLIP 1, CHECK_FLAG 1, BLOCK 2048}, 8.
struct KeyParts {
  std::string kernel;
  json constexprs = json::object();
  int num_warps = 0;
};
KeyParts parse_key(const std::string& key);

struct VariantOptions {
  std::string payload;        // the .text bytes; "" : "cubin of <file name>"
  KernelSpec spec;            // an empty kernel: the spec of the key's kernel
  int trailing = 2;           // trailing scratch pointers (Triton 3.5+: 2)
  std::string triton_version = "3.6.0";
};
// Writes a cubin into `dir` (make_fake_cubin with the spec's entry, `arch`, the parameter sizes
// of its signature plus the trailing pointers, num_warps * 32 threads) and returns a manifest
// entry for it whose constexprs and num_warps are those the key encodes.
json add_variant(const TempDir& dir, const std::string& key, int arch, const VariantOptions& options);
json add_variant(const TempDir& dir, const std::string& key, int arch, const std::string& payload = "",
                 const KernelSpec& spec = KernelSpec{});

// A format_version 2 manifest holding `kernels`, with 18-column tables (the engine's).
json manifest_with(const std::vector<json>& kernels);
void write_manifest(const TempDir& dir, const json& manifest);

constexpr const char* kPass2Key = "pass2.p1g1s0.sr1.b2.c1.f1.B2048.w8";

}  // namespace luminav_test
